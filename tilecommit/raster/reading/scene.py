"""What a source raster is (:class:`SceneInfo`) and whether this pipeline accepts it.

:func:`inspect_source` is the gate before any tile is written: every refusal is a typed
:class:`~tilecommit.errors.BadInputError` whose message says what is wrong and what would be
accepted, so a job fails at once instead of retrying an input that can never work.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from rasterio.crs import CRS
from rasterio.enums import ColorInterp, MaskFlags
from rasterio.errors import CRSError, RasterioIOError
from rasterio.windows import Window as RioWindow

from ... import profiles
from ...errors import InvalidRasterError, UnsupportedRasterError
from ...grid import plan_windows
from ...records import Record
from ...settings import Settings
from ...spec import OutputSpec
from ..env import gdal_env
from . import budgets, jpeg2000
from .acquisition import acquisition_of
from .alpha import WARP, alpha_band, check_alpha_options
from .budgets import MAX_BLOCK_BYTES, MAX_WINDOW_BYTES, Blocks, check_carried_metadata, check_window_reads
from .metadata import colour_interpretations, descriptions_of, has_colormap
from .scene_document import member_format, member_sources, member_spec, open_any_upload, read_document
from .source import Source, as_source, prefetch_window, source_of
from .upload import (
    ACCEPTED_FORMATS,
    HEADER_BYTES,
    JPEG2000,
    SCENE_DOCUMENT,
    TIFF,
    check_upload_content,
    upload_gdal_options,
)
from .warp import TargetGrid, target_grid

#: Sample types a tile COG, the mosaic and the quicklook handle (PREDICTOR 2 or 3 applies to all).
SUPPORTED_DTYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "float64")

ACCEPTED = (
    f"accepted: {ACCEPTED_FORMATS} with a CRS and a north-up affine geotransform (no rotation or shear), "
    "one sample type among " + ", ".join(SUPPORTED_DTYPES)
)

#: Most blocks a source may have: their offsets are checked one by one before any tile is written.
MAX_BLOCKS = 262_144
#: Sources up to this size (file bytes and decoded bytes) are decoded whole by the validation, so
#: a damaged block anywhere is refused before any tile is written; larger ones have their block
#: offsets checked and their last block decoded, and damage elsewhere is found by the window that
#: reads it.
FULL_DECODE_MAX_FILE_BYTES = 64 * 1024 * 1024
FULL_DECODE_MAX_DECODED_BYTES = 512 * 1024 * 1024

T = TypeVar("T")

#: What a file whose open failed started like, in a refusal's words, by the format's name.
_LOOKS_LIKE = {"GeoTIFF": "a TIFF", "JPEG 2000": "a JPEG 2000 (JP2) file", "NetCDF": "a NetCDF file"}


def _nodata_to_json(value: float | None) -> float | str | None:
    if value is None:
        return None
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return float(value)


def _nodata_from_json(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class SceneInfo(Record):
    """A source raster's shape, georeferencing and encoding: small, JSON-serialisable, no pixels.

    ``transform`` holds the six affine coefficients in rasterio's order ``(a, b, c, d, e, f)``:
    ``x = a * col + b * row + c``, ``y = d * col + e * row + f``.

    ``crs`` is the source's CRS as GDAL reads it, in WKT2 (2019): the whole definition, not an
    authority code GDAL or PROJ may attach to it (a WKT-only CRS can be identified as, say,
    ``IGNF:ETRS89LAEA`` whose definition differs in details). Compare CRSs with :func:`same_crs`.
    """

    width: int
    height: int
    count: int
    dtype: str
    crs: str
    transform: list[float]
    nodata: float | None
    block_shapes: list[list[int]]
    driver: str = ""
    descriptions: list[str | None] = field(default_factory=list)
    colorinterp: list[str] = field(default_factory=list)
    #: How validity is carried: "none", "nodata", "alpha" or "per-dataset" (an internal mask).
    mask: str = "none"
    #: The overview resampling used for tiles and mosaic ("nearest" for paletted data, else "average").
    overview_resampling: str = "average"
    nbytes: int | None = None
    #: Per band, what a pixel value means: value x scale + offset, in unit (empty: 1, 0, none;
    #: payloads from before these were kept have none).
    scales: list[float] = field(default_factory=list)
    offsets: list[float] = field(default_factory=list)
    units: list[str | None] = field(default_factory=list)
    #: When the pixels were acquired, RFC 3339 in UTC, from the source's IMAGERY
    #: ACQUISITIONDATETIME (:mod:`.acquisition`); None when it gives none (or payloads from before).
    acquired: str | None = None
    #: Why the source's ACQUISITIONDATETIME was not taken, when it has one that is not a time ("" otherwise).
    acquired_note: str = ""
    #: Per band, what a scene document says of it beside its name (the STAC item's eo:bands
    #: ``description``); empty for a single file (and payloads from before).
    band_notes: list[str] = field(default_factory=list)

    @property
    def pixels(self) -> int:
        return self.width * self.height

    @property
    def affine(self):
        from affine import Affine

        return Affine(*self.transform[:6])

    JSON_OUT = {"nodata": _nodata_to_json}

    def to_dict(self) -> dict:
        """The record; ``band_notes`` only when set, so a single file's scene is written as before."""
        data = super().to_dict()
        if not data["band_notes"]:
            del data["band_notes"]
        return data

    JSON_IN = {
        "nodata": _nodata_from_json,
        "transform": lambda values: [float(v) for v in values],
        "block_shapes": lambda shapes: [[int(a), int(b)] for a, b in shapes],
    }


