"""The mosaic's companions: its quicklook and STAC item, each committed create-only, both read from
the committed mosaic through /vsiaz/ (never from a local copy: a server-side mosaic has none).
"""

from __future__ import annotations

import time

import rasterio
from azure.storage.blob import ContainerClient

from .. import gates, jobs
from ..errors import StorageFaultError
from ..settings import Settings
from ..storage import vsiaz_path
from .checks import blob_properties, remote_gdal_options
from .env import gdal_env
from .gdal_errors import gdal_step
from .scene import SceneInfo
from .stac import mosaic_footprint, quicklook_png, stac_item_bytes


def write_sidecars(
    job_id: str,
    scene: SceneInfo,
    *,
    output: ContainerClient,
    settings: Settings,
    gdal_options: dict | None,
    source_name: str,
    timings: dict[str, float],
    replace: dict[str, str | None] | None = None,
) -> int:
    """Quicklook, then STAC item (which names both), each create-only; skipped when already there.

    ``replace`` (a rebuild of the mosaic): ``{"quicklook": etag, "stac": etag}``, the versions
    inspected before the rebuild; each is then written whatever is there, with ``If-Match`` on
    that ETag (create-only where it was None), so a newer companion is never overwritten.

    Both are read from the committed mosaic through /vsiaz/ (the quicklook from its smallest
    overview: a few blocks), never from a local copy: there is none for a streamed mosaic, and a
    crash between the commits leaves the next call (which finds the mosaic present) the same
    source, so it writes the same bytes.
    """
    mosaic_name, stac_name, quicklook_name = (
        jobs.mosaic_blob_name(job_id),
        jobs.stac_blob_name(job_id),
        jobs.quicklook_blob_name(job_id),
    )
    props = blob_properties(output, mosaic_name)
    if props is None:
        raise StorageFaultError(f"{mosaic_name} vanished after it was committed")
    sha = (props.metadata or {}).get(gates.SHA256_METADATA_KEY, "")
    remote = vsiaz_path(output.container_name, mosaic_name)
    with gdal_env(settings, remote_gdal_options(gdal_options, remote)):
        started = time.perf_counter()
        if replace is not None or blob_properties(output, quicklook_name) is None:
            with gdal_step(f"making the quicklook of {mosaic_name}", window="smallest overview"):
                quicklook = quicklook_png(remote)
            _commit(output, quicklook_name, quicklook, "image/png", job_id, replace, "quicklook")
        timings["quicklook"] = time.perf_counter() - started
        started = time.perf_counter()
        if replace is not None or blob_properties(output, stac_name) is None:
            with (
                gdal_step(f"reading the overview levels of {mosaic_name} for its STAC item"),
                rasterio.open(remote) as src,
            ):
                levels = len(src.overviews(1))
            body = stac_item_bytes(
                job_id=job_id,
                scene=scene,
                mosaic_href="./" + mosaic_name.rsplit("/", 1)[-1],
                quicklook_href="./" + quicklook_name.rsplit("/", 1)[-1],
                mosaic_nbytes=int(props.size),
                mosaic_sha256=sha,
                overview_levels=levels,
                created=props.creation_time or props.last_modified,
                footprint=mosaic_footprint(remote, scene.crs),
                source_name=source_name,
            )
            _commit(output, stac_name, body, "application/geo+json", job_id, replace, "stac")
        timings["stac"] = time.perf_counter() - started
    return int(props.size)


def _commit(output, name: str, body: bytes, content_type: str, job_id: str, replace, key: str) -> gates.Outcome:
    """Create-only, or (a rebuild) If-Match on the version ``replace[key]`` inspected before it."""
    expect = (replace or {}).get(key)
    if expect is None:
        return gates.commit_blob(output, name, body, content_type=content_type, job_id=job_id)
    return gates.repair_blob(output, name, body, expect_etag=expect, content_type=content_type, job_id=job_id)
