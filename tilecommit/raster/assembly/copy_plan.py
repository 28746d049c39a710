"""Which staged blocks make the mosaic blob when the storage service copies the tiles' bytes itself.

Pure: from the writer's block order (:meth:`tiff.TiffWriter.block_order`) to a list of pieces in
file order, each one staged block of the output blob:

- :class:`CopyRange`: a byte range of one tile blob, staged by the service (Put Block From URL).
  A block's leader and trailer are copied with it: the tiles frame their blocks as the mosaic
  does (checked when the layout is prepared), so the 4 bytes before a block in the tile are its
  leader and the 4 after it its trailer. Consecutive blocks that are also consecutive in one
  tile (a tile's block row, masks interleaved) become one range.
- :class:`LocalRun`: bytes this process supplies (the head: header, ghost area, directories;
  and the computed coarse levels), cut into blocks of at most ``local_block_bytes``.

The service commits at most :data:`MAX_COMMITTED_BLOCKS` blocks a blob; :func:`plan_copy`
refuses a plan above that before anything is staged.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from ...errors import MosaicCheckError
from .. import tiff

#: Blocks one blob may commit (Azure Blob Storage's limit for block blobs).
MAX_COMMITTED_BLOCKS = 50_000
#: Largest range one Put Block From URL stages here. The service allows 4000 MiB a block; a
#: tile's block row is a few MiB, so this only bounds one request's duration.
MAX_RANGE_BYTES = 256 * 1024 * 1024
#: Local bytes (head, coarse levels) staged per Put Block.
LOCAL_BLOCK_BYTES = 8 * 1024 * 1024


@dataclass
class CopyRange:
    """``length`` bytes of the tile ``source`` (a window id) from ``offset``."""

    source: str
    offset: int
    length: int


@dataclass
class LocalRun:
    """Bytes from this process: literal ``data`` first, then ``blocks`` (each framed) read locally."""

    data: bytes = b""
    blocks: list[tiff.BlockRef] = field(default_factory=list)
    nbytes: int = 0


@dataclass
class CopyPlan:
    pieces: list[CopyRange | LocalRun]
    total: int
    head: bytes

    @property
    def ranges(self) -> list[CopyRange]:
        """The copied ranges in file order: their index in this list is their block index."""
        return [p for p in self.pieces if isinstance(p, CopyRange)]

    @property
    def copied_bytes(self) -> int:
        return sum(p.length for p in self.pieces if isinstance(p, CopyRange))

    @property
    def local_bytes(self) -> int:
        return sum(p.nbytes for p in self.pieces if isinstance(p, LocalRun))

    def staged_blocks(self, local_block_bytes: int = LOCAL_BLOCK_BYTES) -> int:
        return sum(1 if isinstance(p, CopyRange) else -(-p.nbytes // local_block_bytes) for p in self.pieces)

    def digest(self, contents: dict[str, str]) -> str:
        """A sha256 naming this mosaic's content without reading it: the head, the local blocks'
        places, and each range with the sha256 of the tile it comes from (the manifest row's).

        It is the evidence the create-only commit stores and compares: two attempts over tiles of
        the same bytes plan the same mosaic, whatever versions of them storage holds (a run after
        the tiles were purged writes new ones). It is not the file's sha256, which no one computes.
        """
        digest = hashlib.sha256(self.head)
        for piece in self.pieces:
            if isinstance(piece, CopyRange):
                text = f"range {piece.source} {contents.get(piece.source, '')} {piece.offset} {piece.length}\n"
            else:
                text = f"local {len(piece.data)} " + " ".join(f"{b.offset}+{b.length}" for b in piece.blocks) + "\n"
            digest.update(text.encode())
        return digest.hexdigest()


def plan_copy(
    head: bytes,
    order: tiff.BlockOrder,
    total: int,
    *,
    leaders: bool,
    trailers: bool,
    local_sources: frozenset = frozenset({"coarse"}),
    max_range_bytes: int = MAX_RANGE_BYTES,
    local_block_bytes: int = LOCAL_BLOCK_BYTES,
) -> CopyPlan:
    """The staged blocks of a file laid out as ``head`` then the framed blocks of ``order``.

    Raises :class:`MosaicCheckError` when the blocks do not follow each other without gaps (the
    writer's plan and this one disagree) or when the plan needs more blocks than a blob commits.
    Found with numpy over the block arrays: one Python step a piece, not a block.
    """
    lead, trail = (4 if leaders else 0), (4 if trailers else 0)
    blocks = order.blocks
    framed = lead + blocks.length + trail
    starts = len(head) + np.cumsum(framed) - framed  # where each framed block is in the file
    wrong = np.flatnonzero(order.data_offset - lead != starts)
    if wrong.size:
        i = int(wrong[0])
        raise MosaicCheckError(
            f"block of {blocks.keys[blocks.source[i]]!r} planned at {order.data_offset[i]}, "
            f"the file is at {starts[i] + lead}"
        )
    position = len(head) + int(framed.sum())
    if position != total:
        raise MosaicCheckError(f"the planned blocks end at {position}, the file's planned size is {total}")
    local = np.isin(blocks.source, [i for i, key in enumerate(blocks.keys) if key in local_sources])
    copied_from = blocks.offset - lead  # a copied block's place in its tile, leader included
    # A block continues the piece before it when both are local (the head is one), or both are
    # copied from consecutive bytes of one tile.
    continues = np.empty(len(blocks), dtype=bool)
    continues[:1] = local[:1]
    continues[1:] = (local[1:] & local[:-1]) | (
        ~local[1:]
        & ~local[:-1]
        & (blocks.source[1:] == blocks.source[:-1])
        & (copied_from[1:] == copied_from[:-1] + framed[:-1])
    )
    head_run = LocalRun(data=head, nbytes=len(head))
    pieces: list[CopyRange | LocalRun] = [head_run]
    firsts = np.flatnonzero(~continues)
    if continues[:1].any():  # local blocks right after the head join its run
        _extend_local(head_run, blocks, framed, 0, int(firsts[0]) if firsts.size else len(blocks))
    if firsts.size:
        lasts = [*firsts[1:].tolist(), len(blocks)]
        lengths = np.add.reduceat(framed, firsts).tolist()
        runs = zip(
            firsts.tolist(),
            lasts,
            local[firsts].tolist(),
            blocks.source[firsts].tolist(),
            copied_from[firsts].tolist(),
            lengths,
            strict=True,
        )
        for a, b, is_local, source, start, length in runs:
            if is_local:
                pieces.append(_extend_local(LocalRun(), blocks, framed, a, b))
            elif length <= max_range_bytes:
                pieces.append(CopyRange(str(blocks.keys[source]), start, length))
            else:
                pieces.extend(_split(str(blocks.keys[source]), start, framed[a:b], max_range_bytes))
    plan = CopyPlan(pieces=pieces, total=total, head=head)
    staged = plan.staged_blocks(local_block_bytes)
    if staged > MAX_COMMITTED_BLOCKS:
        raise MosaicCheckError(
            f"the mosaic would be {staged} staged blocks, more than the {MAX_COMMITTED_BLOCKS} a blob commits"
        )
    return plan


def _extend_local(run: LocalRun, blocks: tiff.BlockArray, framed: np.ndarray, a: int, b: int) -> LocalRun:
    run.blocks.extend(blocks[a:b])
    run.nbytes += int(framed[a:b].sum())
    return run


def _split(source: str, start: int, framed: np.ndarray, max_range_bytes: int) -> list[CopyRange]:
    """Consecutive blocks of one tile as ranges of at most ``max_range_bytes`` (a block larger
    than that is a range of its own), filled in order."""
    ranges = [CopyRange(source, start, 0)]
    for length in framed.tolist():
        last = ranges[-1]
        if last.length and last.length + length > max_range_bytes:
            ranges.append(CopyRange(source, last.offset + last.length, length))
        else:
            last.length += length
    return ranges


def cut_shares(ranges: list[CopyRange], share_bytes: int, max_shares: int) -> list[tuple[int, int]]:
    """Contiguous shares ``[start, stop)`` of ``ranges`` in order, each copying at most
    ``share_bytes`` (a range larger than that is a share of its own). When that makes more than
    ``max_shares``, the share size is doubled until it does not: the job's history stays bounded."""
    if share_bytes <= 0 or max_shares <= 0:
        raise ValueError("share_bytes and max_shares must be positive")
    while True:
        shares: list[tuple[int, int]] = []
        start, filled = 0, 0
        for index, piece in enumerate(ranges):
            if index > start and filled + piece.length > share_bytes:
                shares.append((start, index))
                start, filled = index, 0
            filled += piece.length
        if start < len(ranges):
            shares.append((start, len(ranges)))
        if len(shares) <= max_shares:
            return shares
        share_bytes *= 2


__all__ = ["MAX_COMMITTED_BLOCKS", "CopyPlan", "CopyRange", "LocalRun", "cut_shares", "plan_copy"]
