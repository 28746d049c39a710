"""The mosaic's pyramid: how big each overview level is, whether a pyramid is complete, and
which of the tiles' own levels become the mosaic's (all pure: directories in, directories out).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ...errors import IncompatibleTilesError, UnsupportedRasterError
from ...grid import Window
from ...spec import OutputSpec
from .. import tiff
from ..env import BLOCK_SIZE
from ..reading.budgets import MAX_WINDOW_BYTES, TEMPORARY_DISK_BYTES, mib, window_bytes
from ..reading.scene import SceneInfo
from ..tiff_alike import AlikeHeads
from ..tiff_blocks import BlockArray
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


@dataclass
class TileHeads:
    """Every tile's head, parsed in groups alike (:func:`..tiff_alike.read_alike`): window
    ``windows[i]``'s tile is the source ``keys[i]``, and member ``i`` of one group."""

    windows: list[Window]
    keys: list[str]
    groups: list[AlikeHeads]

    @classmethod
    def of(cls, heads: list[TileHead]) -> TileHeads:
        """Heads parsed one by one, each a group of its own."""
        return cls(
            [h.window for h in heads],
            [h.key for h in heads],
            [AlikeHeads.single(h.layout, i) for i, h in enumerate(heads)],
        )


def _tile_level_size(n: int, level: int) -> int:
    for _ in range(level):
        n = halve_floor(n)
    return n


def tile_levels(layout: tiff.TiffLayout) -> list[tuple[tiff.Directory, tiff.Directory | None]]:
    """A tile's levels, full resolution first: (image directory, its internal mask's directory or None).

    The COG driver writes the full resolution's mask (subfile type 4) after its image, and the
    overviews' masks (type 5) after all the overviews; a mask belongs to the image of its size.
    """
    directories = layout.directories
    return [(directories[i], directories[m] if m is not None else None) for i, m in _level_indices(layout)]


def _level_indices(layout: tiff.TiffLayout) -> list[tuple[int, int | None]]:
    """:func:`tile_levels` as indices into ``layout.directories``."""
    directories = layout.directories
    images = [i for i, d in enumerate(directories) if not d.subfile_type & tiff.SUBFILE_MASK]
    masks = {
        (d.width, d.height, d.subfile_type & tiff.SUBFILE_REDUCED): i
        for i, d in enumerate(directories)
        if d.subfile_type & tiff.SUBFILE_MASK
    }
    levels = []
    for i in images:
        d = directories[i]
        levels.append((i, masks.pop((d.width, d.height, d.subfile_type & tiff.SUBFILE_REDUCED), None)))
    if masks:
        raise IncompatibleTilesError(f"mask directories without an image of their size: {sorted(masks)}")
    return levels


