"""JPEG 2000 files for the tests, made by GDAL at test time (never committed), and what is done to
them: boxes that name a URL or a local file spliced in, a main header made to declare what the
file does not hold, a named pipe that sees every open of a local file."""

from __future__ import annotations

import errno
import os
import struct
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import rasterio
from rasterio.transform import from_origin

from tilecommit.raster.reading.jpeg2000 import find_codestream

#: The grid of the files made here: UTM 33N, 10 m pixels (a Sentinel-2 band's).
CRS = "EPSG:32633"
ORIGIN = (300000.0, 5000040.0)
RESOLUTION = 10.0


def pixels(width: int, height: int, count: int = 1, dtype: str = "uint16", seed: int = 0) -> np.ndarray:
    """Smooth terrain with noise, as a reflectance band is: deterministic for a seed."""
    rng = np.random.default_rng(seed)
    rows, cols = np.mgrid[0:height, 0:width]
    top = 4000 if np.dtype(dtype).itemsize > 1 else 250
    bands = [((cols * (3 + b) + rows * (5 + b)) % top + rng.integers(0, 16, (height, width))) for b in range(count)]
    return np.stack(bands).astype(dtype)


def write_jp2(
    path: Path,
    data: np.ndarray,
    *,
    tile: int = 256,
    lossless: bool = True,
    georeferenced: bool = True,
    colorinterp: list | None = None,
    tags: dict[str, str] | None = None,
    **options,
) -> Path:
    """``data`` as a JP2 file made by GDAL's JP2OpenJPEG: tiles of ``tile`` pixels with TLM markers,
    lossless (QUALITY=100, REVERSIBLE=YES: the 5/3 wavelet) or lossy (QUALITY=20: the 9/7);
    georeferenced by a GeoJP2 and a GMLJP2 box (GDAL's default) or by nothing. ``tags`` travel
    in GDAL's own metadata box (WRITE_METADATA=YES)."""
    count, height, width = data.shape
    profile = dict(driver="JP2OpenJPEG", width=width, height=height, count=count, dtype=data.dtype.name)
    # rasterio passes its own blockxsize over a BLOCKXSIZE option; the codec is JP2 whatever the
    # name (GDAL picks a raw codestream for names not ending .jp2).
    profile.update(blockxsize=tile, blockysize=tile, TLM="YES", CODEC="JP2")
    profile.update(QUALITY=100, REVERSIBLE="YES") if lossless else profile.update(QUALITY=20)
    if georeferenced:
        profile.update(crs=CRS, transform=from_origin(*ORIGIN, RESOLUTION, RESOLUTION))
    else:
        profile.update(GeoJP2="NO", GMLJP2="NO")
    profile.update(options)
    if tags:
        profile.update(WRITE_METADATA="YES")
    with rasterio.Env(GDAL_PAM_ENABLED="NO"), rasterio.open(path, "w", **profile) as dst:
        dst.write(data)
        if colorinterp:
            dst.colorinterp = colorinterp
        if tags:
            dst.update_tags(**tags)
    return path


def single_tiled(path: Path, data: np.ndarray) -> Path:
    """``data`` as a lossless JP2 of one tile, as many vendors deliver (Debian's gdal_translate
    from a GeoTIFF: rasterio's writer keeps JP2 tiles at most 1024 wide)."""
    tiff = path.with_suffix(".tif")
    count, height, width = data.shape
    profile = dict(driver="GTiff", width=width, height=height, count=count, dtype=data.dtype.name, crs=CRS)
    with rasterio.open(tiff, "w", transform=from_origin(*ORIGIN, RESOLUTION, RESOLUTION), **profile) as dst:
        dst.write(data)
    options = [
        "-co",
        f"BLOCKXSIZE={width}",
        "-co",
        f"BLOCKYSIZE={height}",
        "-co",
        "QUALITY=100",
        "-co",
        "REVERSIBLE=YES",
    ]
    subprocess.run(["gdal_translate", "-q", "-of", "JP2OpenJPEG", *options, str(tiff), str(path)], check=True)
    tiff.unlink()
    return path


def sentinel2_like(path: Path, size: int = 2048, tile: int = 1024, seed: int = 2) -> Path:
    """A stand-in for a Sentinel-2 band (10980² of 15-bit samples in uint16, 1024² tiles, TLM
    markers, lossless), smaller."""
    return write_jp2(path, pixels(size, size, seed=seed), tile=tile, NBITS=15)


# --------------------------------------------------------------------------- boxes


def box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I4s", 8 + len(payload), kind) + payload


