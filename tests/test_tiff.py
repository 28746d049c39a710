"""tilecommit.raster.tiff, the TIFF reader and writer behind block-copy mosaic assembly.

The files are real: GDAL writes them (little- and big-endian, classic and BigTIFF, COG with
block leaders and trailers), GDAL reads back what the writer made, and GDAL's own idea of every
block's offset and size (the ``TIFF`` metadata domain) is the reference for the reader. Only
the BigTIFF switch is planned with fake block references: a 4 GiB file is not written here.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
import rasterio
from rasterio.io import MemoryFile

from tilecommit.errors import InvalidRasterError
from tilecommit.raster import tiff

WIDTH, HEIGHT, BLOCK = 520, 300, 256  # 3 x 2 blocks, the right and bottom ones partial
PIXELS = (np.arange(2 * HEIGHT * WIDTH, dtype="uint32") * 7919 % 65521).astype("uint16").reshape(2, HEIGHT, WIDTH)


def gdal_tiff(driver: str = "GTiff", **options) -> bytes:
    """The bytes of a 2-band uint16 deflate TIFF of PIXELS, as GDAL writes it with ``options``."""
    layout = {"blocksize": BLOCK} if driver == "COG" else {"tiled": True, "blockxsize": BLOCK, "blockysize": BLOCK}
    with MemoryFile() as memory:
        with memory.open(
            driver=driver,
            width=WIDTH,
            height=HEIGHT,
            count=2,
            dtype="uint16",
            compress="deflate",
            crs="EPSG:32633",
            transform=rasterio.transform.from_origin(500000, 4600000, 10, 10),
            **layout,
            **options,
        ) as dst:
            dst.write(PIXELS)
        return memory.read()


def gdal_block_arrays(data: bytes) -> tuple[list[int], list[int]]:
    """Offsets and byte counts of the full-resolution blocks, row-major, as GDAL reports them."""
    offsets, sizes = [], []
    with MemoryFile(data) as memory, memory.open() as src:
        for row in range(-(-HEIGHT // BLOCK)):
            for col in range(-(-WIDTH // BLOCK)):
                offsets.append(int(src.get_tag_item(f"BLOCK_OFFSET_{col}_{row}", "TIFF", bidx=1)))
                sizes.append(int(src.get_tag_item(f"BLOCK_SIZE_{col}_{row}", "TIFF", bidx=1)))
    return offsets, sizes


def copy_plan(layout: tiff.TiffLayout) -> list[tiff.OutputDirectory]:
    """Every directory of ``layout`` as a directory to write, its blocks referenced in the source."""
    return [
        tiff.OutputDirectory(
            tags=tiff.copyable_tags(d, width=d.width, height=d.height, subfile_type=d.subfile_type),
            blocks=[tiff.BlockRef("source", o, n) for o, n in zip(d.block_offsets, d.block_byte_counts, strict=True)],
            width=d.width,
            height=d.height,
        )
        for d in layout.directories
    ]


def fetch_from(data: bytes):
    def fetch(index: int, directory: tiff.OutputDirectory):
        for block in directory.blocks:
            yield data[block.offset : block.offset + block.length]

    return fetch


class Sink:
    """What TiffWriter.write needs of ``out``: ``write(bytes)``."""

    def __init__(self):
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data


def write_copy(data: bytes, writer: tiff.TiffWriter | None = None, **kwargs) -> tuple[bytes, tiff.WrittenTiff]:
    layout = tiff.read_layout(data)
    writer = writer or tiff.TiffWriter(
        layout.byte_order, ghost=layout.ghost, leaders=layout.block_leaders, trailers=layout.block_trailers
    )
    sink = Sink()
    written = writer.write(sink, copy_plan(layout), fetch_from(data), **kwargs)
    return bytes(sink.data), written


def read_pixels(data: bytes, overview_level: int | None = None) -> np.ndarray:
    with MemoryFile(data) as memory, memory.open(overview_level=overview_level) as src:
        return src.read()


# --------------------------------------------------------------------------- reading what GDAL wrote


@pytest.mark.parametrize("endianness", ["LITTLE", "BIG"])
@pytest.mark.parametrize("bigtiff", ["NO", "YES"])
def test_the_reader_finds_the_blocks_gdal_reports(endianness, bigtiff):
    data = gdal_tiff(ENDIANNESS=endianness, BIGTIFF=bigtiff)
    layout = tiff.read_layout(data)

    assert layout.byte_order == {"LITTLE": "<", "BIG": ">"}[endianness]
    assert data[:2] == {"LITTLE": b"II", "BIG": b"MM"}[endianness]
    assert layout.bigtiff is (bigtiff == "YES")
    [d] = layout.directories
    assert (d.width, d.height, d.tile_width, d.tile_height) == (WIDTH, HEIGHT, BLOCK, BLOCK)
    assert (d.blocks_across, d.blocks_down, d.planar_config, d.subfile_type) == (3, 2, 1, 0)
    assert (list(d.block_offsets), list(d.block_byte_counts)) == gdal_block_arrays(data)
    assert d.values(tiff.BITS_PER_SAMPLE) == (16, 16)  # an array of SHORTs, in the file's byte order
    assert layout.ghost == b"" and not layout.block_leaders and not layout.block_trailers


@pytest.mark.parametrize("endianness", ["LITTLE", "BIG"])
def test_a_big_endian_file_copied_block_by_block_reads_back_the_same_pixels(endianness):
    data = gdal_tiff(ENDIANNESS=endianness)
    copied, written = write_copy(data)

    assert copied[:2] == data[:2]
    assert written.nbytes == len(copied) and not written.bigtiff
    np.testing.assert_array_equal(read_pixels(copied), PIXELS)
    # The copy's directories say where its own blocks are, and GDAL agrees.
    [d] = tiff.read_layout(copied).directories
    assert (list(d.block_offsets), list(d.block_byte_counts)) == gdal_block_arrays(copied)


def test_values_beyond_the_head_are_fetched_with_ranged_reads():
    data = gdal_tiff(ENDIANNESS="BIG")
    first_ifd = struct.unpack(">I", data[4:8])[0]
    reads = []

    def read(offset: int, length: int) -> bytes:
        reads.append((offset, length))
        return data[offset : offset + length]

    layout = tiff.read_layout(data[: first_ifd + 2], read)  # the head ends inside the first directory
    assert reads, "nothing was read beyond the head"
    assert layout.directories[0].block_offsets == tiff.read_layout(data).directories[0].block_offsets


def test_an_unknown_field_type_is_skipped_like_other_tiff_readers_do():
    data = bytearray(gdal_tiff())
    first_ifd = struct.unpack("<I", data[4:8])[0]
    entry = first_ifd + 2  # the first entry: ImageWidth
    assert struct.unpack("<H", data[entry : entry + 2])[0] == tiff.IMAGE_WIDTH
    data[entry + 2 : entry + 4] = struct.pack("<H", 99)  # no such TIFF field type
    [d] = tiff.read_layout(bytes(data)).directories
    assert tiff.IMAGE_WIDTH not in d.tags and d.width == 0
    assert d.height == HEIGHT


# --------------------------------------------------------------------------- the reader's refusals


def classic_ifd_chain(next_offsets: list[int], byte_order: str = "<") -> bytes:
    """A classic TIFF of len(next_offsets) one-entry directories at 8, 26, 44, ... with those links."""
    magic = b"II" if byte_order == "<" else b"MM"
    out = bytearray(magic + struct.pack(f"{byte_order}HI", 42, 8))
    for next_offset in next_offsets:
        out += struct.pack(f"{byte_order}H", 1)
        out += struct.pack(f"{byte_order}HHI", tiff.IMAGE_WIDTH, tiff.TYPE_LONG, 1) + struct.pack(f"{byte_order}I", 1)
        out += struct.pack(f"{byte_order}I", next_offset)
    return bytes(out)


def test_a_hand_made_chain_of_directories_reads_in_both_byte_orders():
    for byte_order in "<>":
        layout = tiff.read_layout(classic_ifd_chain([26, 44, 0], byte_order))
        assert [d.offset for d in layout.directories] == [8, 26, 44]
        assert [d.width for d in layout.directories] == [1, 1, 1]


@pytest.mark.parametrize(
    ("head", "message"),
    [
        (b"GIF89a\0\0", "does not start with II or MM"),
        (b"II" + struct.pack("<HI", 41, 8), "magic number 41"),
        (b"MM" + struct.pack(">HI", 42 << 8, 8), "magic number"),  # little-endian magic in a big-endian file
        (b"II*\0", "points past the end of the data"),  # shorter than a header
        (b"II+\0\x08\0\0\0", "points past the end of the data"),  # BigTIFF header cut before its first offset
        (classic_ifd_chain([0])[:20], "points past the end of the data"),  # cut inside the directory
        (classic_ifd_chain([8]), "loops"),  # a directory whose next is itself
        (classic_ifd_chain([26, 8]), "loops"),  # two directories pointing at each other
    ],
)
def test_the_reader_refuses_what_is_not_a_readable_tiff(head, message):
    with pytest.raises(InvalidRasterError, match=message):
        tiff.read_layout(head)


def test_the_reader_refuses_an_implausibly_long_chain():
    head = classic_ifd_chain([26, 44, 62, 0])
    assert len(tiff.read_layout(head, max_directories=4).directories) == 4
    with pytest.raises(InvalidRasterError, match="implausibly long"):
        tiff.read_layout(head, max_directories=3)


def test_the_reader_refuses_a_ranged_read_that_comes_back_short():
    data = classic_ifd_chain([0])
    with pytest.raises(InvalidRasterError, match="truncated: wanted"):
        tiff.read_layout(data[:10], lambda offset, length: data[offset : offset + length - 1])


def test_a_tag_value_that_points_past_the_end_is_refused():
    data = bytearray(gdal_tiff())
    layout = tiff.read_layout(bytes(data))
    offsets_tag = layout.directories[0].tags[tiff.TILE_OFFSETS]
    assert offsets_tag.count * 4 > 4  # stored out of line: the entry holds an offset
    first_ifd = struct.unpack("<I", data[4:8])[0]
    (n,) = struct.unpack("<H", data[first_ifd : first_ifd + 2])
    for i in range(n):
        entry = first_ifd + 2 + 12 * i
        if struct.unpack("<H", data[entry : entry + 2])[0] == tiff.TILE_OFFSETS:
            data[entry + 8 : entry + 12] = struct.pack("<I", len(data) + 100)
    with pytest.raises(InvalidRasterError, match="points past the end"):
        tiff.read_layout(bytes(data))


# --------------------------------------------------------------------------- block leaders and trailers


def test_a_cog_with_block_leaders_and_trailers_is_copied_with_them():
    data = gdal_tiff("COG")
    layout = tiff.read_layout(data)
    assert layout.ghost.startswith(tiff.GHOST_PREFIX) and layout.block_leaders and layout.block_trailers
    # Full resolution, then overviews down to one that fits a 256-px block.
    assert [(d.width, d.height, d.subfile_type) for d in layout.directories] == [
        (520, 300, 0),
        (260, 150, 1),
        (130, 75, 1),
    ]

    copied, _ = write_copy(data)
    again = tiff.read_layout(copied)
    assert again.ghost == layout.ghost
    for source, copy in zip(layout.directories, again.directories, strict=True):
        assert copy.block_byte_counts == source.block_byte_counts
        for offset, source_offset, n in zip(
            copy.block_offsets, source.block_offsets, source.block_byte_counts, strict=True
        ):
            # The block, its leader and its trailer, as GDAL wrote them.
            assert copied[offset - 4 : offset + n + 4] == data[source_offset - 4 : source_offset + n + 4]
    for level in (None, 0, 1):
        assert np.array_equal(read_pixels(copied, level), read_pixels(data, level)), level


@pytest.mark.parametrize("byte_order", ["<", ">"])
def test_each_block_is_preceded_by_its_length_and_followed_by_its_last_4_bytes(byte_order):
    blocks = [b"first block", b"xy", b"", b"the fourth"]
    directory = tiff.OutputDirectory(
        tags=_image_tags(byte_order, 4 * BLOCK),
        width=4 * BLOCK,
        height=BLOCK,
        blocks=[tiff.BlockRef("mem", i, len(b)) for i, b in enumerate(blocks)],
    )
    writer = tiff.TiffWriter(byte_order, leaders=True, trailers=True)
    sink = Sink()
    writer.write(sink, [directory], lambda index, d: iter(blocks))
    out = bytes(sink.data)

    [d] = tiff.read_layout(out).directories
    assert d.block_byte_counts == tuple(len(b) for b in blocks)
    for block, offset in zip(blocks, d.block_offsets, strict=True):
        if not block:
            assert offset == 0  # a sparse block has no bytes, no leader and no trailer
            continue
        # The leader is little-endian whatever the file's byte order (GDAL's BLOCK_LEADER=SIZE_AS_UINT4).
        assert out[offset - 4 : offset] == struct.pack("<I", len(block))
        assert out[offset : offset + len(block)] == block
        assert out[offset + len(block) : offset + len(block) + 4] == (b"\0\0\0\0" + block)[-4:]
    assert len(out) == d.block_offsets[-1] + len(blocks[-1]) + 4


def _image_tags(byte_order: str, width: int, height: int = BLOCK) -> dict[int, tiff.Tag]:
    """The tags of a one-band uint8 deflate image tiled in 256-pixel blocks (block arrays excluded)."""
    tags = [
        tiff.pack_tag(tiff.IMAGE_WIDTH, tiff.TYPE_LONG, [width], byte_order),
        tiff.pack_tag(tiff.IMAGE_LENGTH, tiff.TYPE_LONG, [height], byte_order),
        tiff.pack_tag(tiff.BITS_PER_SAMPLE, tiff.TYPE_SHORT, [8], byte_order),
        tiff.pack_tag(tiff.COMPRESSION, tiff.TYPE_SHORT, [8], byte_order),
        tiff.pack_tag(tiff.PHOTOMETRIC, tiff.TYPE_SHORT, [1], byte_order),
        tiff.pack_tag(tiff.SAMPLES_PER_PIXEL, tiff.TYPE_SHORT, [1], byte_order),
        tiff.pack_tag(tiff.TILE_WIDTH, tiff.TYPE_SHORT, [BLOCK], byte_order),
        tiff.pack_tag(tiff.TILE_LENGTH, tiff.TYPE_SHORT, [BLOCK], byte_order),
    ]
    return {t.code: t for t in tags}


# --------------------------------------------------------------------------- zero-length blocks


def test_a_zero_length_block_is_written_as_offset_0_and_read_by_gdal_as_empty():
    data = gdal_tiff()
    layout = tiff.read_layout(data)
    [directory] = copy_plan(layout)
    directory.blocks[4] = tiff.BlockRef("nothing", 0, 0)  # row 1, col 1
    sink = Sink()
    tiff.TiffWriter("<").write(sink, [directory], fetch_from(data))

    [d] = tiff.read_layout(bytes(sink.data)).directories
    assert d.block_offsets[4] == 0 and d.block_byte_counts[4] == 0
    pixels = read_pixels(bytes(sink.data))
    assert not pixels[:, BLOCK:, BLOCK : 2 * BLOCK].any()  # GDAL reads a sparse block as zeros
    expected = PIXELS.copy()
    expected[:, BLOCK:, BLOCK : 2 * BLOCK] = 0
    np.testing.assert_array_equal(pixels, expected)


# --------------------------------------------------------------------------- BigTIFF above 4 GiB


def _one_block_plan(length: int) -> list[tiff.OutputDirectory]:
    return [
        tiff.OutputDirectory(
            tags=_image_tags("<", BLOCK), width=BLOCK, height=BLOCK, blocks=[tiff.BlockRef("fake", 0, length)]
        )
    ]


def test_the_writer_switches_to_bigtiff_exactly_when_a_classic_tiff_cannot_address_the_file():
    writer = tiff.TiffWriter("<")
    _, small_total, small_bigtiff = writer.plan(_one_block_plan(1000))
    assert not small_bigtiff
    head_len = small_total - 1000
    fits = tiff.CLASSIC_LIMIT - head_len  # the largest block a classic file of this layout can address

    _, total, bigtiff = writer.plan(_one_block_plan(fits))
    assert (total, bigtiff) == (tiff.CLASSIC_LIMIT, False)
    _, total, bigtiff = writer.plan(_one_block_plan(fits + 1))
    assert bigtiff and total > tiff.CLASSIC_LIMIT + 1  # BigTIFF's longer header and entries


def test_a_planned_4_gib_mosaic_has_a_bigtiff_head_gdal_can_open():
    """Fake block references (never fetched): 2 x 3 blocks of 900 MB, 5.4 GB in all."""
    length = 900_000_000
    directory = tiff.OutputDirectory(
        tags=_image_tags("<", 3 * BLOCK, 2 * BLOCK),
        width=3 * BLOCK,
        height=2 * BLOCK,
        blocks=[tiff.BlockRef("fake", i, length) for i in range(6)],
    )
    head, total = tiff.TiffWriter("<").head([directory])

    assert head[:4] == b"II+\0" and total > 2**32
    layout = tiff.read_layout(head)
    [d] = layout.directories
    assert layout.bigtiff and d.tags[tiff.TILE_OFFSETS].type == tiff.TYPE_LONG8
    assert d.block_byte_counts == (length,) * 6
    assert d.block_offsets[0] == len(head)
    assert all(b - a == length for a, b in zip(d.block_offsets, d.block_offsets[1:], strict=False))
    assert d.block_offsets[-1] + length == total and d.block_offsets[-1] > 2**32
    with MemoryFile(head) as memory, memory.open() as src:  # GDAL reads no block on open
        assert (src.width, src.height, src.block_shapes[0]) == (3 * BLOCK, 2 * BLOCK, (BLOCK, BLOCK))


def test_a_copy_forced_to_bigtiff_reads_back_the_same_pixels():
    data = gdal_tiff(ENDIANNESS="BIG")
    copied, written = write_copy(data, force_bigtiff=True)
    assert written.bigtiff and copied[:4] == b"MM\0+"
    np.testing.assert_array_equal(read_pixels(copied), PIXELS)


# --------------------------------------------------------------------------- the writer's refusals


def test_a_block_whose_length_differs_from_its_directory_is_refused():
    directory = _one_block_plan(10)[0]
    with pytest.raises(InvalidRasterError, match="has 9 bytes, its directory says 10"):
        tiff.TiffWriter("<").write(Sink(), [directory], lambda index, d: iter([b"x" * 9]))


def test_a_fetch_that_yields_too_few_blocks_is_an_error_not_a_short_file():
    directory = tiff.OutputDirectory(
        tags=_image_tags("<", 2 * BLOCK),
        width=2 * BLOCK,
        height=BLOCK,
        blocks=[tiff.BlockRef("m", 0, 3), tiff.BlockRef("m", 3, 3)],
    )
    with pytest.raises(AssertionError, match="1 blocks fetched of 2"):
        tiff.TiffWriter("<").write(Sink(), [directory], lambda index, d: iter([b"abc"]))


def test_a_bigtiff_only_tag_type_cannot_go_into_a_classic_tiff():
    tags = _image_tags("<", BLOCK)
    tags[tiff.GDAL_NODATA] = tiff.Tag(tiff.GDAL_NODATA, tiff.TYPE_LONG8, 1, struct.pack("<Q", 0))
    directory = tiff.OutputDirectory(tags=tags, width=BLOCK, height=BLOCK, blocks=[tiff.BlockRef("m", 0, 1)])
    with pytest.raises(InvalidRasterError, match="BigTIFF-only type"):
        tiff.TiffWriter("<").head([directory])
    head, _ = tiff.TiffWriter("<").head([directory], force_bigtiff=True)
    assert tiff.read_layout(head).directories[0].tags[tiff.GDAL_NODATA].type == tiff.TYPE_LONG8


def test_a_directory_with_tags_that_hold_file_offsets_cannot_be_copied():
    layout = tiff.read_layout(classic_ifd_chain([0]))
    directory = layout.directories[0]
    directory.tags[tiff.EXIF_IFD] = tiff.pack_tag(tiff.EXIF_IFD, tiff.TYPE_LONG, [1234], "<")
    with pytest.raises(InvalidRasterError, match="holds file offsets"):
        tiff.copyable_tags(directory, width=1, height=1, subfile_type=0)


@pytest.mark.parametrize("byte_order", ["<", ">"])
@pytest.mark.parametrize(
    ("type_", "values"), [(tiff.TYPE_SHORT, (1, 65535)), (tiff.TYPE_LONG8, (2**40,)), (5, (1, 3, 2, 7))]
)
def test_pack_tag_and_unpack_values_agree(byte_order, type_, values):
    tag = tiff.pack_tag(700, type_, values, byte_order)
    assert tag.count == (len(values) // 2 if type_ == 5 else len(values))  # a RATIONAL is a pair of LONGs
    assert tiff.unpack_values(tag, byte_order) == values
