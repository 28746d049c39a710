"""A seeded corpus of damaged GeoTIFFs, and the worker that validates each as the job would.

The corpus starts from a few intact GeoTIFFs made by rasterio (tiled and striped, compressed and
raw, classic and BigTIFF, little- and big-endian, a COG with overviews) and damages them the ways
real uploads get damaged, or hostile ones are made: truncations, flipped bytes, directory fields
and block offsets/byte counts pointing anywhere, directory loops, absurd dimensions, block sizes
and sample counts, broken compression streams, and tiny files that declare huge images; and
two small files whose windows would need more memory than validation allows (65,535 bands;
200 float64 bands).

The worker (``python -m tests.tiff_fuzz DIR``) runs in its own process, so a crash of GDAL or a
hang cannot take the test runner with it: for each file it prints one JSON line saying how the
file ended (refused / processed), how long it took and the process's peak RSS so far.
"""

from __future__ import annotations

import json
import random
import resource
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: TIFF tags the mutations aim at.
IMAGE_WIDTH, IMAGE_LENGTH, BITS_PER_SAMPLE, COMPRESSION = 256, 257, 258, 259
STRIP_OFFSETS, SAMPLES_PER_PIXEL, ROWS_PER_STRIP, STRIP_BYTE_COUNTS = 273, 277, 278, 279
TILE_WIDTH, TILE_LENGTH, TILE_OFFSETS, TILE_BYTE_COUNTS = 322, 323, 324, 325
_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 16: 8, 17: 8, 18: 8}


@dataclass
class Entry:
    """One directory entry: where it sits in the file and what it says."""

    tag: int
    type: int
    count: int
    at: int  # file offset of the entry
    value_at: int  # file offset of its value(s): inside the entry, or where its offset points


@dataclass
class Layout:
    order: str  # "<" or ">"
    bigtiff: bool
    ifds: list[int]  # offsets of the directories
    next_at: list[int]  # offset of each directory's next-IFD field
    entries: list[list[Entry]]

    def entry(self, tag: int, ifd: int = 0) -> Entry | None:
        return next((e for e in self.entries[ifd] if e.tag == tag), None)


def parse(data: bytes) -> Layout:
    """The directories of an intact TIFF (classic or BigTIFF, either byte order)."""
    order = "<" if data[:2] == b"II" else ">"
    bigtiff = struct.unpack(order + "H", data[2:4])[0] == 43
    first = struct.unpack(order + ("Q" if bigtiff else "I"), data[8:16] if bigtiff else data[4:8])[0]
    layout = Layout(order, bigtiff, [], [], [])
    offset = first
    while offset and offset not in layout.ifds:
        layout.ifds.append(offset)
        count_fmt, entry_size, field = ("Q", 20, 8) if bigtiff else ("H", 12, 4)
        count_size = 8 if bigtiff else 2
        (n,) = struct.unpack(order + count_fmt, data[offset : offset + count_size])
        entries = []
        for i in range(n):
            at = offset + count_size + i * entry_size
            tag, type_ = struct.unpack(order + "HH", data[at : at + 4])
            count = struct.unpack(order + ("Q" if bigtiff else "I"), data[at + 4 : at + 4 + field])[0]
            inline = _SIZES.get(type_, 1) * count <= field
            value_at = at + 4 + field
            if not inline:
                value_at = struct.unpack(order + ("Q" if bigtiff else "I"), data[value_at : value_at + field])[0]
            entries.append(Entry(tag, type_, count, at, value_at))
        layout.entries.append(entries)
        next_at = offset + count_size + n * entry_size
        layout.next_at.append(next_at)
        offset = struct.unpack(order + ("Q" if bigtiff else "I"), data[next_at : next_at + field])[0]
    return layout


def _put(data: bytearray, at: int, fmt: str, value: int) -> None:
    size = struct.calcsize(fmt)
    if at >= 0 and at + size <= len(data):
        struct.pack_into(fmt, data, at, value)


def _set_value(data: bytearray, layout: Layout, entry: Entry, value: int, index: int = 0) -> None:
    size = _SIZES.get(entry.type, 4)
    fmt = layout.order + {1: "B", 2: "H", 4: "I", 8: "Q"}[size]
    _put(data, entry.value_at + index * size, fmt, value & ((1 << (8 * size)) - 1))


def _block_entries(layout: Layout) -> tuple[Entry | None, Entry | None]:
    offsets = layout.entry(TILE_OFFSETS) or layout.entry(STRIP_OFFSETS)
    counts = layout.entry(TILE_BYTE_COUNTS) or layout.entry(STRIP_BYTE_COUNTS)
    return offsets, counts


