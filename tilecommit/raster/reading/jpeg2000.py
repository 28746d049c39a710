"""A JPEG 2000 (JP2) upload's header, read and checked before GDAL's JP2OpenJPEG driver parses it.

OpenJPEG allocates from what the codestream's main header declares: a structure per tile when it
reads the header, a whole tile of 32-bit samples per component when it decodes one (GDAL's
``frmts/opjlike/jp2opjlikedataset.cpp``, ``GetEstimatedRAMUsage``: "libopenjp2 holds the code
block values in a uint32_t array" and "ingests the codestream for a whole tile"). A few hundred
bytes can declare a 500000² image in tiles of one pixel, or tiles of gigabytes. So the boxes and
the main header are walked here, in Python, from the bytes the upload's reader serves, and the
numbers are checked (:func:`check_codestream`) before GDAL opens the file.

What is read (ISO/IEC 15444-1, Annex A for the codestream, Annex I for the JP2 boxes):

- the boxes before the contiguous codestream box ``jp2c`` (their headers only: GeoJP2 ``uuid``,
  GMLJP2 ``asoc`` and ``xml`` boxes are GDAL's to parse, restricted as docs/uploads.md says);
- the codestream's main header: SIZ (image and tile sizes, components, bit depths), COD and COC
  (decomposition levels, code-block size), TLM (tile-part lengths), up to the first SOT;
- the tile-parts' SOT markers, from TLM when the file has it, else walked one by one: every tile
  must have its bytes inside the file (a truncated upload is refused before a tile is written).

The module reads through the callable it is given and keeps no state: the job's reader
(``Source.read_at``) records a failed read as a storage fault, never as a damaged file.
"""

from __future__ import annotations

import re
import struct
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace

from ...errors import InvalidRasterError, UnsupportedRasterError

#: Top-level boxes walked before the codestream (a GDAL-written GMLJP2 file has seven).
MAX_BOXES = 256
#: Markers in the main header (SIZ, COD, QCD, TLM, COM..., a COC and a QCC per component at
#: most: a real one has a few dozen). Only SIZ, COD, COC and TLM are read; the others are skipped.
MAX_MARKERS = 1024
#: Tiles a source may have: each is indexed before any tile is written (as TIFF's blocks).
MAX_TILES = 262_144
#: The standard's limits (ISO/IEC 15444-1, Table A.15 and A.18): at most 32 decomposition levels;
#: code-block width and height exponents 2..10 each, their sum at most 12 (4096 samples).
MAX_LEVELS = 32
MAX_CODEBLOCK_EXPONENT_SUM = 12
#: Bit depths OpenJPEG decodes: its samples are 32-bit integers (GDAL maps up to 8 bits to Byte,
#: 16 to (U)Int16, more to (U)Int32).
MAX_BITS = 31
#: OpenJPEG's decoded sample: one 32-bit integer per sample of every component of a tile.
DECODED_SAMPLE_BYTES = 4
#: What OpenJPEG keeps for each tile, and each tile's component, from the moment it reads the
#: header (its coding parameters): measured with rasterio 1.4.4's GDAL 3.10.3, headers written byte
#: by byte, 40960² in 16384 tiles of one component +163 MiB, of eight components +281 MiB; 42025
#: tiles of one component +406 MiB. Rounded up.
HEADER_BYTES_PER_TILE = 9400
HEADER_BYTES_PER_TILE_COMPONENT = 1100

_SOC, _SOT, _EOC = 0xFF4F, 0xFF90, 0xFFD9
_SIZ, _COD, _COC, _TLM = 0xFF51, 0xFF52, 0xFF53, 0xFF55

Read = Callable[[int, int], bytes]