def as_crs(value: str | CRS) -> CRS:
    """A CRS from what a SceneInfo holds (WKT; older payloads an authority code such as "EPSG:32633")."""
    return value if isinstance(value, CRS) else CRS.from_user_input(value)


def same_crs(a: str | CRS | None, b: str | CRS | None) -> bool:
    """Whether two CRSs are equivalent as GDAL and PROJ see them (OSRIsSame), not as strings or codes.

    A WKT-only CRS and the authority definition GDAL identifies it with are not always
    equivalent (towgs84, names of parameters); two WKTs of one CRS written by different software are.
    """
    if a is None or b is None:
        return a is None and b is None
    return as_crs(a) == as_crs(b)


def crs_label(value: str | CRS) -> str:
    """A short name for messages: its authority code when it is equivalent to it, else its WKT name."""
    crs = as_crs(value)
    epsg = crs.to_epsg()
    if epsg is not None and CRS.from_epsg(epsg) == crs:
        return f"EPSG:{epsg}"
    name = crs.to_dict(projjson=True).get("name") or "unnamed"
    return f"{name!r} (WKT, no equivalent EPSG code)"


def read_classified(src, read: Callable[[], T], what: str, invalid: Callable[[Exception], str]) -> T:
    """``read()`` on the open upload ``src``, with a failure called corrupt only when every byte arrived.

    The upload's reader records every read storage did not answer in full
    (:mod:`.source`); when one failed during ``read()`` the result is a retryable
    :class:`StorageFaultError` (or :class:`SourceChangedError`), whether GDAL raised or returned
    pixels. Only a GDAL failure with no such record is :class:`InvalidRasterError`
    (``invalid(exc)`` is its message): the bytes arrived and did not decode. The read is not
    repeated on the same dataset to find out: GDAL can return a block on a second read after
    failing to decode it (measured on the fuzz corpus: LZW "Not enough data", then a read that
    succeeded, then one that failed again), so a repeat's success proves nothing.
    """
    source = source_of(src)
    # A dataset opened otherwise (a local file a test or benchmark opened itself) has no reader
    # of ours to ask; the job's uploads are always opened with open_upload.
    with source.checked() if source is not None else nullcontext():
        try:
            return read()
        except RasterioIOError as exc:
            failed = exc
    raise InvalidRasterError(invalid(failed)) from failed


def _read_header(source: Source) -> tuple[bytes, int]:
    """The first bytes and the size of the upload, read before any GDAL driver sees it."""
    size = source.file_size
    with source.checked():
        head = source.read_at(0, HEADER_BYTES)
    return head, size


def _mask_kind(src) -> str:
    flags = src.mask_flag_enums
    if any(MaskFlags.alpha in band for band in flags):
        return "alpha"
    if any(MaskFlags.nodata in band for band in flags):
        return "nodata"
    if all(MaskFlags.per_dataset in band for band in flags):
        return "per-dataset"
    return "none"


def overview_resampling_for(src) -> str:
    """Average for measurements; nearest for paletted (class) data, where an average is meaningless."""
    return "nearest" if has_colormap(src) else "average"


def window_bytes(src, window_size: int) -> int:
    """Decoded bytes of the largest window of ``src`` at ``window_size`` (clipped to the scene)."""
    return budgets.window_bytes(src.count, np.dtype(src.dtypes[0]).itemsize, src.width, src.height, window_size)


