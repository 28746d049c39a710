"""Blocks as arrays: the writer's layout and order and the copy plan, found with numpy, are what
placing one block at a time makes (the oracle below is that per-block walk, written out)."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest

from tilecommit.errors import InvalidRasterError, MosaicCheckError
from tilecommit.raster import tiff
from tilecommit.raster.assembly.copy_plan import CopyRange, LocalRun, plan_copy
from tilecommit.raster.tiff_blocks import BlockArray, BlockOrder, BlockRef, concatenated


def test_a_block_array_reads_as_the_blocks_it_was_made_of():
    refs = [BlockRef("a", 10, 5), BlockRef("b", 0, 0), BlockRef("a", 15, 7)]
    array = BlockArray.of(refs)
    assert array.keys == ("a", "b") and array.source.tolist() == [0, 1, 0]
    assert len(array) == 3 and list(array) == refs and array[2] == refs[2] and array == refs
    assert BlockArray.of(array) is array
    assert list(array[1:]) == refs[1:] and list(array[np.array([2, 0])]) == [refs[2], refs[0]]
    merged = concatenated([array, BlockArray.of([BlockRef("c", 1, 2), BlockRef("a", 3, 4)])])
    assert merged.keys == ("a", "b", "c") and list(merged) == [*refs, BlockRef("c", 1, 2), BlockRef("a", 3, 4)]
    with pytest.raises(ValueError, match="one length"):
        BlockArray(("a",), [0, 0], [1], [1])


def _oracle(writer: tiff.TiffWriter, directories, head: bytes, max_range_bytes: int, local_sources: frozenset):
    """The copy plan as it was found before blocks were arrays: one block at a time."""
    lead, trail = (4 if writer.leaders else 0), (4 if writer.trailers else 0)
    position = len(head)
    order = []
    for d in reversed(directories):
        parts = [p for p in (d, d.mask) if p is not None]
        for i in range(len(d.blocks)):
            for part in parts:
                block = part.blocks[i]
                if block.length:
                    order.append((block, position + lead))
                    position += lead + block.length + trail
    pieces = [LocalRun(data=head, nbytes=len(head))]
    for ref, _ in order:
        framed, last = lead + ref.length + trail, pieces[-1]
        if ref.source in local_sources:
            if isinstance(last, LocalRun):
                last.blocks.append(ref)
                last.nbytes += framed
            else:
                pieces.append(LocalRun(blocks=[ref], nbytes=framed))
            continue
        start = ref.offset - lead
        contiguous = isinstance(last, CopyRange) and last.source == ref.source and last.offset + last.length == start
        if contiguous and last.length + framed <= max_range_bytes:
            last.length += framed
        else:
            pieces.append(CopyRange(str(ref.source), start, framed))
    return order, pieces, position


def _directories(rng: random.Random, masked: bool) -> list[tiff.OutputDirectory]:
    """A pyramid whose blocks come from tiles laid out block row by block row (so neighbours
    are often contiguous), sparse blocks and local coarse blocks among them."""
    tiles = {f"t{i}": 0 for i in range(4)}

    def blocks(n: int, local: bool) -> list[BlockRef]:
        out = []
        for _ in range(n):
            if rng.random() < 0.1:
                out.append(BlockRef("t0", 0, 0))  # sparse
                continue
            # Mostly one tile's consecutive blocks; some from others, a few local among them.
            key = "coarse" if local or rng.random() < 0.03 else rng.choice(list(tiles)) if rng.random() < 0.3 else "t1"
            length = rng.randint(1, 900)
            offset = tiles.get(key, 0) + 4 if key != "coarse" else rng.randint(0, 10_000)
            if key != "coarse":
                tiles[key] = offset + length + 4 if rng.random() < 0.85 else offset + length + 40
            out.append(BlockRef(key, offset, length))
        return out

    directories = []
    for level, n in enumerate((24, 8, 4, 1)):
        local = level >= 2
        d = tiff.OutputDirectory(tags={}, blocks=blocks(n, local), width=256 * n, height=256)
        if masked:
            d.mask = tiff.OutputDirectory(tags={}, blocks=blocks(n, local), width=256 * n, height=256)
        directories.append(d)
    return directories


@pytest.mark.parametrize("seed", range(12))
def test_the_order_and_copy_plan_are_what_placing_one_block_at_a_time_makes(seed):
    rng = random.Random(seed)
    writer = tiff.TiffWriter("<", ghost=b"", leaders=seed % 2 == 0, trailers=seed % 3 != 0)
    directories = _directories(rng, masked=seed % 4 < 2)
    as_arrays = [
        tiff.OutputDirectory(
            tags={},
            blocks=BlockArray.of(d.blocks),
            width=d.width,
            height=d.height,
            mask=tiff.OutputDirectory(tags={}, blocks=BlockArray.of(d.mask.blocks), width=d.width, height=d.height)
            if d.mask is not None
            else None,
        )
        for d in directories
    ]
    max_range = rng.choice([600, 2000, 10**9])
    head, order, total = writer.block_order(directories)
    head_of_arrays, order_of_arrays, total_of_arrays = writer.block_order(as_arrays)
    assert (head_of_arrays, list(order_of_arrays), total_of_arrays) == (head, list(order), total)
    expected_order, expected_pieces, end = _oracle(writer, directories, head, max_range, frozenset({"coarse"}))
    assert list(order) == expected_order and total == end
    plan = plan_copy(head, order, total, leaders=writer.leaders, trailers=writer.trailers, max_range_bytes=max_range)
    assert plan.pieces == expected_pieces
    assert sum(p.length for p in plan.ranges) + plan.local_bytes == total


def test_a_copy_plan_refuses_blocks_that_do_not_follow_each_other():
    writer = tiff.TiffWriter("<", leaders=True, trailers=True)
    directory = tiff.OutputDirectory(
        tags={}, blocks=[BlockRef("t", 4, 10), BlockRef("t", 22, 10)], width=512, height=256
    )
    head, order, total = writer.block_order([directory])
    moved = BlockOrder(order.blocks, order.data_offset + np.array([0, 2]))
    with pytest.raises(MosaicCheckError, match=rf"block of 't' planned at {order.data_offset[1] + 2}, the file is at"):
        plan_copy(head, moved, total, leaders=True, trailers=True)
    with pytest.raises(MosaicCheckError, match="the planned blocks end at"):
        plan_copy(head, order, total + 1, leaders=True, trailers=True)
    plan = plan_copy(head, order, total, leaders=True, trailers=True)
    assert [(p.source, p.offset, p.length) for p in plan.ranges] == [("t", 0, 36)]


def test_a_block_array_value_too_large_for_its_tag_type_is_refused_not_wrapped():
    assert tiff.pack_tag(tiff.TILE_OFFSETS, tiff.TYPE_LONG, np.array([1, 2**32 - 1]), "<").data == struct.pack(
        "<2I", 1, 2**32 - 1
    )
    with pytest.raises(InvalidRasterError, match="does not fit"):
        tiff.pack_tag(tiff.TILE_OFFSETS, tiff.TYPE_LONG, np.array([2**32]), "<")
    with pytest.raises(InvalidRasterError, match="does not fit"):
        tiff.pack_tag(tiff.TILE_BYTE_COUNTS, tiff.TYPE_LONG, np.array([-1]), ">")
