"""One node of the mosaic's coarse-level reduction tree (:mod:`.reduction`), run by its activity.

:func:`reduce_node` reads its children's smallest levels (the tiles' last level for the first
stage, the previous stage's intermediates after it), each pinned to the ETag its manifest row
recorded (:class:`.block_sources.BlobRangeSource`), lays their blocks out as its region of the
level, has GDAL compute the node's levels of it as the single-instance commit computes a whole
level (:func:`.block_copy.build_coarse_levels`), and writes them as one create-only intermediate
blob, named by the job, the level and the node (:func:`tilecommit.jobs.level_blob_name`), with a
manifest row of its own (:func:`tilecommit.jobs.level_row_key`: never a window row). After its
TIFF it carries heads (:func:`.coarse_levels.pack_heads`): a first-stage node its tiles', a node
above its children's and all they carry, so the last node carries every head the commit parses.
Its bytes are a pure function of its children's versions (their bytes and the ETags it carries),
so every execution over the same children makes the same ones: one that finds the blob there
compares the stored bytes with its own before it calls them ``already-present``, and replaces,
``If-Match``, a blob that differs (a repair: a child rewritten since changes its parent too, one
stage at a time as the job runs the tree again), as it repairs a row that names another version.
"""

from __future__ import annotations

import logging
import os
import shutil
import time

from azure.data.tables import TableClient

from ... import gates, jobs
from ...errors import IncompatibleTilesError, IncompleteManifestError, MosaicCheckError
from ...jobs import Job
from ...manifest import (
    ManifestEntry,
    get_manifest_entry,
    get_manifest_row,
    record_manifest_entry,
    repair_manifest_entry,
)
from ...storage_answers import call_failed
from ...stores import JobStores
from ...usage import ContextExecutor
from .. import tiff
from ..reading.scene import SceneInfo
from . import attempt
from .block_copy import build_coarse_levels
from .block_sources import FETCH_THREADS, BlockFetcher, read_heads
from .coarse_levels import pack_heads, read_carried
from .pyramid import tile_levels
from .reduction import LevelTree, node_region

logger = logging.getLogger(__name__)

LEVEL_CONTENT_TYPE = "image/tiff"