def _values(data: bytes, layout: Layout, entry: Entry) -> list[int]:
    size = _SIZES.get(entry.type, 4)
    fmt = layout.order + {1: "B", 2: "H", 4: "I", 8: "Q"}[size]
    return [struct.unpack_from(fmt, data, entry.value_at + i * size)[0] for i in range(entry.count)]


# --------------------------------------------------------------------------- the mutations


def truncate(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    return data[: rng.randrange(8, len(data))]


def flip_bytes(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def directory_field(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    out = bytearray(data)
    entry = rng.choice(layout.entries[0])
    field = 8 if layout.bigtiff else 4
    choice = rng.randrange(4)
    if choice == 0:  # the value or offset field
        _put(
            out,
            entry.at + 4 + field,
            layout.order + ("Q" if layout.bigtiff else "I"),
            rng.choice([0, 1, len(data), len(data) + 7, 2**31 - 1, 2**32 - 1]),
        )
    elif choice == 1:  # the count
        _put(
            out, entry.at + 4, layout.order + ("Q" if layout.bigtiff else "I"), rng.choice([0, 2**16, 2**30, 2**32 - 1])
        )
    elif choice == 2:  # the type
        _put(out, entry.at + 2, layout.order + "H", rng.choice([0, 13, 99, 65535]))
    else:  # the tag itself
        _put(out, entry.at, layout.order + "H", rng.choice([0, 1, 65535, TILE_OFFSETS, STRIP_OFFSETS]))
    return bytes(out)


def block_offsets(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    out = bytearray(data)
    offsets, _ = _block_entries(layout)
    _set_value(
        out,
        layout,
        offsets,
        rng.choice([0, 8, layout.ifds[0], len(data) - 1, len(data) + 4096, 2**32 - 2]),
        rng.randrange(offsets.count),
    )
    return bytes(out)


def block_byte_counts(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    out = bytearray(data)
    _, counts = _block_entries(layout)
    _set_value(out, layout, counts, rng.choice([0, 1, 3, len(data), 2**31, 2**32 - 1]), rng.randrange(counts.count))
    return bytes(out)


def directory_loop(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    out = bytearray(data)
    which = rng.randrange(len(layout.ifds))
    target = rng.choice(layout.ifds[: which + 1])
    _put(out, layout.next_at[which], layout.order + ("Q" if layout.bigtiff else "I"), target)
    return bytes(out)


def absurd_dimensions(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    out = bytearray(data)
    for tag in rng.sample([IMAGE_WIDTH, IMAGE_LENGTH], rng.randint(1, 2)):
        entry = layout.entry(tag)
        _set_value(out, layout, entry, rng.choice([0, 1, 65535, 1_000_000, 2**31 - 1, 2**32 - 1]))
    return bytes(out)


def absurd_blocks(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    out = bytearray(data)
    for tag in (TILE_WIDTH, TILE_LENGTH, ROWS_PER_STRIP):
        entry = layout.entry(tag)
        if entry is not None and rng.random() < 0.8:
            _set_value(out, layout, entry, rng.choice([0, 1, 15, 16, 2**16 - 16, 2**20, 2**31, 2**32 - 1]))
    return bytes(out)


def absurd_samples(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    out = bytearray(data)
    entry = layout.entry(rng.choice([SAMPLES_PER_PIXEL, BITS_PER_SAMPLE]))
    _set_value(out, layout, entry, rng.choice([0, 3, 7, 64, 255, 65535]))
    return bytes(out)


def broken_compression(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    out = bytearray(data)
    offsets, counts = _block_entries(layout)
    starts, lengths = _values(data, layout, offsets), _values(data, layout, counts)
    i = rng.randrange(len(starts))
    start, length = starts[i], max(1, lengths[i])
    if rng.random() < 0.5:
        for _ in range(rng.randint(1, 16)):
            out[start + rng.randrange(length)] = rng.randrange(256)
    else:
        keep = rng.randrange(length)
        out[start + keep : start + length] = bytes(rng.randrange(256) for _ in range(length - keep))
    return bytes(out)


def tiny_huge(data: bytes, layout: Layout, rng: random.Random) -> bytes:
    """Only the header and directories, declaring a huge image whose blocks lie past the end."""
    out = bytearray(data)
    for tag, value in (
        (IMAGE_WIDTH, rng.choice([40_000, 100_000, 2**31 - 1])),
        (IMAGE_LENGTH, rng.choice([40_000, 100_000])),
    ):
        _set_value(out, layout, layout.entry(tag), value)
    end = max(e.value_at + _SIZES.get(e.type, 1) * e.count for entries in layout.entries for e in entries)
    end = max(end, max(layout.next_at) + 8)
    block_start = min(_values(data, layout, _block_entries(layout)[0]) or [len(data)])
    return bytes(out[: max(end, min(block_start, len(out)))])


MUTATIONS = {
    "truncate": (truncate, 40),
    "flip-bytes": (flip_bytes, 60),
    "directory-field": (directory_field, 50),
    "block-offsets": (block_offsets, 30),
    "block-byte-counts": (block_byte_counts, 30),
    "directory-loop": (directory_loop, 15),
    "absurd-dimensions": (absurd_dimensions, 25),
    "absurd-blocks": (absurd_blocks, 25),
    "absurd-samples": (absurd_samples, 15),
    "broken-compression": (broken_compression, 40),
    "tiny-huge": (tiny_huge, 15),
}


def write_bases(directory: Path) -> list[Path]:
    """The intact sources the corpus damages."""
    import rasterio
    import rasterio.shutil
    from rasterio.transform import from_origin

    rng = np.random.default_rng(7)
    bases = []
    common = dict(
        driver="GTiff", width=300, height=200, crs="EPSG:32633", transform=from_origin(500000, 4600000, 10, 10)
    )
    specs = {
        "tiled-deflate-uint16.tif": dict(
            count=1, dtype="uint16", tiled=True, blockxsize=256, blockysize=256, compress="deflate", predictor=2
        ),
        "striped-raw-rgb.tif": dict(count=3, dtype="uint8", blockysize=16),
        "tiled-lzw-float32.tif": dict(
            count=1, dtype="float32", tiled=True, blockxsize=128, blockysize=128, compress="lzw", nodata=-9999.0
        ),
        "bigtiff-deflate.tif": dict(
            count=2, dtype="uint8", tiled=True, blockxsize=256, blockysize=256, compress="deflate", BIGTIFF="YES"
        ),
        "big-endian-int16.tif": dict(
            count=1, dtype="int16", tiled=True, blockxsize=256, blockysize=256, compress="deflate", ENDIANNESS="BIG"
        ),
    }
    for name, spec in specs.items():
        path = directory / name
        with rasterio.open(path, "w", **common, **spec) as dst:
            info = np.iinfo(spec["dtype"]) if np.dtype(spec["dtype"]).kind in "iu" else None
            high = min(info.max, 4000) if info else 1000
            dst.write(rng.integers(0, high, (spec["count"], 200, 300)).astype(spec["dtype"]))
        bases.append(path)
    cog = directory / "cog-uint16.tif"
    with rasterio.open(
        directory / "cog-src.tif", "w", **{**common, "width": 512, "height": 512}, count=1, dtype="uint16"
    ) as dst:
        dst.write(rng.integers(0, 4000, (1, 512, 512)).astype("uint16"))
    with rasterio.open(directory / "cog-src.tif") as src:
        rasterio.shutil.copy(src, cog, driver="COG", BLOCKSIZE=256, COMPRESS="DEFLATE", OVERVIEW_COUNT=1)
    (directory / "cog-src.tif").unlink()
    bases.append(cog)
    return bases


def write_window_budget_files(directory: Path) -> list[Path]:
    """Small files declaring more bands than one window may hold decoded (validation's budget).

    - 65,535 uint8 bands (TIFF's most), pixel-interleaved strips, 64 x 64 pixels: 256 MiB in
      one window; 394 KB of header, nearly all the per-band BitsPerSample, SampleFormat and
      ExtraSamples arrays. Its strips are declared past the end of the file, so any read of a
      pixel before the budget's refusal would fail as a truncated file instead.
    - 200 float64 bands, band-interleaved strips, 512 x 512 pixels: 100 MiB in one 256-px window;
      sparse (no strip written), 309 KB.

    Fewer pixels than that would not do: a 1 x 1 file of 65,535 bands needs 64 KiB a window.
    """
    import rasterio
    from rasterio.transform import from_origin

    common = dict(driver="GTiff", crs="EPSG:32633", transform=from_origin(500000, 4600000, 10, 10), sparse_ok=True)
    specs = {
        "window-budget-65535-bands-uint8.tif": dict(
            width=64, height=64, count=65535, dtype="uint8", interleave="pixel"
        ),
        "window-budget-200-bands-float64.tif": dict(
            width=512, height=512, count=200, dtype="float64", interleave="band"
        ),
    }
    paths = []
    for name, spec in specs.items():
        path = directory / name
        with rasterio.open(path, "w", **common, **spec):
            pass  # nothing written: every strip sparse
        paths.append(path)
    data = bytearray(paths[0].read_bytes())
    layout = parse(bytes(data))
    offsets, counts = _block_entries(layout)
    strip = 64 * 65535
    for i in range(offsets.count):
        _set_value(data, layout, offsets, len(data) + i * strip, i)
        _set_value(data, layout, counts, strip, i)
    paths[0].write_bytes(bytes(data))
    return paths


def make_corpus(directory: Path, seed: int = 20261130) -> list[tuple[Path, str]]:
    """At least 300 damaged files (plus the intact bases), named after their mutation; seeded."""
    directory.mkdir(parents=True, exist_ok=True)
    bases = write_bases(directory)
    rng = random.Random(seed)
    corpus = [(base, "intact") for base in bases]
    corpus += [(path, "window-budget") for path in write_window_budget_files(directory)]
    for family, (mutate, count) in MUTATIONS.items():
        for i in range(count):
            base = bases[i % len(bases)]
            data = base.read_bytes()
            mutated = mutate(data, parse(data), rng)
            path = directory / f"{family}-{i:03d}-{base.stem}.tif"
            path.write_bytes(mutated)
            corpus.append((path, family))
    return corpus


# --------------------------------------------------------------------------- the worker


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def check_file(path: str, settings) -> dict:
    """What the job does with an upload, without storage: validate, then encode every window."""
    from rasterio.io import MemoryFile
    from rasterio.windows import Window as RioWindow

    from tilecommit.errors import BadInputError
    from tilecommit.grid import plan_windows
    from tilecommit.raster import encode_tile, inspect_source
    from tilecommit.raster.tiling.render import window_of_upload
    from tilecommit.spec import OutputSpec

    try:
        scene = inspect_source(path, settings=settings, spec=OutputSpec.from_settings(settings))
    except BadInputError as exc:
        return {"outcome": "refused", "error_type": type(exc).__name__, "message": str(exc)[:300]}
    windows = plan_windows(scene.width, scene.height, settings.window_size)
    checked = windows if len(windows) <= 16 else windows[:8] + windows[-8:]
    spec = OutputSpec(window_size=settings.window_size)
    for window in checked:
        # Each window read as a job's render reads it (its format's GDAL configuration included).
        with window_of_upload(path, window, settings=settings, purpose="check", spec=spec) as src:
            try:
                body, _ = encode_tile(src, window, spec=spec)
            except BadInputError as exc:
                # Inspection accepted the file, then a window was refused: tiles of other
                # windows could already have been written for an upload that is refused.
                return {"outcome": "refused-after-tiling", "window": window.id, "message": str(exc)[:300]}
            expected = src.read(window=RioWindow(window.col_off, window.row_off, window.width, window.height))
        with MemoryFile(body) as memory, memory.open() as tile:
            if not np.array_equal(tile.read(), expected, equal_nan=expected.dtype.kind == "f"):
                return {"outcome": "wrong-pixels", "window": window.id}
    return {"outcome": "processed", "windows": len(windows), "checked": len(checked)}


def main(directory: str, start_after: str = "") -> None:
    import warnings

    from tilecommit.settings import Settings

    warnings.simplefilter("ignore")
    settings = Settings(window_size=256)
    # Imports and GDAL's driver registration happen once per process, not per file: pay for them
    # before the clock runs, on an intact file the worker makes itself.
    warm_up = Path(directory) / ".warm-up"
    warm_up.mkdir(exist_ok=True)
    check_file(str(write_bases(warm_up)[0]), settings)
    for path in sorted(Path(directory).glob("*.tif")):
        if path.name <= start_after:  # resumed after a file that crashed or hung the previous worker
            continue
        print(json.dumps({"file": path.name, "event": "start"}), flush=True)
        started = time.perf_counter()
        try:
            result = check_file(str(path), settings)
        except Exception as exc:  # anything else is a defect the test reports, file by file
            result = {"outcome": "error", "error_type": type(exc).__name__, "message": str(exc)[:300]}
        result.update(
            file=path.name, event="done", seconds=round(time.perf_counter() - started, 3), peak_rss=_peak_rss_bytes()
        )
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
