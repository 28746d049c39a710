"""The window plan: a pure function of scene size and window size, tested as properties."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tilecommit.errors import BadInputError
from tilecommit.grid import Window, plan_windows, window_for_id

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def scenes(draw, max_side=5000):
    """(width, height, size) with a bounded number of windows, so a plan stays cheap."""
    width = draw(st.integers(1, max_side))
    height = draw(st.integers(1, max_side))
    smallest = max(1, -(-max(width, height) // 50))  # at most 50 x 50 windows
    size = draw(
        st.one_of(
            st.integers(smallest, max(smallest, 2 * max(width, height))), st.sampled_from([256, 512, 1024])
        ).filter(lambda s: s >= smallest)
    )
    return width, height, size


def _runs(windows, offset, length):
    return sorted({(getattr(w, offset), getattr(w, length)) for w in windows})


@PROPS
@given(scene=scenes())
@example(scene=(10240, 10240, 1024))
@example(scene=(10241, 10239, 1024))
@example(scene=(1, 1, 1024))
@example(scene=(1024, 1, 1024))
@example(scene=(2500, 1, 1))
def test_windows_cover_the_scene_exactly_once(scene):
    width, height, size = scene
    plan = plan_windows(width, height, size)
    # Rows (and columns) of the grid: contiguous runs from 0 to the edge, no gap, no overlap.
    for offset, length, extent in (("row_off", "height", height), ("col_off", "width", width)):
        runs = _runs(plan, offset, length)
        assert runs[0][0] == 0
        for (off_a, len_a), (off_b, _) in itertools.pairwise(runs):
            assert off_a + len_a == off_b
        assert runs[-1][0] + runs[-1][1] == extent
    rows, cols = len(_runs(plan, "row_off", "height")), len(_runs(plan, "col_off", "width"))
    # Every (row run, column run) pair exactly once, and the areas add up to the scene.
    assert len(plan) == rows * cols
    assert len({(w.row_off, w.col_off) for w in plan}) == len(plan)
    assert sum(w.width * w.height for w in plan) == width * height


@PROPS
@given(scene=scenes(max_side=400))
def test_every_pixel_is_in_exactly_one_window(scene):
    width, height, size = scene
    hits = np.zeros((height, width), dtype=np.uint16)
    for w in plan_windows(width, height, size):
        assert w.row_off >= 0 and w.col_off >= 0 and w.height > 0 and w.width > 0
        assert w.row_off + w.height <= height and w.col_off + w.width <= width
        hits[w.row_off : w.row_off + w.height, w.col_off : w.col_off + w.width] += 1
    assert hits.min() == 1 and hits.max() == 1


@PROPS
@given(scene=scenes())
def test_windows_are_full_size_except_at_the_far_edges(scene):
    width, height, size = scene
    plan = plan_windows(width, height, size)
    for w in plan:
        assert w.height == (size if w.row_off + size <= height else height - w.row_off)
        assert w.width == (size if w.col_off + size <= width else width - w.col_off)
        assert w.row_off == w.row * size and w.col_off == w.col * size
        if w.height < size:  # only the last row of windows is short, and only when size does not divide
            assert w.row_off + w.height == height and height % size
        if w.width < size:
            assert w.col_off + w.width == width and width % size
    assert plan == sorted(plan, key=lambda w: (w.row, w.col)), "row-major order"


@PROPS
@given(scene=scenes())
def test_window_ids_are_unique_and_window_for_id_agrees_with_the_plan(scene):
    width, height, size = scene
    plan = plan_windows(width, height, size)
    ids = [w.id for w in plan]
    assert len(set(ids)) == len(ids)
    for w in plan:
        assert w.id == f"{w.row:04d}_{w.col:04d}"
        assert window_for_id(w.id, width, height, size) == w
        assert Window.from_dict(w.to_dict()) == w
    assert plan_windows(width, height, size) == plan  # pure: same inputs, same plan


@PROPS
@given(scene=scenes(), row=st.integers(0, 200), col=st.integers(0, 200))
def test_window_for_id_outside_the_plan_is_bad_input(scene, row, col):
    width, height, size = scene
    inside = row * size < height and col * size < width
    window_id = f"{row:04d}_{col:04d}"
    if inside:
        assert window_for_id(window_id, width, height, size) in plan_windows(width, height, size)
    else:
        with pytest.raises(BadInputError):
            window_for_id(window_id, width, height, size)


@pytest.mark.parametrize(
    "window_id",
    [
        "",
        "1_2",
        "0001-0002",
        "0001_0002.tif",
        "-001_0002",
        "abcd_efgh",
        "0001_0002\n",
        "\u0660\u0660\u0660\u0661_\u0660\u0660\u0660\u0662",
        None,
        12,
    ],
)
def test_window_for_id_refuses_malformed_ids(window_id):
    with pytest.raises(BadInputError):
        window_for_id(window_id, 4096, 4096, 1024)


@pytest.mark.parametrize(
    "width, height, size", [(0, 10, 256), (10, 0, 256), (-1, 10, 256), (10, 10, 0), (10, 10, -256)]
)
def test_plan_windows_refuses_empty_scenes_and_sizes(width, height, size):
    with pytest.raises(BadInputError):
        plan_windows(width, height, size)