def _check_window_budget(path: str, src, spec: OutputSpec) -> None:
    """Refuse a scene one of whose windows would need more than :data:`~.budgets.MAX_WINDOW_BYTES`
    decoded to render (:mod:`.budgets`: the figure, and how a window's render peaks at 6 times it).

    Only the header's numbers are used (band count, sample type, size), never a pixel, so a
    small file declaring tens of thousands of bands is refused at once, before any block is read.
    """
    needed = window_bytes(src, spec.window_size)
    if needed <= MAX_WINDOW_BYTES:
        return
    width, height = min(spec.window_size, src.width), min(spec.window_size, src.height)
    per_band = needed // src.count
    fits = range(spec.window_size - spec.block_size, 0, -spec.block_size)
    smaller = next((size for size in fits if window_bytes(src, size) <= MAX_WINDOW_BYTES), None)
    remedies = []
    if per_band <= MAX_WINDOW_BYTES:
        remedies.append(
            f"at most {MAX_WINDOW_BYTES // per_band} bands of {src.dtypes[0]} per file at this window size "
            "(split the bands into several files)"
        )
    if smaller is not None:
        remedies.append(f"a smaller window (TILECOMMIT_WINDOW_SIZE={smaller} fits {src.count} bands)")
    elif remedies:
        remedies[-1] += (
            f"; a smaller window would not do: the smallest, {spec.block_size} px, needs "
            f"{window_bytes(src, spec.block_size)} bytes"
        )
    remedy = "accepted: " + (" or ".join(remedies) or "fewer bands per file and a smaller window")
    raise UnsupportedRasterError(
        f"{path} has {src.count} bands of {src.dtypes[0]}: one {width} x {height} window of it needs "
        f"{needed} bytes ({needed / 2**20:.1f} MiB) decoded, more than the {MAX_WINDOW_BYTES} bytes "
        f"({MAX_WINDOW_BYTES // 2**20} MiB) a window may use; {remedy}"
    )


def _check_georeferencing(path: str, src, stream: jpeg2000.Codestream | None = None) -> None:
    """``stream``: a JPEG 2000's header, whose GMLJP2 box's CRS names a refusal then quotes."""
    transform = src.transform
    if src.crs is None or transform.is_identity:
        if src.gcps[0]:
            raise UnsupportedRasterError(
                f"{path} is georeferenced only by ground control points ({len(src.gcps[0])} GCPs): "
                "warp it to a regular grid first (gdalwarp); accepted: a CRS and an affine geotransform"
            )
        missing = "CRS" if src.crs is None else "geotransform"
        names = jpeg2000.unfollowed_crs_names(src) if stream is not None and src.crs is None else []
        named = (
            f" (its GMLJP2 box names its CRS {', '.join(map(repr, names))}: a name that is no EPSG code, URN or "
            "OGC CRS URL is looked up among the file's own boxes only, never fetched or opened)"
            if names
            else ""
        )
        raise UnsupportedRasterError(
            f"{path} has no georeferencing (it lacks a {missing}){named}: tiles and mosaic must be placed on the "
            "Earth; accepted: a raster with a CRS and an affine geotransform (e.g. a GeoTIFF with GeoKeys, a JP2 "
            "with a GeoJP2 or GMLJP2 box)"
        )
    if transform.b != 0 or transform.d != 0:
        raise UnsupportedRasterError(
            f"{path} has a rotated or sheared geotransform (b={transform.b}, d={transform.d}): "
            "accepted: north-up grids only (b = d = 0); warp it to a north-up grid first (gdalwarp)"
        )
    if transform.a == 0 or transform.e == 0:
        raise UnsupportedRasterError(f"{path} has a degenerate geotransform {tuple(transform)[:6]}: pixel size is zero")


def _check_samples(path: str, src) -> str:
    dtypes = set(src.dtypes)
    if len(dtypes) != 1:
        raise UnsupportedRasterError(
            f"{path} mixes sample types across bands ({', '.join(sorted(dtypes))}): a COG holds one; "
            f"convert every band to one of {', '.join(SUPPORTED_DTYPES)}"
        )
    dtype = src.dtypes[0]
    if dtype not in SUPPORTED_DTYPES:
        raise UnsupportedRasterError(
            f"{path} has sample type {dtype}, which this pipeline does not tile; "
            f"accepted: {', '.join(SUPPORTED_DTYPES)}"
        )
    nodatas = {("nan" if v is not None and math.isnan(v) else v) for v in src.nodatavals}
    if len(nodatas) > 1:
        raise UnsupportedRasterError(
            f"{path} has a different nodata value per band ({src.nodatavals}); a GeoTIFF stores one "
            "for all bands: set one nodata value"
        )
    return dtype


