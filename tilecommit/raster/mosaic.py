"""Assemble a job's tiles into one COG mosaic, committed once, with its STAC item and quicklook.

Two ways to build the mosaic, both exact at full resolution:

``blocks`` (the default when the tiles allow it): the mosaic's full resolution and the overview
levels the tiles carry are the tiles' own compressed blocks, copied byte for byte into a new
TIFF layout (:mod:`tilecommit.raster.tiff`). Windows are a multiple of the 256-pixel block, so
every tile block is a mosaic block. Only the coarser levels are computed, by GDAL, from the last
copied level (1/16 of the pixels with 1024-pixel windows). Nothing at full resolution is decoded
or re-encoded, so assembly costs about what moving the bytes costs.

``vrt``: a VRT over the tiles, translated by GDAL's COG driver with the memory-bounding settings
of docs/design.md ('GDAL settings and raster figures') and ``OVERVIEWS=IGNORE_EXISTING`` (the VRT would otherwise lend the tiles'
overviews and the COG driver would write only some levels). Used when the tiles cannot be
block-copied (an internal mask, or tiles from an older encoding) and as the benchmark's reference.

Either way the result is checked (size, bands, georeferencing, every overview level) before
anything is committed. The block-copy mosaic is never a file: its layout (every directory) is
planned and checked first, then it is streamed front to back into staged blocks of the output
blob and committed create-only (Put Block List with ``If-None-Match: *``), then the committed blob
is checked again through /vsiaz/. The VRT path still writes a temporary file (GDAL's COG driver
needs one) and uploads it create-only.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import BinaryIO
from xml.sax.saxutils import escape

import rasterio
import rasterio.shutil
from azure.core import MatchConditions
from azure.core.exceptions import (
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.data.tables import TableClient
from azure.storage.blob import BlobClient, ContainerClient, ContentSettings
from rasterio.enums import MaskFlags, Resampling
from rasterio.errors import NotGeoreferencedWarning
from rasterio.io import MemoryFile

from .. import gates, jobs
from ..errors import (
    IncompatibleTilesError,
    IncompleteManifestError,
    InvalidRasterError,
    MosaicCheckError,
    StorageFaultError,
)
from ..grid import Window, plan_windows
from ..records import Record
from ..settings import Settings
from ..storage import vsiaz_path
from . import attempt, tiff
from .env import BLOCK_SIZE, NUM_THREADS, gdal_env
from .gdal_errors import gdal_step
from .scene import SceneInfo, as_crs, crs_label, same_crs
from .stac import mosaic_footprint, quicklook_png, stac_item_bytes
from .tiles import cog_creation_options, predictor_for, tile_overview_count

logger = logging.getLogger(__name__)

#: Bytes read from the start of each tile: a tile COG's directories and block arrays fit.
TILE_HEAD_BYTES = 16 * 1024
#: Concurrent ranged reads of tile blobs while copying blocks.
FETCH_THREADS = 8
#: Two block runs of one tile closer than this are fetched in one ranged read (leaders/trailers lie between).
MERGE_GAP_BYTES = 4096
#: Blob metadata key recording the mosaic's overview level count (read back by a duplicate call).
OVERVIEW_LEVELS_METADATA_KEY = "overview_levels"
#: Upload concurrency for the VRT path's staged upload of its file (each in-flight block is 4 MiB of memory).
UPLOAD_CONCURRENCY = 4
#: Bytes of the streamed (block-copy) mosaic buffered before they are sent as one staged block.
#: 50,000 blocks (Azure's limit) of 8 MiB allow a 400 GiB mosaic.
STREAM_BLOCK_BYTES = 8 * 1024 * 1024
#: While it streams, an attempt asks this often (one HEAD) whether another attempt has committed
#: the mosaic meanwhile, and stops if so: a duplicate that started late wastes seconds, not a
#: whole assembly.
COMMITTED_ELSEWHERE_CHECK_S = 2.0
#: Staged blocks in flight at once. Memory of the stream: the buffer plus this many blocks.
STAGE_IN_FLIGHT = 2
#: Temporary disk the VRT path may need before it logs a WARNING (the Consumption plan gives an
#: instance about 0.5 GB in all; the block-copy path needs only its 1/16 coarse-level copy).
TEMP_BUDGET_BYTES = 400 * 1000 * 1000

_TRANSPORT_FAULTS = (ServiceRequestError, ServiceResponseError)


@dataclass(frozen=True)
class MosaicResult(Record):
    outcome: str
    mosaic: str
    stac: str
    quicklook: str
    nbytes: int
    overview_levels: int
    timings: dict[str, float] = field(default_factory=dict)
    method: str = ""
    sha256: str = ""

    JSON_IN = {"timings": lambda timings: dict(timings or {})}


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


def mosaic_overview_levels(width: int, height: int, block_size: int = BLOCK_SIZE) -> int:
    """Overview levels a complete mosaic of ``width`` x ``height`` has (COG driver's rounding)."""
    return levels_to_fit(width, height, halve_floor, block_size)


def pyramid_problems(sizes: list[tuple[int, int]], block_size: int = BLOCK_SIZE) -> list[str]:
    """What is wrong with a pyramid (full resolution first): every level about half the previous
    one, the last fitting in one block and the one before it not (no level missing, none extra).

    A count alone is not enough to call a pyramid complete, and GDAL's COG validator checks
    neither (docs/design.md, 'GDAL settings and raster figures'), so this is checked on every mosaic before upload.
    """
    problems = []
    for k in range(1, len(sizes)):
        (pw, ph), (w, h) = sizes[k - 1], sizes[k]
        if not (halve_floor(pw) <= w <= halve_ceil(pw) + 1 and halve_floor(ph) <= h <= halve_ceil(ph) + 1):
            problems.append(f"level {k} is {w}x{h}, not half of {pw}x{ph}")
    w, h = sizes[-1]
    if w > block_size or h > block_size:
        problems.append(f"the smallest level, {w}x{h}, is larger than one {block_size}-pixel block: levels are missing")
    if len(sizes) > 1 and max(sizes[-2]) <= block_size:
        problems.append(f"level {len(sizes) - 1} is superfluous: the level before it already fits one block")
    return problems


# --------------------------------------------------------------------------- byte sources


class BlobRangeSource:
    """Ranged reads of one blob (a tile), checked against the size its manifest row recorded."""

    def __init__(self, container: ContainerClient, name: str, expected_size: int | None = None):
        self.container = container
        self.name = name
        self.expected_size = expected_size

    def head(self, length: int) -> tuple[bytes, int]:
        try:
            downloader = self.container.download_blob(self.name, offset=0, length=length, max_concurrency=1)
            data = downloader.readall()
        except ResourceNotFoundError as exc:
            raise IncompleteManifestError(
                f"tile {self.name} is in the manifest but not in storage", mismatched=[self.name]
            ) from exc
        except (HttpResponseError, *_TRANSPORT_FAULTS) as exc:
            raise StorageFaultError(f"reading the head of {self.name} failed: {exc}") from exc
        # For a ranged read, properties.size is the range's length; the blob's is after the "/".
        content_range = downloader.properties.content_range or ""
        total = content_range.rsplit("/", 1)[-1]
        return data, int(total) if total.isdigit() else int(downloader.properties.size)

    def read(self, offset: int, length: int) -> bytes:
        try:
            return self.container.download_blob(self.name, offset=offset, length=length, max_concurrency=1).readall()
        except (HttpResponseError, *_TRANSPORT_FAULTS) as exc:
            raise StorageFaultError(f"reading {length} bytes at {offset} of {self.name} failed: {exc}") from exc

    def __repr__(self) -> str:
        return f"blob:{self.name}"


class FileRangeSource:
    """Ranged reads of a local file (os.pread: safe from the fetcher's threads)."""

    def __init__(self, path: str):
        self.path = path
        self._fd: int | None = os.open(path, os.O_RDONLY)

    def read(self, offset: int, length: int) -> bytes:
        if self._fd is None:
            raise ValueError(f"{self.path} is closed")
        return os.pread(self._fd, length, offset)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __repr__(self) -> str:
        return f"file:{self.path}"


class BlockFetcher:
    """Yields a directory's blocks in order, reading each block row's runs concurrently.

    Blocks of one tile in one block row are stored next to each other (COG row-major order), so a
    row costs one ranged read per tile; the next row is fetched while the current one is written.
    Memory: two block rows of compressed data.
    """

    def __init__(self, sources: dict, executor: ThreadPoolExecutor, block_size: int = BLOCK_SIZE):
        self.sources = sources
        self.executor = executor
        self.block_size = block_size

    def _row_futures(self, refs: list[tiff.BlockRef]) -> list[tuple[Future, int, list[tuple[int, tiff.BlockRef]]]]:
        by_source: dict = {}
        for position, ref in enumerate(refs):
            if ref.length:
                by_source.setdefault(ref.source, []).append((position, ref))
        runs = []
        for key, items in by_source.items():
            items.sort(key=lambda item: item[1].offset)
            run: list[tuple[int, tiff.BlockRef]] = [items[0]]
            for item in items[1:]:
                last = run[-1][1]
                if item[1].offset - (last.offset + last.length) <= MERGE_GAP_BYTES:
                    run.append(item)
                else:
                    runs.append((key, run))
                    run = [item]
            runs.append((key, run))
        futures = []
        for key, run in runs:
            start = run[0][1].offset
            end = max(ref.offset + ref.length for _, ref in run)
            futures.append((self.executor.submit(self.sources[key].read, start, end - start), start, run))
        return futures

    def __call__(self, index: int, directory: tiff.OutputDirectory) -> Iterator[bytes]:
        across = -(-directory.width // self.block_size)
        rows = [directory.blocks[i : i + across] for i in range(0, len(directory.blocks), across)]
        pending = self._row_futures(rows[0]) if rows else []
        for r, row in enumerate(rows):
            current = pending
            pending = self._row_futures(rows[r + 1]) if r + 1 < len(rows) else []
            out: list[bytes] = [b""] * len(row)
            for future, start, run in current:
                data = future.result()
                for position, ref in run:
                    piece = data[ref.offset - start : ref.offset - start + ref.length]
                    if len(piece) != ref.length:
                        raise InvalidRasterError(f"{self.sources[ref.source]!r} is shorter than its directory says")
                    out[position] = piece
            yield from out


# --------------------------------------------------------------------------- manifest checks


def check_manifest(job_id: str, scene: SceneInfo, *, tiles: ContainerClient, manifest: TableClient, settings: Settings):
    """The planned windows and their manifest rows, or :class:`IncompleteManifestError`.

    Completeness comes from the manifest (never from listing the tiles); each row's byte count is
    then compared with its blob's stored size. The listing below only reads sizes, one request
    per 5,000 tiles instead of one HEAD per tile; a row naming a blob the listing lacks counts
    as a mismatch.
    """
    windows = plan_windows(scene.width, scene.height, settings.window_size)
    summary = gates.count_manifest(manifest, job_id)
    missing = [w.id for w in windows if w.id not in summary.entries]
    if missing:
        shown = ", ".join(missing[:20]) + (f" and {len(missing) - 20} more" if len(missing) > 20 else "")
        raise IncompleteManifestError(
            f"job {job_id}: {len(missing)} of {len(windows)} planned windows have no manifest row: {shown}",
            missing=missing,
        )
    prefix = f"tiles/{job_id}/"
    try:
        sizes = {b.name: int(b.size) for b in tiles.list_blobs(name_starts_with=prefix)}
    except (HttpResponseError, *_TRANSPORT_FAULTS) as exc:
        raise StorageFaultError(f"listing the sizes of {prefix} failed: {exc}") from exc
    mismatched = []
    details = []
    for window in windows:
        entry = summary.entries[window.id]
        stored = sizes.get(entry.uri)
        if stored is None and not entry.uri.startswith(prefix):
            try:
                stored = int(tiles.get_blob_client(entry.uri).get_blob_properties().size)
            except ResourceNotFoundError:
                stored = None
        if stored != entry.nbytes:
            mismatched.append(window.id)
            details.append(f"{window.id} ({entry.uri}: manifest {entry.nbytes} bytes, stored {stored})")
    if mismatched:
        raise IncompleteManifestError(
            f"job {job_id}: {len(mismatched)} tiles differ in size from their manifest rows: "
            + ", ".join(details[:20]),
            mismatched=mismatched,
        )
    return windows, summary


# --------------------------------------------------------------------------- building: blocks


@dataclass
class _TileHead:
    window: Window
    key: str
    layout: tiff.TiffLayout


def _read_tile_heads(windows: list[Window], summary, tiles: ContainerClient, executor) -> tuple[dict, list[_TileHead]]:
    sources = {}
    for window in windows:
        entry = summary.entries[window.id]
        sources[window.id] = BlobRangeSource(tiles, entry.uri, entry.nbytes)

    def one(window: Window) -> _TileHead:
        source = sources[window.id]
        head, size = source.head(TILE_HEAD_BYTES)
        if size != source.expected_size:
            raise IncompleteManifestError(
                f"tile {source.name} has {size} bytes, its manifest row says {source.expected_size}",
                mismatched=[window.id],
            )
        return _TileHead(window, window.id, tiff.read_layout(head, source.read))

    return sources, list(executor.map(one, windows))


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


def _check_tile_directory(head: _TileHead, d: tiff.Directory, key: tuple, expected: tuple[int, int], what: str) -> None:
    if (d.width, d.height) != expected:
        raise IncompatibleTilesError(f"tile {head.window.id} {what} is {d.width}x{d.height}, expected {expected}")
    if d.encoding_key() != key or d.tile_width != BLOCK_SIZE or d.tile_height != BLOCK_SIZE or d.planar_config != 1:
        raise IncompatibleTilesError(f"tile {head.window.id} {what} is encoded differently from tile 0000_0000")
    if len(d.block_offsets) != d.blocks_across * d.blocks_down or len(d.block_byte_counts) != len(d.block_offsets):
        raise IncompatibleTilesError(f"tile {head.window.id} {what} has an unexpected number of blocks")


def _plan_tile_levels(scene: SceneInfo, heads: list[_TileHead], settings: Settings) -> list[tiff.OutputDirectory]:
    """The mosaic's directories 0..K taken from the tiles' directories 0..K, or IncompatibleTilesError.

    Level k of the mosaic is the tiles' level k side by side: interior tiles contribute exactly
    window/2^k pixels (a whole number of blocks), edge tiles what the COG driver made of them.
    Stops at the first level that fits in one block, or at the tiles' last block-aligned level.
    Tiles with an internal mask give every level its mask, copied the same way (a 1-bit mask
    block covers the same 256 x 256 pixels as the image block beside it).
    """
    window_size = settings.window_size
    available = tile_overview_count(window_size)
    reference = heads[0].layout
    if heads[0].window.id != "0000_0000":
        raise IncompatibleTilesError("the first planned window is not 0000_0000")
    levels = {h.window.id: tile_levels(h.layout) for h in heads}
    reference_levels = levels["0000_0000"]
    masked = reference_levels[0][1] is not None
    grid = {(h.window.row, h.window.col): h for h in heads}
    rows = 1 + max(h.window.row for h in heads)
    cols = 1 + max(h.window.col for h in heads)
    out: list[tiff.OutputDirectory] = []
    for k in range(available + 1):
        if k >= len(reference_levels):
            raise IncompatibleTilesError(f"tile 0000_0000 has no overview level {k}")
        ref_dir, ref_mask = reference_levels[k]
        per_tile = window_size // 2**k // BLOCK_SIZE
        width = sum(_tile_level_size(grid[(0, c)].window.width, k) for c in range(cols))
        height = sum(_tile_level_size(grid[(r, 0)].window.height, k) for r in range(rows))
        for head in heads:
            tile = levels[head.window.id]
            if head.layout.byte_order != reference.byte_order:
                raise IncompatibleTilesError(f"tile {head.window.id} has another byte order")
            if len(tile) <= k:
                raise IncompatibleTilesError(f"tile {head.window.id} has no overview level {k}")
            if (tile[k][1] is not None) != masked:
                raise IncompatibleTilesError(
                    f"tile {head.window.id} level {k} {'lacks' if masked else 'has'} an internal mask"
                )
            expected = (_tile_level_size(head.window.width, k), _tile_level_size(head.window.height, k))
            _check_tile_directory(head, tile[k][0], ref_dir.encoding_key(), expected, f"level {k}")
            if masked:
                _check_tile_directory(head, tile[k][1], ref_mask.encoding_key(), expected, f"level {k} mask")

        def copied(
            which: int,
            reference_dir: tiff.Directory,
            subfile_type: int,
            *,
            k: int = k,
            width: int = width,
            height: int = height,
            per_tile: int = per_tile,
        ) -> tiff.OutputDirectory:
            blocks = []
            for by in range(-(-height // BLOCK_SIZE)):
                for bx in range(-(-width // BLOCK_SIZE)):
                    head = grid[(by // per_tile, bx // per_tile)]
                    d = levels[head.window.id][k][which]
                    index = (by % per_tile) * d.blocks_across + (bx % per_tile)
                    blocks.append(tiff.BlockRef(head.key, d.block_offsets[index], d.block_byte_counts[index]))
            tags = tiff.copyable_tags(reference_dir, width=width, height=height, subfile_type=subfile_type)
            return tiff.OutputDirectory(tags=tags, blocks=blocks, width=width, height=height)

        reduced = tiff.SUBFILE_REDUCED if k else 0
        image = copied(0, ref_dir, reduced)
        if masked:
            image.mask = copied(1, ref_mask, reduced | tiff.SUBFILE_MASK)
        out.append(image)
        if width <= BLOCK_SIZE and height <= BLOCK_SIZE:
            break
    return out


def _build_coarse_levels(
    scene: SceneInfo,
    base_directory: tiff.OutputDirectory,
    nodata_tag: tiff.Tag | None,
    byte_order: str,
    first_level: int,
    fetch: BlockFetcher,
    workdir: str,
    settings: Settings,
) -> tuple[list[tiff.OutputDirectory], FileRangeSource]:
    """The levels below ``first_level``, computed by GDAL from a copy of level ``first_level``.

    The copy is written block for block like the mosaic; GDAL then builds its internal overviews
    (bounded by GDAL_CACHEMAX and GDAL_OVR_CHUNK_MAX_SIZE) and their directories become the
    mosaic's coarse levels. A level with an internal mask is copied with it; GDAL then builds the
    mask's overviews too (after the image's, in the copy) and each is paired with its image by size.
    """
    base_path = os.path.join(workdir, f"level{first_level}.tif")
    tags = dict(base_directory.tags)
    tags.pop(tiff.NEW_SUBFILE_TYPE, None)
    if nodata_tag is not None:
        tags[tiff.GDAL_NODATA] = nodata_tag
    base = tiff.OutputDirectory(
        tags=tags, blocks=base_directory.blocks, width=base_directory.width, height=base_directory.height
    )
    if base_directory.mask is not None:
        mask = base_directory.mask
        subfile = tiff.pack_tag(tiff.NEW_SUBFILE_TYPE, tiff.TYPE_LONG, [tiff.SUBFILE_MASK], byte_order)
        mask_tags = {**mask.tags, subfile.code: subfile}
        base.mask = tiff.OutputDirectory(tags=mask_tags, blocks=mask.blocks, width=mask.width, height=mask.height)
    with open(base_path, "wb") as out:
        tiff.TiffWriter(byte_order).write(out, [base], fetch)
    factors = [2**j for j in range(1, levels_to_fit(base.width, base.height, halve_ceil) + 1)]
    with gdal_env(settings, {"PREDICTOR_OVERVIEW": predictor_for(scene.dtype)}), warnings.catch_warnings():
        # The level copy carries no georeferencing on purpose: only its blocks are reused.
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        step = f"computing the mosaic's overview levels below level {first_level}"
        with (
            gdal_step(step, window=f"level {first_level}, {base.width}x{base.height}"),
            rasterio.open(base_path, "r+") as dst,
        ):
            dst.build_overviews(factors, Resampling[scene.overview_resampling])
    source = FileRangeSource(base_path)
    with open(base_path, "rb") as f:
        layout = tiff.read_layout(f.read(TILE_HEAD_BYTES), source.read, max_directories=2 * len(factors) + 4)

    def coarse(d: tiff.Directory, subfile_type: int, what: str) -> tiff.OutputDirectory:
        if d.tile_width != BLOCK_SIZE or d.tile_height != BLOCK_SIZE or d.planar_config != 1:
            raise MosaicCheckError(f"computed {what} has blocks of {d.tile_width}x{d.tile_height}")
        blocks = [tiff.BlockRef("coarse", o, c) for o, c in zip(d.block_offsets, d.block_byte_counts, strict=True)]
        tags = tiff.copyable_tags(d, width=d.width, height=d.height, subfile_type=subfile_type)
        return tiff.OutputDirectory(tags=tags, blocks=blocks, width=d.width, height=d.height)

    reduced = [d for d in layout.directories if d.subfile_type == tiff.SUBFILE_REDUCED]
    masks = {
        (d.width, d.height): d for d in layout.directories if d.subfile_type == tiff.SUBFILE_REDUCED | tiff.SUBFILE_MASK
    }
    out_dirs = []
    for j, d in enumerate(reduced, start=1):
        image = coarse(d, tiff.SUBFILE_REDUCED, f"level {first_level + j}")
        if base.mask is not None:
            mask = masks.get((d.width, d.height))
            if mask is None:
                raise MosaicCheckError(f"GDAL built no mask for computed level {first_level + j}")
            image.mask = coarse(mask, tiff.SUBFILE_REDUCED | tiff.SUBFILE_MASK, f"level {first_level + j} mask")
        out_dirs.append(image)
    if len(out_dirs) != len(factors):
        raise MosaicCheckError(f"GDAL built {len(out_dirs)} coarse levels, {len(factors)} were asked for")
    return out_dirs, source


def build_mosaic_blocks(
    job_id: str,
    scene: SceneInfo,
    windows: list[Window],
    summary,
    out: BinaryIO,
    *,
    tiles: ContainerClient,
    settings: Settings,
    workdir: str,
    timings: dict[str, float],
    check_head: Callable[[bytes, int], None] | None = None,
) -> tuple[tiff.WrittenTiff, int]:
    """Lay the mosaic out from the tiles' directories and write it, front to back, into ``out``.

    ``out`` needs only ``write``: a :class:`StagedBlockSink` (assembly streams into the output
    blob) or a local file. ``check_head(head, levels)`` sees the planned header and directories
    before the first byte goes to ``out``; it raises to stop the build. The only file written is
    the copy of the last reused level (``workdir``), from which GDAL computes the coarse levels.
    """
    with ThreadPoolExecutor(max_workers=FETCH_THREADS, thread_name_prefix="tilefetch") as executor:
        started = time.perf_counter()
        sources, heads = _read_tile_heads(windows, summary, tiles, executor)
        timings["tile_heads"] = time.perf_counter() - started

        started = time.perf_counter()
        directories = _plan_tile_levels(scene, heads, settings)
        reference = heads[0].layout
        fetch = BlockFetcher(sources, executor)
        coarse_source = None
        if directories[-1].width > BLOCK_SIZE or directories[-1].height > BLOCK_SIZE:
            nodata = reference.directories[0].tags.get(tiff.GDAL_NODATA)
            coarse, coarse_source = _build_coarse_levels(
                scene, directories[-1], nodata, reference.byte_order, len(directories) - 1, fetch, workdir, settings
            )
            sources["coarse"] = coarse_source
            directories.extend(coarse)
        timings["coarse_levels"] = time.perf_counter() - started

        writer = tiff.TiffWriter(
            reference.byte_order,
            ghost=reference.ghost,
            leaders=reference.block_leaders,
            trailers=reference.block_trailers,
        )
        try:
            if check_head is not None:
                started = time.perf_counter()
                head, _ = writer.head(directories)
                check_head(head, len(directories) - 1)
                timings["check"] = time.perf_counter() - started
            started = time.perf_counter()
            written = writer.write(out, directories, fetch)
            timings["write"] = time.perf_counter() - started
        finally:
            if coarse_source is not None:
                coarse_source.close()
    return written, len(directories) - 1


# --------------------------------------------------------------------------- building: VRT


def _vrt_xml(scene: SceneInfo, windows: list[Window], summary, tiles_container: str) -> str:
    crs = as_crs(scene.crs).to_wkt(version="WKT2_2019")
    a, b, c, d, e, f = scene.transform[:6]
    gdal_type = {
        "uint8": "Byte",
        "int8": "Int8",
        "uint16": "UInt16",
        "int16": "Int16",
        "uint32": "UInt32",
        "int32": "Int32",
        "float32": "Float32",
        "float64": "Float64",
    }[scene.dtype]
    lines = [
        f'<VRTDataset rasterXSize="{scene.width}" rasterYSize="{scene.height}">',
        f"  <SRS>{escape(crs)}</SRS>",
        f"  <GeoTransform>{c!r}, {a!r}, {b!r}, {f!r}, {d!r}, {e!r}</GeoTransform>",
    ]

    def sources(band: str) -> list[str]:
        out = []
        for w in windows:
            path = vsiaz_path(tiles_container, summary.entries[w.id].uri)
            out.append(
                f'    <SimpleSource><SourceFilename relativeToVRT="0">{escape(path)}</SourceFilename>'
                f"<SourceBand>{band}</SourceBand>"
                f'<SourceProperties RasterXSize="{w.width}" RasterYSize="{w.height}" DataType="{gdal_type}" BlockXSize="{BLOCK_SIZE}" BlockYSize="{BLOCK_SIZE}"/>'
                f'<SrcRect xOff="0" yOff="0" xSize="{w.width}" ySize="{w.height}"/>'
                f'<DstRect xOff="{w.col_off}" yOff="{w.row_off}" xSize="{w.width}" ySize="{w.height}"/></SimpleSource>'
            )
        return out

    if scene.mask == "per-dataset":
        lines.append('  <MaskBand><VRTRasterBand dataType="Byte">')
        lines += sources("mask,1")
        lines.append("  </VRTRasterBand></MaskBand>")
    for band in range(1, scene.count + 1):
        lines.append(f'  <VRTRasterBand dataType="{gdal_type}" band="{band}">')
        if scene.nodata is not None:
            lines.append(f"    <NoDataValue>{scene.nodata!r}</NoDataValue>")
        if band <= len(scene.colorinterp):
            lines.append(f"    <ColorInterp>{scene.colorinterp[band - 1].capitalize()}</ColorInterp>")
        if band <= len(scene.descriptions) and scene.descriptions[band - 1]:
            lines.append(f"    <Description>{escape(scene.descriptions[band - 1])}</Description>")
        lines += sources(str(band))
        lines.append("  </VRTRasterBand>")
    lines.append("</VRTDataset>")
    return "\n".join(lines)


def _pyramid_share(levels: int) -> float:
    """Bytes of a pyramid of ``levels`` overviews relative to its full resolution (1 + 1/4 + ...)."""
    return sum(0.25**k for k in range(levels + 1))


#: Size of the COG driver's temporary overview file (``*.ovr.tmp``) relative to the overview
#: levels' size in the finished mosaic: measured 2.4 at 2048² and 4096² x 3 uint16 (GDAL 3.10.3).
VRT_OVR_TMP_FACTOR = 2.4


def estimate_vrt_temp_bytes(scene: SceneInfo, summary, settings: Settings) -> int:
    """Temporary disk the VRT path needs at its peak, from the tiles' stored sizes.

    The mosaic compresses about as its tiles do: their bytes, less the share of their own
    overviews, plus the mosaic's full pyramid (597 MB of mosaic from 588 MB of tiles at 10240²).
    While it writes, the COG driver also holds the overview levels in a temporary file beside
    the output (CPL_TMPDIR = workdir), larger than they end up. Measured peaks: 1.59 and 1.60
    times the mosaic (2048², 4096²); this estimate came within 1 % of both.
    """
    full = summary.total_bytes / _pyramid_share(tile_overview_count(settings.window_size))
    pyramid = _pyramid_share(mosaic_overview_levels(scene.width, scene.height))
    return int(full * pyramid + full * (pyramid - 1) * VRT_OVR_TMP_FACTOR)


def build_mosaic_vrt(
    scene: SceneInfo,
    windows: list[Window],
    summary,
    out_path: str,
    *,
    tiles: ContainerClient,
    settings: Settings,
    gdal_options: dict | None,
    workdir: str,
    timings: dict[str, float],
    num_threads: int = NUM_THREADS,
) -> tuple[int, int]:
    levels = mosaic_overview_levels(scene.width, scene.height)
    estimate = estimate_vrt_temp_bytes(scene, summary, settings)
    if estimate > TEMP_BUDGET_BYTES:
        logger.warning(
            "VRT assembly of a %dx%dx%d %s mosaic needs about %d MB of temporary disk in %s (the COG driver's "
            "output file and its overview file), over the %d MB budget: the Consumption plan gives an instance "
            "about 0.5 GB of temporary disk in all, so this may fail there (block copy streams instead)",
            scene.width,
            scene.height,
            scene.count,
            scene.dtype,
            estimate // 10**6,
            workdir,
            TEMP_BUDGET_BYTES // 10**6,
        )
    vrt_path = os.path.join(workdir, "mosaic.vrt")
    with open(vrt_path, "w", encoding="utf-8") as f:
        f.write(_vrt_xml(scene, windows, summary, tiles.container_name))
    options = cog_creation_options(
        scene.dtype, overview_count=levels, resampling=scene.overview_resampling, num_threads=num_threads
    )
    if levels:
        # A VRT over tiles lends their overviews; the COG driver would then copy those (2 of 5
        # levels when measured) instead of computing every level.
        options["OVERVIEWS"] = "IGNORE_EXISTING"
    started = time.perf_counter()
    # The COG driver writes its overviews to a temporary file beside the output: keep it in workdir.
    with (
        gdal_env(settings, {**(gdal_options or {}), "CPL_TMPDIR": workdir}, num_threads=num_threads),
        gdal_step(
            "assembling the mosaic through a VRT (COG driver)",
            window=f"{scene.width}x{scene.height}, {len(windows)} tiles",
        ),
    ):
        rasterio.shutil.copy(vrt_path, out_path, driver="COG", **options)
    timings["write"] = time.perf_counter() - started
    return os.path.getsize(out_path), levels


# --------------------------------------------------------------------------- check and commit


def check_mosaic_file(
    path: str,
    scene: SceneInfo,
    levels: int,
    *,
    settings: Settings,
    gdal_options: dict | None = None,
    label: str | None = None,
) -> None:
    """Refuse a mosaic whose shape, georeferencing or overview levels are not what was planned.

    ``path`` is anything GDAL opens: the VRT path's temporary file, the planned head of a
    block-copy mosaic (``/vsimem/``), or the committed blob (``/vsiaz/``, with ``gdal_options``).
    Only directories are read, never a block. GDAL's COG validator passes a file with missing
    overview levels (docs/design.md, 'GDAL settings and raster figures'), so the levels are counted here, and their sizes checked.
    """
    with (
        gdal_env(settings, gdal_options),
        gdal_step(f"checking {label or path}"),
        rasterio.open(path) as src,
    ):
        problems = []
        if (src.width, src.height, src.count) != (scene.width, scene.height, scene.count):
            problems.append(f"size {src.width}x{src.height}x{src.count}")
        if src.dtypes[0] != scene.dtype:
            problems.append(f"dtype {src.dtypes[0]}")
        if not src.transform.almost_equals(scene.affine, precision=1e-9):
            problems.append(f"transform {tuple(src.transform)[:6]}")
        if not same_crs(src.crs, scene.crs):
            found = "none" if src.crs is None else crs_label(src.crs)
            problems.append(f"crs {found} is not equivalent to the source's {crs_label(scene.crs)}")
        if (src.nodata is None) != (scene.nodata is None) or (
            scene.nodata is not None
            and not (math.isnan(scene.nodata) and math.isnan(src.nodata))
            and src.nodata != scene.nodata
        ):
            problems.append(f"nodata {src.nodata}")
        if scene.mask == "per-dataset" and not all(MaskFlags.per_dataset in flags for flags in src.mask_flag_enums):
            problems.append("no internal mask, while the source has one")
        if scene.colorinterp and [ci.name for ci in src.colorinterp] != scene.colorinterp:
            problems.append(
                f"colour interpretation {[ci.name for ci in src.colorinterp]} instead of {scene.colorinterp}"
            )
        factors = src.overviews(1)
        if len(factors) != levels:
            problems.append(f"{len(factors)} overview levels instead of {levels}")
        sizes = [(src.width, src.height)]
        for level in range(len(factors)):
            with rasterio.open(path, overview_level=level) as overview:
                sizes.append((overview.width, overview.height))
        problems += pyramid_problems(sizes)
        if src.block_shapes[0] != (BLOCK_SIZE, BLOCK_SIZE) and (src.width > BLOCK_SIZE or src.height > BLOCK_SIZE):
            problems.append(f"blocks {src.block_shapes[0]}")
        if problems:
            raise MosaicCheckError(f"{label or f'assembled mosaic {path}'} is wrong: " + "; ".join(problems))


def check_planned_mosaic(head: bytes, scene: SceneInfo, levels: int, *, settings: Settings, job_id: str = "") -> None:
    """:func:`check_mosaic_file` on the planned header and directories of a block-copy mosaic.

    Everything the check reads lives in the directories, which are complete before the first
    block is fetched, so a wrong shape, dtype, CRS, transform, nodata or pyramid is refused here
    without a byte sent (the head is a few tens of KB, held in /vsimem/).
    """
    with MemoryFile(head, ext=".tif") as memory:
        check_mosaic_file(memory.name, scene, levels, settings=settings, label=f"planned mosaic of job {job_id}")


def _remote_gdal_options(gdal_options: dict | None, remote: str) -> dict:
    """GDAL options for reading a just-committed blob: never from a cache filled before it existed."""
    return {**(gdal_options or {}), "CPL_VSIL_CURL_NON_CACHED": remote}


# --------------------------------------------------------------------------- streaming into a blob


class CommittedElsewhere(Exception):
    """Raised inside a stream when another attempt committed the blob meanwhile: stop, nothing to do."""


class StagedBlockSink:
    """A write-only file that streams into a block blob: every ``block_bytes`` become one Put Block.

    :meth:`close` stages the tail and waits for every block, returning the ids for
    :func:`commit_staged_blob`. Nothing is visible in the container until that commit: staged
    blocks are uncommitted (the service drops them after a week, or when the blob is committed
    from another list). Put Block carries no condition, and no claim keeps a second attempt
    from streaming into the same blob at the same time: each sink stages under ids of its own
    (:func:`attempt.block_id`, a random tag per sink), so the list it commits names only blocks
    it staged, and the create-only commit lets one list through.

    ``committed_elsewhere`` (a callable, asked at most every ``check_every_s`` seconds before a
    block is staged, the first time before the first block) ends the stream with
    :class:`CommittedElsewhere` when it answers True.

    Memory: ``in_flight + 1`` buffers of ``block_bytes``, allocated once and reused (one being
    filled, the others being sent; a block is sent from its buffer without a copy). Allocating a
    new 8 MiB object per block instead cost about 30 MB more peak RSS at 4096², which glibc kept
    after freeing.
    """

    def __init__(
        self,
        blob: BlobClient,
        *,
        block_bytes: int | None = None,
        in_flight: int | None = None,
        committed_elsewhere: Callable[[], bool] | None = None,
        check_every_s: float | None = None,
    ):
        self.blob = blob
        self.block_bytes = int(block_bytes or STREAM_BLOCK_BYTES)
        self.in_flight = int(in_flight or STAGE_IN_FLIGHT)
        if self.block_bytes <= 0 or self.in_flight <= 0:
            raise ValueError("block_bytes and in_flight must be positive")
        self.tag = attempt.new_attempt_tag()
        self.committed_elsewhere = committed_elsewhere
        self.check_every_s = COMMITTED_ELSEWHERE_CHECK_S if check_every_s is None else check_every_s
        self._checked_at: float | None = None
        self.nbytes = 0
        self.block_ids: list[str] = []
        self._free: list[bytearray] = []
        self._allocated = 0
        self._current: bytearray | None = None
        self._fill = 0
        self._pending: deque[tuple[Future, bytearray]] = deque()
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False

    def write(self, data: bytes) -> int:
        if self._closed:
            raise ValueError("write to a closed StagedBlockSink")
        with memoryview(data) as view:
            length, position = view.nbytes, 0
            while position < length:
                if self._current is None:
                    self._current, self._fill = self._take_buffer(), 0
                take = min(self.block_bytes - self._fill, length - position)
                self._current[self._fill : self._fill + take] = view[position : position + take]
                self._fill += take
                position += take
                if self._fill == self.block_bytes:
                    self._stage(self._current, self._fill)
                    self._current = None
        self.nbytes += length
        return length

    def _wait_oldest(self) -> None:
        future, buffer = self._pending.popleft()
        try:
            future.result()  # raises that block's fault, if any
        finally:
            self._free.append(buffer)

    def _take_buffer(self) -> bytearray:
        if not self._free and self._allocated <= self.in_flight:
            self._allocated += 1
            return bytearray(self.block_bytes)
        while not self._free:
            self._wait_oldest()
        return self._free.pop()

    def _check_committed_elsewhere(self) -> None:
        if self.committed_elsewhere is None:
            return
        now = time.monotonic()
        if self._checked_at is not None and now - self._checked_at < self.check_every_s:
            return
        self._checked_at = now
        if self.committed_elsewhere():
            raise CommittedElsewhere(f"{self.blob.blob_name} was committed by another attempt")

    def _stage(self, buffer: bytearray, length: int) -> None:
        self._check_committed_elsewhere()
        while len(self._pending) >= self.in_flight:
            self._wait_oldest()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=self.in_flight, thread_name_prefix="stageblock")
        index = len(self.block_ids)
        self.block_ids.append(attempt.block_id(self.tag, index))
        # The buffer is not written again until this future is done (_wait_oldest frees it).
        self._pending.append((self._executor.submit(self._put_block, index, memoryview(buffer)[:length]), buffer))

    def _put_block(self, index: int, chunk: memoryview) -> None:
        name = self.blob.blob_name
        for _ in range(gates.UNKNOWN_OUTCOME_ATTEMPTS):
            try:
                self.blob.stage_block(attempt.block_id(self.tag, index), chunk, length=chunk.nbytes)
                return
            except HttpResponseError as exc:
                raise StorageFaultError(
                    f"staging block {index} ({chunk.nbytes} bytes) of {name} failed: {exc}"
                ) from exc
            except _TRANSPORT_FAULTS as exc:
                # Staging our own id with the same bytes again is harmless: the later one replaces it.
                logger.warning("staging block %d of %s had no answer (%s): staging it again", index, name, exc)
        raise StorageFaultError(
            f"staging block {index} of {name}: no answer after {gates.UNKNOWN_OUTCOME_ATTEMPTS} attempts"
        )

    def close(self) -> list[str]:
        """Stage what is buffered, wait for every block, and return the block ids in order."""
        if not self._closed:
            try:
                if self._current is not None and self._fill:
                    self._stage(self._current, self._fill)
                    self._current = None
                while self._pending:
                    self._wait_oldest()
            except BaseException:
                self.abort()
                raise
            self._closed = True
            if self._executor is not None:
                self._executor.shutdown(wait=True)
            self._free.clear()
        return list(self.block_ids)

    def abort(self) -> None:
        """Give up: cancel blocks not yet sent, wait for those being sent, drop the buffers."""
        self._closed = True
        for future, _ in self._pending:
            future.cancel()
        self._pending.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
        self._current = None
        self._free.clear()


def commit_staged_blob(
    container: ContainerClient,
    name: str,
    block_ids: list[str],
    *,
    sha256: str,
    content_type: str,
    job_id: str = "",
    metadata: dict[str, str] | None = None,
) -> gates.Outcome:
    """Commit staged blocks as ``name`` only if nothing holds the key: Put Block List, ``If-None-Match: *``.

    The same outcomes and evidence as :func:`gates.commit_blob`: ``WRITTEN`` when this request
    created the blob; ``ALREADY_PRESENT`` on 409/412 (the stored sha256 is compared with ours; a
    difference is logged at WARNING and counted); a transport fault with an unknown outcome is
    resolved from the stored sha256 (ours: ``WRITTEN``; absent: the same conditional commit again,
    the blocks are still staged). The sha256 and ``metadata`` go into the blob in the same request.

    The condition is ``match_condition=MatchConditions.IfMissing`` alone: the SDK turns it into
    ``If-None-Match: *``. Adding ``etag="*"`` (the upload_blob trap of docs/design.md, 'Storage semantics') leaves
    ``etag`` among the keyword arguments the SDK hands to its transport, which raises TypeError
    (azure-storage-blob 12.31.1, ``_get_match_headers`` pops ``etag`` only for IfNotModified/IfModified).
    """
    blob = container.get_blob_client(name)
    return gates.create_once(
        blob,
        lambda: blob.commit_block_list(
            block_ids,
            content_settings=ContentSettings(content_type=content_type),
            metadata={**(metadata or {}), gates.SHA256_METADATA_KEY: sha256},
            match_condition=MatchConditions.IfMissing,
        ),
        digest=sha256,
        job_id=job_id,
    )


def commit_file(
    container: ContainerClient,
    name: str,
    path: str,
    *,
    sha256: str,
    content_type: str,
    job_id: str,
    metadata: dict[str, str] | None = None,
) -> gates.Outcome:
    """Create ``name`` from the file at ``path`` only if nothing holds the key (If-None-Match: *).

    Above 64 MiB the SDK stages blocks and the condition rides on Put Block List. The SDK gives
    every staged block a random id, so a concurrent duplicate's blocks are never in this list.
    """
    blob = container.get_blob_client(name)
    size = os.path.getsize(path)

    def upload() -> None:
        with open(path, "rb") as body:
            blob.upload_blob(
                body,
                length=size,
                overwrite=False,
                metadata={**(metadata or {}), gates.SHA256_METADATA_KEY: sha256},
                content_settings=ContentSettings(content_type=content_type),
                max_concurrency=UPLOAD_CONCURRENCY,
            )

    return gates.create_once(blob, upload, digest=sha256, job_id=job_id)


def _blob_exists(container: ContainerClient, name: str):
    try:
        return container.get_blob_client(name).get_blob_properties()
    except ResourceNotFoundError:
        return None
    except (HttpResponseError, *_TRANSPORT_FAULTS) as exc:
        raise StorageFaultError(f"reading the properties of {name} failed: {exc}") from exc


def _write_sidecars(
    job_id: str,
    scene: SceneInfo,
    *,
    output: ContainerClient,
    settings: Settings,
    gdal_options: dict | None,
    source_name: str,
    timings: dict[str, float],
) -> int:
    """Quicklook, then STAC item (which names both), each create-only; skipped when already there.

    Both are read from the committed mosaic through /vsiaz/ (the quicklook from its smallest
    overview: a few blocks), never from a local copy: there is none for a streamed mosaic, and a
    crash between the commits leaves the next call (which finds the mosaic present) the same
    source, so it writes the same bytes.
    """
    mosaic_name, stac_name, quicklook_name = (
        jobs.mosaic_blob_name(job_id),
        jobs.stac_blob_name(job_id),
        jobs.quicklook_blob_name(job_id),
    )
    props = _blob_exists(output, mosaic_name)
    if props is None:
        raise StorageFaultError(f"{mosaic_name} vanished after it was committed")
    sha = (props.metadata or {}).get(gates.SHA256_METADATA_KEY, "")
    remote = vsiaz_path(output.container_name, mosaic_name)
    with gdal_env(settings, _remote_gdal_options(gdal_options, remote)):
        started = time.perf_counter()
        if _blob_exists(output, quicklook_name) is None:
            with gdal_step(f"making the quicklook of {mosaic_name}", window="smallest overview"):
                quicklook = quicklook_png(remote)
            gates.commit_blob(output, quicklook_name, quicklook, content_type="image/png", job_id=job_id)
        timings["quicklook"] = time.perf_counter() - started
        started = time.perf_counter()
        if _blob_exists(output, stac_name) is None:
            with (
                gdal_step(f"reading the overview levels of {mosaic_name} for its STAC item"),
                rasterio.open(remote) as src,
            ):
                levels = len(src.overviews(1))
            body = stac_item_bytes(
                job_id=job_id,
                scene=scene,
                mosaic_href="./" + mosaic_name.rsplit("/", 1)[-1],
                quicklook_href="./" + quicklook_name.rsplit("/", 1)[-1],
                mosaic_nbytes=int(props.size),
                mosaic_sha256=sha,
                overview_levels=levels,
                created=props.creation_time or props.last_modified,
                footprint=mosaic_footprint(remote, scene.crs),
                source_name=source_name,
            )
            gates.commit_blob(output, stac_name, body, content_type="application/geo+json", job_id=job_id)
        timings["stac"] = time.perf_counter() - started
    return int(props.size)


def verify_committed_mosaic(
    output: ContainerClient,
    name: str,
    scene: SceneInfo,
    levels: int,
    *,
    settings: Settings,
    gdal_options: dict | None,
    written: tiff.WrittenTiff | None = None,
) -> None:
    """The checks of :func:`check_mosaic_file`, on the committed blob through /vsiaz/ (directories only).

    With ``written`` (this call committed it), the stored size and sha256 must also be the ones
    streamed. Raises :class:`MosaicCheckError`.
    """
    props = _blob_exists(output, name)
    if props is None:
        raise StorageFaultError(f"{name} vanished after it was committed")
    if written is not None:
        stored = (props.metadata or {}).get(gates.SHA256_METADATA_KEY)
        if int(props.size) != written.nbytes or stored != written.sha256:
            raise MosaicCheckError(
                f"committed mosaic {name} has {props.size} bytes and sha256 {stored}; "
                f"{written.nbytes} bytes with sha256 {written.sha256} were streamed"
            )
    remote = vsiaz_path(output.container_name, name)
    check_mosaic_file(
        remote,
        scene,
        levels,
        settings=settings,
        gdal_options=_remote_gdal_options(gdal_options, remote),
        label=f"committed mosaic {name}",
    )


def assemble_mosaic(
    job_id: str,
    scene: SceneInfo,
    *,
    tiles: ContainerClient,
    output: ContainerClient,
    manifest: TableClient,
    settings: Settings,
    gdal_options: dict | None = None,
    source_name: str = "",
    method: str = "auto",
    workdir: str | None = None,
) -> MosaicResult:
    """Assemble the job's tiles into ``jobs.mosaic_blob_name(job_id)`` once, plus STAC item and quicklook.

    ``method``: "auto" (block copy when the tiles allow it, else VRT), "blocks" or "vrt".
    Raises :class:`IncompleteManifestError` (missing windows, or a tile whose size differs from
    its row). Attempts running at the same time take no claim and never wait for each other: each
    stages under block ids of its own, the create-only commit lets one mosaic through and the
    other attempts return ``already-present`` (see :mod:`tilecommit.raster.attempt`).
    ``workdir`` (default: a private temporary directory, removed afterwards) holds the block
    path's coarse-level copy, or the VRT path's VRT and output file.
    """
    if method not in ("auto", "blocks", "vrt"):
        raise ValueError(f"method must be 'auto', 'blocks' or 'vrt', not {method!r}")
    mosaic_name = jobs.mosaic_blob_name(job_id)
    names = dict(mosaic=mosaic_name, stac=jobs.stac_blob_name(job_id), quicklook=jobs.quicklook_blob_name(job_id))
    timings: dict[str, float] = {}

    def already_present(existing) -> MosaicResult:
        # Its companions are written if a crash left them out.
        levels = int((existing.metadata or {}).get(OVERVIEW_LEVELS_METADATA_KEY, -1))
        if _blob_exists(output, names["stac"]) is None or _blob_exists(output, names["quicklook"]) is None:
            _write_sidecars(
                job_id,
                scene,
                output=output,
                settings=settings,
                gdal_options=gdal_options,
                source_name=source_name,
                timings=timings,
            )
        return MosaicResult(
            outcome=str(gates.Outcome.ALREADY_PRESENT),
            nbytes=int(existing.size),
            overview_levels=levels,
            timings=timings,
            method="none",
            sha256=(existing.metadata or {}).get(gates.SHA256_METADATA_KEY, ""),
            **names,
        )

    # 1. Cheap check first: a mosaic already there means nothing is rebuilt.
    started = time.perf_counter()
    existing = _blob_exists(output, mosaic_name)
    timings["exists_check"] = time.perf_counter() - started
    if existing is not None:
        return already_present(existing)

    # 2. The manifest says every window is done, with the stored sizes it recorded.
    started = time.perf_counter()
    windows, summary = check_manifest(job_id, scene, tiles=tiles, manifest=manifest, settings=settings)
    timings["manifest"] = time.perf_counter() - started

    # 3. No claim: a dead attempt's temporary directories are removed, its staged blocks are
    #    never in our list (and are discarded by our commit).
    own_workdir = workdir is None
    if own_workdir:
        attempt.sweep_dead_workdirs()
        workdir = attempt.new_workdir(job_id)
    sink: StagedBlockSink | None = None
    try:
        used = method
        if method in ("auto", "blocks"):
            # 4. Block copy, streamed: the layout is planned and checked (check_planned_mosaic: size,
            #    bands, dtype, CRS, transform, nodata, the pyramid level by level) before the first
            #    byte leaves, then the file goes front to back into staged blocks of the output blob.
            #    Another attempt may be streaming beside this one: if it commits first, this one
            #    stops at its next check (every COMMITTED_ELSEWHERE_CHECK_S) or at its own commit.
            sink = StagedBlockSink(
                output.get_blob_client(mosaic_name),
                committed_elsewhere=lambda: _blob_exists(output, mosaic_name) is not None,
            )

            def check_head(head: bytes, planned_levels: int) -> None:
                check_planned_mosaic(head, scene, planned_levels, settings=settings, job_id=job_id)

            try:
                written, levels = build_mosaic_blocks(
                    job_id,
                    scene,
                    windows,
                    summary,
                    sink,
                    tiles=tiles,
                    settings=settings,
                    workdir=workdir,
                    timings=timings,
                    check_head=check_head,
                )
                used = "blocks"
            except IncompatibleTilesError as exc:
                sink.abort()
                sink = None
                if method == "blocks":
                    raise
                logger.warning("job %s: tiles cannot be block-copied (%s); assembling through a VRT", job_id, exc)
                used = "vrt"

        if used == "blocks":
            assert sink is not None
            started = time.perf_counter()
            block_ids = sink.close()
            if sink.nbytes != written.nbytes:
                raise AssertionError(f"streamed {sink.nbytes} bytes, the writer wrote {written.nbytes}")
            nbytes, sha256 = written.nbytes, written.sha256
            outcome = commit_staged_blob(
                output,
                mosaic_name,
                block_ids,
                sha256=sha256,
                content_type=COG_CONTENT_TYPE,
                job_id=job_id,
                metadata={OVERVIEW_LEVELS_METADATA_KEY: str(levels), "method": used},
            )
            timings["upload"] = time.perf_counter() - started
            # 5. The committed blob, checked again through /vsiaz/ with the same function. It is
            #    checked after the commit, not before, because there is no file to check before: the
            #    bytes went straight to storage. That order is acceptable: the layout was checked
            #    before streaming, the bytes are a deterministic function of the tiles (a retry
            #    writes the same ones), and the list committed names only this attempt's blocks. A failure
            #    here is therefore a bug (the writer or the service did not produce what was
            #    planned) that repeating would not fix, so it is raised loudly (MosaicCheckError,
            #    not retryable) and the blob is left in place to be examined.
            started = time.perf_counter()
            verify_committed_mosaic(
                output,
                mosaic_name,
                scene,
                levels,
                settings=settings,
                gdal_options=gdal_options,
                written=written if outcome is gates.Outcome.WRITTEN else None,
            )
            timings["verify"] = time.perf_counter() - started
        else:
            # The VRT path: GDAL's COG driver writes a file (whose size build_mosaic_vrt estimates
            # and warns about), checked before its create-only upload.
            out_path = os.path.join(workdir, "mosaic.tif")
            nbytes, levels = build_mosaic_vrt(
                scene,
                windows,
                summary,
                out_path,
                tiles=tiles,
                settings=settings,
                gdal_options=gdal_options,
                workdir=workdir,
                timings=timings,
            )
            sha256 = _file_sha256(out_path)
            started = time.perf_counter()
            check_mosaic_file(out_path, scene, levels, settings=settings)
            timings["check"] = time.perf_counter() - started
            started = time.perf_counter()
            outcome = commit_file(
                output,
                mosaic_name,
                out_path,
                sha256=sha256,
                content_type=COG_CONTENT_TYPE,
                job_id=job_id,
                metadata={OVERVIEW_LEVELS_METADATA_KEY: str(levels), "method": used},
            )
            timings["upload"] = time.perf_counter() - started
            os.remove(out_path)

        _write_sidecars(
            job_id,
            scene,
            output=output,
            settings=settings,
            gdal_options=gdal_options,
            source_name=source_name,
            timings=timings,
        )
    except CommittedElsewhere:
        sink.abort()
        logger.info("job %s: another attempt committed the mosaic while this one streamed; stopped", job_id)
        existing = _blob_exists(output, mosaic_name)
        if existing is None:
            raise StorageFaultError(f"{mosaic_name} vanished after another attempt committed it") from None
        return already_present(existing)
    except BaseException:
        if sink is not None:
            sink.abort()
        raise
    finally:
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    logger.info(
        "job %s: mosaic %s (%s, %d bytes, %d overview levels, %s)",
        job_id,
        outcome,
        used,
        nbytes,
        levels,
        {k: round(v, 3) for k, v in timings.items()},
    )
    return MosaicResult(
        outcome=str(outcome),
        nbytes=nbytes,
        overview_levels=levels,
        timings=timings,
        method=used,
        sha256=sha256,
        **names,
    )


COG_CONTENT_TYPE = "image/tiff; application=geotiff; profile=cloud-optimized"


def _file_sha256(path: str) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


__all__ = [
    "CommittedElsewhere",
    "MosaicCheckError",
    "MosaicResult",
    "assemble_mosaic",
    "StagedBlockSink",
    "build_mosaic_blocks",
    "build_mosaic_vrt",
    "check_manifest",
    "check_mosaic_file",
    "check_planned_mosaic",
    "commit_file",
    "commit_staged_blob",
    "estimate_vrt_temp_bytes",
    "verify_committed_mosaic",
    "mosaic_overview_levels",
]