def gml_boxes(root_instance: str) -> bytes:
    """A GMLJP2 association: ``asoc(lbl "gml.data", asoc(lbl "gml.root-instance", xml))``."""
    inner = box(b"asoc", box(b"lbl ", b"gml.root-instance") + box(b"xml ", root_instance.encode()))
    return box(b"asoc", box(b"lbl ", b"gml.data") + inner)


def gml_coverage(width: int, height: int, srs_name: str, *, feature: str = "", schema: str = "") -> str:
    """A GMLJP2 2.0 coverage collection placing the image at :data:`ORIGIN` in ``srs_name``, with a
    feature collection named by ``feature`` (xlink:href) and a schema location ``schema``."""
    x, y = ORIGIN[0] + RESOLUTION / 2, ORIGIN[1] - RESOLUTION / 2
    schema_location = f'xsi:schemaLocation="http://www.opengis.net/gmljp2/2.0 {schema}"' if schema else ""
    linked = f'<gmljp2:feature xlink:href="{feature}"/>' if feature else ""
    return f"""<gmljp2:GMLJP2CoverageCollection gml:id="JPEG2000_0" xmlns:gml="http://www.opengis.net/gml/3.2"
 xmlns:gmlcov="http://www.opengis.net/gmlcov/1.0" xmlns:gmljp2="http://www.opengis.net/gmljp2/2.0"
 xmlns:xlink="http://www.w3.org/1999/xlink" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" {schema_location}>
 <gml:domainSet nilReason="inapplicable"/><gml:rangeSet nilReason="inapplicable"/><gmlcov:rangeType/>
 <gmljp2:featureMember><gmljp2:GMLJP2RectifiedGridCoverage gml:id="RGC_1">
  <gml:domainSet><gml:RectifiedGrid gml:id="RGC_1_GRID" dimension="2" srsName="{srs_name}">
   <gml:limits><gml:GridEnvelope><gml:low>0 0</gml:low><gml:high>{width - 1} {height - 1}</gml:high></gml:GridEnvelope></gml:limits>
   <gml:axisLabels>x y</gml:axisLabels>
   <gml:origin><gml:Point gml:id="RGC_1_ORIGIN" srsName="{srs_name}"><gml:pos>{x} {y}</gml:pos></gml:Point></gml:origin>
   <gml:offsetVector srsName="{srs_name}">{RESOLUTION} 0</gml:offsetVector>
   <gml:offsetVector srsName="{srs_name}">0 {-RESOLUTION}</gml:offsetVector>
  </gml:RectifiedGrid></gml:domainSet>
  <gml:rangeSet><gml:File><gml:rangeParameters/><gml:fileName>gmljp2://codestream/0</gml:fileName>
   <gml:fileStructure>inapplicable</gml:fileStructure></gml:File></gml:rangeSet>
  <gmlcov:rangeType/>{linked}
 </gmljp2:GMLJP2RectifiedGridCoverage></gmljp2:featureMember>
</gmljp2:GMLJP2CoverageCollection>"""


def crs_dictionary(epsg: int = 4326) -> str:
    """A GML dictionary whose entry ``crs1`` is another CRS: what a file would apply if it were read."""
    return (
        '<gml:Dictionary gml:id="CRSU1" xmlns:gml="http://www.opengis.net/gml"><gml:name>CRS</gml:name>'
        f'<gml:dictionaryEntry><gml:GeographicCRS gml:id="crs1"><gml:srsName>EPSG:{epsg}</gml:srsName>'
        "</gml:GeographicCRS></gml:dictionaryEntry></gml:Dictionary>"
    )


def with_boxes(source: Path, target: Path, extra: bytes) -> Path:
    """``source`` with ``extra`` boxes inserted before its codestream box (where GDAL writes its own)."""
    data = source.read_bytes()
    start, _ = find_codestream(lambda offset, length: data[offset : offset + length], len(data), str(source))
    at = start - 8  # a GDAL-written jp2c box has an 8-byte header
    assert data[at + 4 : at + 8] == b"jp2c"
    target.write_bytes(data[:at] + extra + data[at:])
    return target


# --------------------------------------------------------------------------- main header


def _codestream(data: bytes) -> int:
    start, _ = find_codestream(lambda offset, length: data[offset : offset + length], len(data), "file")
    return start


