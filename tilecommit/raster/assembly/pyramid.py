"""The mosaic's pyramid: how big each overview level is, whether a pyramid is complete, and
which of the tiles' own levels become the mosaic's (all pure: directories in, directories out).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ...errors import IncompatibleTilesError, UnsupportedRasterError
from ...grid import Window
from ...spec import OutputSpec
from .. import tiff
from ..env import BLOCK_SIZE
from ..reading.budgets import MAX_WINDOW_BYTES, TEMPORARY_DISK_BYTES, mib, window_bytes
from ..reading.scene import SceneInfo
from ..tiling.encode import tile_overview_count


def halve_floor(n: int) -> int:
    """How GDAL's COG driver sizes an overview: half, rounded down, at least 1 (999 -> 499)."""
    return max(1, n // 2)


def halve_ceil(n: int) -> int:
    """How GDAL sizes overviews it builds into an existing GeoTIFF: half, rounded up (999 -> 500)."""
    return -(-n // 2)


def levels_to_fit(width: int, height: int, halve=halve_floor, block_size: int = BLOCK_SIZE) -> int:
    """Overview levels until the image fits in one block: what a complete pyramid has."""
    levels = 0
    while width > block_size or height > block_size:
        width, height = halve(width), halve(height)
        levels += 1
    return levels


def mosaic_overview_levels(width: int, height: int, block_size: int = BLOCK_SIZE, *, shorter_side: bool = False) -> int:
    """Overview levels a complete mosaic of ``width`` x ``height`` has (COG driver's rounding).

    ``shorter_side``: the levels rio-cogeo 7.0.4 makes instead, for a web-optimized job's mosaic:
    halvings while the *shorter* side stays above one block (rasterio's
    ``get_maximum_overview_level``, which ``cog_translate`` calls), so an elongated grid gets
    fewer levels than a complete pyramid (docs/raster.md, "Web-optimized output").
    """
    if shorter_side:
        levels, factor = 0, 1
        while min(width // factor, height // factor) > block_size:
            factor *= 2
            levels += 1
        return levels
    return levels_to_fit(width, height, halve_floor, block_size)


def levels_of(scene: SceneInfo, spec: OutputSpec) -> int:
    """The overview levels the job's mosaic has: rio-cogeo's for a web-optimized job, else a complete pyramid."""
    return mosaic_overview_levels(scene.width, scene.height, spec.block_size, shorter_side=spec.choice.web_optimized)


def pyramid_problems(
    sizes: list[tuple[int, int]], block_size: int = BLOCK_SIZE, *, shorter_side: bool = False
) -> list[str]:
    """What is wrong with a pyramid (full resolution first): every level about half the previous
    one, the last fitting in one block and the one before it not (no level missing, none extra);
    ``shorter_side``: the last one's shorter side fitting in one block and the one before's not
    (rio-cogeo's pyramid, :func:`mosaic_overview_levels`).

    A count alone is not enough to call a pyramid complete, and GDAL's COG validator checks
    neither (docs/design.md, 'GDAL settings and raster figures'), so this is checked on every mosaic before upload.
    """
    problems = []
    for k in range(1, len(sizes)):
        (pw, ph), (w, h) = sizes[k - 1], sizes[k]
        if not (halve_floor(pw) <= w <= halve_ceil(pw) + 1 and halve_floor(ph) <= h <= halve_ceil(ph) + 1):
            problems.append(f"level {k} is {w}x{h}, not half of {pw}x{ph}")
    if shorter_side:
        if min(sizes[-1]) > block_size:
            problems.append(f"the smallest level, {sizes[-1]}, has no side within one {block_size}-pixel block")
        if len(sizes) > 1 and min(sizes[-2]) <= block_size:
            problems.append(f"level {len(sizes) - 1} is superfluous: the level before it has a side within one block")
        return problems
    w, h = sizes[-1]
    if w > block_size or h > block_size:
        problems.append(f"the smallest level, {w}x{h}, is larger than one {block_size}-pixel block: levels are missing")
    if len(sizes) > 1 and max(sizes[-2]) <= block_size:
        problems.append(f"level {len(sizes) - 1} is superfluous: the level before it already fits one block")
    return problems


@dataclass
class TileHead:
    """A tile's window, its source key and its parsed directories."""

    window: Window
    key: str
    layout: tiff.TiffLayout


def _tile_level_size(n: int, level: int) -> int:
    for _ in range(level):
        n = halve_floor(n)
    return n


def tile_levels(layout: tiff.TiffLayout) -> list[tuple[tiff.Directory, tiff.Directory | None]]:
    """A tile's levels, full resolution first: (image directory, its internal mask's directory or None).

    The COG driver writes the full resolution's mask (subfile type 4) after its image, and the
    overviews' masks (type 5) after all the overviews; a mask belongs to the image of its size.
    """
    images = [d for d in layout.directories if not d.subfile_type & tiff.SUBFILE_MASK]
    masks = {
        (d.width, d.height, d.subfile_type & tiff.SUBFILE_REDUCED): d
        for d in layout.directories
        if d.subfile_type & tiff.SUBFILE_MASK
    }
    levels = [(d, masks.pop((d.width, d.height, d.subfile_type & tiff.SUBFILE_REDUCED), None)) for d in images]
    if masks:
        raise IncompatibleTilesError(f"mask directories without an image of their size: {sorted(masks)}")
    return levels


@dataclass(frozen=True)
class _LevelBlocks:
    """One tile directory's block arrays, unpacked once (its tags are raw bytes)."""

    offsets: tuple[int, ...]
    byte_counts: tuple[int, ...]
    across: int


def _checked_blocks(
    head: TileHead, d: tiff.Directory, key: tuple, expected: tuple[int, int], what: str, block_size: int
) -> _LevelBlocks:
    """``d``'s block arrays once it is checked to be ``expected`` in size, encoded as ``key`` in
    ``block_size`` blocks, with one block per place; or :class:`IncompatibleTilesError`."""
    if (d.width, d.height) != expected:
        raise IncompatibleTilesError(f"tile {head.window.id} {what} is {d.width}x{d.height}, expected {expected}")
    if d.encoding_key() != key or d.tile_width != block_size or d.tile_height != block_size or d.planar_config != 1:
        raise IncompatibleTilesError(f"tile {head.window.id} {what} is encoded differently from tile 0000_0000")
    offsets, byte_counts = d.block_offsets, d.block_byte_counts
    across, down = -(-expected[0] // block_size), -(-expected[1] // block_size)
    if len(offsets) != across * down or len(byte_counts) != len(offsets):
        raise IncompatibleTilesError(f"tile {head.window.id} {what} has an unexpected number of blocks")
    return _LevelBlocks(offsets, byte_counts, across)


def plan_tile_levels(scene: SceneInfo, heads: list[TileHead], spec: OutputSpec) -> list[tiff.OutputDirectory]:
    """The mosaic's directories 0..K taken from the tiles' directories 0..K, or IncompatibleTilesError.

    Level k of the mosaic is the tiles' level k side by side: interior tiles contribute exactly
    window/2^k pixels (a whole number of blocks), edge tiles what the COG driver made of them.
    Stops at the first level that fits in one block, or at the tiles' last block-aligned level.
    Tiles with an internal mask give every level its mask, copied the same way (a 1-bit mask
    block covers the same 256 x 256 pixels as the image block beside it).
    """
    window_size, block_size = spec.window_size, spec.block_size
    available = tile_overview_count(window_size, block_size)
    if spec.choice.web_optimized:  # rio-cogeo's pyramid may stop before the tiles' levels do
        available = min(available, levels_of(scene, spec))
    reference = heads[0].layout
    if heads[0].window.id != "0000_0000":
        raise IncompatibleTilesError("the first planned window is not 0000_0000")
    levels = {h.window.id: tile_levels(h.layout) for h in heads}
    reference_levels = levels["0000_0000"]
    masked = reference_levels[0][1] is not None
    grid = {(h.window.row, h.window.col): h for h in heads}
    rows = 1 + max(h.window.row for h in heads)
    cols = 1 + max(h.window.col for h in heads)
    for head in heads:
        if head.layout.byte_order != reference.byte_order:
            raise IncompatibleTilesError(f"tile {head.window.id} has another byte order")
    out: list[tiff.OutputDirectory] = []
    for k in range(available + 1):
        if k >= len(reference_levels):
            raise IncompatibleTilesError(f"tile 0000_0000 has no overview level {k}")
        ref_dir, ref_mask = reference_levels[k]
        width = sum(_tile_level_size(grid[(0, c)].window.width, k) for c in range(cols))
        height = sum(_tile_level_size(grid[(r, 0)].window.height, k) for r in range(rows))
        images, masks = _level_blocks(heads, levels, k, ref_dir, ref_mask, masked, block_size)
        per_tile = window_size // 2**k // block_size
        placed = functools.partial(_copied, grid=grid, width=width, height=height, per_tile=per_tile, block=block_size)
        reduced = tiff.SUBFILE_REDUCED if k else 0
        image = placed(images, ref_dir, reduced)
        if ref_mask is not None:  # ``masked``: every tile's level has its mask (checked by _level_blocks)
            image.mask = placed(masks, ref_mask, reduced | tiff.SUBFILE_MASK)
        out.append(image)
        if width <= block_size and height <= block_size:
            break
    return out


def _level_blocks(
    heads: list[TileHead],
    levels: dict[str, list],
    k: int,
    ref_dir: tiff.Directory,
    ref_mask: tiff.Directory | None,
    masked: bool,
    block_size: int,
) -> tuple[dict[tuple[int, int], _LevelBlocks], dict[tuple[int, int], _LevelBlocks]]:
    """Every tile's level ``k`` checked against tile 0000_0000's (``ref_dir``, ``ref_mask``),
    with a mask if and only if ``masked`` (tile 0000_0000's full resolution has one): the block
    arrays of its image and of its mask, by the tile's (row, col)."""
    image_key = ref_dir.encoding_key()
    mask_key = ref_mask.encoding_key() if ref_mask is not None else None
    images: dict[tuple[int, int], _LevelBlocks] = {}
    masks: dict[tuple[int, int], _LevelBlocks] = {}
    for head in heads:
        tile = levels[head.window.id]
        if len(tile) <= k:
            raise IncompatibleTilesError(f"tile {head.window.id} has no overview level {k}")
        tile_dir, tile_mask = tile[k]
        if (tile_mask is not None) != masked:
            lacks = "lacks" if masked else "has"
            raise IncompatibleTilesError(f"tile {head.window.id} level {k} {lacks} an internal mask")
        place = (head.window.row, head.window.col)
        expected = (_tile_level_size(head.window.width, k), _tile_level_size(head.window.height, k))
        images[place] = _checked_blocks(head, tile_dir, image_key, expected, f"level {k}", block_size)
        if tile_mask is not None and mask_key is not None:  # both or neither: tile 0000_0000 is checked too
            masks[place] = _checked_blocks(head, tile_mask, mask_key, expected, f"level {k} mask", block_size)
    return images, masks


def _copied(
    tiles: dict[tuple[int, int], _LevelBlocks],
    reference: tiff.Directory,
    subfile_type: int,
    *,
    grid: dict[tuple[int, int], TileHead],
    width: int,
    height: int,
    per_tile: int,
    block: int,
) -> tiff.OutputDirectory:
    """A level of the mosaic: each block the block of the tile that covers it, in block-index order."""
    blocks = []
    for by in range(-(-height // block)):
        row, ly = divmod(by, per_tile)
        for bx in range(-(-width // block)):
            col, lx = divmod(bx, per_tile)
            tile = tiles[(row, col)]
            index = ly * tile.across + lx
            blocks.append(tiff.BlockRef(grid[(row, col)].key, tile.offsets[index], tile.byte_counts[index]))
    tags = tiff.copyable_tags(reference, width=width, height=height, subfile_type=subfile_type)
    return tiff.OutputDirectory(tags=tags, blocks=blocks, width=width, height=height)


def coarse_copy_bytes(scene: SceneInfo, spec: OutputSpec) -> tuple[int, tuple[int, int]]:
    """Temporary disk the block-copy assemblies need at most, from the scene's numbers alone, and
    the size of the level they copy: :func:`.block_copy.build_coarse_levels` writes a copy of the
    last level the tiles carry and has GDAL build the coarser levels into it.

    Counted as incompressible pixels (bands x sample size, an internal mask's bit a pixel), the
    computed levels twice: GDAL rewrites blocks of the levels it builds into an existing file,
    leaving dead space about as large as the levels (measured at 10240² x 3 uint16, 1024-pixel
    windows: a 27.0 MB copy of level 2, 9.5 MB of levels built, 45.0 MB on disk; counted so:
    65.4 MB). (0, size) when the tiles' levels reach one block and nothing is copied.
    """
    first = tile_overview_count(spec.window_size, spec.block_size)
    if spec.choice.web_optimized:
        first = min(first, levels_of(scene, spec))
    width, height = scene.width, scene.height
    for _ in range(first):
        width, height = halve_floor(width), halve_floor(height)
    levels = levels_to_fit(width, height, halve_ceil, spec.block_size)
    if spec.choice.web_optimized:
        levels = levels_of(scene, spec) - first
    if levels <= 0:
        return 0, (width, height)
    per_pixel = scene.count * np.dtype(scene.dtype).itemsize + (0.125 if scene.mask == "per-dataset" else 0)
    computed, w, h = 0, width, height
    for _ in range(levels):
        w, h = halve_ceil(w), halve_ceil(h)
        computed += w * h
    return int((width * height + 2 * computed) * per_pixel), (width, height)


def check_temporary_disk(path: str, scene: SceneInfo, spec: OutputSpec) -> None:
    """Refuse, at validation, a scene whose mosaic's coarse-level copy (:func:`coarse_copy_bytes`)
    may need more than :data:`~..reading.budgets.TEMPORARY_DISK_BYTES` of temporary disk, with
    the numbers and what would fit: a larger window (its tiles carry more levels, and the copy is
    of a level a quarter the size), or a smaller scene."""
    needed, (width, height) = coarse_copy_bytes(scene, spec)
    if needed <= TEMPORARY_DISK_BYTES:
        return
    itemsize = np.dtype(scene.dtype).itemsize
    remedies = []
    for size in range(spec.window_size * 2, 4 * 4096 + 1, spec.window_size):
        larger = OutputSpec(
            window_size=size, block_size=spec.block_size, profile=spec.profile, profile_options=spec.profile_options
        )
        if window_bytes(scene.count, itemsize, scene.width, scene.height, size) > MAX_WINDOW_BYTES:
            break
        if coarse_copy_bytes(scene, larger)[0] <= TEMPORARY_DISK_BYTES:
            remedies.append(f"a larger window (TILECOMMIT_WINDOW_SIZE={size})")
            break
    pixels = scene.width * scene.height * TEMPORARY_DISK_BYTES // needed
    remedies.append(f"a scene of at most about {pixels} pixels (split it), or fewer bands per file")
    raise UnsupportedRasterError(
        f"{path}: the mosaic of its {scene.width} x {scene.height} x {scene.count} {scene.dtype} scene has its coarse "
        f"levels computed on temporary disk from a copy of the tiles' last level ({width} x {height} pixels), "
        f"up to {needed} bytes ({mib(needed)}) with incompressible pixels, more than the {TEMPORARY_DISK_BYTES} "
        f"bytes an assembly may use (the Consumption plan gives an instance about 0.5 GB); accepted: "
        + " or ".join(remedies)
    )
