"""Scrub a finished job: compare each window's tile with its source window, and repair what differs.

A tile deleted or replaced after its manifest row was written is never rendered again (the row
says the window is done), so nothing but a scrub finds it. :func:`check_window` reads the
window's row, its tile blob and the source window at the job's version, and names every
difference; asked to repair, it makes the tile the bytes :func:`~.tiling.render.render_tile` would
write and the row name that blob, each write conditional on the version it inspected
(``If-Match``; create-only where nothing was there). :func:`rebuild_outputs` then replaces the
mosaic and its companions through the assembly's own commit, ``If-Match`` on their inspected
ETags. A condition that fails is a newer write (a concurrent repair): ``superseded``, left be.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from azure.storage.blob import ContainerClient
from rasterio.errors import RasterioIOError
from rasterio.io import MemoryFile
from rasterio.windows import Window as RioWindow

from .. import gates, jobs
from ..errors import IncompleteManifestError, InvalidRasterError, MosaicCheckError
from ..grid import Window
from ..jobs import Job
from ..manifest import get_manifest_row, record_manifest_entry, repair_manifest_entry
from ..observability import telemetry
from ..records import Record
from ..storage_answers import unless_missing
from ..stores import JobStores
from .assembly.checks import blob_properties
from .assembly.commit import MosaicResult, output_names
from .assembly.committed import verify_outputs
from .assembly.mosaic import assemble_mosaic
from .gdal_errors import gdal_step
from .reading.scene import SceneInfo
from .reading.source import Source
from .tiling.encode import encode_tile, read_window
from .tiling.render import window_of_upload

logger = logging.getLogger(__name__)

#: The window has no manifest row.
MISSING_ROW = "missing-row"
#: The row (or, without one, the window's key) names a tile blob that does not exist.
MISSING_TILE = "missing-tile"
#: The tile blob is not the version its row recorded: another ETag, size or sha256.
TILE_CHANGED = "tile-changed"
#: The tile's decoded pixels or mask differ from the source window (or it cannot be decoded).
OTHER_PIXELS = "other-pixels"
#: The mosaic, STAC item or quicklook is missing or not what the tiles make (the assembly's own checks).
OUTPUTS_DIFFER = "outputs-differ"
DIFFERENCES = (MISSING_ROW, MISSING_TILE, TILE_CHANGED, OTHER_PIXELS, OUTPUTS_DIFFER)
#: A repair step that found nothing to write.
UNCHANGED = "unchanged"


@dataclass(frozen=True)
class WindowReport(Record):
    """What :func:`check_window` found for one window and, with ``repair``, what it wrote."""

    window: str
    differences: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    #: The tile's repair: written / already-present / superseded / unchanged ("" when not repaired).
    tile: str = ""
    #: The row's repair, the same outcomes.
    manifest: str = ""

    JSON_IN = {"differences": list, "details": list}


@dataclass(frozen=True)
class StoredTile:
    body: bytes
    etag: str

    @property
    def sha256(self) -> str:
        return gates.sha256_hex(self.body)


def _stored_tile(tiles: ContainerClient, name: str) -> StoredTile | None:
    """The tile blob's bytes and the ETag of the version read, or None when there is none."""

    def read() -> StoredTile:
        download = tiles.get_blob_client(name).download_blob()
        return StoredTile(download.readall(), download.properties.etag)

    return unless_missing("reading tile", name, read)


def _decoded(body: bytes) -> tuple[np.ndarray, np.ndarray | None]:
    with MemoryFile(body) as memory, memory.open() as tile:
        return read_window(tile, RioWindow(0, 0, tile.width, tile.height))


def _pixel_difference(source: tuple, body: bytes, against: str = "the source window") -> str | None:
    """Why the tile's decoded pixels and mask are not ``source`` (``against`` names it), or None."""
    try:
        data, mask = _decoded(body)
    except (InvalidRasterError, RasterioIOError) as exc:
        return f"the tile cannot be decoded: {exc}"
    want, want_mask = source
    if data.shape != want.shape or data.dtype != want.dtype:
        return f"the tile holds {data.shape} {data.dtype}, {against} {want.shape} {want.dtype}"
    if not np.array_equal(data, want, equal_nan=data.dtype.kind == "f"):
        return f"{int(np.count_nonzero(data != want))} samples differ from {against}"
    if (mask is None) != (want_mask is None) or (mask is not None and not np.array_equal(mask, want_mask)):
        return f"the tile's mask differs from that of {against}"
    return None


def _differences(
    pixels: tuple, row, stored: StoredTile | None, name: str, against: str = "the source window"
) -> tuple[list[str], list[str]]:
    kinds, details = [], []
    if row is None:
        kinds.append(MISSING_ROW)
        details.append(f"no manifest row for {name}")
    if stored is None:
        kinds.append(MISSING_TILE)
        details.append(f"{name} does not exist")
        return kinds, details
    entry = row[0] if row else None
    if entry is not None and (entry.etag, entry.nbytes, entry.sha256) != (stored.etag, len(stored.body), stored.sha256):
        kinds.append(TILE_CHANGED)
        details.append(
            f"{name} is ETag {stored.etag}, {len(stored.body)} bytes, sha256 {stored.sha256}; its row recorded "
            f"ETag {entry.etag}, {entry.nbytes} bytes, sha256 {entry.sha256}"
        )
    why = _pixel_difference(pixels, stored.body, against)
    if why:
        kinds.append(OTHER_PIXELS)
        details.append(f"{name}: {why}")
    return kinds, details


