"""The budgets an upload can exceed, every one derived from one figure: an instance's memory.

Validation (:func:`~.scene.inspect_source`) checks each from the header before the job reads a
block, and refuses an upload over one as bad input, with the numbers and what would be accepted.
Without these checks such an upload was read anyway: its windows took more memory than an
activity has, so the instance (with the other jobs' activities on it) was recycled and the window
retried on the next, or GDAL failed to allocate and the read was retried as a fault.

**The figure.** The Consumption plan gives an instance 1536 MiB (:data:`INSTANCE_MEMORY_BYTES`);
host.json runs :data:`ACTIVITY_SLOTS` activities on it at once. Less the process's baseline and
what an assembly beside the last tiles takes, each activity has :data:`ACTIVITY_MEMORY_BYTES`
(289 MiB). Everything an activity holds at its peak must fit that:

- rendering a window peaks at :data:`RENDER_PEAK_FACTOR` times its decoded bytes, hence
  :data:`MAX_WINDOW_BYTES` (48 MiB) a window (``scene._check_window_budget``);
- reading a window holds the window and one whole block of the upload decoded, with its stored
  bytes (:attr:`Blocks.read_bytes`, :func:`check_window_reads`);
- a warped window also holds the source area one block of its grid maps to (:func:`warp_source_area`);
- a JPEG 2000's tile, decoded whole by OpenJPEG, from its header before GDAL opens it
  (:func:`check_jpeg2000_tile`);
- the tags the upload's tiles and mosaic carry are bounded apart (:func:`check_carried_metadata`);
- an assembly's temporary disk: :data:`TEMPORARY_DISK_BYTES` (a NetCDF upload's local copy:
  :data:`.netcdf.MAX_LOCAL_COPY_BYTES`).

Flex Consumption's 2048 and 4096 MB instances hold what fits this one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from rasterio.errors import CRSError
from rasterio.warp import transform

from ...errors import InvalidRasterError, UnsupportedRasterError
from ...settings import CONSUMPTION_INSTANCE_MB
from ...spec import OutputSpec
from . import jpeg2000, metadata
from .source import READ_AHEAD
from .warp import EDGE_SAMPLES, PREFETCH_MARGIN, WARP_BLOCK, TargetGrid, srs_grid

MiB = 2**20

#: Linux Consumption's instance memory: past it the platform recycles the instance.
INSTANCE_MEMORY_BYTES = CONSUMPTION_INSTANCE_MB * MiB
#: Activities one instance runs at once: host.json's ``maxConcurrentActivityFunctions``
#: (tests/test_budgets.py holds the two equal).
ACTIVITY_SLOTS = 4
#: The process before any raster work: Python, GDAL, the SDK clients (docs/benchmarks.md, ``mem_baseline``).
BASELINE_BYTES = 90 * MiB
#: Left for an assembly running beside the last tiles: it measured +103 to +157 MiB over the
#: baseline (docs/design.md, "Sizing for the Consumption plan"), with room for their spread.
ASSEMBLY_RESERVE_BYTES = 290 * MiB
#: What one activity may hold at its peak: 289 MiB.
ACTIVITY_MEMORY_BYTES = (INSTANCE_MEMORY_BYTES - BASELINE_BYTES - ASSEMBLY_RESERVE_BYTES) // ACTIVITY_SLOTS
#: Rendering a window peaks at about 6 times its decoded bytes: the array read, the COG driver's
#: working copy and overviews, the tile in memory and its bytes read out, GDAL's block cache
#: (+289 MiB for a 48 MiB window of 1024² x 24 uint16, +59 MiB for 6 MiB of 1024² x 3 uint16,
#: incompressible pixels; docs/design.md, "GDAL settings and raster figures").
RENDER_PEAK_FACTOR = 6
#: Most bytes one window may take decoded (bands x width x height x sample size): 48 MiB, whole MiB.
MAX_WINDOW_BYTES = ACTIVITY_MEMORY_BYTES // RENDER_PEAK_FACTOR // MiB * MiB
#: The largest block a source may declare, decoded: one that alone needs more than an activity
#: has can never be read (GDAL holds a whole block to read any pixel of it). Refused before the
#: blocks are listed; :func:`check_window_reads` then checks what reading one really takes.
MAX_BLOCK_BYTES = ACTIVITY_MEMORY_BYTES
#: Bytes of tags a tile and the mosaic may carry from the upload (:mod:`.metadata`): each tile
#: writes them into its head and the mosaic into its own, where every reader meets them. Heads
#: are read in chunks of this size (``source.READ_AHEAD``: the app's reader, the committed
#: mosaic's verification); the assembly reads each tile's first 16 KiB and anything past it with
#: one more request. Within it a head costs a request or two; a 10 MB description would cost every
#: tile 10 MB written and read again, and every reader of the mosaic 10 MB at open.
MAX_CARRIED_METADATA_BYTES = READ_AHEAD
#: Temporary disk one assembly may use: the Consumption plan gives an instance about 0.5 GB in all.
TEMPORARY_DISK_BYTES = 400 * 1000 * 1000

#: How an upload gets blocks a window can read: what the refusals say.
RETILE = "gdal_translate -co TILED=YES -co BLOCKXSIZE=512 -co BLOCKYSIZE=512 in.tif out.tif"


def mib(n: float) -> str:
    return f"{n / MiB:.1f} MiB"


@dataclass(frozen=True)
class Blocks:
    """How an upload's header says its pixels are stored, as far as reading them costs memory."""

    #: Block (tile, or strip: rows per strip x the full width) in pixels.
    width: int
    height: int
    #: Samples one block holds: every band when pixel-interleaved, one when band-interleaved.
    samples: int
    itemsize: int
    dtype: str
    #: The most bytes stored at one block position (every band's block there, band-interleaved).
    stored: int
    #: Blocks as wide as the image and not as tall (strips).
    striped: bool = False

    @classmethod
    def of(cls, src, stored: int) -> Blocks:
        block_h, block_w = src.block_shapes[0]
        band = src.interleaving is not None and src.interleaving.name == "BAND"
        return cls(
            width=block_w,
            height=block_h,
            samples=1 if band else src.count,
            itemsize=np.dtype(src.dtypes[0]).itemsize,
            dtype=src.dtypes[0],
            stored=stored,
            striped=block_w == src.width and block_h < src.height,
        )

    @property
    def decoded(self) -> int:
        return self.width * self.height * self.samples * self.itemsize

    @property
    def read_bytes(self) -> int:
        """What reading any pixel of one block holds: the block decoded whole, the band GDAL copies
        out of a pixel-interleaved one, and its stored bytes as read. Measured with the app's reader
        (the peak over a fresh process, one 1024² window of 3 uint16 bands, so 6 MiB of window
        besides; counted here with the window, then measured): strips of 16384 x 1024 pixels,
        DEFLATE of smooth data 135 / 136 MiB, DEFLATE of noise 230 / 231, ZSTD of noise 230 / 235,
        LZW of noise (stored larger than decoded) 265 / 266, uncompressed 230 / 192; the same
        band-interleaved, LZW of noise 169 / 168, smooth 38 / 38; tiles of 4096² 135 / 135. A window
        touching several blocks holds one at a time: 4 tiles of 1536² under one window held 24 MiB,
        1024 one-row strips 8 MiB, so what counts is the largest block, not the blocks' sum."""
        plane = self.width * self.height * self.itemsize
        return self.decoded + (plane if self.samples > 1 else 0) + self.stored

    def describe(self) -> str:
        shape = (
            f"strips of {self.height} rows ({self.width} x {self.height} pixels)"
            if self.striped
            else (f"tiles of {self.width} x {self.height} pixels")
        )
        return (
            f"{shape} x {self.samples} samples of {self.dtype}: {self.decoded} bytes ({mib(self.decoded)}) a block decoded, "
            f"up to {self.stored} stored"
        )


