"""One window of a source raster rendered into the tiles container as a COG tile, committed exactly once.

The upload is opened for one window (:func:`window_of_upload`), the window encoded
(:func:`.encode.encode_tile`), the tile committed create-only, then its manifest row.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

from rasterio.errors import RasterioIOError

from ... import cancellation, gates, jobs
from ... import manifest as manifest_rows
from ...errors import InvalidRasterError, JobCancelledError
from ...grid import Window
from ...jobs import Job
from ...records import Record
from ...settings import Settings
from ...spec import OutputSpec
from ...stores import JobStores
from ..env import NUM_THREADS, gdal_env
from ..gdal_errors import gdal_step
from ..reading.scene_document import open_any_upload
from ..reading.source import Source, as_source, upload_format_of
from ..reading.upload import upload_gdal_options
from ..reading.warp import view_grid, warped
from .encode import encode_tile

logger = logging.getLogger(__name__)


@contextmanager
def window_of_upload(
    upload: str | os.PathLike | Source,
    window: Window,
    *,
    settings: Settings,
    purpose: str,
    spec: OutputSpec | None = None,
    gdal_options: dict | None = None,
    num_threads: int = NUM_THREADS,
) -> Iterator:
    """The upload opened to read ``window`` (to ``purpose`` it: render, verify): the GTiff driver
    alone, every byte read through its pinned, counted reader, every GDAL call in the block
    checked (:meth:`~tilecommit.raster.reading.source.Source.checked`). validate_source checked the content of this same
    version, so an open that fails on bytes that all arrived is the file's, not storage's.

    For a spec that warps (``web_optimized``, ``target_srs``, ``resolution``: tilecommit/warping.py)
    the dataset yielded is the upload warped onto the job's grid
    (:func:`~tilecommit.raster.reading.warp.warped`), computed again from the same version, and
    ``window`` is a window of that grid; for ``add_mask`` on an upload whose valid area is an
    alpha band, the upload seen through the warper on its own grid
    (:func:`~tilecommit.raster.reading.warp.view_grid`)."""
    source = as_source(upload)
    upload_format = upload_format_of(source)
    config = {**(gdal_options or {}), **upload_gdal_options(source.path, upload_format)}
    with gdal_env(settings, config, num_threads=num_threads):
        try:
            src = open_any_upload(
                source, upload_format=upload_format, variable=spec.choice.variable if spec is not None else None
            )
        except RasterioIOError as exc:
            raise InvalidRasterError(f"{source.name} cannot be opened to {purpose} window {window.id}: {exc}") from exc
        with src, source.checked():
            choice = spec.choice if spec is not None else None
            grid = view_grid(src, choice) if choice is not None else None
            if choice is not None and grid is not None:
                with warped(src, grid, resampling=choice.warp_resampling, nodata=choice.nodata_for(src.nodata)) as view:
                    _check_inside(window, view, f"{grid.name} of the source")
                    yield view
                return
            _check_inside(window, src, "source")
            yield src


def _check_inside(window: Window, dataset, what: str) -> None:
    if window.col_off + window.width > dataset.width or window.row_off + window.height > dataset.height:
        raise InvalidRasterError(
            f"window {window.id} ({window.col_off},{window.row_off} {window.width}x{window.height}) lies "
            f"outside the {dataset.width}x{dataset.height} {what}: the source changed since it was planned"
        )


@dataclass(frozen=True)
class TileResult(Record):
    """What :func:`render_tile` did for one window."""

    window: str
    outcome: str
    skipped: bool
    nbytes: int
    sha256: str
    uri: str
    timings: dict[str, float] = field(default_factory=dict)

    JSON_IN = {"timings": lambda timings: dict(timings or {})}


def render_tile(
    job: Job,
    stores: JobStores,
    upload: str | os.PathLike | Source,
    window: Window,
    *,
    num_threads: int = NUM_THREADS,
) -> TileResult:
    """Render one window of ``upload`` into the tiles container, at most once in effect, made to
    the job's output spec (the stores' settings give GDAL's limits only).

    1. A point read of the manifest: a row means the tile is done. Without one, a point read of
       the job's cancellation row: a cancelled job (:mod:`tilecommit.cancellation`) renders
       nothing more. Either way nothing is read or encoded.
    2. Read exactly this window, encode a COG in memory.
    3. Commit the blob create-only, then the manifest row. A crash between the two leaves a tile
       without a row; the retry re-encodes identical bytes, gets ``ALREADY_PRESENT`` for the blob
       (same sha256) and writes the row. The row is written only after the blob exists, so the
       manifest never names a tile that is not there.
    """
    job_id, spec = job.job_id, job.spec
    timings: dict[str, float] = {}
    began = datetime.now(UTC)
    started = time.perf_counter()
    entry, cancelled = cancellation.lookup_window(stores.manifest, job_id, window)
    timings["manifest_check"] = time.perf_counter() - started
    if cancelled:
        raise JobCancelledError(f"job {job_id} was cancelled: window {window.id} is not rendered")
    if entry is not None:
        return TileResult(
            window=window.id,
            outcome=str(gates.Outcome.ALREADY_PRESENT),
            skipped=True,
            nbytes=entry.nbytes,
            sha256=entry.sha256,
            uri=entry.uri,
            timings=timings,
        )

    with window_of_upload(
        upload,
        window,
        settings=stores.settings,
        purpose="render",
        spec=spec,
        gdal_options=stores.gdal_options,
        num_threads=num_threads,
    ) as src:
        where = f"col={window.col_off} row={window.row_off} {window.width}x{window.height}"
        with gdal_step(f"rendering tile {window.id} of {src.name}", window=where):
            body, encode_timings = encode_tile(src, window, spec=spec, num_threads=num_threads)
    # Every read of this window was answered in full at the job's version (checked() above
    # raised otherwise): only now may its tile be committed, once and for good.
    timings.update(encode_timings)
    return _commit_tile(job, stores, window, body, timings, began)


def _commit_tile(
    job: Job, stores: JobStores, window: Window, body: bytes, timings: dict[str, float], began: datetime
) -> TileResult:
    """Step 3 of :func:`render_tile`: the tile committed create-only, then its manifest row."""
    job_id, name = job.job_id, jobs.tile_blob_name(job.job_id, window)
    started = time.perf_counter()
    outcome, stored = gates.commit_blob_versioned(stores.tiles, name, body, job_id=job_id)
    timings["commit"] = time.perf_counter() - started

    # The row describes the tile storage holds (ours, or an already-present one with other bytes).
    started = time.perf_counter()
    # Called through its module, where the crash tests' fault injection replaces it.
    manifest_rows.record_manifest_entry(
        stores.manifest,
        job_id=job_id,
        window=window,
        uri=name,
        nbytes=stored.nbytes,
        sha256=stored.sha256,
        etag=stored.etag,
        times=manifest_rows.RenderTimes(began, datetime.now(UTC)),
    )
    timings["manifest"] = time.perf_counter() - started
    logger.info("tile %s of job %s: %s, %d bytes", window.id, job_id, outcome, stored.nbytes)
    return TileResult(
        window=window.id,
        outcome=str(outcome),
        skipped=False,
        nbytes=stored.nbytes,
        sha256=stored.sha256,
        uri=name,
        timings=timings,
    )
