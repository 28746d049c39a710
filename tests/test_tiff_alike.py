"""Tile heads parsed in groups alike: each member's block arrays are its own, a head that differs
where the parse could is never taken for another, and the mosaic's levels planned from groups
are those planned from every head parsed alone."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import rasterio

from testkit.scenes import SceneSpec, write_scene
from tilecommit.grid import plan_windows
from tilecommit.raster import tiff, tiff_alike
from tilecommit.raster.assembly.block_sources import TILE_HEAD_BYTES
from tilecommit.raster.assembly.pyramid import TileHead, TileHeads, plan_tile_levels
from tilecommit.raster.tiff_alike import VARIABLE, _fixed_bytes, read_alike
from tilecommit.raster.tiling.encode import encode_tile
from tilecommit.spec import OutputSpec

SPEC = OutputSpec(window_size=1024)


@pytest.fixture(scope="module")
def tiles(tmp_path_factory):
    """(windows, each tile's whole body) of a 2600² scene in 1024-pixel windows: four interior
    tiles, two on the right edge, two on the bottom edge, the corner; each with its own origin."""
    path = write_scene(str(tmp_path_factory.mktemp("alike") / "scene.tif"), SceneSpec(2600, 2600, nodata=0))
    windows = plan_windows(2600, 2600, 1024)
    with rasterio.open(path) as src:
        return windows, [encode_tile(src, w, spec=SPEC)[0] for w in windows]


def _heads(bodies: list[bytes]) -> list[bytes]:
    return [body[:TILE_HEAD_BYTES] for body in bodies]


def _assert_members_parse_as_alone(groups, heads):
    assert sorted(int(m) for g in groups for m in g.members) == list(range(len(heads)))
    for group in groups:
        for row, m in enumerate(group.members.tolist()):
            alone = tiff.read_layout(heads[m], None)
            assert len(alone.directories) == len(group.layout.directories)
            for d, (own, template) in enumerate(zip(alone.directories, group.layout.directories, strict=True)):
                assert group.offsets[d][row].tolist() == list(own.block_offsets)
                assert group.byte_counts[d][row].tolist() == list(own.block_byte_counts)
                fixed = {c: (t.type, t.count, t.data) for c, t in own.tags.items() if c not in VARIABLE}
                assert fixed == {c: (t.type, t.count, t.data) for c, t in template.tags.items() if c not in VARIABLE}


def test_tiles_of_one_shape_are_one_group_each_with_its_own_block_arrays(tiles):
    windows, bodies = tiles
    heads = _heads(bodies)
    groups = read_alike(heads, lambda i: None)
    assert groups[0].members[0] == 0
    assert sorted(len(g.members) for g in groups) == [1, 2, 2, 4]
    _assert_members_parse_as_alone(groups, heads)
    interior = max(groups, key=lambda g: len(g.members))
    tiepoints = {tiff.read_layout(heads[m], None).directories[0].tags[33922].data for m in interior.members.tolist()}
    offsets = {g.offsets[0][row].tobytes() for g in groups for row in range(len(g.members))}
    assert len(tiepoints) == 4 and len(offsets) == len(heads)  # georeferencing and block arrays differ


def _with_value(head: bytes, code: int, value: int) -> bytes:
    """``head`` with tag ``code`` of its first directory set to ``value`` (a SHORT, in place)."""
    tag = tiff.read_layout(head, None).directories[0].tags[code]
    return head[: tag.position] + value.to_bytes(2, "little") + head[tag.position + 2 :]


def test_a_head_that_differs_where_the_parse_could_is_parsed_on_its_own(tiles):
    _, bodies = tiles
    heads = _heads(bodies)
    heads[4] = _with_value(heads[4], tiff.COMPRESSION, 5)  # an interior tile said to be LZW
    groups = read_alike(heads, lambda i: None)
    (alone,) = [g for g in groups if 4 in g.members.tolist()]
    assert alone.members.tolist() == [4] and alone.layout.directories[0].value(tiff.COMPRESSION) == 5
    assert sorted(len(g.members) for g in groups) == [1, 1, 2, 2, 3]
    _assert_members_parse_as_alone(groups, heads)


def test_heads_all_different_are_each_parsed_whole_past_the_groups_tried(tiles, monkeypatch):
    _, bodies = tiles
    heads = [_with_value(h, tiff.PREDICTOR, 1 + i) for i, h in enumerate(_heads(bodies))]
    monkeypatch.setattr(tiff_alike, "MAX_TEMPLATES", 3)
    groups = read_alike(heads, lambda i: None)
    assert [g.members.tolist() for g in groups] == [[i] for i in range(len(heads))]
    _assert_members_parse_as_alone(groups, heads)


def test_a_head_whose_directories_lie_beyond_it_is_read_through_its_source(tiles):
    _, bodies = tiles
    heads = _heads(bodies)
    heads[1] = bodies[1][:100]
    reads = []

    def read_for(i):
        def read(offset, length):
            reads.append(i)
            return bodies[i][offset : offset + length]

        return read

    groups = read_alike(heads, read_for)
    (alone,) = [g for g in groups if 1 in g.members.tolist()]
    assert alone.members.tolist() == [1] and set(reads) == {1}
    _assert_members_parse_as_alone(groups, [*heads[:1], bodies[1], *heads[2:]])


def test_a_variable_value_overlapping_a_directory_leads_no_group(tiles):
    _, bodies = tiles
    head = bodies[0][:TILE_HEAD_BYTES]
    layout = tiff.read_layout(head, None)
    assert _fixed_bytes(layout, head) is not None
    first = layout.directories[0]
    tiepoint = first.tags[33922]
    moved = dataclasses.replace(tiepoint, position=first.offset + 2)  # as if its values lay over the entries
    layout.directories[0] = dataclasses.replace(first, tags={**first.tags, 33922: moved})
    assert _fixed_bytes(layout, head) is None


def test_block_arrays_that_are_not_integers_lead_no_group(tiles):
    _, bodies = tiles
    head = bodies[0][:TILE_HEAD_BYTES]
    layout = tiff.read_layout(head, None)
    first = layout.directories[0]
    counts = first.tags[tiff.TILE_BYTE_COUNTS]
    rational = dataclasses.replace(counts, type=5, count=counts.count // 2)  # RATIONAL, same bytes: two LONGs a value
    layout.directories[0] = dataclasses.replace(first, tags={**first.tags, tiff.TILE_BYTE_COUNTS: rational})
    assert _fixed_bytes(layout, head) is None


def test_the_levels_planned_from_groups_are_those_planned_from_each_head(tiles):
    windows, bodies = tiles
    heads = _heads(bodies)
    keys = [w.id for w in windows]
    grouped = plan_tile_levels(None, TileHeads(windows, keys, read_alike(heads, lambda i: None)), SPEC)
    each = [TileHead(w, w.id, tiff.read_layout(h, None)) for w, h in zip(windows, heads, strict=True)]
    alone = plan_tile_levels(None, TileHeads.of(each), SPEC)
    assert len(grouped) == len(alone) == 3
    for g, a in zip(grouped, alone, strict=True):
        assert (g.width, g.height, g.tags) == (a.width, a.height, a.tags)
        assert list(g.blocks) == list(a.blocks) and len(set(np.asarray(g.blocks.source).tolist())) == len(windows)
