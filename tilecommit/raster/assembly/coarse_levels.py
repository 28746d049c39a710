"""The mosaic's coarse levels computed by a reduction tree (:mod:`.reduction`): one node, and the stitch.

:func:`reduce_node` is one node: it reads its children's smallest levels (the tiles' last level
for the first stage, the previous stage's intermediates after it), each pinned to the ETag its
manifest row recorded (:class:`.block_sources.BlobRangeSource`), lays their blocks out as its
region of the level, has GDAL compute the node's levels of it as the single-instance commit
computes a whole level (:func:`.block_copy.build_coarse_levels`), and writes them as one
create-only intermediate blob, named by the job, the level and the node
(:func:`tilecommit.jobs.level_blob_name`), with a manifest row of its own
(:func:`tilecommit.jobs.level_row_key`: never a window row). Its bytes are a pure function of its
children's, so every execution makes the same ones: one that finds the blob there compares the
stored bytes with its own before it calls them ``already-present``, and replaces, ``If-Match``,
a blob that differs (a repair), as it repairs a row that names another version.

:func:`stitched_levels` is the commit's part: the intermediates' levels side by side, their
blocks read (pinned) from the intermediates, as the tiles' levels are the tiles' blocks.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from azure.data.tables import TableClient

from ... import gates, jobs
from ...errors import IncompatibleTilesError, IncompleteManifestError, MosaicCheckError
from ...jobs import Job
from ...manifest import (
    ManifestEntry,
    get_manifest_entry,
    get_manifest_row,
    manifest_entry,
    record_manifest_entry,
    repair_manifest_entry,
)
from ...storage_answers import STORAGE_ERRORS, call_failed
from ...stores import JobStores
from ...usage import ContextExecutor
from .. import tiff
from ..reading.scene import SceneInfo
from . import attempt
from .block_copy import build_coarse_levels
from .block_sources import FETCH_THREADS, TILE_HEAD_BYTES, BlobRangeSource, BlockFetcher, Head, read_heads
from .pyramid import tile_levels
from .reduction import LevelTree, Stage, node_blocks, node_region

logger = logging.getLogger(__name__)

LEVEL_CONTENT_TYPE = "image/tiff"


class BytesSource:
    """Ranged reads of bytes held in memory (an intermediate read whole, pinned)."""

    def __init__(self, data: bytes, name: str):
        self.data, self.name = data, name

    def read(self, offset: int, length: int) -> bytes:
        return self.data[offset : offset + length]

    def __repr__(self) -> str:
        return f"blob:{self.name}"


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
        sources, layouts, heads = read_heads(entries, stores.tiles, executor)
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
            writer = tiff.TiffWriter(first_layout.byte_order)
            path = os.path.join(workdir, "node.tif")
            with open(path, "wb") as out:
                writer.write(out, computed, BlockFetcher({"coarse": local}, executor, tree.block_size))
            with open(path, "rb") as f:
                body = f.read()
        finally:
            local.close()
    if s == 0:  # the tiles' heads, for the commit (read_intermediates): after the TIFF, which ignores them
        body += pack_heads(heads)
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


def level_rows(table: TableClient, job_id: str) -> dict[str, ManifestEntry]:
    """Every intermediate's manifest row of the job (one query, every page read)."""
    try:
        pages = table.query_entities(
            f"PartitionKey eq @job and {jobs.LEVEL_ROWS_FILTER}",
            parameters={"job": job_id},
            select=["RowKey", "uri", "bytes", "sha256", "etag"],
        )
        return {e.window: e for e in (manifest_entry(p) for p in pages)}
    except STORAGE_ERRORS as exc:
        raise call_failed("reading the level rows of", job_id, exc) from exc


@dataclass
class Intermediates:
    """Every intermediate of a tree, read whole and pinned: its bytes as a source, its layout,
    and the heads of the tiles its first stage carries."""

    tree: LevelTree
    sources: dict[str, BytesSource]
    layouts: dict[str, tiff.TiffLayout]
    heads: dict[str, Head]