def _children(job: Job, stores: JobStores, tree: LevelTree, s: int, row: int, col: int):
    """The node's region (x0, y0 in blocks, width, height) and, for each of its blocks, the
    child key and block index within that child's level, with each child's manifest row."""
    stage, block = tree.stages[s], tree.block_size
    x0, y0, width, height = node_region(stage, row, col, block)
    across, down = -(-width // block), -(-height // block)
    places: list[tuple[str, int, int]] = []
    if s == 0:  # the tiles' last level: each tile is per_tile x per_tile blocks of it (fewer at an edge)
        per_tile = job.spec.window_size // 2**tree.first // block
        for by in range(y0, y0 + down):
            for bx in range(x0, x0 + across):
                places.append((f"{by // per_tile:04d}_{bx // per_tile:04d}", by % per_tile, bx % per_tile))
    else:  # the previous stage's nodes: each one block, its smallest level
        previous = tree.stages[s - 1]
        for by in range(y0, y0 + down):
            for bx in range(x0, x0 + across):
                places.append((jobs.level_row_key(previous.level, by, bx), 0, 0))
    keys = list(dict.fromkeys(p[0] for p in places))
    entries: dict[str, ManifestEntry] = {}
    for key in keys:
        entry = get_manifest_entry(stores.manifest, job.job_id, key)
        if entry is None:
            raise IncompleteManifestError(
                f"job {job.job_id}: level node {s} ({row}, {col}) lacks its child {key}: no manifest row", missing=[key]
            )
        entries[key] = entry
    return (x0, y0, width, height), places, entries


def _region(
    places: list[tuple[str, int, int]], levels: dict[str, tuple], width: int, height: int
) -> tuple[tiff.OutputDirectory, tiff.Directory]:
    """The region's directory (with its mask) from each block's child level."""
    ref_image, ref_mask = levels[places[0][0]]
    key = ref_image.encoding_key()
    for child, (image, mask) in levels.items():
        if image.encoding_key() != key or (mask is None) != (ref_mask is None):
            raise IncompatibleTilesError(f"level child {child} is encoded differently from {places[0][0]}")

    def directory(which: int, reference: tiff.Directory, subfile: int) -> tiff.OutputDirectory:
        blocks = []
        for child, ly, lx in places:
            d = levels[child][which]
            index = ly * d.blocks_across + lx
            if lx >= d.blocks_across or index >= len(d.block_offsets):
                raise IncompatibleTilesError(f"level child {child} has no block ({ly}, {lx})")
            blocks.append(tiff.BlockRef(child, d.block_offsets[index], d.block_byte_counts[index]))
        tags = tiff.copyable_tags(reference, width=width, height=height, subfile_type=subfile)
        return tiff.OutputDirectory(tags=tags, blocks=blocks, width=width, height=height)

    out = directory(0, ref_image, 0)
    if ref_mask is not None:
        out.mask = directory(1, ref_mask, tiff.SUBFILE_MASK)
    return out, ref_image


def compute_node(
    job: Job, stores: JobStores, scene: SceneInfo, tree: LevelTree, s: int, row: int, col: int, workdir: str
) -> tuple[bytes, dict[str, str | None]]:
    """The node's intermediate (a TIFF of its levels, smallest last) and the child versions it read."""
    stage = tree.stages[s]
    (_, _, width, height), places, entries = _children(job, stores, tree, s, row, col)
    with ContextExecutor(max_workers=FETCH_THREADS, thread_name_prefix="levelfetch") as executor:
        sources, heads = read_heads(entries, stores.tiles, executor)
        layouts = {k: tiff.read_layout(head, sources[k].read) for k, (_, _, head) in heads.items()}
        levels = {
            k: (tile_levels(layout)[tree.first] if s == 0 else tile_levels(layout)[-1]) for k, layout in layouts.items()
        }
        base, reference = _region(places, levels, width, height)
        first_layout = layouts[places[0][0]]
        # A tile's first directory carries the job's nodata; so does an intermediate's (GDAL
        # writes it into every overview's directory, and the intermediate copies their tags).
        nodata = first_layout.directories[0].tags.get(tiff.GDAL_NODATA)
        fetch = BlockFetcher(sources, executor, tree.block_size)
        computed, local = build_coarse_levels(
            scene,
            base,
            nodata,
            first_layout.byte_order,
            stage.level,
            fetch,
            workdir,
            stores.settings,
            job.spec,
            count=stage.levels,
        )
        try:
            # Framed as the tiles frame their blocks (their ghost area, leaders and trailers),
            # as the mosaic is: the service copies these blocks with their frames into it.
            writer = tiff.TiffWriter(
                first_layout.byte_order,
                ghost=first_layout.ghost,
                leaders=first_layout.block_leaders,
                trailers=first_layout.block_trailers,
            )
            path = os.path.join(workdir, "node.tif")
            with open(path, "wb") as out:
                writer.write(out, computed, BlockFetcher({"coarse": local}, executor, tree.block_size))
            with open(path, "rb") as f:
                body = f.read()
        finally:
            local.close()
        # After the TIFF, which ignores them, the heads the commit parses (coarse_levels.py): its
        # children's, each cut to the bytes its directories take (1,152 of the 16,384 read, for a
        # 1024² tile of 3 bands), and above the first stage those its children carry, so the last
        # node carries every head of the tree and of its tiles.
        # Each with the contents its row recorded: the commit refuses a tree computed from a
        # tile's other contents (coarse_levels.check_tree_contents).
        carried = {k: (etag, size, head[: layouts[k].extent]) for k, (etag, size, head) in heads.items()}
        contents = {k: e.sha256 for k, e in entries.items()}
        if s > 0:
            for below, below_contents in executor.map(read_carried, [sources[k] for k in heads]):
                carried.update(below)
                contents.update(below_contents)
    body += pack_heads(carried, contents)
    return body, {k: e.etag for k, e in entries.items()}


def reduce_node(job: Job, stores: JobStores, scene: SceneInfo, tree: LevelTree, s: int, row: int, col: int) -> dict:
    """Compute node (``row``, ``col``) of stage ``s``, write its intermediate once and record it;
    ``{"stage", "row", "col", "outcome", "nbytes", "seconds"}``. Raises what its reads raise
    (:class:`IncompleteManifestError` for a child without a row or changed since it;
    :class:`IncompatibleTilesError` for children that cannot be laid out side by side)."""
    started = time.perf_counter()
    stage = tree.stages[s]
    workdir = attempt.new_workdir(job.job_id)
    try:
        body, _ = compute_node(job, stores, scene, tree, s, row, col, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    name = jobs.level_blob_name(job.job_id, stage.level, row, col)
    key = jobs.level_row_key(stage.level, row, col)
    outcome, stored = gates.commit_blob_versioned(
        stores.tiles, name, body, content_type=LEVEL_CONTENT_TYPE, job_id=job.job_id
    )
    ours = gates.sha256_hex(body)
    blob = stores.tiles.get_blob_client(name)
    if outcome is not gates.Outcome.WRITTEN and gates.content_sha256(blob, stored.etag) != ours:
        # Verified before it counts as present: one that holds other bytes is replaced, that version only.
        logger.warning(
            "job %s: intermediate %s holds other bytes than its children make: replacing it", job.job_id, name
        )
        repaired, etag = gates.repair_blob_versioned(
            stores.tiles, name, body, expect_etag=stored.etag, content_type=LEVEL_CONTENT_TYPE, job_id=job.job_id
        )
        if repaired is not gates.Outcome.WRITTEN or etag is None:
            raise MosaicCheckError(f"intermediate {name} changed while it was repaired ({repaired}); run the job again")
        outcome, stored = repaired, gates.StoredBlob(etag=etag, nbytes=len(body), sha256=ours)
    _record(stores.manifest, job.job_id, key, name, stored)
    logger.info("job %s: level node %s %s (%d bytes)", job.job_id, key, outcome, stored.nbytes)
    return {
        "stage": s,
        "row": row,
        "col": col,
        "outcome": str(outcome),
        "nbytes": stored.nbytes,
        "seconds": round(time.perf_counter() - started, 3),
    }


def _record(table: TableClient, job_id: str, key: str, name: str, stored: gates.StoredBlob) -> None:
    """The intermediate's row, naming the version stored; a row naming another is repaired (If-Match)."""
    record_manifest_entry(
        table, job_id=job_id, window=key, uri=name, nbytes=stored.nbytes, sha256=stored.sha256, etag=stored.etag
    )
    held = get_manifest_row(table, job_id, key)
    if held is None:
        raise call_failed("reading back", f"{job_id}/{key}", RuntimeError("the row vanished after its write"))
    entry, row_etag = held
    if (entry.sha256, entry.etag, entry.uri) != (stored.sha256, stored.etag, name):
        repair_manifest_entry(
            table,
            job_id=job_id,
            window=key,
            uri=name,
            nbytes=stored.nbytes,
            sha256=stored.sha256,
            etag=stored.etag,
            expect_row_etag=row_etag,
        )


__all__ = ["reduce_node"]
