"""A directory's blocks as arrays: where each block's bytes come from, one numpy array a field.

A mosaic's layout names every block of every level: 25,600 at full resolution for a 40960²
scene in 256-pixel blocks, 102,400 at 81920². As one Python object a block, placing them, laying
them out and finding the copy ranges cost a few microseconds a block at each step (0.3 s at
40960²), which made the commit step grow with the scene's area; as arrays,
:class:`~.tiff.TiffWriter` places them and :func:`~.assembly.copy_plan.plan_copy` cuts its ranges
with numpy. A block is still seen as a :class:`BlockRef` wherever one is taken out
(``blocks[i]``, iteration), so code that handles a few blocks at a time (the fetcher, the
writer's ``write``) reads the same either way.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Sequence
from typing import NamedTuple, overload

import numpy as np


class BlockRef(NamedTuple):
    """Where one compressed block's bytes come from: a source (by key), an offset and a length."""

    source: Hashable
    offset: int
    length: int


class BlockArray(Sequence[BlockRef]):
    """Blocks in block-index order: block ``i`` is ``length[i]`` bytes of ``keys[source[i]]`` from
    ``offset[i]`` (a length of 0: a sparse block, which has no bytes)."""

    __slots__ = ("keys", "length", "offset", "source")

    def __init__(self, keys: Sequence[Hashable], source, offset, length):
        self.keys = tuple(keys)
        self.source = np.asarray(source, dtype=np.int64)
        self.offset = np.asarray(offset, dtype=np.int64)
        self.length = np.asarray(length, dtype=np.int64)
        if not (self.source.shape == self.offset.shape == self.length.shape) or self.source.ndim != 1:
            raise ValueError("a block array's source, offset and length must be one-dimensional and of one length")

    @classmethod
    def of(cls, blocks: Iterable[BlockRef]) -> BlockArray:
        """``blocks`` as an array (itself, when it is one)."""
        if isinstance(blocks, BlockArray):
            return blocks
        refs = list(blocks)
        index: dict[Hashable, int] = {}
        source = [index.setdefault(ref.source, len(index)) for ref in refs]
        return cls(list(index), source, [ref.offset for ref in refs], [ref.length for ref in refs])

    def __len__(self) -> int:
        return len(self.source)

    @overload
    def __getitem__(self, index: int) -> BlockRef: ...
    @overload
    def __getitem__(self, index: slice | np.ndarray) -> BlockArray: ...
    def __getitem__(self, index):
        if isinstance(index, slice | np.ndarray):  # a slice, or numpy's indices or mask: an array
            return BlockArray(self.keys, self.source[index], self.offset[index], self.length[index])
        return BlockRef(self.keys[self.source[index]], int(self.offset[index]), int(self.length[index]))

    def __iter__(self) -> Iterator[BlockRef]:
        keys = self.keys
        for s, o, n in zip(self.source.tolist(), self.offset.tolist(), self.length.tolist(), strict=True):
            yield BlockRef(keys[s], o, n)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"BlockArray({len(self)} blocks of {len(self.keys)} sources)"


def block_lengths(blocks: Iterable[BlockRef]) -> np.ndarray:
    """The blocks' lengths, as an array."""
    return BlockArray.of(blocks).length


def concatenated(arrays: Sequence[BlockArray]) -> BlockArray:
    """The blocks of ``arrays`` one after the other, their keys merged."""
    index: dict[Hashable, int] = {}
    sources = []
    for array in arrays:
        remap = np.array([index.setdefault(key, len(index)) for key in array.keys], dtype=np.int64)
        sources.append(remap[array.source])
    if not arrays:
        return BlockArray((), [], [], [])
    return BlockArray(
        list(index),
        np.concatenate(sources),
        np.concatenate([a.offset for a in arrays]),
        np.concatenate([a.length for a in arrays]),
    )


class BlockOrder:
    """Every non-empty block of a planned file in file order, and the offset in the file of its
    data (after its leader, when blocks have one). Iterating gives ``(BlockRef, data offset)``."""

    __slots__ = ("blocks", "data_offset")

    def __init__(self, blocks: BlockArray, data_offset):
        self.blocks = blocks
        self.data_offset = np.asarray(data_offset, dtype=np.int64)
        if self.data_offset.shape != blocks.source.shape:
            raise ValueError("a block order needs one data offset a block")

    def __len__(self) -> int:
        return len(self.blocks)

    def __iter__(self) -> Iterator[tuple[BlockRef, int]]:
        return zip(self.blocks, self.data_offset.tolist(), strict=True)


__all__ = ["BlockArray", "BlockOrder", "BlockRef", "block_lengths", "concatenated"]
