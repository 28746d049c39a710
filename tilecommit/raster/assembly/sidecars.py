"""The mosaic's companions: its quicklook and STAC item, each committed create-only, both read from
the committed mosaic at its version, every byte counted (never from a local copy: a server-side
mosaic has none).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from azure.storage.blob import ContainerClient

from ... import gates, jobs
from ...errors import MosaicCheckError
from ..env import gdal_env
from ..gdal_errors import gdal_step
from ..reading.source import PinnedBlob, reading
from ..reading.upload import upload_gdal_options
from .checks import blob_properties, committed_properties, repair_instruction
from .stac import CommittedMosaic, comparable_items, mosaic_footprint, quicklook_png, stac_item_bytes
from .statistics import MosaicStatistics, mosaic_statistics
from .strategy import MosaicJob


def write_sidecars(job: MosaicJob, *, replace: dict[str, str | None] | None = None, verify_only: bool = False) -> int:
    """Quicklook, then STAC item (which names both), each create-only, or verified when already there.

    The assembly's ``cost``: what the job has cost until the item is made, recorded in it as
    ``tilecommit:cost``. That is the one part of the item that is not a function of the mosaic:
    an item already there is checked with it left out (:func:`.stac.comparable_items`), and
    keeps the cost of the run that wrote it; one a build before the bands' statistics wrote is
    checked without them.

    ``verify_only`` (a scrub): nothing is written; a companion that is absent is known bad too.

    ``replace`` (a rebuild of the mosaic): ``{"quicklook": etag, "stac": etag}``, the versions
    inspected before the rebuild; each is then written whatever is there, with ``If-Match`` on
    that ETag (create-only where it was None), so a newer companion is never overwritten.

    Both are read from the committed mosaic at the version inspected, through the app's pinned,
    counted reader (the quicklook from its smallest overview: a few blocks), never from a local copy: there is none for a streamed mosaic, and a
    crash between the commits leaves the next call (which finds the mosaic present) the same
    source, so it writes the same bytes. For the same reason an existing one must hold exactly
    those bytes (:func:`_commit_or_verify`).
    """
    job_id, output, timings = job.job_id, job.stores.output, job.timings
    props = committed_properties(output, job.mosaic_name)
    # The mosaic is read at the version just inspected, through the app's counted reader: a read
    # storage did not answer in full fails the step (retried) instead of baking zeros into a
    # companion committed create-only. GDAL's network file systems are closed meanwhile.
    mosaic = PinnedBlob(output.get_blob_client(job.mosaic_name), props.etag, upload=False)
    with gdal_env(job.stores.settings, upload_gdal_options(mosaic.path)):
        started = time.perf_counter()
        with gdal_step(f"making the quicklook of {job.mosaic_name}", window="smallest overview"):
            quicklook = quicklook_png(mosaic)
        _commit_or_verify(
            output,
            jobs.quicklook_blob_name(job_id),
            quicklook,
            content_type="image/png",
            job_id=job_id,
            replace=replace,
            key="quicklook",
            verify_only=verify_only,
        )
        timings["quicklook"] = time.perf_counter() - started
        started = time.perf_counter()
        _commit_or_verify(
            output,
            jobs.stac_blob_name(job_id),
            _stac_item(job, mosaic, props),
            content_type="application/geo+json",
            job_id=job_id,
            replace=replace,
            key="stac",
            verify_only=verify_only,
            comparable=comparable_items,
        )
        timings["stac"] = time.perf_counter() - started
    return int(props.size)


def _stac_item(job: MosaicJob, mosaic: PinnedBlob, props) -> bytes:
    """The STAC item of the committed mosaic ``mosaic`` (whose properties are ``props``), naming its
    quicklook beside it; the cost in it is the job's until now, its statistics from one overview
    level (:func:`.statistics.mosaic_statistics`)."""
    mosaic_name, scene = job.mosaic_name, job.scene
    with (
        gdal_step(f"reading the overview levels of {mosaic_name} for its STAC item"),
        reading(mosaic) as src,
    ):
        levels = len(src.overviews(1))
    committed = CommittedMosaic(
        name=mosaic_name,
        nbytes=int(props.size),
        sha256=(props.metadata or {}).get(gates.SHA256_METADATA_KEY, ""),
        overview_levels=levels,
        created=props.creation_time or props.last_modified,
        footprint=mosaic_footprint(mosaic, scene.crs),
        statistics=_statistics(mosaic_name, mosaic),
    )
    return stac_item_bytes(job, committed)


def _statistics(mosaic_name: str, mosaic: PinnedBlob) -> MosaicStatistics:
    with gdal_step(f"reading the bands' statistics of {mosaic_name} for its STAC item", window="one overview"):
        return mosaic_statistics(mosaic)


def _commit_or_verify(
    output: ContainerClient,
    name: str,
    body: bytes,
    *,
    content_type: str,
    job_id: str,
    replace: dict[str, str | None] | None = None,
    key: str = "",
    verify_only: bool = False,
    comparable: Callable[[bytes, bytes], tuple[bytes, bytes]] | None = None,
) -> None:
    """Create ``name`` with ``body``, or check that what holds the key is ``body`` (the stored
    bytes and ``body`` as ``comparable(stored, body)`` gives them, when given); in a rebuild (``replace``), write it with ``If-Match`` on
    the version ``replace[key]`` inspected before it.

    A companion is a pure function of the committed mosaic, so one with other bytes describes
    another mosaic (or a fault that was baked into it, such as a missing footprint): it is known
    bad, a :class:`MosaicCheckError` saying how to repair it. The bytes are read and hashed, not
    the sha256 in the metadata trusted: a writer that replaced the blob may have copied that.
    A rebuild that finds a newer companion (``superseded``) leaves it: the newer rebuild wrote it.
    """
    expect = (replace or {}).get(key)
    if replace is not None and expect is not None:
        gates.repair_blob(output, name, body, expect_etag=expect, content_type=content_type, job_id=job_id)
        return
    absent = blob_properties(output, name) is None
    if absent and verify_only:
        raise MosaicCheckError(f"{name} does not exist; " + repair_instruction(job_id))
    if (
        absent
        and gates.commit_blob(output, name, body, content_type=content_type, job_id=job_id) is gates.Outcome.WRITTEN
    ):
        return
    if replace is not None:
        return  # created by a concurrent rebuild since it was inspected: already-present
    stored = gates.content_bytes(output.get_blob_client(name))
    found, ours = (gates.sha256_hex(b) for b in (comparable or _as_they_are)(stored, body))
    if found != ours:
        raise MosaicCheckError(
            f"{name} is not what the committed mosaic gives (stored sha256 {found}, from the mosaic {ours}); "
            + repair_instruction(job_id)
        )


def _as_they_are(stored: bytes, body: bytes) -> tuple[bytes, bytes]:
    return stored, body
