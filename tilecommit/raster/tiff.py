"""Just enough TIFF to copy compressed blocks from tile COGs into a mosaic COG.

The mosaic's full-resolution level (and the overview levels the tiles carry, while they are
block-aligned) is made of exactly the compressed blocks the tiles already hold: same compression,
predictor, sample layout and byte order, so a block's bytes mean the same thing in either file.
This module reads a TIFF's directories (IFDs: image sizes, tags, block offsets and byte counts)
and writes a TIFF whose directories point at blocks copied verbatim, in the Cloud-Optimized
layout GDAL's COG driver uses: every directory first, then the blocks of the smallest overview,
..., then the full-resolution blocks, each in row-major order.

No pixel is decoded here; GDAL remains the only codec.

Why not tifffile for the reading side: it decodes tag values, where copying a directory needs
each tag's raw bytes in the file's byte order; it reads from a seekable file, where a tile's
head is read once and anything beyond it with a ranged GET; and the reader here is about 90
lines, against a new dependency of the deployed app. GDAL stays the check: the tests compare
this reader's block arrays with GDAL's and read every written file back with GDAL.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..errors import InvalidRasterError
from .tiff_blocks import BlockArray, BlockOrder, BlockRef, block_lengths, concatenated


class Writable(Protocol):
    """Where a file is written: a local file, or a sink staging blocks (only ``write`` is called)."""

    def write(self, data: bytes, /) -> int: ...


# Tag codes used by name.
NEW_SUBFILE_TYPE = 254
IMAGE_WIDTH = 256
IMAGE_LENGTH = 257
BITS_PER_SAMPLE = 258
COMPRESSION = 259
PHOTOMETRIC = 262
STRIP_OFFSETS = 273
SAMPLES_PER_PIXEL = 277
STRIP_BYTE_COUNTS = 279
PLANAR_CONFIG = 284
PREDICTOR = 317
TILE_WIDTH = 322
TILE_LENGTH = 323
TILE_OFFSETS = 324
TILE_BYTE_COUNTS = 325
SUB_IFDS = 330
EXTRA_SAMPLES = 338
SAMPLE_FORMAT = 339
JPEG_TABLES = 347
YCBCR_SUBSAMPLING = 530
EXIF_IFD = 34665
GPS_IFD = 34853
GDAL_NODATA = 42113
LERC_PARAMETERS = 50674

#: Tags whose values are file offsets into the *source* file: copying them would point nowhere.
#: The block arrays are rebuilt; any other offset-valued tag makes a directory uncopyable.
OFFSET_TAGS = frozenset({STRIP_OFFSETS, STRIP_BYTE_COUNTS, SUB_IFDS, EXIF_IFD, GPS_IFD, 513, 514})

#: NewSubfileType bits.
SUBFILE_REDUCED = 1
SUBFILE_MASK = 4

# TIFF field types: code -> (struct format char, size in bytes).
_TYPES: dict[int, tuple[str, int]] = {
    1: ("B", 1),  # BYTE
    2: ("s", 1),  # ASCII
    3: ("H", 2),  # SHORT
    4: ("I", 4),  # LONG
    5: ("II", 8),  # RATIONAL
    6: ("b", 1),  # SBYTE
    7: ("s", 1),  # UNDEFINED
    8: ("h", 2),  # SSHORT
    9: ("i", 4),  # SLONG
    10: ("ii", 8),  # SRATIONAL
    11: ("f", 4),  # FLOAT
    12: ("d", 8),  # DOUBLE
    13: ("I", 4),  # IFD
    16: ("Q", 8),  # LONG8 (BigTIFF)
    17: ("q", 8),  # SLONG8 (BigTIFF)
    18: ("Q", 8),  # IFD8 (BigTIFF)
}
_BIGTIFF_ONLY_TYPES = frozenset({16, 17, 18})
TYPE_SHORT, TYPE_LONG, TYPE_LONG8 = 3, 4, 16

#: The largest offset a classic TIFF can hold.
CLASSIC_LIMIT = 2**32 - 1

#: The structural metadata GDAL writes after the header of a COG (its "ghost area").
GHOST_PREFIX = b"GDAL_STRUCTURAL_METADATA_SIZE="


@dataclass(frozen=True)
class Tag:
    """One directory entry, its value kept as the raw bytes of the file (in its byte order)."""

    code: int
    type: int
    count: int
    data: bytes
    #: Where the value's bytes are in the file it was read from (-1: a tag made here).
    position: int = field(default=-1, compare=False)


@dataclass
class Directory:
    """One image file directory: an image (full resolution, an overview or a mask) and its blocks."""

    tags: dict[int, Tag]
    byte_order: str  # "<" or ">"
    offset: int = 0

    def values(self, code: int) -> tuple:
        tag = self.tags.get(code)
        if tag is None:
            return ()
        return unpack_values(tag, self.byte_order)

    def value(self, code: int, default: int | None = None) -> int | None:
        values = self.values(code)
        return int(values[0]) if values else default

    @property
    def width(self) -> int:
        return int(self.value(IMAGE_WIDTH, 0) or 0)

    @property
    def height(self) -> int:
        return int(self.value(IMAGE_LENGTH, 0) or 0)

    @property
    def tile_width(self) -> int | None:
        return self.value(TILE_WIDTH)

    @property
    def tile_height(self) -> int | None:
        return self.value(TILE_LENGTH)

    @property
    def subfile_type(self) -> int:
        return int(self.value(NEW_SUBFILE_TYPE, 0) or 0)

    @property
    def planar_config(self) -> int:
        return int(self.value(PLANAR_CONFIG, 1) or 1)

    @property
    def block_offsets(self) -> tuple[int, ...]:
        return tuple(int(v) for v in self.values(TILE_OFFSETS))

    @property
    def block_byte_counts(self) -> tuple[int, ...]:
        return tuple(int(v) for v in self.values(TILE_BYTE_COUNTS))

    @property
    def blocks_across(self) -> int:
        return -(-self.width // int(self.tile_width or 1))

    @property
    def blocks_down(self) -> int:
        return -(-self.height // int(self.tile_height or 1))

    def encoding_key(self) -> tuple:
        """What must agree between two directories for their compressed blocks to be interchangeable."""
        return tuple(
            (code, self.tags[code].type, self.tags[code].data) if code in self.tags else (code, None, None)
            for code in (
                BITS_PER_SAMPLE,
                COMPRESSION,
                PHOTOMETRIC,
                SAMPLES_PER_PIXEL,
                PLANAR_CONFIG,
                PREDICTOR,
                TILE_WIDTH,
                TILE_LENGTH,
                EXTRA_SAMPLES,
                SAMPLE_FORMAT,
                JPEG_TABLES,
                YCBCR_SUBSAMPLING,
                LERC_PARAMETERS,
            )
        ) + (self.byte_order,)


@dataclass
class TiffLayout:
    """The parsed head of a TIFF: byte order, flavour, GDAL's ghost area and every directory;
    ``extent``: the end of the last byte parsed, so ``head[:extent]`` parses to the same layout."""

    byte_order: str
    bigtiff: bool
    ghost: bytes
    directories: list[Directory]
    extent: int = 0

    @property
    def block_leaders(self) -> bool:
        return b"BLOCK_LEADER=SIZE_AS_UINT4" in self.ghost

    @property
    def block_trailers(self) -> bool:
        return b"BLOCK_TRAILER=LAST_4_BYTES_REPEATED" in self.ghost


def unpack_values(tag: Tag, byte_order: str) -> tuple:
    fmt, size = _TYPES[tag.type]
    if tag.type in (2, 7):
        return (tag.data,)
    per_value = len(fmt)
    return struct.unpack(f"{byte_order}{tag.count * per_value}{fmt[0]}", tag.data[: tag.count * size])


def pack_tag(code: int, type_: int, values: Iterable, byte_order: str) -> Tag:
    """A tag of numeric ``values``, flat as :func:`unpack_values` returns them (a RATIONAL is two);
    a numpy array of them is packed by numpy (a block array of a mosaic's level is one)."""
    fmt, _ = _TYPES[type_]
    if isinstance(values, np.ndarray):
        dtype = np.dtype(byte_order + fmt[0])
        if (
            dtype.kind in "iu"
            and values.size
            and not (np.iinfo(dtype).min <= values.min() <= values.max() <= np.iinfo(dtype).max)
        ):
            raise InvalidRasterError(f"tag {code}: a value does not fit its type {type_}")  # as struct.pack refuses
        return Tag(code, type_, len(values) // len(fmt), values.astype(dtype, copy=False).tobytes())
    values = list(values)
    return Tag(code, type_, len(values) // len(fmt), struct.pack(f"{byte_order}{len(values)}{fmt[0]}", *values))


# --------------------------------------------------------------------------- reading


class _Buffered:
    """Reads from a head buffer, falling back to ``read(offset, length)`` beyond it."""

    def __init__(self, head: bytes, read: Callable[[int, int], bytes] | None):
        self.head = head
        self.read_more = read
        #: The end of the furthest byte read.
        self.end = 0

    def read(self, offset: int, length: int) -> bytes:
        self.end = max(self.end, offset + length)
        if offset + length <= len(self.head):
            return self.head[offset : offset + length]
        if self.read_more is None:
            raise InvalidRasterError(f"TIFF directory points past the end of the data ({offset}+{length})")
        data = self.read_more(offset, length)
        if len(data) != length:
            raise InvalidRasterError(f"TIFF is truncated: wanted {length} bytes at {offset}, got {len(data)}")
        return data


def read_layout(
    head: bytes, read: Callable[[int, int], bytes] | None = None, *, max_directories: int = 64
) -> TiffLayout:
    """Parse the header and every directory of a TIFF.

    ``head`` is the start of the file (16 KB covers a tile COG's directories); ``read`` fetches
    anything beyond it (a ranged GET for a blob).
    """
    buf = _Buffered(head, read)
    start = buf.read(0, 8)
    if start[:2] == b"II":
        bo = "<"
    elif start[:2] == b"MM":
        bo = ">"
    else:
        raise InvalidRasterError("not a TIFF: the file does not start with II or MM")
    magic = struct.unpack(f"{bo}H", start[2:4])[0]
    if magic == 42:
        bigtiff = False
        first = struct.unpack(f"{bo}I", start[4:8])[0]
        header_len = 8
    elif magic == 43:
        bigtiff = True
        first = struct.unpack(f"{bo}Q", buf.read(8, 8))[0]
        header_len = 16
    else:
        raise InvalidRasterError(f"not a TIFF: magic number {magic}")

    ghost = b""
    if first > header_len:
        gap = buf.read(header_len, min(first - header_len, 1024))
        if gap.startswith(GHOST_PREFIX):
            ghost = gap

    count_fmt, entry_len, value_fmt, inline = ("Q", 20, "Q", 8) if bigtiff else ("H", 12, "I", 4)
    count_len = 8 if bigtiff else 2
    directories: list[Directory] = []
    offset = first
    seen: set[int] = set()
    while offset:
        if offset in seen or len(directories) >= max_directories:
            raise InvalidRasterError("TIFF directory chain loops or is implausibly long")
        seen.add(offset)
        (n,) = struct.unpack(f"{bo}{count_fmt}", buf.read(offset, count_len))
        raw = buf.read(offset + count_len, n * entry_len + (8 if bigtiff else 4))
        tags: dict[int, Tag] = {}
        for i in range(n):
            entry = raw[i * entry_len : (i + 1) * entry_len]
            code, type_ = struct.unpack(f"{bo}HH", entry[:4])
            if type_ not in _TYPES:
                continue  # unknown field type: TIFF readers skip it, so do we
            (count,) = struct.unpack(f"{bo}{'Q' if bigtiff else 'I'}", entry[4 : 4 + (8 if bigtiff else 4)])
            size = count * _TYPES[type_][1]
            value_field = entry[(12 if bigtiff else 8) :]
            if size <= inline:
                data = value_field[:size]
                position = offset + count_len + i * entry_len + (12 if bigtiff else 8)
            else:
                (position,) = struct.unpack(f"{bo}{value_fmt}", value_field)
                data = buf.read(position, size)
            tags[code] = Tag(code, type_, count, data, position)
        directories.append(Directory(tags=tags, byte_order=bo, offset=offset))
        (offset,) = struct.unpack(f"{bo}{value_fmt}", raw[n * entry_len :])
    return TiffLayout(byte_order=bo, bigtiff=bigtiff, ghost=ghost, directories=directories, extent=buf.end)


# --------------------------------------------------------------------------- writing


@dataclass
class OutputDirectory:
    """A directory to write: its tags (block arrays excluded) and its blocks in block-index order.

    ``mask``: the image's internal mask (NewSubfileType with the mask bit), same size and blocks.
    As GDAL's COG driver lays them out, the full resolution's mask directory follows its image's
    and the overviews' mask directories follow all the overviews; each mask block follows the
    image block it masks (``MASK_INTERLEAVED_WITH_IMAGERY=YES`` in the ghost area).
    """

    tags: dict[int, Tag]
    blocks: Sequence[BlockRef]
    width: int
    height: int
    mask: OutputDirectory | None = None


@dataclass
class WrittenTiff:
    nbytes: int
    sha256: str
    bigtiff: bool


@dataclass
class _Placed:
    directory: OutputDirectory
    ifd_offset: int = 0
    ifd_size: int = 0
    data_offsets: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def _value_size(tag: Tag) -> int:
    return tag.count * _TYPES[tag.type][1]


def _even(n: int) -> int:
    return n + (n & 1)


class TiffWriter:
    """Writes a COG-layout TIFF from directories whose blocks are copied from elsewhere.

    Every offset is known before the first byte is written (block lengths come from the sources'
    directories), so the file is written once, front to back, and hashed as it goes.
    """

    def __init__(self, byte_order: str, *, ghost: bytes = b"", leaders: bool = False, trailers: bool = False):
        self.byte_order = byte_order
        self.ghost = ghost
        self.leaders = leaders
        self.trailers = trailers

    def _ifd_size(self, directory: OutputDirectory, bigtiff: bool) -> int:
        inline = 8 if bigtiff else 4
        n = len(directory.tags) + 2  # plus the two block arrays
        size = (8 + n * 20 + 8) if bigtiff else (2 + n * 12 + 4)
        for tag in directory.tags.values():
            if _value_size(tag) > inline:
                size += _even(_value_size(tag))
        for _ in range(2):
            array = len(directory.blocks) * (8 if bigtiff else 4)
            if array > inline:
                size += _even(array)
        return size

    @staticmethod
    def _pairs(directories: list[OutputDirectory]) -> list[tuple[_Placed, _Placed | None]]:
        pairs = []
        for d in directories:
            if d.mask is not None and len(d.mask.blocks) != len(d.blocks):
                raise AssertionError(f"a mask of {len(d.mask.blocks)} blocks for an image of {len(d.blocks)}")
            pairs.append((_Placed(d), _Placed(d.mask) if d.mask is not None else None))
        return pairs

    def _layout(self, directories: list[OutputDirectory], bigtiff: bool) -> tuple[list[_Placed], int]:
        header = 16 if bigtiff else 8
        position = header + len(self.ghost)
        pairs = self._pairs(directories)
        # Directories in the COG driver's order: the image, its mask, the overviews, their masks.
        placed = [
            item for item in (*pairs[0], *(i for i, _ in pairs[1:]), *(m for _, m in pairs[1:])) if item is not None
        ]
        for item in placed:
            item.ifd_offset = position
            item.ifd_size = self._ifd_size(item.directory, bigtiff)
            position += item.ifd_size
        # Data: smallest overview first, full resolution last (COG order); a mask block right
        # after the image block it masks. A sparse block (length 0, offset 0) takes no bytes:
        # GDAL reads it as nodata (or zero).
        lead, trail = (4 if self.leaders else 0), (4 if self.trailers else 0)
        for image, mask in reversed(pairs):
            parts = [part for part in (image, mask) if part is not None]
            lengths = np.stack([block_lengths(part.directory.blocks) for part in parts], axis=1)
            framed = np.where(lengths > 0, lead + lengths + trail, 0)  # block-major: image, mask, image, ...
            ends = position + np.cumsum(framed.ravel()).reshape(framed.shape)
            offsets = np.where(lengths > 0, ends - framed + lead, 0)
            for j, part in enumerate(parts):
                part.data_offsets = offsets[:, j]
            position = int(ends[-1, -1]) if framed.size else position
        return placed, position

    def plan(
        self, directories: list[OutputDirectory], *, force_bigtiff: bool = False
    ) -> tuple[list[_Placed], int, bool]:
        """Place every directory and block; BigTIFF only when a classic TIFF cannot address the file."""
        bigtiff = force_bigtiff
        placed, total = self._layout(directories, bigtiff)
        if not bigtiff and total > CLASSIC_LIMIT:
            bigtiff = True
            placed, total = self._layout(directories, bigtiff)
        return placed, total, bigtiff

    def _encode_ifd(self, item: _Placed, next_offset: int, bigtiff: bool) -> bytes:
        bo = self.byte_order
        d = item.directory
        array_type = TYPE_LONG8 if bigtiff else TYPE_LONG
        tags = dict(d.tags)
        for tag in tags.values():
            if not bigtiff and tag.type in _BIGTIFF_ONLY_TYPES:
                raise InvalidRasterError(f"tag {tag.code} has a BigTIFF-only type and cannot go into a classic TIFF")
        tags[TILE_OFFSETS] = pack_tag(TILE_OFFSETS, array_type, item.data_offsets, bo)
        tags[TILE_BYTE_COUNTS] = pack_tag(TILE_BYTE_COUNTS, array_type, block_lengths(d.blocks), bo)
        inline = 8 if bigtiff else 4
        entries = sorted(tags.values(), key=lambda t: t.code)
        head_len = (8 + len(entries) * 20 + 8) if bigtiff else (2 + len(entries) * 12 + 4)
        extra = bytearray()
        out = bytearray(struct.pack(f"{bo}Q" if bigtiff else f"{bo}H", len(entries)))
        for tag in entries:
            size = _value_size(tag)
            if size <= inline:
                field_bytes = tag.data[:size] + b"\0" * (inline - size)
            else:
                field_bytes = struct.pack(f"{bo}{'Q' if bigtiff else 'I'}", item.ifd_offset + head_len + len(extra))
                extra += tag.data[:size]
                if len(extra) & 1:
                    extra += b"\0"
            if bigtiff:
                out += struct.pack(f"{bo}HHQ", tag.code, tag.type, tag.count) + field_bytes
            else:
                out += struct.pack(f"{bo}HHI", tag.code, tag.type, tag.count) + field_bytes
        out += struct.pack(f"{bo}{'Q' if bigtiff else 'I'}", next_offset)
        out += extra
        if len(out) != item.ifd_size:
            raise AssertionError(f"directory size {len(out)} differs from its planned {item.ifd_size}")
        return bytes(out)

    def _head_bytes(self, placed: list[_Placed], bigtiff: bool) -> bytes:
        bo = self.byte_order
        magic = b"II" if bo == "<" else b"MM"
        if bigtiff:
            parts = [magic + struct.pack(f"{bo}HHHQ", 43, 8, 0, placed[0].ifd_offset)]
        else:
            parts = [magic + struct.pack(f"{bo}HI", 42, placed[0].ifd_offset)]
        parts.append(self.ghost)
        for i, item in enumerate(placed):
            next_offset = placed[i + 1].ifd_offset if i + 1 < len(placed) else 0
            parts.append(self._encode_ifd(item, next_offset, bigtiff))
        return b"".join(parts)

    def head(self, directories: list[OutputDirectory], *, force_bigtiff: bool = False) -> tuple[bytes, int]:
        """(the bytes :meth:`write` emits before the first block, the file's planned size).

        The head is the header, GDAL's ghost area and every directory: all a reader needs to see
        the image's size, georeferencing, nodata and pyramid. GDAL opens it on its own (nothing
        is read from the blocks on open), so the planned file can be checked before any block
        is fetched or any byte is sent.
        """
        placed, total, bigtiff = self.plan(directories, force_bigtiff=force_bigtiff)
        return self._head_bytes(placed, bigtiff), total

    def block_order(
        self, directories: list[OutputDirectory], *, force_bigtiff: bool = False
    ) -> tuple[bytes, BlockOrder, int]:
        """What :meth:`write` writes, as references: (the head, every non-empty block in file order
        with its planned data offset, the file's size).

        A block's bytes in the file are its leader (4 bytes, when ``leaders``), its data at the
        planned offset, and its trailer (4 bytes, when ``trailers``), with nothing between one
        block's trailer and the next block's leader. The server-side copy stages the file from
        this order without holding a block.
        """
        placed, total, bigtiff = self.plan(directories, force_bigtiff=force_bigtiff)
        by_directory = {id(item.directory): item for item in placed}
        blocks, offsets = [], []
        for index in range(len(directories) - 1, -1, -1):
            parts = [by_directory[id(d)] for d in (directories[index], directories[index].mask) if d is not None]
            arrays = [BlockArray.of(part.directory.blocks) for part in parts]
            # Block-major, as laid out: block i of the image, then block i of its mask.
            interleaved = concatenated(arrays)
            order = np.arange(len(interleaved)).reshape(len(parts), -1).T.ravel()
            placed_at = np.concatenate([part.data_offsets for part in parts])[order]
            present = interleaved.length[order] > 0
            blocks.append(interleaved[order[present]])
            offsets.append(placed_at[present])
        return self._head_bytes(placed, bigtiff), BlockOrder(concatenated(blocks), np.concatenate(offsets)), total

    def write(
        self,
        out: Writable,
        directories: list[OutputDirectory],
        fetch: Callable[[int, OutputDirectory], Iterator[bytes]],
        *,
        force_bigtiff: bool = False,
    ) -> WrittenTiff:
        """Write the file; ``fetch(index, directory)`` yields that directory's block bytes in order.

        ``out`` only needs ``write(bytes)``: a local file, or a sink that streams to storage
        (the bytes arrive strictly front to back, each once).
        """
        placed, total, bigtiff = self.plan(directories, force_bigtiff=force_bigtiff)
        digest = hashlib.sha256()
        written = 0

        def emit(data: bytes) -> None:
            nonlocal written
            out.write(data)
            digest.update(data)
            written += len(data)

        emit(self._head_bytes(placed, bigtiff))
        by_directory = {id(item.directory): item for item in placed}

        def emit_block(block: BlockRef, data: bytes, offset: int) -> None:
            if len(data) != block.length:
                raise InvalidRasterError(
                    f"block from {block.source!r} at {block.offset} has {len(data)} bytes, its directory says {block.length}"
                )
            if block.length == 0:
                return
            if self.leaders:
                emit(struct.pack("<I", block.length))  # GDAL writes the leader little-endian
            if written != offset:
                raise AssertionError(f"block written at {written}, planned at {offset}")
            emit(data)
            if self.trailers:
                emit((b"\0\0\0\0" + data)[-4:])

        for index in range(len(directories) - 1, -1, -1):
            image = by_directory[id(directories[index])]
            mask = by_directory[id(directories[index].mask)] if directories[index].mask is not None else None
            streams = [(item, iter(fetch(index, item.directory))) for item in (image, mask) if item is not None]
            for i in range(len(image.directory.blocks)):
                for item, stream in streams:
                    data = next(stream, None)
                    if data is None:
                        raise AssertionError(f"directory {index}: {i} blocks fetched of {len(item.directory.blocks)}")
                    emit_block(item.directory.blocks[i], data, item.data_offsets[i])
        if written != total:
            raise AssertionError(f"wrote {written} bytes, planned {total}")
        return WrittenTiff(nbytes=written, sha256=digest.hexdigest(), bigtiff=bigtiff)


def copyable_tags(directory: Directory, *, width: int, height: int, subfile_type: int) -> dict[int, Tag]:
    """A directory's tags for a new image of ``width`` x ``height``, block arrays left to the writer."""
    bo = directory.byte_order
    tags = {}
    for code, tag in directory.tags.items():
        if code in (TILE_OFFSETS, TILE_BYTE_COUNTS, IMAGE_WIDTH, IMAGE_LENGTH, NEW_SUBFILE_TYPE):
            continue
        if code in OFFSET_TAGS:
            raise InvalidRasterError(
                f"TIFF tag {code} holds file offsets; its directory cannot be copied block by block"
            )
        tags[code] = tag
    size_type = TYPE_LONG if max(width, height) > 0xFFFF else TYPE_SHORT
    tags[IMAGE_WIDTH] = pack_tag(IMAGE_WIDTH, size_type, [width], bo)
    tags[IMAGE_LENGTH] = pack_tag(IMAGE_LENGTH, size_type, [height], bo)
    if subfile_type:
        tags[NEW_SUBFILE_TYPE] = pack_tag(NEW_SUBFILE_TYPE, TYPE_LONG, [subfile_type], bo)
    return tags


__all__ = [
    "BlockArray",
    "BlockOrder",
    "BlockRef",
    "Directory",
    "OutputDirectory",
    "Tag",
    "TiffLayout",
    "TiffWriter",
    "WrittenTiff",
    "copyable_tags",
    "pack_tag",
    "read_layout",
]
