"""The mosaic's coarse levels from a reduction tree's intermediates (:mod:`.reduction`,
:mod:`.level_nodes`): the commit's part.

:func:`read_carried_intermediates` reads the tree's last node whole, pinned to the ETag its
manifest row recorded: after its TIFF (:func:`pack_heads`) it carries the heads of every node and
tile below it, each node having carried up its children's (:mod:`.level_nodes`). The commit then
parses the intermediates' directories without reading them, and the storage service copies their
blocks into the mosaic as it copies the tiles', each range pinned to its row's ETag: no step of
the commit reads or stages the coarse levels' bytes. :func:`read_intermediates` is the form of
jobs started before (``Job.coarse_levels_copied`` unset): every intermediate read whole, its
blocks staged by this process. :func:`stitched_levels` lays their levels side by side, as the
tiles' levels are the tiles' blocks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from azure.data.tables import TableClient

from ... import jobs
from ...errors import IncompleteManifestError
from ...jobs import Job
from ...manifest import ManifestEntry, manifest_entry
from ...storage_answers import STORAGE_ERRORS, call_failed
from ...stores import JobStores
from .. import tiff
from .block_sources import TILE_HEAD_BYTES, BlobRangeSource, Head, read_heads
from .pyramid import tile_levels
from .reduction import LevelTree, Stage, node_blocks


class BytesSource:
    """Ranged reads of bytes held in memory (an intermediate read whole, pinned)."""

    def __init__(self, data: bytes, name: str):
        self.data, self.name = data, name

    def read(self, offset: int, length: int) -> bytes:
        return self.data[offset : offset + length]

    def __repr__(self) -> str:
        return f"blob:{self.name}"


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
    """Every intermediate of a tree as a source, pinned (its bytes read whole, or ranged reads of
    its blob), its layout, and the heads of the tiles the tree carries."""

    tree: LevelTree
    sources: Mapping[str, BytesSource | BlobRangeSource]
    layouts: dict[str, tiff.TiffLayout]
    heads: dict[str, Head]
    #: Each intermediate's manifest row: the blob and the ETag its source is pinned to.
    rows: dict[str, ManifestEntry]
    #: The contents (sha256 of the manifest rows) of the tiles the tree computed from, as its
    #: first stage read them; none for intermediates written before they were recorded.
    contents: dict[str, str]


def intermediate_rows(job: Job, stores: JobStores, tree: LevelTree) -> dict[str, ManifestEntry]:
    """The row of every intermediate of ``tree``, in stage order (one query). A missing row is
    :class:`IncompleteManifestError`: the job runs the tree again."""
    rows = level_rows(stores.manifest, job.job_id)
    wanted = [jobs.level_row_key(st.level, r, c) for st in tree.stages for r, c in st.nodes]
    missing = [k for k in wanted if k not in rows]
    if missing:
        raise IncompleteManifestError(
            f"job {job.job_id}: {len(missing)} coarse-level intermediates have no manifest row ({', '.join(missing[:10])}): "
            "run the job again to compute them",
            missing=missing,
        )
    return {k: rows[k] for k in wanted}


def read_carried_intermediates(
    job: Job, stores: JobStores, tree: LevelTree, executor: ThreadPoolExecutor
) -> Intermediates:
    """Every intermediate of ``tree`` as a pinned source the service copies from, with its
    parsed directories, and the tiles' heads, from the tree's last node read whole (pinned) and
    what it carries. A carried head is used only where it is of the version its row names now; any
    other (a node repaired after the node above it read it) is read here, pinned to its row, and
    a tile's head the last node does not carry, by :func:`.block_copy.read_tile_levels`."""
    entries = intermediate_rows(job, stores, tree)
    top = jobs.level_row_key(tree.stages[-1].level, 0, 0)
    last = entries[top]
    data = BlobRangeSource(stores.tiles, last.uri, last.nbytes, last.etag or "", top).read(0, last.nbytes)
    carried, contents = unpack_carried(data)
    carried[top] = (last.etag or "", last.nbytes, data[:TILE_HEAD_BYTES])
    sources, heads = read_heads(entries, stores.tiles, executor, known=carried)
    layouts = {k: tiff.read_layout(heads[k][2], sources[k].read) for k in entries}
    tile_heads = {k: head for k, head in carried.items() if not jobs.is_level_row_key(k)}
    return Intermediates(tree, sources, layouts, tile_heads, entries, contents)


def read_intermediates(job: Job, stores: JobStores, tree: LevelTree, executor: ThreadPoolExecutor) -> Intermediates:
    """Every intermediate of ``tree``, each read whole, pinned to its row's ETag (one query for
    the rows), its blocks to be staged by this process. A missing row is
    :class:`IncompleteManifestError`: the job runs the tree again."""
    entries = intermediate_rows(job, stores, tree)
    readers = {k: BlobRangeSource(stores.tiles, e.uri, e.nbytes, e.etag or "", k) for k, e in entries.items()}
    data = dict(zip(entries, executor.map(lambda k: readers[k].read(0, entries[k].nbytes), list(entries)), strict=True))
    sources = {k: BytesSource(data[k], entries[k].uri) for k in entries}
    layouts = {k: tiff.read_layout(data[k][:TILE_HEAD_BYTES], sources[k].read) for k in entries}
    heads: dict[str, Head] = {}
    contents: dict[str, str] = {}
    for r, c in tree.stages[0].nodes:
        node_heads, node_contents = unpack_carried(data[jobs.level_row_key(tree.stages[0].level, r, c)])
        heads.update(node_heads)
        contents.update(node_contents)
    return Intermediates(tree, sources, layouts, heads, entries, contents)