def _check_block_layout(path: str, src) -> None:
    """Refuse block shapes no real raster has before any block is read or listed.

    A few bytes of header can declare one giant block (GDAL would allocate it whole to read one
    pixel: more than an activity has, :data:`~.budgets.MAX_BLOCK_BYTES`) or millions of tiny ones
    (each checked below): both are refused with what to do instead. What reading a block of a
    file that passes costs is checked once its stored sizes are listed (:func:`_list_blocks`).
    """
    blocks = Blocks.of(src, stored=0)
    count = -(-src.height // blocks.height) * -(-src.width // blocks.width) * (src.count if blocks.samples == 1 else 1)
    if blocks.decoded > MAX_BLOCK_BYTES or count > MAX_BLOCKS:
        raise UnsupportedRasterError(
            f"{path} is stored in {count} blocks of {blocks.width} x {blocks.height} pixels ({blocks.decoded} bytes "
            f"each, decoded): accepted: blocks of at most {MAX_BLOCK_BYTES} bytes ({MAX_BLOCK_BYTES // 2**20} MiB, "
            f"what one activity may hold) and at most {MAX_BLOCKS} of them; save it tiled first "
            f"(`{budgets.RETILE}`)"
        )


def _decode(path: str, src, window: RioWindow) -> None:
    def decode():
        prefetch_window(src, window)
        return src.read(window=window)

    read_classified(
        src,
        decode,
        path,
        lambda exc: (
            f"{path} is corrupt: its pixels at column {int(window.col_off)}, row {int(window.row_off)} "
            f"({int(window.width)} x {int(window.height)}) cannot be decoded ({exc}); upload an intact file"
        ),
    )


@dataclass(frozen=True)
class BlockList:
    """What the header's block arrays say: the block stored last and the most bytes one block
    position stores (every band's block there, for a band-interleaved file)."""

    last_at: tuple[int, int] | None
    largest_stored: int


def _list_blocks(path: str, src, size: int | None) -> BlockList:
    """Refuse a truncated file, from the header: every full-resolution block's offset and byte
    count must lie inside the file (a cut-off upload fails this even when its directories, at the
    start of a COG, are intact). Reads no block."""
    block_h, block_w = src.block_shapes[0]
    bands = range(1, src.count + 1) if src.interleaving and src.interleaving.name == "BAND" else (1,)
    stored = np.zeros((-(-src.height // block_h), -(-src.width // block_w)), dtype=np.int64)
    last_end, last_at = -1, None
    for band in bands:
        for by in range(stored.shape[0]):
            for bx in range(stored.shape[1]):
                offset = src.get_tag_item(f"BLOCK_OFFSET_{bx}_{by}", "TIFF", bidx=band)
                count = src.get_tag_item(f"BLOCK_SIZE_{bx}_{by}", "TIFF", bidx=band)
                if offset is None or count is None:
                    continue
                end = int(offset) + int(count)
                if size is not None and end > size:
                    raise InvalidRasterError(
                        f"{path} is truncated: it has {size} bytes but block ({bx},{by}) of band {band} "
                        f"extends to byte {end}; upload the complete file"
                    )
                stored[by, bx] += int(count)
                if int(count) and end > last_end:
                    last_end, last_at = end, (bx, by)
    return BlockList(last_at, int(stored.max(initial=0)))


def _check_blocks_decode(path: str, src, size: int | None, window_size: int, listed: BlockList) -> None:
    """Refuse a damaged file before any tile is written.

    A source of at most ``FULL_DECODE_MAX_*`` bytes is read window by window, exactly as the job's
    windows will read it (GDAL takes different paths for different window shapes, and only the
    same reads are sure to succeed the same way), so damage anywhere is refused here; a larger
    one has the block stored last decoded, and damage inside another block is found when its
    window is rendered (:func:`render_tile` raises :class:`InvalidRasterError` then, naming the
    window). That block is decoded through a window of at most the job's size at its corner:
    GDAL decodes a block whole to read any pixel of it, and the read then holds what a job's
    window read holds (:mod:`.budgets`), not the whole block again as an array.
    """
    block_h, block_w = src.block_shapes[0]
    decoded = src.width * src.height * src.count * np.dtype(src.dtypes[0]).itemsize
    if size is not None and size <= FULL_DECODE_MAX_FILE_BYTES and decoded <= FULL_DECODE_MAX_DECODED_BYTES:
        for window in plan_windows(src.width, src.height, window_size):
            _decode(path, src, RioWindow(window.col_off, window.row_off, window.width, window.height))
        return
    # Every block empty (sparse): the bottom-right one stands for them.
    bx, by = listed.last_at or ((src.width - 1) // block_w, (src.height - 1) // block_h)
    col, row = bx * block_w, by * block_h
    _decode(
        path,
        src,
        RioWindow(col, row, min(block_w, window_size, src.width - col), min(block_h, window_size, src.height - row)),
    )


def scene_from_dataset(
    src, *, nbytes: int | None = None, choice: profiles.Choice = profiles.DEFAULT_CHOICE, path: str = ""
) -> SceneInfo:
    """``src`` described as the job's outputs will be, made with the profile ``choice``: its
    ``nodata`` override is the nodata value and decides the mask, as ``rio cogeo create --nodata``
    makes it (a source with an internal mask keeps one, masked by the value too); with
    ``add_mask`` the outputs have an internal mask and no nodata value, as ``--add-mask`` makes them.
    ``path`` names the source in the warning about an acquisition time that is not one.
    With ``add_mask`` on a source whose valid area is an alpha band, that band becomes the mask
    and the outputs have the other bands, as ``--add-mask`` drops it."""
    mask = _mask_kind(src)
    acquisition = acquisition_of(src, path or src.name)
    if choice.add_mask:
        mask = "per-dataset"
    elif choice.nodata is not None and mask != "per-dataset":
        mask = "nodata"
    dropped = alpha_band(src) if choice.add_mask else None
    bands = [band for band in src.indexes if band != dropped]
    scales, offsets = [float(src.scales[b - 1]) for b in bands], [float(src.offsets[b - 1]) for b in bands]
    units = [src.units[b - 1] or None for b in bands]
    descriptions = descriptions_of(src)
    return SceneInfo(
        width=src.width,
        height=src.height,
        count=len(bands),
        dtype=src.dtypes[0],
        crs=src.crs.to_wkt(version="WKT2_2019"),
        transform=[float(v) for v in tuple(src.transform)[:6]],
        nodata=choice.output_nodata(src.nodata),
        block_shapes=[[int(h), int(w)] for h, w in src.block_shapes],
        driver=src.driver,
        descriptions=[descriptions[b - 1] for b in bands],
        colorinterp=[ci.name for ci in colour_interpretations(src, bands)],
        mask=mask,
        overview_resampling=overview_resampling_for(src),
        nbytes=nbytes,
        # Kept only when some band says something, so a scene without them is described as before.
        scales=scales if any(v != 1.0 for v in scales) else [],
        offsets=offsets if any(v != 0.0 for v in offsets) else [],
        units=units if any(units) else [],
        acquired=acquisition.time,
        acquired_note=acquisition.note,
    )


def inspect_source(
    upload: str | os.PathLike | Source, *, settings: Settings, spec: OutputSpec, gdal_options: dict | None = None
) -> SceneInfo:
    """Check that ``upload`` (a local path, or a :class:`~.source.PinnedBlob`: one version of a
    blob) is an upload this pipeline accepts, and describe it.

    The first bytes decide, before any GDAL driver parses the file, that it is in an accepted
    format (see :mod:`.upload`; a JPEG 2000's header is then checked by the app itself,
    :func:`_jpeg2000_header`); it is then opened by that format's driver alone, every byte read through the
    upload's counted reader (:mod:`.source`). Raises :class:`InvalidRasterError` (not a TIFF;
    empty, truncated or corrupt) or :class:`UnsupportedRasterError` (another format; no or
    rotated georeferencing, too many pixels, absurd blocks, a sample type or band layout this
    pipeline does not handle), both :class:`BadInputError`; :class:`StorageFaultError` when
    storage did not deliver every byte asked for (retry); :class:`SourceChangedError` when the
    upload is no longer the version the job was started for. ``spec`` is the job's output spec:
    its windows are what a window's memory and the decoding check are measured by.
    """
    source = as_source(upload)
    path = source.name
    head, size = _read_header(source)
    upload_format = check_upload_content(path, head, size)
    stacked = upload_format is SCENE_DOCUMENT
    if stacked and (spec.choice.warped or spec.choice.add_mask):
        raise UnsupportedRasterError(
            f"{path} is a scene document and its profile {spec.profile!r} warps or adds a mask; accepted: a scene "
            "stacked on its members' grid (a profile without web_optimized, target_srs, resolution or add_mask)"
        )
    notes: list[str] = []
    if stacked:  # every member checked as an upload, before the stack is opened
        document = read_document(source)
        notes = [band.description for band in document.bands] if any(b.description for b in document.bands) else []
        members = member_sources(source, document)
        for member in members:
            member_format(member)
            inspect_source(member, settings=settings, spec=member_spec(spec), gdal_options=gdal_options)
        size = sum(member.file_size for member in members)
    with gdal_env(settings, {**(gdal_options or {}), **upload_gdal_options(source.path, upload_format)}):
        stream = _jpeg2000_header(path, source, size, settings, spec) if upload_format is JPEG2000 else None
        try:
            src = open_any_upload(source, upload_format=upload_format, variable=spec.choice.variable)
        except RasterioIOError as exc:
            raise InvalidRasterError(
                f"{path} starts like {_LOOKS_LIKE.get(upload_format.name, upload_format.name)} but its header or directories cannot be read "
                f"({size} bytes): the file is truncated or corrupt ({exc}); upload the complete file"
            ) from exc
        with src, source.checked():
            if src.count == 0:
                raise InvalidRasterError(f"{path} has no raster bands; {ACCEPTED}")
            if src.width * src.height > settings.max_pixels:
                raise UnsupportedRasterError(
                    f"{path} has {src.width} x {src.height} = {src.width * src.height} pixels, more than the "
                    f"{settings.max_pixels} allowed (TILECOMMIT_MAX_PIXELS); accepted: at most {settings.max_pixels} "
                    "pixels: split the scene, or raise the limit if the plan's time and memory allow"
                )
            _check_samples(path, src)
            # The alpha band from the header's colour interpretation, not from GDAL's mask flags:
            # asking for those before the checks below let a damaged file of the fuzz corpus
            # (directory-field-025-striped-raw-rgb.tif) pass the decode check it fails otherwise
            # (its first window then failed at rendering; observed, the mechanism not traced).
            alpha = any(ci == ColorInterp.alpha for ci in src.colorinterp)
            nodata = spec.choice.nodata_for(src.nodata)
            profiles.check_for(spec.choice, src.dtypes[0], count=src.count, nodata=nodata, alpha=alpha)
            _check_window_budget(path, src, spec)
            _check_georeferencing(path, src, stream)
            grid = _target_grid(path, src, settings, spec.choice) if spec.choice.warped else None
            if not stacked:  # a stack's blocks are its members', each checked above
                if stream is not None:
                    listed, blocks = _jpeg2000_blocks(src, stream)
                else:
                    _check_block_layout(path, src)
                    # A TIFF's block arrays, read from its tags; a NetCDF chunk is counted at its decoded size.
                    listed = _list_blocks(path, src, size) if upload_format is TIFF else BlockList(None, 0)
                    blocks = Blocks.of(src, stored=listed.largest_stored or Blocks.of(src, stored=0).decoded)
                # The budgets of a window's read, from the header (and the target grid): before any block is decoded.
                check_window_reads(path, src, spec, blocks, grid, resolution=spec.choice.resolution)
                _check_blocks_decode(path, src, size, spec.window_size, listed)
            # After the decode check, as the mask flags: listing the metadata domains before it let
            # directory-field-025-striped-raw-rgb.tif of the fuzz corpus pass it (and fail its first window).
            check_carried_metadata(path, src)
            check_alpha_options(path, src, spec.choice, _mask_kind(src))
            scene = dataclasses.replace(
                scene_from_dataset(src, nbytes=size, choice=spec.choice, path=path), band_notes=notes
            )
            if grid is not None:
                return on_target_grid(path, src, scene, grid, spec.choice)
            return scene


def _jpeg2000_header(path: str, source: Source, size: int, settings: Settings, spec: OutputSpec) -> jpeg2000.Codestream:
    """A JPEG 2000 upload's codestream header, checked before GDAL (and OpenJPEG) parse it: what
    it declares must fit the pixel limit, the standard, a window's memory and what OpenJPEG holds
    (:func:`~.jpeg2000.check_codestream`, :func:`_check_window_budget`,
    :func:`~.budgets.check_jpeg2000_tile`), and every tile's bytes
    must be in the file (:func:`~.jpeg2000.index_tiles`). A read that failed is a storage fault."""
    with source.checked():
        stream = jpeg2000.read_codestream(source.read_at, size, path)
        jpeg2000.check_codestream(path, stream, settings.max_pixels)
        _check_window_budget(path, jpeg2000.HeaderView.of(stream), spec)
        budgets.check_jpeg2000_tile(path, stream, spec.window_size)
        return jpeg2000.index_tiles(stream, source.read_at, path)


def _jpeg2000_blocks(src, stream: jpeg2000.Codestream) -> tuple[BlockList, Blocks]:
    """What reading a JPEG 2000 upload's window holds (:func:`~.jpeg2000.decode_unit`, in
    OpenJPEG's 32-bit samples), and its last tile as GDAL's block to decode for the damage check."""
    width, height, stored = jpeg2000.decode_unit(stream, src.block_shapes[0])
    blocks = Blocks(
        width=width,
        height=height,
        samples=stream.components,
        itemsize=jpeg2000.DECODED_SAMPLE_BYTES,
        dtype="int32 (OpenJPEG's decoded samples)",
        stored=stored,
    )
    block_h, block_w = src.block_shapes[0]
    col, row, _, _ = stream.tile_area(stream.tiles - 1)
    return BlockList((col // block_w, row // block_h), stored), blocks


def _target_grid(path: str, src, settings: Settings, choice: profiles.Choice) -> TargetGrid:
    """The grid of :func:`~.warp.target_grid` a warped job's outputs are on (web-optimized, or
    ``target_srs`` / ``resolution``), from the header alone. Refused with the reason: a grid GDAL
    cannot compute (no transformation to the target CRS), a grid over the pixel limit."""
    target = "WebMercatorQuad (EPSG:3857)" if choice.web_optimized else choice.target_srs or "its own CRS"
    try:
        grid = target_grid(src, choice)
    except (CRSError, RasterioIOError, ValueError) as exc:
        raise UnsupportedRasterError(
            f"{path} cannot be placed on a grid of {target}: {exc}; accepted: a source whose CRS transforms to "
            "it, or this source without the options that warp it"
        ) from exc
    if grid.width * grid.height > settings.max_pixels:
        raise UnsupportedRasterError(
            f"{path} on the {grid.name} is {grid.width} x {grid.height} = {grid.width * grid.height} pixels, more "
            f"than the {settings.max_pixels} allowed (TILECOMMIT_MAX_PIXELS); accepted: a scene whose target grid "
            "has at most that many pixels (a coarser resolution)"
        )
    return grid


def on_target_grid(path: str, src, scene: SceneInfo, grid: TargetGrid, choice: profiles.Choice) -> SceneInfo:
    """``scene`` as a warped job's outputs are: on ``grid`` (:func:`_target_grid`), the source's
    bands, sample type, nodata and mask (an internal mask becomes the warped footprint's, as
    rio-cogeo makes it from the warper's alpha). A source whose valid area is an alpha band keeps
    it, warped as the warper's alpha (:func:`~.warp.warped`), or, with ``add_mask``, has it as the mask.

    Refused with the reason: an internal mask with a ``nodata`` override (rio-cogeo then writes a
    mask made of the value alone, unlike any other job's; so too with the source's own nodata
    value; an alpha band with a ``nodata`` override: :func:`~.alpha.check_alpha_options`).
    """
    own, nodata_override, warp = _mask_kind(src), choice.nodata, WARP
    nodata = nodata_override if nodata_override is not None else src.nodata
    if own == "per-dataset" and nodata is not None:
        whose = "the profile's" if nodata_override is not None else "its own"
        raise UnsupportedRasterError(
            f"{path} has an internal mask, and {whose} nodata={nodata:g} would replace it in {warp}, which "
            "takes one or the other; accepted: a source with a nodata value or an internal mask, not both, and "
            "no nodata option with an internal mask"
        )
    return dataclasses.replace(
        scene,
        width=grid.width,
        height=grid.height,
        crs=grid.crs.to_wkt(version="WKT2_2019"),
        transform=[float(v) for v in tuple(grid.transform)[:6]],
    )