def plan_tile_levels(scene: SceneInfo, tiles: TileHeads, spec: OutputSpec) -> list[tiff.OutputDirectory]:
    """The mosaic's directories 0..K taken from the tiles' directories 0..K, or IncompatibleTilesError.

    Level k of the mosaic is the tiles' level k side by side: interior tiles contribute exactly
    window/2^k pixels (a whole number of blocks), edge tiles what the COG driver made of them.
    Stops at the first level that fits in one block, or at the tiles' last block-aligned level.
    Tiles with an internal mask give every level its mask, copied the same way (a 1-bit mask
    block covers the same 256 x 256 pixels as the image block beside it). Each group of tiles
    alike is checked once and placed with numpy: its members share every directory but the
    block arrays (:mod:`..tiff_alike`).
    """
    window_size, block_size = spec.window_size, spec.block_size
    available = tile_overview_count(window_size, block_size)
    if spec.choice.web_optimized:  # rio-cogeo's pyramid may stop before the tiles' levels do
        available = min(available, levels_of(scene, spec))
    if tiles.windows[0].id != "0000_0000":
        raise IncompatibleTilesError("the first planned window is not 0000_0000")
    reference = tiles.groups[0].layout
    for group in tiles.groups:
        if group.layout.byte_order != reference.byte_order:
            raise IncompatibleTilesError(f"tile {tiles.windows[group.members[0]].id} has another byte order")
    levels = [_level_indices(group.layout) for group in tiles.groups]
    masked = levels[0][0][1] is not None  # every level of every tile has a mask, or none has
    # Each window's row, column, width and height, as arrays: where its blocks go, what size its levels are.
    grid = np.array([(w.row, w.col, w.width, w.height) for w in tiles.windows], dtype=np.int64).T
    first_row = {w.col: w for w in tiles.windows if w.row == 0}
    first_col = {w.row: w for w in tiles.windows if w.col == 0}
    out: list[tiff.OutputDirectory] = []
    for k in range(available + 1):
        if k >= len(levels[0]):
            raise IncompatibleTilesError(f"tile 0000_0000 has no overview level {k}")
        width = sum(_tile_level_size(first_row[c].width, k) for c in range(len(first_row)))
        height = sum(_tile_level_size(first_col[r].height, k) for r in range(len(first_col)))
        level = _Level(k, width, height, window_size // 2**k // block_size, block_size)
        image, mask = level.placed(tiles, levels, masked, grid)
        out.append(image if mask is None else dataclasses.replace(image, mask=mask))
        if width <= block_size and height <= block_size:
            break
    return out


@dataclass
class _Level:
    """Level ``k`` of the mosaic, ``width`` x ``height``, each tile ``per_tile`` blocks across."""

    k: int
    width: int
    height: int
    per_tile: int
    block: int

    def placed(
        self, tiles: TileHeads, levels: list, masked: bool, grid: np.ndarray
    ) -> tuple[tiff.OutputDirectory, tiff.OutputDirectory | None]:
        """This level's directory and its mask's (None unless ``masked``): every group's level
        ``k`` checked against tile 0000_0000's, its blocks placed where they lie in the mosaic."""
        reference = tiles.groups[0].layout.directories
        ref_image, ref_mask = self._of_group(tiles, tiles.groups[0], levels[0], masked)
        parts = [(reference[ref_image], "")] + ([(reference[ref_mask], " mask")] if ref_mask is not None else [])
        across, down = -(-self.width // self.block), -(-self.height // self.block)
        arrays = [np.full((3, across * down), -1, dtype=np.int64) for _ in parts]
        sizes = grid[2:]
        for _ in range(self.k):
            sizes = np.maximum(1, sizes // 2)  # halve_floor, each window's level k
        for group, group_levels in zip(tiles.groups, levels, strict=True):
            indices = self._of_group(tiles, group, group_levels, masked)
            # The image, then its mask when the level has one (``indices``' second is None without).
            for (ref, what), index, into in zip(parts, indices, arrays, strict=False):
                d = group.layout.directories[index]
                self._check(tiles, group, d, index, ref, what, sizes)
                indices_in_tile = np.arange(group.offsets[index].shape[1])
                ly, lx = np.divmod(indices_in_tile, -(-d.width // self.block))
                members = group.members[:, None]
                place = (grid[0][members] * self.per_tile + ly) * across + grid[1][members] * self.per_tile + lx
                into[0, place] = np.broadcast_to(members, place.shape)
                into[1, place] = group.offsets[index]
                into[2, place] = group.byte_counts[index]
        directories = []
        for (ref, what), (source, offset, length) in zip(parts, arrays, strict=True):
            if (source < 0).any():
                raise IncompatibleTilesError(f"the tiles' level {self.k}{what} leaves blocks of the mosaic uncovered")
            subfile = (tiff.SUBFILE_REDUCED if self.k else 0) | (tiff.SUBFILE_MASK if what else 0)
            tags = tiff.copyable_tags(ref, width=self.width, height=self.height, subfile_type=subfile)
            blocks = BlockArray(tiles.keys, source, offset, length)
            directories.append(tiff.OutputDirectory(tags=tags, blocks=blocks, width=self.width, height=self.height))
        return directories[0], (directories[1] if len(directories) > 1 else None)

    def _of_group(self, tiles: TileHeads, group: AlikeHeads, group_levels: list, masked: bool) -> tuple:
        """The group's level ``k`` as directory indices (image, mask), once it has one, with a
        mask if and only if ``masked`` (tile 0000_0000's full resolution has one)."""
        first = tiles.windows[group.members[0]].id
        if len(group_levels) <= self.k:
            raise IncompatibleTilesError(f"tile {first} has no overview level {self.k}")
        image, mask = group_levels[self.k]
        if (mask is not None) != masked:
            lacks = "lacks" if masked else "has"
            raise IncompatibleTilesError(f"tile {first} level {self.k} {lacks} an internal mask")
        return image, mask

    def _check(
        self, tiles: TileHeads, group: AlikeHeads, d: tiff.Directory, index: int, ref: tiff.Directory, what: str, sizes
    ) -> None:
        """``d`` (directory ``index`` of the group) of each member's window's level size, encoded
        as ``ref`` in the job's blocks, one block per place; or IncompatibleTilesError."""
        members = group.members
        wrong = np.flatnonzero((sizes[0][members] != d.width) | (sizes[1][members] != d.height))
        if wrong.size:
            m = int(members[wrong[0]])
            expected = (int(sizes[0][m]), int(sizes[1][m]))
            raise IncompatibleTilesError(
                f"tile {tiles.windows[m].id} level {self.k}{what} is {d.width}x{d.height}, expected {expected}"
            )
        first = tiles.windows[members[0]].id
        if (
            d.encoding_key() != ref.encoding_key()
            or d.tile_width != self.block
            or d.tile_height != self.block
            or d.planar_config != 1
        ):
            raise IncompatibleTilesError(
                f"tile {first} level {self.k}{what} is encoded differently from tile 0000_0000"
            )
        across, down = -(-d.width // self.block), -(-d.height // self.block)
        if not group.offsets[index].shape[1] == group.byte_counts[index].shape[1] == across * down:
            raise IncompatibleTilesError(f"tile {first} level {self.k}{what} has an unexpected number of blocks")


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