def read_intermediates(job: Job, stores: JobStores, tree: LevelTree, executor: ThreadPoolExecutor) -> Intermediates:
    """Every intermediate of ``tree``, each read whole, pinned to its row's ETag (one query for
    the rows). A missing row is :class:`IncompleteManifestError`: the job runs the tree again."""
    rows = level_rows(stores.manifest, job.job_id)
    wanted = [jobs.level_row_key(st.level, r, c) for st in tree.stages for r, c in st.nodes]
    missing = [k for k in wanted if k not in rows]
    if missing:
        raise IncompleteManifestError(
            f"job {job.job_id}: {len(missing)} coarse-level intermediates have no manifest row ({', '.join(missing[:10])}): "
            "run the job again to compute them",
            missing=missing,
        )
    entries = {k: rows[k] for k in wanted}
    readers = {k: BlobRangeSource(stores.tiles, e.uri, e.nbytes, e.etag or "", k) for k, e in entries.items()}
    data = dict(zip(entries, executor.map(lambda k: readers[k].read(0, entries[k].nbytes), list(entries)), strict=True))
    sources = {k: BytesSource(data[k], entries[k].uri) for k in entries}
    layouts = {k: tiff.read_layout(data[k][:TILE_HEAD_BYTES], sources[k].read) for k in entries}
    heads: dict[str, Head] = {}
    for r, c in tree.stages[0].nodes:
        heads.update(unpack_heads(data[jobs.level_row_key(tree.stages[0].level, r, c)]))
    return Intermediates(tree, sources, layouts, heads)


def stitched_levels(intermediates: Intermediates) -> list[tiff.OutputDirectory]:
    """The mosaic's coarse levels, smallest last: the intermediates' levels side by side, their
    blocks read from the intermediates (``intermediates.sources``, keyed by their rows)."""
    tree, out = intermediates.tree, []
    for stage in tree.stages:
        node_levels = {
            (r, c): tile_levels(intermediates.layouts[jobs.level_row_key(stage.level, r, c)]) for r, c in stage.nodes
        }
        for j in range(1, stage.levels + 1):
            out.append(_stitched(stage, j, node_levels, tree.block_size))
    return out


#: The end of a first-stage intermediate: its tiles' heads, a JSON index, their lengths, this.
HEADS_MAGIC = b"TCHEADS1"


def pack_heads(heads: dict[str, Head]) -> bytes:
    """The heads as bytes to append to a TIFF: each head, a JSON index (window -> ETag, size,
    offset among the heads, length), the heads' and the index's lengths (8 bytes each, little
    endian), :data:`HEADS_MAGIC`."""
    blob, index = b"", {}
    for key in sorted(heads):
        etag, size, head = heads[key]
        index[key] = [etag, size, len(blob), len(head)]
        blob += head
    text = json.dumps(index, sort_keys=True, separators=(",", ":")).encode()
    return blob + text + len(blob).to_bytes(8, "little") + len(text).to_bytes(8, "little") + HEADS_MAGIC


def unpack_heads(data: bytes) -> dict[str, Head]:
    """The heads :func:`pack_heads` appended to ``data``; none when it carries none."""
    if not data.endswith(HEADS_MAGIC):
        return {}
    blob_length, text_length = int.from_bytes(data[-24:-16], "little"), int.from_bytes(data[-16:-8], "little")
    index = json.loads(data[-24 - text_length : -24])
    start = len(data) - 24 - text_length - blob_length
    return {k: (etag, size, data[start + o : start + o + n]) for k, (etag, size, o, n) in index.items()}


def _stitched(stage: Stage, j: int, node_levels: dict, block: int) -> tiff.OutputDirectory:
    """Level ``j`` of a stage: its nodes' level ``j`` side by side."""
    if stage.rows == stage.cols == 1:
        width, height = node_levels[(0, 0)][j - 1][0].width, node_levels[(0, 0)][j - 1][0].height
    else:
        width, height = stage.width >> j, stage.height >> j
    reference_image, reference_mask = node_levels[(0, 0)][j - 1]

    def directory(which: int, reference: tiff.Directory, subfile: int) -> tiff.OutputDirectory:
        blocks = []
        for by in range(-(-height // block)):
            for bx in range(-(-width // block)):
                r, c, ly, lx = node_blocks(stage, j, by, bx)
                d = node_levels[(r, c)][j - 1][which]
                index = ly * d.blocks_across + lx
                key = jobs.level_row_key(stage.level, r, c)
                blocks.append(tiff.BlockRef(key, d.block_offsets[index], d.block_byte_counts[index]))
        tags = tiff.copyable_tags(reference, width=width, height=height, subfile_type=subfile)
        return tiff.OutputDirectory(tags=tags, blocks=blocks, width=width, height=height)

    image = directory(0, reference_image, tiff.SUBFILE_REDUCED)
    if reference_mask is not None:
        image.mask = directory(1, reference_mask, tiff.SUBFILE_REDUCED | tiff.SUBFILE_MASK)
    return image


__all__ = ["BytesSource", "Intermediates", "level_rows", "read_intermediates", "reduce_node", "stitched_levels"]
