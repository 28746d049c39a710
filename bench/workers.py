"""Child processes of the bench: one library step in a fresh process, measured from outside.

    python -m bench.workers imports
    python -m bench.workers render JOB_ID SOURCE WINDOW_ID[,WINDOW_ID...] WIDTH HEIGHT
    python -m bench.workers assemble JOB_ID SCENE_JSON METHOD
    python -m bench.workers assemble-shares JOB_ID SCENE_JSON SHARE_BYTES SLOTS

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


def _job(job_id: str, settings, blob: str = "", url: str = "", etag: str = "", size: int = 0):
    """The bench's job ``job_id``, made to the spec of its app settings as the starter would make it."""
    from tilecommit.jobs import Job
    from tilecommit.spec import OutputSpec

    spec = OutputSpec.from_settings(settings)
    return Job(job_id, blob, url, etag, size, spec, batch_size=settings.batch_size)


def _stores(settings, blobs, tables, *, tiles_blobs=None, gdal_options=None):
    from tilecommit.stores import JobStores

    return JobStores(
        tiles=(tiles_blobs or blobs).get_container_client(settings.tiles_container),
        output=blobs.get_container_client(settings.output_container),
        manifest=tables.get_table_client(settings.manifest_table),
        settings=settings,
        gdal_options=gdal_options,
    )


def imports_only() -> dict:
    """What a worker process weighs before it renders anything (interpreter, GDAL, SDKs, clients)."""
    import tilecommit.raster  # noqa: F401

    _clients()
    return {}


def render(job_id: str, source: str, window_ids: list[str], width: int, height: int) -> dict:
    """Render these windows of the upload ``source`` (a blob name of the input container) one
    after the other, as one tile activity would: each window reads it through its own pinned reader."""
    from tilecommit.gates import SINGLE_PUT_CLIENT_OPTIONS
    from tilecommit.grid import window_for_id
    from tilecommit.raster import PinnedBlob, render_tile

    connection, settings, blobs, tables = _clients()
    stores = _stores(settings, blobs, tables, tiles_blobs=connection.blob_service(**SINGLE_PUT_CLIENT_OPTIONS))
    upload = connection.blob_service().get_blob_client(settings.input_container, source)
    props = upload.get_blob_properties()
    job = _job(job_id, settings, source, upload.url, props.etag.strip('"'), props.size)
    totals: dict[str, float] = {}
    nbytes = 0
    for window_id in window_ids:
        window = window_for_id(window_id, width, height, job.spec.window_size)
        result = render_tile(job, stores, PinnedBlob(upload, props.etag), window)
        nbytes += result.nbytes
        for key, value in result.timings.items():
            totals[key] = totals.get(key, 0.0) + value
    return {"windows": len(window_ids), "nbytes": nbytes, "timings": totals}


class HttpBodies:
    """Bytes of HTTP bodies this process sends and receives through the Azure SDK (every client
    built with :meth:`hooks`), from each request's and response's Content-Length."""

    def __init__(self):
        self.sent = self.received = self.requests = 0

    def _request(self, request) -> None:
        self.requests += 1
        self.sent += int(request.http_request.headers.get("Content-Length") or 0)

    def _response(self, response) -> None:
        # A HEAD's Content-Length is the blob's size, but no body follows it.
        if response.http_request.method != "HEAD":
            self.received += int(response.http_response.headers.get("Content-Length") or 0)

    def hooks(self) -> dict:
        return {"raw_request_hook": self._request, "raw_response_hook": self._response}


def gdal_network_bytes() -> dict:
    """GDAL's own count of its network file systems' traffic (CPL_VSIL_NETWORK_STATS_ENABLED=YES
    must be in the environment before GDAL's first request). rasterio does not wrap
    VSINetworkStatsGetAsSerializedJSON, so it is called in the libgdal rasterio ships."""
    import ctypes
    import glob
    import os

    import rasterio

    (library,) = glob.glob(os.path.join(os.path.dirname(rasterio.__file__) + ".libs", "libgdal*"))
    stats = ctypes.CDLL(library).VSINetworkStatsGetAsSerializedJSON
    stats.restype, stats.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    methods = json.loads(ctypes.string_at(stats(None)).decode()).get("methods", {})
    return {
        "requests": sum(m.get("count", 0) for m in methods.values()),
        "sent": sum(m.get("uploaded_bytes", 0) for m in methods.values()),
        "received": sum(m.get("downloaded_bytes", 0) for m in methods.values()),
    }


def assemble(job_id: str, scene_json: str, method: str) -> dict:
    """``assemble_mosaic`` of a job whose manifest is complete, by ``method`` ("auto", "server",
    "blocks", "vrt"), with the HTTP body bytes this process moved (SDK and GDAL)."""
    from tilecommit.raster import SceneInfo, assemble_mosaic
    from tilecommit.settings import Settings
    from tilecommit.storage import StorageConnection

    connection, settings = StorageConnection.from_env(), Settings.from_env()
    bodies = HttpBodies()
    blobs, tables = connection.blob_service(**bodies.hooks()), connection.table_service(**bodies.hooks())
    result = assemble_mosaic(
        _job(job_id, settings),
        _stores(settings, blobs, tables, gdal_options=connection.gdal_options()),
        SceneInfo.from_dict(json.loads(scene_json)),
        method=method,
    )
    sdk = {"requests": bodies.requests, "sent": bodies.sent, "received": bodies.received}
    return {**result.to_dict(), "http_bodies": {"sdk": sdk, "gdal": gdal_network_bytes()}}


def assemble_in_shares(job_id: str, scene_json: str, share_bytes: str, slots: str) -> dict:
    """The split path in one process, as the local host runs it: plan, the shares as activities
    (threads of this process, ``slots`` at a time: the host's activity slots), then the commit;
    the wall of each step."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from tilecommit.raster import SceneInfo, assemble_mosaic
    from tilecommit.raster.assembly import shares

    connection, settings, blobs, tables = _clients()
    scene = SceneInfo.from_dict(json.loads(scene_json))
    job, stores = _job(job_id, settings), _stores(settings, blobs, tables, gdal_options=connection.gdal_options())
    started = time.perf_counter()
    staged = shares.plan_shares(job, stores, scene, share_bytes=int(share_bytes))
    if isinstance(staged, str):
        raise SystemExit(f"not split: {staged}")
    planned = time.perf_counter()
    with ThreadPoolExecutor(int(slots)) as pool:
        walls = list(
            pool.map(lambda i: _timed(lambda: shares.stage_share(job, stores, staged, i)), range(staged.shares))
        )
    staged_at = time.perf_counter()
    result = assemble_mosaic(job, stores, scene, shares=staged)
    done = time.perf_counter()
    return {
        **result.to_dict(),
        "shares": staged.to_dict(),
        "steps_s": {
            "plan": round(planned - started, 2),
            "shares": round(staged_at - planned, 2),
            "commit": round(done - staged_at, 2),
            "share_walls": [round(w, 2) for w in walls],
        },
    }


def _timed(step) -> float:
    import time

    started = time.perf_counter()
    step()
    return time.perf_counter() - started


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
    elif step == "assemble-shares":
        result = assemble_in_shares(*args)
    else:
        raise SystemExit(f"unknown step {step!r}: imports, render, assemble or assemble-shares")
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