def check_tree_contents(intermediates: Intermediates, windows: list, summary, job_id: str) -> None:
    """Refuse intermediates computed from other contents of a tile than its manifest row names now
    (a tile repaired with other bytes after the tree ran): their coarse levels would keep the old
    pixels under a mosaic named by the new ones. A tile rewritten with the same bytes (another
    ETag, the same sha256) changes nothing and passes."""
    stale = [
        w.id
        for w in windows
        if intermediates.contents.get(w.id, summary.entries[w.id].sha256) != summary.entries[w.id].sha256
    ]
    if stale:
        raise IncompleteManifestError(
            f"job {job_id}: the coarse levels' intermediates were computed from other contents of {len(stale)} "
            f"tiles than their manifest rows name ({', '.join(stale[:10])}), repaired since: nothing was committed; "
            "run the job again, or its repair again (a repair of orchestration version 4.0 on runs the tree "
            "first), so that its reduction tree computes them anew",
            mismatched=stale,
        )


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


def pack_heads(heads: dict[str, Head], contents: Mapping[str, str] | None = None) -> bytes:
    """The heads as bytes to append to a TIFF: each head, a JSON index (window -> ETag, size,
    offset among the heads, length, and the sha256 its manifest row recorded where ``contents``
    has it), the heads' and the index's lengths (8 bytes each, little endian), :data:`HEADS_MAGIC`."""
    blob, index = bytearray(), {}  # appended in place: the last node packs every head of the tree
    contents = contents or {}
    for key in sorted(heads):
        etag, size, head = heads[key]
        index[key] = [etag, size, len(blob), len(head), *([contents[key]] if key in contents else [])]
        blob += head
    text = json.dumps(index, sort_keys=True, separators=(",", ":")).encode()
    return b"".join((blob, text, len(blob).to_bytes(8, "little"), len(text).to_bytes(8, "little"), HEADS_MAGIC))


def heads_length(data: bytes) -> int:
    """How many bytes at the end of ``data`` the heads :func:`pack_heads` appended take, their
    lengths and :data:`HEADS_MAGIC` included (read from its last 24 bytes); 0 when it carries none."""
    if not data.endswith(HEADS_MAGIC):
        return 0
    return 24 + int.from_bytes(data[-24:-16], "little") + int.from_bytes(data[-16:-8], "little")


def unpack_carried(data: bytes) -> tuple[dict[str, Head], dict[str, str]]:
    """The heads :func:`pack_heads` appended to ``data`` and the contents (sha256) recorded with
    them; none when it carries none (an intermediate written before carries no contents)."""
    if not data.endswith(HEADS_MAGIC):
        return {}, {}
    text_length = int.from_bytes(data[-16:-8], "little")
    index = json.loads(data[-24 - text_length : -24])
    start = len(data) - heads_length(data)
    heads = {k: (etag, size, data[start + o : start + o + n]) for k, (etag, size, o, n, *_) in index.items()}
    return heads, {k: entry[4] for k, entry in index.items() if len(entry) > 4}


def unpack_heads(data: bytes) -> dict[str, Head]:
    """The heads :func:`pack_heads` appended to ``data``; none when it carries none."""
    return unpack_carried(data)[0]


#: Bytes read first from the end of an intermediate for its heads: a first-stage node of 4 x 4
#: tiles carries 16 heads cut to their directories (1,152 bytes for a 1024² tile of 3 bands; 4
#: KiB leaves room for masks and more levels) and their index. Heads that take more (a node above
#: the first stage carries its whole region's) are read in a second request, exactly.
HEADS_TAIL_BYTES = 16 * 4 * 1024 + 16 * 1024


def carried_heads(job: Job, stores: JobStores, tree: LevelTree, executor: ThreadPoolExecutor) -> dict[str, Head]:
    """The tiles' heads the tree's first stage carries, read from the end of each of its
    intermediates (pinned to the ETag of its row), without their levels' blocks. A node whose row
    is missing gives none: its tiles' heads are then read one by one, as without a tree."""
    rows = level_rows(stores.manifest, job.job_id)
    first = tree.stages[0]
    entries = [rows[k] for k in (jobs.level_row_key(first.level, r, c) for r, c in first.nodes) if k in rows]
    heads: dict[str, Head] = {}
    for part in executor.map(
        lambda e: read_carried(BlobRangeSource(stores.tiles, e.uri, e.nbytes, e.etag or "", e.window))[0], entries
    ):
        heads.update(part)
    return heads


def read_carried(source: BlobRangeSource) -> tuple[dict[str, Head], dict[str, str]]:
    """The heads an intermediate carries and their contents (:func:`unpack_carried`), read from
    its end (``source`` pinned, of its row's size): :data:`HEADS_TAIL_BYTES` first, then exactly
    what they take when that is more (a node above the first stage carries its whole region's)."""
    nbytes = source.expected_size or 0
    tail = source.read(max(0, nbytes - HEADS_TAIL_BYTES), min(nbytes, HEADS_TAIL_BYTES))
    needed = heads_length(tail)
    if needed > len(tail):
        tail = source.read(nbytes - needed, needed)
    return unpack_carried(tail)


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


__all__ = [
    "BytesSource",
    "Intermediates",
    "carried_heads",
    "check_tree_contents",
    "heads_length",
    "intermediate_rows",
    "read_carried",
    "read_carried_intermediates",
    "level_rows",
    "pack_heads",
    "read_intermediates",
    "stitched_levels",
    "unpack_carried",
    "unpack_heads",
]
