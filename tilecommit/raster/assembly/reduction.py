"""The plan of the mosaic's coarse levels as a reduction tree (pure: sizes in, stages out).

The coarse levels (those below the last level the tiles carry, :mod:`.block_copy`) are computed
in stages. A stage reads one level of the pyramid in square regions of ``span`` x ``span``
blocks, one activity a region (a *node*), and each node computes the next ``levels`` levels of
its region with GDAL, as the single-instance commit computes them for the whole level
(:func:`.block_copy.build_coarse_levels`); its smallest level is one block, the block the next
stage reads. The last stage is one node that computes the remaining levels of the whole level,
exactly as the single-instance commit would from there.

Why the pixels are those of the single-instance commit: GDAL computes each overview level from
the one before it (cascading; for ``average`` and ``nearest`` alike, checked on 3.10 in
tests/test_level_tree.py), and at an exact factor of two every output pixel depends only on the
2 x 2 input pixels under it. A stage is planned only where every level it computes halves a level
whose width and height are even, so that each node's region starts on an even pixel of each of
its levels and a node computes exactly the pixels the whole level would give there. Where a level
is odd (GDAL then stretches a pixel's footprint over the whole row), the last stage takes it
whole. Lossy codecs are left to the single-instance commit: GDAL computes the next level from
the values it has just computed, not from their lossy encoding, which a node reads back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...grid import plan_windows
from ...records import Record
from ...spec import OutputSpec
from ..tiling.encode import tile_overview_count
from .pyramid import _tile_level_size, halve_ceil, levels_to_fit, mosaic_overview_levels


@dataclass(frozen=True)
class Stage(Record):
    """One stage: it reads level ``level`` (``width`` x ``height``) in regions of ``span`` blocks
    a side (``rows`` x ``cols`` nodes) and each node computes ``levels`` levels."""

    level: int
    width: int
    height: int
    span: int
    levels: int
    rows: int
    cols: int

    @property
    def nodes(self) -> list[tuple[int, int]]:
        return [(r, c) for r in range(self.rows) for c in range(self.cols)]


@dataclass(frozen=True)
class LevelTree(Record):
    """The stages in order; level ``first`` is the last one the tiles carry."""

    first: int
    block_size: int
    stages: list[Stage] = field(default_factory=list)

    JSON_IN = {"stages": lambda stages: [Stage.from_dict(s) for s in stages]}

    @property
    def levels(self) -> int:
        return sum(s.levels for s in self.stages)


def _twos(n: int) -> int:
    """How many times ``n`` halves exactly."""
    count = 0
    while n > 0 and n % 2 == 0:
        n //= 2
        count += 1
    return count


def tile_level_plan(width: int, height: int, spec: OutputSpec) -> tuple[int, int, int, int]:
    """(the last level the tiles carry, its width and height, the coarse levels below it), as
    :func:`.pyramid.plan_tile_levels` and :func:`.block_copy.prepare_block_copy` decide them."""
    block, web = spec.block_size, spec.choice.web_optimized
    total = mosaic_overview_levels(width, height, block, shorter_side=web)
    available = tile_overview_count(spec.window_size, block)
    if web:
        available = min(available, total)
    windows = plan_windows(width, height, spec.window_size)
    top = [w for w in windows if w.row == 0]
    left = [w for w in windows if w.col == 0]
    for k in range(available + 1):
        w = sum(_tile_level_size(x.width, k) for x in top)
        h = sum(_tile_level_size(x.height, k) for x in left)
        if w <= block and h <= block:
            break
    if web:
        return k, w, h, max(0, total - k)
    return k, w, h, (0 if w <= block and h <= block else levels_to_fit(w, h, halve_ceil, block))


def plan_level_tree(width: int, height: int, spec: OutputSpec, per_node: int | None) -> LevelTree | None:
    """The reduction tree of a ``width`` x ``height`` mosaic made to ``spec``, nodes of
    ``per_node`` levels; None when there is none to run in parallel (no coarse level, a lossy
    codec, ``per_node`` None or 0, or a first coarse level that is odd or fits one node): the
    commit then computes the coarse levels itself."""
    if not per_node or spec.choice.lossy or spec.window_size % spec.block_size:
        return None
    first, w, h, remaining = tile_level_plan(width, height, spec)
    block = spec.block_size
    stages: list[Stage] = []
    level = first
    while remaining > 0:
        region = block * 2**per_node
        levels = min(per_node, _twos(w), _twos(h), remaining)
        if (w <= region and h <= region) or levels == 0:
            span = max(-(-w // block), -(-h // block))
            stages.append(Stage(level, w, h, span, remaining, 1, 1))
            break
        span = 2**levels
        stages.append(Stage(level, w, h, span, levels, -(-h // (span * block)), -(-w // (span * block))))
        w, h, level, remaining = w >> levels, h >> levels, level + levels, remaining - levels
    if len(stages) < 2:
        return None
    return LevelTree(first, block, stages)


def node_region(stage: Stage, row: int, col: int, block: int) -> tuple[int, int, int, int]:
    """(first block column, first block row, width, height) of node (``row``, ``col``)'s region
    of the level its stage reads."""
    if stage.rows == stage.cols == 1:
        return 0, 0, stage.width, stage.height
    side = stage.span * block
    return col * stage.span, row * stage.span, min(side, stage.width - col * side), min(side, stage.height - row * side)


def node_blocks(stage: Stage, j: int, by: int, bx: int) -> tuple[int, int, int, int]:
    """Where block (``by``, ``bx``) of the ``j``-th level a stage computes (1-based) lies: the
    node (row, col) and the block (row, col) within that node's level."""
    if stage.rows == stage.cols == 1:
        return 0, 0, by, bx
    side = stage.span >> j
    return by // side, bx // side, by % side, bx % side


__all__ = ["LevelTree", "Stage", "node_blocks", "node_region", "plan_level_tree", "tile_level_plan"]