def check_window(
    job: Job, stores: JobStores, upload: str | os.PathLike | Source, window: Window, *, repair: bool = False
) -> WindowReport:
    """Compare one window's row and tile with the source window; with ``repair``, fix what differs."""
    job_id, spec = job.job_id, job.spec
    row = get_manifest_row(stores.manifest, job_id, window)
    name = row[0].uri if row else jobs.tile_blob_name(job_id, window)
    stored = _stored_tile(stores.tiles, name)
    with (
        window_of_upload(
            upload, window, settings=stores.settings, purpose="verify", spec=spec, gdal_options=stores.gdal_options
        ) as src,
        gdal_step(f"verifying tile {window.id} of {src.name}", window=window.id),
    ):
        pixels = read_window(src, window, choice=spec.choice)
        body = None
        expected, against = pixels, "the source window"
        if spec.choice.lossy:
            # A lossy profile's tile holds what the codec makes of the window, not the window:
            # encoding is deterministic, so the window encoded again is what the tile must hold.
            body, _ = encode_tile(src, window, spec=spec, pixels=pixels)
            expected, against = _decoded(body), f"the source window encoded again ({spec.profile})"
        kinds, details = _differences(expected, row, stored, name, against)
        if kinds and repair and body is None:  # the bytes render_tile writes for this window
            body, _ = encode_tile(src, window, spec=spec, pixels=pixels)
    report = WindowReport(window=window.id, differences=kinds, details=details)
    for kind in kinds:
        telemetry.count_difference(job_id, kind)
    if kinds:
        logger.warning("job %s: window %s differs from its source: %s", job_id, window.id, "; ".join(details))
    if not (kinds and repair):
        return report
    assert body is not None  # encoded above whenever a repair is due
    tile, recorded = _repair_window(job, stores, window, body, name, row, stored)
    return WindowReport(window=window.id, differences=kinds, details=details, tile=tile, manifest=recorded)


def _repair_window(
    job: Job, stores: JobStores, window: Window, body: bytes, name: str, row, stored: StoredTile | None
) -> tuple[str, str]:
    """Make ``name`` hold ``body`` and the window's row name it, each conditional on what was
    inspected (``stored``, ``row``); returns the two outcomes."""
    job_id, tiles, manifest = job.job_id, stores.tiles, stores.manifest
    digest = gates.sha256_hex(body)
    tile: gates.Outcome | str
    if stored is None:
        tile, _ = gates.commit_blob_versioned(tiles, name, body, job_id=job_id)
    elif stored.sha256 != digest:
        tile = gates.repair_blob(tiles, name, body, expect_etag=stored.etag, job_id=job_id)
    else:
        tile = UNCHANGED
    # The row names the blob as stored now; after a superseded write that is the concurrent
    # repair's, which is recorded only if it holds the very bytes this window renders to.
    now = _stored_tile(tiles, name)
    if now is None or now.sha256 != digest:
        logger.warning("job %s: %s changed again during its repair; its row is left for the next scrub", job_id, name)
        return str(tile), str(gates.Outcome.SUPERSEDED)
    fields: dict[str, Any] = dict(
        job_id=job_id, window=window, uri=name, nbytes=len(now.body), sha256=digest, etag=now.etag
    )
    recorded: gates.Outcome | str
    if row is None:
        recorded = record_manifest_entry(manifest, **fields)
    elif (row[0].uri, row[0].nbytes, row[0].sha256, row[0].etag) != (name, len(now.body), digest, now.etag):
        recorded = repair_manifest_entry(manifest, **fields, expect_row_etag=row[1])
    else:
        recorded = UNCHANGED
    logger.info("job %s: window %s repaired: tile %s, row %s", job_id, window.id, tile, recorded)
    return str(tile), str(recorded)


def check_outputs(job: Job, stores: JobStores, scene: SceneInfo) -> list[str]:
    """What is wrong with the committed mosaic, STAC item and quicklook ([] when they verify as an
    assembly would verify them), writing nothing. Counted and logged like the windows' differences."""
    try:
        verify_outputs(job, stores, scene)
    except (MosaicCheckError, IncompleteManifestError) as exc:
        telemetry.count_difference(job.job_id, OUTPUTS_DIFFER)
        logger.warning("job %s: its outputs are not what its tiles make: %s", job.job_id, exc)
        return [str(exc)]
    return []


def inspect_outputs(output: ContainerClient, job_id: str) -> dict[str, str | None]:
    """The ETags of the job's mosaic, STAC item and quicklook as they are now (None: absent)."""
    names = cast(dict[str, str], output_names(job_id))
    found = {key: blob_properties(output, name) for key, name in names.items()}
    return {key: props.etag if props is not None else None for key, props in found.items()}


def rebuild_outputs(job: Job, stores: JobStores, scene: SceneInfo) -> MosaicResult:
    """Assemble the mosaic again from the (repaired) manifest and replace the outputs as inspected now."""
    return assemble_mosaic(job, stores, scene, replace=inspect_outputs(stores.output, job.job_id))