@dataclass(frozen=True)
class Codestream:
    """What a JPEG 2000 codestream's main header declares, and where its tiles' bytes are."""

    #: Where the codestream starts in the file, and its length (to the end of its box).
    offset: int
    length: int
    width: int
    height: int
    tile_width: int
    tile_height: int
    #: Image and tile-grid origins on the reference grid (XOsiz, YOsiz, XTOsiz, YTOsiz).
    origin: tuple[int, int]
    tile_origin: tuple[int, int]
    #: Per component: bit depth, signedness, subsampling (XRsiz, YRsiz).
    bits: tuple[int, ...]
    signed: tuple[bool, ...]
    subsampling: tuple[tuple[int, int], ...]
    #: The most decomposition levels, and the largest code-block (width, height), of COD and any COC.
    levels: int
    codeblock: tuple[int, int]
    #: The main header's TLM entries (tile index, or None where the order gives it; tile-part
    #: length), empty when it has none, and where the first tile-part starts.
    tlm: tuple[tuple[int | None, int], ...]
    first_sot: int
    #: Stored bytes of each tile, in raster order, and every tile-part as (tile, offset, length)
    #: (filled by :func:`index_tiles`).
    tile_bytes: tuple[int, ...] = ()
    parts: tuple[tuple[int, int, int], ...] = ()

    @property
    def components(self) -> int:
        return len(self.bits)

    @property
    def tiles_across(self) -> int:
        return -(-(self.origin[0] + self.width - self.tile_origin[0]) // self.tile_width)

    @property
    def tiles_down(self) -> int:
        return -(-(self.origin[1] + self.height - self.tile_origin[1]) // self.tile_height)

    @property
    def tiles(self) -> int:
        return self.tiles_across * self.tiles_down

    @property
    def single_tiled(self) -> bool:
        return self.tiles == 1

    @property
    def itemsize(self) -> int:
        """Bytes of one sample as GDAL hands it out (Byte, (U)Int16 or (U)Int32)."""
        deepest = max(self.bits)
        return 1 if deepest <= 8 else 2 if deepest <= 16 else 4

    def tile_area(self, index: int) -> tuple[int, int, int, int]:
        """Column, row, width, height of tile ``index`` in image pixels (clipped to the image)."""
        across, down = index % self.tiles_across, index // self.tiles_across
        x0 = max(self.tile_origin[0] + across * self.tile_width, self.origin[0])
        y0 = max(self.tile_origin[1] + down * self.tile_height, self.origin[1])
        x1 = min(self.tile_origin[0] + (across + 1) * self.tile_width, self.origin[0] + self.width)
        y1 = min(self.tile_origin[1] + (down + 1) * self.tile_height, self.origin[1] + self.height)
        return x0 - self.origin[0], y0 - self.origin[1], x1 - x0, y1 - y0

    @property
    def header_bytes(self) -> int:
        """What OpenJPEG holds from reading the header on: its structures for every tile."""
        return self.tiles * (HEADER_BYTES_PER_TILE + HEADER_BYTES_PER_TILE_COMPONENT * self.components)

    @property
    def decoded_tile_bytes(self) -> int:
        """What OpenJPEG holds to decode one tile: 32-bit samples of every component."""
        width = min(self.tile_width, self.width)
        height = min(self.tile_height, self.height)
        return width * height * self.components * DECODED_SAMPLE_BYTES

    def describe(self) -> str:
        return (
            f"{self.width} x {self.height} pixels, {self.components} components of {max(self.bits)} bits, "
            f"{self.tiles} tiles of {self.tile_width} x {self.tile_height}, {self.levels} decomposition levels, "
            f"code-blocks of {self.codeblock[0]} x {self.codeblock[1]}"
        )


def _u(data: bytes, fmt: str, at: int) -> tuple:
    return struct.unpack_from(">" + fmt, data, at)


class _Reader:
    """Exact reads of the file: fewer bytes than asked for (the file ends) is a truncated file."""

    def __init__(self, read: Read, size: int, path: str):
        self.read, self.size, self.path = read, size, path

    def exact(self, offset: int, length: int, what: str) -> bytes:
        data = self.read(offset, length) if offset + length <= self.size else b""
        if len(data) != length:
            raise InvalidRasterError(
                f"{self.path} is truncated: it has {self.size} bytes but its {what} needs bytes {offset}-"
                f"{offset + length - 1}; upload the complete file"
            )
        return data


def find_codestream(read: Read, size: int, path: str) -> tuple[int, int]:
    """Offset and length of the ``jp2c`` box's contents: the top-level boxes' headers walked."""
    reader, offset = _Reader(read, size, path), 0
    for _ in range(MAX_BOXES):
        if offset + 8 > size:
            break
        length, kind = _u(reader.exact(offset, 8, "box header"), "I4s", 0)
        header = 8
        if length == 1:
            (length,), header = _u(reader.exact(offset + 8, 8, "box length"), "Q", 0), 16
        elif length == 0:
            length = size - offset
        if length < header or offset + length > size:
            raise InvalidRasterError(
                f"{path} is truncated or damaged: its {kind!r} box at byte {offset} declares {length} bytes, "
                f"the file has {size - offset} from there; upload the complete file"
            )
        if kind == b"jp2c":
            return offset + header, length - header
        offset += length
    raise InvalidRasterError(
        f"{path} is a JP2 file without a codestream box (jp2c) among its first {MAX_BOXES} boxes: "
        "it is truncated or not an image; upload the complete file"
    )


def _coding_style(body: bytes, at: int) -> tuple[int, tuple[int, int]]:
    """Decomposition levels and code-block (width, height) of a COD's SPcod or COC's SPcoc at
    ``at`` (each side stored as its base-2 logarithm less 2)."""
    levels, xcb, ycb = _u(body, "BBB", at)
    return levels, (2 ** min(xcb + 2, 64), 2 ** min(ycb + 2, 64))


def _siz(body: bytes, path: str) -> dict:
    if len(body) < 36:
        raise InvalidRasterError(f"{path} has a damaged SIZ marker ({len(body)} bytes); upload an intact file")
    xsiz, ysiz, xo, yo, xt, yt, xto, yto, count = _u(body, "IIIIIIIIH", 2)
    if len(body) < 38 + 3 * count - 2 or count == 0:
        raise InvalidRasterError(f"{path} has a damaged SIZ marker ({count} components); upload an intact file")
    comps = [_u(body, "BBB", 36 + 3 * i) for i in range(count)]
    if not (xsiz > xo and ysiz > yo and xt and yt and xto <= xo and yto <= yo and xto + xt > xo and yto + yt > yo):
        raise InvalidRasterError(
            f"{path} declares an impossible image grid (SIZ: {xsiz} x {ysiz} from {xo},{yo}, tiles of {xt} x {yt} "
            f"from {xto},{yto}); upload an intact file"
        )
    return {
        "width": xsiz - xo,
        "height": ysiz - yo,
        "origin": (xo, yo),
        "tile_width": xt,
        "tile_height": yt,
        "tile_origin": (xto, yto),
        "bits": tuple((s & 0x7F) + 1 for s, _, _ in comps),
        "signed": tuple(bool(s & 0x80) for s, _, _ in comps),
        "subsampling": tuple((dx, dy) for _, dx, dy in comps),
    }


def _tlm_lengths(body: bytes) -> list[tuple[int | None, int]]:
    """(tile index or None when implicit, tile-part length) of each entry of one TLM marker."""
    stlm = body[1]
    index_size, length_size = (stlm >> 4) & 3, 4 if stlm & 0x40 else 2
    entry = index_size + length_size
    out: list[tuple[int | None, int]] = []
    for at in range(2, len(body) - entry + 1, entry):
        index = int.from_bytes(body[at : at + index_size], "big") if index_size else None
        out.append((index, int.from_bytes(body[at + index_size : at + entry], "big")))
    return out


def read_codestream(read: Read, size: int, path: str) -> Codestream:
    """The main header of the upload's codestream, from ``read`` (``read(offset, length)``: the
    upload's bytes). Raises :class:`InvalidRasterError` for a damaged or truncated header; reads
    no tile's data (:func:`index_tiles` finds the tiles)."""
    start, length = find_codestream(read, size, path)
    reader = _Reader(read, start + length, path)
    if _u(reader.exact(start, 2, "codestream start"), "H", 0)[0] != _SOC:
        raise InvalidRasterError(f"{path}'s codestream does not start with SOC; upload an intact file")
    offset, siz, levels, codeblock, tlm = start + 2, None, 0, (0, 0), []
    for _ in range(MAX_MARKERS):
        marker, size_ = _u(reader.exact(offset, 4, "main header"), "HH", 0)
        if marker == _SOT:
            break
        if marker >> 8 != 0xFF or size_ < 2:
            raise InvalidRasterError(
                f"{path} has a damaged codestream main header at byte {offset}; upload an intact file"
            )
        if marker in (_SIZ, _COD, _COC, _TLM):
            body = reader.exact(offset + 4, size_ - 2, f"marker {marker:04X}")
            try:
                if marker == _SIZ:
                    siz = _siz(body, path)
                elif marker == _TLM:
                    tlm.extend(_tlm_lengths(body))
                elif siz is not None:
                    # SPcod follows Scod and SGcod (5 bytes); SPcoc follows Ccoc (1 or 2 bytes) and Scoc.
                    at = 5 if marker == _COD else (2 if len(siz["bits"]) < 257 else 3)
                    found_levels, found_block = _coding_style(body, at)
                    levels = max(levels, found_levels)
                    codeblock = (max(codeblock[0], found_block[0]), max(codeblock[1], found_block[1]))
            except (struct.error, IndexError):
                raise InvalidRasterError(
                    f"{path} has a damaged marker {marker:04X} ({size_ - 2} bytes) at byte {offset}; upload an intact file"
                ) from None
        offset += 2 + size_
    else:
        raise InvalidRasterError(f"{path}'s codestream main header has more than {MAX_MARKERS} markers")
    if siz is None:
        raise InvalidRasterError(f"{path}'s codestream has no SIZ marker; upload an intact file")
    return Codestream(start, length, levels=levels, codeblock=codeblock, tlm=tuple(tlm), first_sot=offset, **siz)


def index_tiles(stream: Codestream, read: Read, path: str) -> Codestream:
    """``stream`` with each tile's stored bytes, from its TLM (no read) or else its SOT markers
    walked one by one; refused as truncated when a tile-part runs past the codestream or a tile
    has no bytes. Call after :func:`check_codestream` (the tile count is bounded there)."""
    end = stream.offset + stream.length
    stored = [0] * stream.tiles
    seen = [False] * stream.tiles
    parts: list[tuple[int, int, int]] = []
    if stream.tlm:
        offset = stream.first_sot
        for part, (tile, length) in enumerate(stream.tlm):
            tile = part if tile is None else tile
            if tile >= stream.tiles or length < 12:
                raise InvalidRasterError(
                    f"{path} has a damaged TLM marker (entry {part}: tile {tile} of {stream.tiles}, {length} bytes); "
                    "upload an intact file"
                )
            _check_inside(path, tile, offset, length, end)
            stored[tile] += length
            seen[tile] = True
            parts.append((tile, offset, length))
            offset += length
        return _complete(stream, stored, seen, parts, path)
    reader = _Reader(read, end, path)
    offset = stream.first_sot
    for part in range(MAX_TILES * 4):
        if offset + 2 > end or _u(reader.exact(offset, 2, "tile-part"), "H", 0)[0] == _EOC:
            break
        marker, _, tile, psot = _u(reader.exact(offset, 10, f"tile-part {part}"), "HHHI", 0)
        if marker != _SOT or tile >= stream.tiles:
            raise InvalidRasterError(
                f"{path} has a damaged tile-part at byte {offset} (marker {marker:04X}, tile {tile} of "
                f"{stream.tiles}); upload an intact file"
            )
        psot = psot or end - offset
        _check_inside(path, tile, offset, psot, end)
        stored[tile] += psot
        seen[tile] = True
        parts.append((tile, offset, psot))
        offset += psot
    return _complete(stream, stored, seen, parts, path)


def _check_inside(path: str, tile: int, offset: int, length: int, end: int) -> None:
    if offset + length > end:
        raise InvalidRasterError(
            f"{path} is truncated: tile {tile}'s data extends to byte {offset + length}, its codestream ends at "
            f"byte {end}; upload the complete file"
        )


def _complete(
    stream: Codestream, stored: list[int], seen: list[bool], parts: list[tuple[int, int, int]], path: str
) -> Codestream:
    missing = [i for i, present in enumerate(seen) if not present]
    if missing:
        col, row, _, _ = stream.tile_area(missing[0])
        raise InvalidRasterError(
            f"{path} is truncated: {len(missing)} of its {stream.tiles} tiles have no data (the first, tile "
            f"{missing[0]}, at column {col}, row {row}); upload the complete file"
        )
    return replace(stream, tile_bytes=tuple(stored), parts=tuple(parts))


#: What OpenJPEG reads past a tile's last tile-part: the next one's SOT marker (GDAL asks for 1 KiB).
NEXT_PART_PEEK = 1024


def window_ranges(stream: Codestream, col: int, row: int, width: int, height: int) -> list[tuple[int, int]]:
    """``(offset, size)`` of every tile-part of the tiles a window touches (OpenJPEG reads a tile
    whole), each with the first :data:`NEXT_PART_PEEK` bytes after it, which OpenJPEG reads too."""
    touched = set()
    for tile in range(stream.tiles):
        x, y, w, h = stream.tile_area(tile)
        if x < col + width and col < x + w and y < row + height and row < y + h:
            touched.add(tile)
    return [(offset, length + NEXT_PART_PEEK) for tile, offset, length in stream.parts if tile in touched]


#: Each source's tile index, for the windows read through it (one parse per open source).
_INDEXES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def indexed(source) -> Codestream | None:
    """The tile index of a JP2 upload read through ``source`` (a :class:`~.source.Source`), when
    its TLM markers give it without a read beyond the header's; None otherwise (a file without
    them would cost a read per tile-part: GDAL's own reads fetch its tiles then)."""
    if source not in _INDEXES:
        stream = read_codestream(source.read_at, source.file_size, source.name)
        _INDEXES[source] = index_tiles(stream, source.read_at, source.name) if stream.tlm else None
    return _INDEXES[source]


@dataclass(frozen=True)
class HeaderView:
    """The numbers of a :class:`Codestream` under the names an open dataset gives them, for the
    checks written for datasets (``scene._check_window_budget``), run before GDAL opens the file."""

    width: int
    height: int
    count: int
    dtypes: tuple[str, ...]

    @classmethod
    def of(cls, stream: Codestream) -> HeaderView:
        signed = any(stream.signed)
        dtype = {
            1: "int8" if signed else "uint8",
            2: "int16" if signed else "uint16",
            4: "int32" if signed else "uint32",
        }
        return cls(stream.width, stream.height, stream.components, (dtype[stream.itemsize],) * stream.components)


#: How a JPEG 2000 gets tiles a window can read: what the refusals say.
RETILE = "gdal_translate -of JP2OpenJPEG -co BLOCKXSIZE=1024 -co BLOCKYSIZE=1024 -co QUALITY=100 -co REVERSIBLE=YES"


def check_codestream(path: str, stream: Codestream, max_pixels: int) -> None:
    """Refuse, from the main header alone and before GDAL opens the file, what OpenJPEG would
    allocate for or cannot decode: each refusal gives the numbers and what is accepted."""
    if any(step != (1, 1) for step in stream.subsampling):
        raise UnsupportedRasterError(
            f"{path} has subsampled components ({list(stream.subsampling)} pixels per sample): accepted: every "
            "component at full resolution; convert it first (`gdal_translate -of COG in.jp2 out.tif`)"
        )
    if max(stream.bits) > MAX_BITS:
        raise UnsupportedRasterError(
            f"{path} has {max(stream.bits)}-bit samples: accepted: at most {MAX_BITS} bits (OpenJPEG's 32-bit samples)"
        )
    pixels = stream.width * stream.height
    if pixels > max_pixels:
        raise UnsupportedRasterError(
            f"{path} declares {stream.width} x {stream.height} = {pixels} pixels in its JPEG 2000 header, more than "
            f"the {max_pixels} allowed (TILECOMMIT_MAX_PIXELS); accepted: at most {max_pixels} pixels: split the "
            "scene, or raise the limit if the plan's time and memory allow"
        )
    if stream.tiles * stream.components > MAX_TILES:
        raise UnsupportedRasterError(
            f"{path} is stored in {stream.tiles} tiles of {stream.tile_width} x {stream.tile_height} pixels x "
            f"{stream.components} components ({stream.tiles * stream.components} tile-components; OpenJPEG keeps a "
            f"structure for each): accepted: at most {MAX_TILES}; re-encode it in larger tiles (`{RETILE}`)"
        )
    _check_coding_style(path, stream)


def _check_coding_style(path: str, stream: Codestream) -> None:
    """The standard's own limits on decomposition levels and code-blocks (a file past them is damaged)."""
    if stream.levels > MAX_LEVELS:
        raise InvalidRasterError(
            f"{path} declares {stream.levels} decomposition levels: JPEG 2000 allows at most {MAX_LEVELS} "
            "(ISO/IEC 15444-1, Table A.15): the header is damaged; upload an intact file"
        )
    width, height = stream.codeblock
    if not (4 <= width <= 1024 and 4 <= height <= 1024 and width * height <= 2**MAX_CODEBLOCK_EXPONENT_SUM):
        raise InvalidRasterError(
            f"{path} declares code-blocks of {width} x {height} samples: JPEG 2000 allows sides of 4 to 1024 and at "
            f"most {2**MAX_CODEBLOCK_EXPONENT_SUM} samples (ISO/IEC 15444-1, Table A.18): the header is damaged; "
            "upload an intact file"
        )


def decode_unit(stream: Codestream, gdal_block: tuple[int, int]) -> tuple[int, int, int]:
    """Width, height and stored bytes of what OpenJPEG decodes at once to serve any pixel of a
    window: a whole tile, with that tile's bytes; for a file of one tile, GDAL's block of it
    (``gdal_block``: (height, width); GDAL sets a decode area of that block: ``bUseSetDecodeArea``
    in GDAL's ``frmts/opjlike/jp2opjlikedataset.cpp``), with up to the whole codestream's bytes."""
    if stream.single_tiled:
        return gdal_block[1], gdal_block[0], stream.length
    largest = max(stream.tile_bytes, default=0)
    return min(stream.tile_width, stream.width), min(stream.tile_height, stream.height), largest


#: The GMLJP2 box, as GDAL's JP2 driver reports it (a metadata domain holding the XML).
GML_DOMAIN = "xml:gml.root-instance"


def unfollowed_crs_names(src) -> list[str]:
    """The CRS names (``srsName``) the GMLJP2 box of an open JP2 gives, for a refusal of a file
    left without a CRS: GDAL resolves EPSG codes, URNs and OGC CRS URLs from PROJ's database and
    looks any other name up only among the file's own boxes (``GMLSRSLookup``, GDAL's
    gcore/gdaljp2metadata.cpp), never fetching or opening it. Empty when it has none."""
    try:
        document = src.tags(ns=GML_DOMAIN).get(GML_DOMAIN, "")
    except UnicodeDecodeError:
        return []
    return sorted(set(re.findall(r'srsName="([^"]{1,300})"', document)))[:3]
