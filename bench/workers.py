"""Child processes of the bench: one library step in a fresh process, measured from outside.

    python -m bench.workers imports
    python -m bench.workers render JOB_ID SOURCE WINDOW_ID[,WINDOW_ID...] WIDTH HEIGHT
    python -m bench.workers assemble JOB_ID SCENE_JSON METHOD

Each prints one JSON line (its result); the caller takes wall time, peak RSS and CPU seconds
with :func:`bench.common.run_measured`, so a figure is the process's own, never the bench's.
Storage and settings come from the environment (``AzureWebJobsStorage`` and the app settings),
as in a Functions worker.
"""

from __future__ import annotations

import json
import sys


def _clients():
    from tilecommit.settings import Settings
    from tilecommit.storage import StorageConnection

    connection = StorageConnection.from_env()
    return connection, Settings.from_env(), connection.blob_service(), connection.table_service()


def imports_only() -> dict:
    """What a worker process weighs before it renders anything (interpreter, GDAL, SDKs, clients)."""
    import tilecommit.raster  # noqa: F401

    _clients()
    return {}


def render(job_id: str, source: str, window_ids: list[str], width: int, height: int) -> dict:
    """Render these windows of ``source`` one after the other, as one tile activity would."""
    from tilecommit.gates import SINGLE_PUT_CLIENT_OPTIONS
    from tilecommit.grid import window_for_id
    from tilecommit.raster import render_tile

    connection, settings, _, tables = _clients()
    tiles = connection.blob_service(**SINGLE_PUT_CLIENT_OPTIONS).get_container_client(settings.tiles_container)
    manifest = tables.get_table_client(settings.manifest_table)
    options = connection.gdal_options()
    totals: dict[str, float] = {}
    nbytes = 0
    for window_id in window_ids:
        window = window_for_id(window_id, width, height, settings.window_size)
        result = render_tile(
            source, window, job_id=job_id, tiles=tiles, manifest=manifest, settings=settings, gdal_options=options
        )
        nbytes += result.nbytes
        for key, value in result.timings.items():
            totals[key] = totals.get(key, 0.0) + value
    return {"windows": len(window_ids), "nbytes": nbytes, "timings": totals}


def assemble(job_id: str, scene_json: str, method: str) -> dict:
    """``assemble_mosaic`` of a job whose manifest is complete, by ``method`` ("auto", "server", "blocks", "vrt")."""
    from tilecommit.raster import SceneInfo, assemble_mosaic

    connection, settings, blobs, tables = _clients()
    result = assemble_mosaic(
        job_id,
        SceneInfo.from_dict(json.loads(scene_json)),
        tiles=blobs.get_container_client(settings.tiles_container),
        output=blobs.get_container_client(settings.output_container),
        manifest=tables.get_table_client(settings.manifest_table),
        settings=settings,
        gdal_options=connection.gdal_options(),
        method=method,
    )
    return result.to_dict()


def copy_manifest(tables, manifest_table: str, from_job: str, to_job: str) -> None:
    """Point a second job at the same tiles (manifest rows name the blobs), so another assembly
    builds its own mosaic from identical tiles."""
    table = tables.get_table_client(manifest_table)
    for row in table.query_entities("PartitionKey eq @job", parameters={"job": from_job}):
        table.upsert_entity({**row, "PartitionKey": to_job})


def main(argv: list[str]) -> None:
    step, args = argv[0], argv[1:]
    if step == "imports":
        result = imports_only()
    elif step == "render":
        job_id, source, ids, width, height = args
        result = render(job_id, source, ids.split(","), int(width), int(height))
    elif step == "assemble":
        result = assemble(*args)
    else:
        raise SystemExit(f"unknown step {step!r}: imports, render or assemble")
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