def window_bytes(count: int, itemsize: int, width: int, height: int, window_size: int) -> int:
    """Decoded bytes of the largest window of a scene at ``window_size`` (clipped to the scene)."""
    return count * min(window_size, width) * min(window_size, height) * itemsize


@dataclass(frozen=True)
class WarpArea:
    """The largest source area one block of a warped job's grid maps to (GDAL's warper reads it whole)."""

    columns: int
    rows: int
    #: The grid block it is for: (column, row) of its upper-left pixel.
    at: tuple[int, int]

    @property
    def pixels(self) -> int:
        return self.columns * self.rows


def _to_source(src, grid: TargetGrid, xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Source pixel coordinates of grid pixel coordinates (exact transformation); NaN where none.

    GDAL refuses a whole batch when one point fails, so a failed batch is redone point by point.
    """
    wx, wy = grid.transform * (xs, ys)  # type: ignore[operator]  # affine maps arrays element-wise; its types say floats
    try:
        sx, sy = (np.asarray(v, dtype="float64") for v in transform(grid.crs, src.crs, list(wx), list(wy)))
    except (CRSError, ValueError, RuntimeError, OSError):
        sx, sy = np.full(len(xs), np.nan), np.full(len(xs), np.nan)
        for i, (x, y) in enumerate(zip(wx, wy, strict=True)):
            try:
                (sx[i],), (sy[i],) = transform(grid.crs, src.crs, [x], [y])
            except (CRSError, ValueError, RuntimeError, OSError):
                continue
    cols, rows = ~src.transform * (sx, sy)
    bad = ~(np.isfinite(cols) & np.isfinite(rows))
    return np.where(bad, np.nan, cols), np.where(bad, np.nan, rows)


def _edges(src, grid: TargetGrid, along: int, across: int, lines: int) -> tuple[np.ndarray, np.ndarray]:
    """Source coordinates of points along the grid's block edges of one direction: shape
    (lines, blocks, EDGE_SAMPLES), line ``k`` at ``min(k * WARP_BLOCK, across)``."""
    blocks = -(-along // WARP_BLOCK)
    steps = np.arange(EDGE_SAMPLES) / (EDGE_SAMPLES - 1)
    starts = np.arange(blocks) * WARP_BLOCK
    spans = np.minimum(WARP_BLOCK, along - starts)
    positions = starts[:, None] + spans[:, None] * steps[None, :]
    at = np.minimum(np.arange(lines) * WARP_BLOCK, across).astype("float64")
    return np.broadcast_to(positions, (lines, *positions.shape)), np.broadcast_to(
        at[:, None, None], (lines, *positions.shape)
    )


def warp_source_area(src, grid: TargetGrid) -> WarpArea:
    """The largest source window one block of ``grid`` maps back to, as GDAL's warper computes the
    window it reads for a block (``GDALWarpOperation::ComputeSourceWindow``): the block's edges,
    :data:`~.warp.EDGE_SAMPLES` points each, transformed exactly, a margin around, clipped to the
    source; the rule :func:`~.warp.source_window` applies to one window, here to every block at once.

    A warped job's windows are read through a VRTWarpedDataset of :data:`~.warp.WARP_BLOCK`-pixel
    blocks, which warps one block at a time with the source window it needs read whole
    (GDAL ``frmts/vrt/vrtwarped.cpp``, ``VRTWarpedDataset::ProcessBlock`` calls
    ``WarpRegionToBuffer`` on the block: no chunking by the warp memory limit, which only
    gdalwarp's ``ChunkAndWarpImage`` applies), and from the source's full resolution: the XML
    names the upload itself, not one of its overviews (gdalwarp's ``-ovr`` is what picks one).
    Measured: a 256² block of a grid 64 times coarser than an 8192² x 3 uint16 source held
    386 MiB (the whole source, 384 MiB decoded), with or without overviews in the source.
    """
    blocks_x, blocks_y = -(-grid.width // WARP_BLOCK), -(-grid.height // WARP_BLOCK)
    # Horizontal edges (blocks_y + 1 lines of blocks_x blocks), then vertical ones, in one batch each.
    hx, hy = _edges(src, grid, grid.width, grid.height, blocks_y + 1)
    vy, vx = _edges(src, grid, grid.height, grid.width, blocks_x + 1)
    h_cols, h_rows = (a.reshape(hx.shape) for a in _to_source(src, grid, hx.ravel(), hy.ravel()))
    v_cols, v_rows = (a.reshape(vx.shape) for a in _to_source(src, grid, vx.ravel(), vy.ravel()))

    def extent(h: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per block (blocks_y, blocks_x): the least and greatest value on its four edges."""
        with np.errstate(invalid="ignore"):
            h_lo, h_hi = np.fmin.reduce(h, axis=2), np.fmax.reduce(h, axis=2)
            v_lo, v_hi = np.fmin.reduce(v, axis=2).T, np.fmax.reduce(v, axis=2).T
        low = np.fmin(np.fmin(h_lo[:-1], h_lo[1:]), np.fmin(v_lo[:, :-1], v_lo[:, 1:]))
        high = np.fmax(np.fmax(h_hi[:-1], h_hi[1:]), np.fmax(v_hi[:, :-1], v_hi[:, 1:]))
        return low, high

    col_lo, col_hi = extent(h_cols, v_cols)
    row_lo, row_hi = extent(h_rows, v_rows)
    with np.errstate(invalid="ignore"):
        columns = np.clip(np.ceil(col_hi) + PREFETCH_MARGIN, 0, src.width) - np.clip(
            np.floor(col_lo) - PREFETCH_MARGIN, 0, src.width
        )
        rows = np.clip(np.ceil(row_hi) + PREFETCH_MARGIN, 0, src.height) - np.clip(
            np.floor(row_lo) - PREFETCH_MARGIN, 0, src.height
        )
    area = np.nan_to_num(np.maximum(columns, 0) * np.maximum(rows, 0))
    worst = np.unravel_index(int(np.argmax(area)), area.shape)
    return WarpArea(
        columns=int(np.nan_to_num(columns[worst])),
        rows=int(np.nan_to_num(rows[worst])),
        at=(int(worst[1]) * WARP_BLOCK, int(worst[0]) * WARP_BLOCK),
    )


def _budget_words() -> str:
    return (
        f"the {ACTIVITY_MEMORY_BYTES} bytes ({mib(ACTIVITY_MEMORY_BYTES)}) one activity may hold "
        f"({ACTIVITY_SLOTS} run at once on an instance of {INSTANCE_MEMORY_BYTES // MiB} MiB)"
    )


def check_window_reads(
    path: str, src, spec: OutputSpec, blocks: Blocks, grid: TargetGrid | None = None, resolution: float | None = None
) -> None:
    """Refuse an upload one of whose windows would hold more than :data:`ACTIVITY_MEMORY_BYTES` while it is read.

    A window read holds the window decoded and one block of the upload (:attr:`Blocks.read_bytes`);
    a warped one (``grid``: the job's target grid) the source area a block of the grid maps to
    besides (:func:`warp_source_area`). All from the header and the grid: no block is read.
    """
    itemsize = np.dtype(src.dtypes[0]).itemsize
    width, height = (grid.width, grid.height) if grid is not None else (src.width, src.height)
    window = window_bytes(src.count, itemsize, width, height, spec.window_size)
    area = warp_source_area(src, grid) if grid is not None else None
    warp = area.pixels * src.count * itemsize if area is not None else 0
    needed = window + blocks.read_bytes + warp
    if needed <= ACTIVITY_MEMORY_BYTES:
        return
    if grid is not None and area is not None and warp >= blocks.read_bytes:
        _refuse_warp(path, src, grid, area, warp, needed, window, blocks, resolution, spec.window_size)
    _refuse_blocks(path, src, spec, blocks, needed, window, warp, width, height)


def _refuse_blocks(
    path: str, src, spec: OutputSpec, blocks: Blocks, needed: int, window: int, warp: int, width: int, height: int
) -> None:
    itemsize = np.dtype(src.dtypes[0]).itemsize
    # The largest block that would fit beside this window, were it stored as this file stores its blocks.
    largest = max(0, int((ACTIVITY_MEMORY_BYTES - window - warp) * blocks.decoded / blocks.read_bytes))
    accepted = f"blocks of at most about {largest} bytes ({mib(largest)}) decoded"
    if blocks.striped:
        rows = largest // (blocks.width * blocks.samples * itemsize)
        accepted += f" (strips of at most {rows} rows at this width)"
    accepted += f", e.g. the file re-tiled in 512 x 512 tiles (`{RETILE}`)"
    room = ACTIVITY_MEMORY_BYTES - blocks.read_bytes - warp
    sizes = range(spec.window_size - spec.block_size, 0, -spec.block_size)
    smaller = next((s for s in sizes if window_bytes(src.count, itemsize, width, height, s) <= room), None)
    if smaller is not None:
        accepted += f", or a smaller window (TILECOMMIT_WINDOW_SIZE={smaller})"
    raise UnsupportedRasterError(
        f"{path} is stored in {blocks.describe()}; GDAL decodes a whole block to read any pixel of it, so "
        f"reading one {min(spec.window_size, width)} x {min(spec.window_size, height)} window holds about "
        f"{needed} bytes ({mib(needed)}: the window {window}, the block decoded and stored {blocks.read_bytes}"
        + (f", the warp's source area {warp}" if warp else "")
        + f"), more than {_budget_words()}; accepted: {accepted}"
    )


def _round_down(value: float) -> float:
    """``value`` rounded down to two significant digits."""
    unit = 10 ** (math.floor(math.log10(value)) - 1)
    return math.floor(value / unit) * unit


def _fitting_resolution(
    src, grid: TargetGrid, area: WarpArea, resolution: float | None, window_size: int, block_read: int
) -> float | None:
    """A ``resolution`` whose grid (:func:`~.warp.srs_grid`, the CRS of ``grid``) passes
    :func:`check_window_reads`, checked on that grid, near the coarsest that does; None when no
    ``resolution`` was given or none is found."""
    per_pixel = src.count * np.dtype(src.dtypes[0]).itemsize

    def needs(candidate: TargetGrid) -> int:
        window = window_bytes(src.count, per_pixel // src.count, candidate.width, candidate.height, window_size)
        return window + block_read + warp_source_area(src, candidate).pixels * per_pixel

    room = ACTIVITY_MEMORY_BYTES - block_read
    if resolution is None or room <= 0:
        return None
    # Source pixels one grid pixel spans at the worst block: its area shrinks with their square.
    x, y = area.at[0] + WARP_BLOCK / 2, area.at[1] + WARP_BLOCK / 2
    cols, rows = _to_source(src, grid, np.array([x, x + 1, x]), np.array([y, y, y + 1]))
    span = math.hypot(cols[1] - cols[0], rows[1] - rows[0]) * math.hypot(cols[2] - cols[0], rows[2] - rows[0])
    if not math.isfinite(span) or span <= 0:
        return None
    candidate = _round_down(resolution * math.sqrt(room / (WARP_BLOCK**2 * span * per_pixel)))
    for _ in range(8):
        if needs(srs_grid(src, grid.crs, candidate)) <= ACTIVITY_MEMORY_BYTES:
            return candidate
        candidate = _round_down(candidate * 0.9)
    return None


def _refuse_warp(
    path: str,
    src,
    grid: TargetGrid,
    area: WarpArea,
    warp: int,
    needed: int,
    window: int,
    blocks: Blocks,
    resolution: float | None,
    window_size: int,
) -> None:
    remedy = "a finer resolution"
    finer = _fitting_resolution(src, grid, area, resolution, window_size, blocks.read_bytes)
    if finer is not None:
        remedy = f"a finer resolution (resolution={finer:g} or less, in the target CRS's units)"
    raise UnsupportedRasterError(
        f"{path} on the {grid.name} ({grid.width} x {grid.height} pixels) is warped a {WARP_BLOCK} x {WARP_BLOCK} "
        f"block at a time, each from the source area it maps to, read whole at full resolution: the block at "
        f"column {area.at[0]}, row {area.at[1]} maps to {area.columns} x {area.rows} = {area.pixels} source "
        f"pixels, {warp} bytes ({mib(warp)}) decoded ({src.count} bands of {src.dtypes[0]}); with the window's "
        f"{window} bytes and the source block's {blocks.read_bytes} that is {needed} bytes ({mib(needed)}), "
        f"more than {_budget_words()}; accepted: {remedy}, or fewer bands per file (a smaller window "
        f"does not help: the warper reads a block's area whatever the window)"
    )


def check_jpeg2000_tile(path: str, stream: jpeg2000.Codestream, window_size: int) -> None:
    """What OpenJPEG holds to read one window, from the header before GDAL opens the file, must
    fit an activity (289 MiB): its structures for every tile (:attr:`~.jpeg2000.Codestream.header_bytes`),
    held from the header's reading on, a tile decoded whole in 32-bit samples of every component,
    and the window. A file of one tile is decoded by areas (:func:`~.jpeg2000.decode_unit`): what
    that holds is checked once GDAL has opened it and chosen them."""
    window = window_bytes(stream.components, stream.itemsize, stream.width, stream.height, window_size)
    tile = 0 if stream.single_tiled else stream.decoded_tile_bytes
    needed = stream.header_bytes + tile + window
    if needed <= ACTIVITY_MEMORY_BYTES:
        return
    per_sample = stream.components * jpeg2000.DECODED_SAMPLE_BYTES
    side = int(max(0, ACTIVITY_MEMORY_BYTES - window - stream.header_bytes) // per_sample) ** 0.5
    accepted = (
        f"tiles of at most {int(side) // 256 * 256} x {int(side) // 256 * 256} pixels at this band count"
        if stream.decoded_tile_bytes >= stream.header_bytes
        else "fewer, larger tiles (1024 x 1024 is what Sentinel-2 uses)"
    )
    raise UnsupportedRasterError(
        f"{path} is stored in {stream.tiles} JPEG 2000 tiles of {stream.tile_width} x {stream.tile_height} "
        f"pixels x {stream.components} components; reading a window holds OpenJPEG's structures for every "
        f"tile ({stream.header_bytes} bytes), a tile decoded whole in 32-bit samples ({tile} bytes) and the "
        f"window ({window} bytes): {needed} bytes ({mib(needed)}), more than the {ACTIVITY_MEMORY_BYTES} bytes "
        f"({mib(ACTIVITY_MEMORY_BYTES)}) one activity may hold ({ACTIVITY_SLOTS} run at once on an instance of "
        f"{INSTANCE_MEMORY_BYTES // MiB} MiB); accepted: {accepted} (`{jpeg2000.RETILE}`)"
    )


def check_carried_metadata(path: str, src) -> None:
    """Refuse an upload whose tags, as its tiles and mosaic would carry them (:func:`~.metadata.carried_sizes`),
    add up to more than :data:`MAX_CARRIED_METADATA_BYTES`, naming the largest. Header only.
    Metadata that is not UTF-8 text (a damaged label or tag: rasterio cannot decode its name) is
    refused as damaged: nothing could carry it."""
    try:
        sizes = metadata.carried_sizes(src)
    except UnicodeDecodeError as exc:
        raise InvalidRasterError(
            f"{path} has metadata whose names or values are not UTF-8 text ({exc}): the file is damaged; "
            "upload an intact file"
        ) from exc
    total = sum(sizes.values())
    if total <= MAX_CARRIED_METADATA_BYTES:
        return
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:3]
    named = ", ".join(f"{label} ({size} bytes)" for label, size in largest)
    raise UnsupportedRasterError(
        f"{path} has {total} bytes of tags and descriptions that every tile and the mosaic would carry in "
        f"their heads, more than the {MAX_CARRIED_METADATA_BYTES} bytes ({MAX_CARRIED_METADATA_BYTES // 1024} KiB) "
        f"a head reader takes in one request; the largest: {named}; accepted: at most "
        f"{MAX_CARRIED_METADATA_BYTES} bytes of them: remove or shorten the large ones first "
        "(`gdal_edit.py -unsetmd` or `gdal_translate -mo NAME=`)"
    )