def with_siz(source: Path, target: Path, **fields: int) -> Path:
    """``source`` with SIZ fields (width/height: Xsiz/Ysiz, tile_width/tile_height) set to other values."""
    data = bytearray(source.read_bytes())
    siz = _codestream(bytes(data)) + 2
    assert data[siz : siz + 2] == b"\xff\x51"
    at = {"width": 6, "height": 10, "tile_width": 22, "tile_height": 26}
    for name, value in fields.items():
        struct.pack_into(">I", data, siz + at[name], value)
    target.write_bytes(bytes(data))
    return target


def with_cod(
    source: Path, target: Path, *, levels: int | None = None, codeblock_exponents: tuple[int, int] | None = None
) -> Path:
    """``source`` with its COD's decomposition levels or code-block size (stored exponents) changed."""
    data = bytearray(source.read_bytes())
    offset = _codestream(bytes(data)) + 2
    while data[offset : offset + 2] != b"\xff\x52":
        offset += 2 + struct.unpack_from(">H", data, offset + 2)[0]
    if levels is not None:
        data[offset + 4 + 5] = levels
    if codeblock_exponents is not None:
        data[offset + 4 + 6], data[offset + 4 + 7] = codeblock_exponents
    target.write_bytes(bytes(data))
    return target


# --------------------------------------------------------------------------- a local file that sees its opens


class LocalFileTrap:
    """A named pipe at ``path`` that sees every open: a process opening it to read waits until the
    trap opens the other end, which it does as soon as a reader is there (an open for writing
    without blocking succeeds only then), counts the open and serves ``content``. So no open of
    the path can go unseen, where a regular file's access time would say nothing reliable."""

    def __init__(self, path: Path, content: bytes):
        self.path, self.content = path, content
        self.opens = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> LocalFileTrap:
        os.mkfifo(self.path)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.path.unlink()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
                time.sleep(0.002)
                continue
            self.opens += 1
            os.set_blocking(fd, True)
            try:
                os.write(fd, self.content)
            except BrokenPipeError:
                pass
            os.close(fd)
            time.sleep(0.05)  # the reader reads to the end and closes before the next look


# --------------------------------------------------------------------------- damaged files


def _bases(directory: Path) -> list[Path]:
    """Intact JP2s the damage starts from: tiled with TLM, lossy RGB without TLM, one tile. Named
    ``.tif``: the content decides what a file is (tests/tiff_fuzz.py's worker takes ``*.tif``)."""
    return [
        write_jp2(directory / "base-tlm-uint16.tif", pixels(300, 200, seed=1), tile=128),
        write_jp2(
            directory / "base-lossy-rgb.tif", pixels(260, 180, 3, "uint8", 2), tile=128, lossless=False, TLM="NO"
        ),
        write_jp2(directory / "base-one-tile.tif", pixels(200, 150, seed=3), tile=256),
    ]


def _flip(data: bytes, rng, start: int, end: int, count: int) -> bytes:
    out = bytearray(data)
    for _ in range(count):
        at = rng.randrange(start, min(end, len(out)))
        out[at] = rng.randrange(256)
    return bytes(out)


def _set_word(data: bytes, rng, start: int, width: int) -> bytes:
    """A SIZ/COD-sized field near ``start`` set to an extreme value."""
    out = bytearray(data)
    at = start + rng.randrange(0, 40)
    value = rng.choice([0, 1, 2**16 - 1, 2**31, 2**32 - 1, rng.randrange(2**32)])
    out[at : at + width] = value.to_bytes(4, "big")[-width:]
    return bytes(out)


def _damaged(family: str, data: bytes, rng) -> bytes:
    header = _codestream(data)
    if family == "truncated":
        return data[: rng.randrange(1, len(data))]
    if family == "header-bytes":
        return _flip(data, rng, 0, header + 200, rng.randint(1, 4))
    if family == "tile-bytes":
        return _flip(data, rng, header + 200, len(data), rng.randint(1, 8))
    return _set_word(data, rng, header + 6, rng.choice([2, 4]))


def damaged_corpus(directory: Path, seed: int = 20261204) -> list[tuple[Path, str]]:
    """Seeded damage to the bases: truncations, flipped bytes in the boxes and main header, in the
    tiles' data, extreme SIZ and COD fields. (file, family) pairs, the intact bases first."""
    import random

    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    bases = _bases(directory)
    corpus = [(base, "intact") for base in bases]
    families = ("truncated", "header-bytes", "tile-bytes", "siz-field")
    for i in range(200):
        base = bases[i % len(bases)]
        family = families[i % 4 if i < 160 else rng.randrange(4)]
        path = directory / f"{family}-{i:03d}-{base.stem}.tif"
        path.write_bytes(_damaged(family, base.read_bytes(), rng))
        corpus.append((path, family))
    return corpus
