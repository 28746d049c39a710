"""A tile's blocks fetched ahead, merged and at once, before GDAL reads them one at a time.

GDAL reads the blocks of a tile from the app's reader one after the other, one GET each: its
multi-range read is not offered to the reader
(:meth:`~tilecommit.raster.reading.source.Source.prefetch` says why). titiler's ``/vsiaz/``
merges neighbouring ranges and fetches them in parallel, so a tile of 4 blocks cost us 4 round
trips where it cost titiler about 2, at once (docs/tiles.md, the bench).

Which level of the mosaic GDAL reads at a zoom is learned from the first tile of that zoom (the
level holding most of the bytes its reads fetched) rather than re-derived from GDAL's choice of
overview, which depends on its version, the warp and rio-tiler's options. Later tiles of that zoom
have that level's blocks under the tile fetched ahead. A wrong guess costs bytes, never pixels:
the reader serves the bytes stored at an offset, pinned to the mosaic's ETag, whether they were
fetched ahead or when GDAL asked.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property

from affine import Affine
from rasterio.crs import CRS
from rasterio.warp import transform_bounds

from ..raster.reading.source import merged_ranges
from ..raster.tiff import SUBFILE_MASK, Directory, TiffLayout, read_layout
from .mosaics import KeptMosaicBlob

#: GETs of one tile's prefetch in flight at once (titiler's GDAL sends a tile's ranges at once too).
PREFETCH_THREADS = 4
#: A tile whose blocks add up to more than this is left to GDAL's own reads (a zoom far past the
#: level the reads were learned at would otherwise fetch a wide area ahead).
MAX_PREFETCH_BYTES = 8 * 1024 * 1024
#: Pixels added around the tile's window: resampling kernels read past the tile's edge.
MARGIN_PX = 2
#: Tiles remembered as rendered (the most recent), whose blocks are not fetched ahead again.
SEEN_TILES = 4096

_POOL = ThreadPoolExecutor(PREFETCH_THREADS, thread_name_prefix="tileprefetch")


@dataclass(frozen=True)
class Level:
    """One image of the mosaic (full resolution or an overview) and its mask, as stored."""

    width: int
    height: int
    block_width: int
    block_height: int
    #: Per block, row by row: ``(offset, size)`` of the image's block and of the mask's (if any).
    blocks: tuple[tuple[tuple[int, int], ...], ...]
    #: The byte range the level's blocks lie in (a COG stores each level's blocks together).
    span: tuple[int, int]

    @classmethod
    def of(cls, image: Directory, mask: Directory | None) -> Level:
        # A block's leader and trailer (GDAL's COG ghost area) are not read by GDAL's block reads.
        planes = [image, *([mask] if mask is not None else [])]
        per_plane = [list(zip(d.block_offsets, d.block_byte_counts, strict=True)) for d in planes]
        blocks = tuple(
            tuple((offset, size) for offset, size in plane_blocks if size > 0)
            for plane_blocks in zip(*per_plane, strict=True)
        )
        stored = [r for block in blocks for r in block]
        span = (min(o for o, _ in stored), max(o + s for o, s in stored)) if stored else (0, 0)
        tile_w, tile_h = int(image.tile_width or image.width), int(image.tile_height or image.height)
        return cls(image.width, image.height, tile_w, tile_h, blocks, span)

    def ranges(self, col_off: float, row_off: float, col_end: float, row_end: float) -> list[tuple[int, int]]:
        """The stored ranges of the blocks under a pixel window of this level."""
        if not self.blocks or col_end < 0 or row_end < 0 or col_off >= self.width or row_off >= self.height:
            return []  # no tiles (a stripped TIFF, never a COG) or a window off the level
        across = -(-self.width // self.block_width)
        first_col, first_row = max(0, int(col_off) // self.block_width), max(0, int(row_off) // self.block_height)
        last_col = min(across - 1, int(col_end) // self.block_width)
        last_row = min(-(-self.height // self.block_height) - 1, int(row_end) // self.block_height)
        return [
            stored
            for by in range(first_row, last_row + 1)
            for bx in range(first_col, last_col + 1)
            for stored in self.blocks[by * across + bx]
        ]


class TilePrefetcher:
    """Fetches ahead the blocks of a mosaic's tiles, per zoom, once a tile of that zoom showed
    which level GDAL reads there (:meth:`tile`)."""

    def __init__(self, source: KeptMosaicBlob, crs: CRS, transform: Affine):
        self.source, self.crs, self.transform = source, crs, transform
        #: zoom -> the index in :attr:`levels` of the level GDAL read at that zoom.
        self.learned: dict[int, int] = {}
        self._seen: OrderedDict[tuple, None] = OrderedDict()

    @cached_property
    def levels(self) -> list[Level]:
        layout: TiffLayout = read_layout(self.source.read_at(0, 16 * 1024), self.source.read_at)
        images = [d for d in layout.directories if not d.subfile_type & SUBFILE_MASK]
        masks = {(d.width, d.height): d for d in layout.directories if d.subfile_type & SUBFILE_MASK}
        return [Level.of(d, masks.get((d.width, d.height))) for d in images]

    @contextmanager
    def tile(self, z: int, bounds: tuple[float, float, float, float], bounds_crs: CRS) -> Iterator[None]:
        """Around a tile's render: its blocks fetched ahead when its zoom's level is known; the
        level learned from what the render fetched when it is not."""
        level, seen = self.learned.get(z), self._seen_before((z, *bounds))
        if level is not None:
            if not seen:
                self._fetch_ahead(self.levels[level], bounds, bounds_crs)
            yield
            return
        self.source.fetched = []
        try:
            yield
            learned = self._level_of(self.source.fetched)
        finally:
            self.source.fetched = None
        if learned is not None:
            self.learned[z] = learned

    def _seen_before(self, key: tuple) -> bool:
        """Whether this tile was rendered lately. Its blocks are then most likely decoded in
        GDAL's block cache, which this cannot see: fetching them ahead again because the stored
        bytes left :class:`KeptMosaicBlob` would read what GDAL does not ask for (measured: warm
        tiles read as much as cold ones)."""
        seen = key in self._seen
        self._seen[key] = None
        self._seen.move_to_end(key)
        while len(self._seen) > SEEN_TILES:
            self._seen.popitem(last=False)
        return seen

    def _level_of(self, fetched: list[tuple[int, int]]) -> int | None:
        weight = [0] * len(self.levels)
        for offset, size in fetched:
            for index, level in enumerate(self.levels):
                if level.span[0] <= offset < level.span[1]:
                    weight[index] += size
        best = max(range(len(weight)), key=weight.__getitem__, default=None)
        return best if best is not None and weight[best] > 0 else None

    def _fetch_ahead(self, level: Level, bounds: tuple[float, float, float, float], bounds_crs: CRS) -> None:
        left, bottom, right, top = transform_bounds(bounds_crs, self.crs, *bounds, densify_pts=21)
        full_width, full_height = self.levels[0].width, self.levels[0].height
        to_level = Affine.scale(level.width / full_width, level.height / full_height) * ~self.transform
        xs, ys = zip(
            *(to_level * corner for corner in ((left, top), (right, top), (left, bottom), (right, bottom))), strict=True
        )
        ranges = level.ranges(min(xs) - MARGIN_PX, min(ys) - MARGIN_PX, max(xs) + MARGIN_PX, max(ys) + MARGIN_PX)
        missing = [r for r in ranges if not self.source.covered(*r)]  # kept from a neighbour: not again
        if not missing or sum(size for _, size in missing) > MAX_PREFETCH_BYTES:
            return
        wanted = merged_ranges(missing)
        # The fetches record their faults on the source, where the render's check finds them.
        for start, data in zip(
            (start for start, _ in wanted), _POOL.map(lambda span: self.source.fetch(*span), wanted), strict=True
        ):
            self.source.keep(start, data)


__all__ = ["TilePrefetcher"]
