"""Hostile uploads for the tests: files that name a URL, a file of the instance or another blob,
other formats, and sidecars. Each is real: opened by GDAL left alone, it does what it says."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import rasterio
from rasterio.transform import from_origin

#: Bytes that must never leave the secret file: its raw content and its pixels.
MARKER = b"TILECOMMIT-SECRET-7f3a9c"


def make_secret_raw(tmp_path: Path) -> Path:
    """A file on the instance's disk that an upload must never be able to read (raw bytes)."""
    path = tmp_path / "instance-secret.bin"
    path.write_bytes(MARKER * 500)
    return path


def make_secret_tif(tmp_path: Path) -> Path:
    """A GeoTIFF on the instance's disk whose pixels spell the marker."""
    path = tmp_path / "instance-secret.tif"
    _write_small(path, "GTiff", np.frombuffer((MARKER * 100)[: 40 * 60], dtype="uint8").reshape(1, 40, 60))
    return path


def _write_small(path, driver: str, pixels: np.ndarray) -> None:
    """A 60 x 40 one-band uint8 raster in EPSG:4326, in the given format."""
    with rasterio.open(
        path,
        "w",
        driver=driver,
        width=60,
        height=40,
        count=1,
        dtype="uint8",
        crs="EPSG:4326",
        transform=from_origin(0, 40, 1, 1),
    ) as dst:
        dst.write(pixels)


def vrt(source: str, *, kind: str = "SimpleSource") -> str:
    return (
        '<VRTDataset rasterXSize="60" rasterYSize="40"><SRS>EPSG:4326</SRS>'
        "<GeoTransform>0, 1, 0, 40, 0, -1</GeoTransform>"
        f'<VRTRasterBand dataType="Byte" band="1"><{kind}>'
        f'<SourceFilename relativeToVRT="0">{source}</SourceFilename><SourceBand>1</SourceBand>'
        f"</{kind}></VRTRasterBand></VRTDataset>"
    )


def raw_vrt(path: str) -> str:
    """A VRT band read straight from a raw file (GDAL's VRTRawRasterBand)."""
    return (
        '<VRTDataset rasterXSize="60" rasterYSize="40"><SRS>EPSG:4326</SRS>'
        "<GeoTransform>0, 1, 0, 40, 0, -1</GeoTransform>"
        '<VRTRasterBand dataType="Byte" band="1" subClass="VRTRawRasterBand">'
        f'<SourceFilename relativeToVRT="0">{path}</SourceFilename><ImageOffset>0</ImageOffset>'
        "<PixelOffset>1</PixelOffset><LineOffset>60</LineOffset></VRTRasterBand></VRTDataset>"
    )


def python_pixel_function_vrt(url: str) -> str:
    """A derived band whose Python pixel function would fetch ``url``."""
    code = f"import urllib.request\ndef f(*a, **k):\n    urllib.request.urlopen('{url}/python')\n"
    return (
        '<VRTDataset rasterXSize="60" rasterYSize="40"><SRS>EPSG:4326</SRS>'
        "<GeoTransform>0, 1, 0, 40, 0, -1</GeoTransform>"
        '<VRTRasterBand dataType="Byte" band="1" subClass="VRTDerivedRasterBand">'
        "<PixelFunctionType>f</PixelFunctionType><PixelFunctionLanguage>Python</PixelFunctionLanguage>"
        f"<PixelFunctionCode><![CDATA[{code}]]></PixelFunctionCode>"
        f'<SimpleSource><SourceFilename relativeToVRT="0">/vsicurl/{url}/derived.tif</SourceFilename>'
        "<SourceBand>1</SourceBand></SimpleSource></VRTRasterBand></VRTDataset>"
    )


def wms(url: str) -> str:
    return (
        f'<GDAL_WMS><Service name="TMS"><ServerUrl>{url}/tms/${{z}}/${{x}}/${{y}}.png</ServerUrl></Service>'
        "<DataWindow><UpperLeftX>-180</UpperLeftX><UpperLeftY>90</UpperLeftY><LowerRightX>180</LowerRightX>"
        "<LowerRightY>-90</LowerRightY><TileLevel>1</TileLevel><TileCountX>1</TileCountX><TileCountY>1</TileCountY>"
        "</DataWindow><Projection>EPSG:4326</Projection><BlockSizeX>256</BlockSizeX><BlockSizeY>256</BlockSizeY>"
        "<BandsCount>1</BandsCount></GDAL_WMS>"
    )


def hfa(tmp_path) -> str:
    path = tmp_path / "imagine.img"
    _write_small(path, "HFA", np.ones((1, 40, 60), dtype="uint8"))
    return str(path)


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def network_vectors(tmp_path, url: str) -> dict[str, str]:
    """Uploads that name an address on the network (the trap)."""
    return {
        "vrt-vsicurl-source": write(tmp_path, "net.vrt", vrt(f"/vsicurl/{url}/remote.tif")),
        "vrt-plain-url-source": write(tmp_path, "url.vrt", vrt(f"{url}/plain.tif")),
        "vrt-named-tif": write(tmp_path, "innocent.tif", vrt(f"/vsicurl/{url}/disguised.tif")),
        "vrt-python-pixel-function": write(tmp_path, "py.vrt", python_pixel_function_vrt(url)),
        "gdal-wms-description": write(tmp_path, "tiles.xml.tif", wms(url)),
    }


def local_vectors(tmp_path, secret_tif, secret_raw) -> dict[str, str]:
    """Uploads that name a file on the instance's disk."""
    return {
        "vrt-local-geotiff": write(tmp_path, "local.vrt", vrt(str(secret_tif))),
        "vrt-local-raw-file": write(tmp_path, "raw.vrt", raw_vrt(str(secret_raw))),
        "vrt-local-named-tif": write(tmp_path, "scene.tif", vrt(str(secret_tif))),
    }


def geotiff(path, *, georeferenced: bool = True) -> str:
    profile = dict(
        driver="GTiff", width=300, height=200, count=1, dtype="uint8", tiled=True, blockxsize=256, blockysize=256
    )
    if georeferenced:
        profile.update(crs="EPSG:32633", transform=from_origin(500000, 4600000, 10, 10))
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(np.full((1, 200, 300), 7, dtype="uint8"))
    return str(path)


def add_sidecars(path: str) -> list[str]:
    """Sidecars that GDAL, left alone, reads beside ``path``: georeferencing, nodata, a mask, overviews."""
    (aux := path + ".aux.xml")
    with open(aux, "w") as f:
        f.write(
            "<PAMDataset><SRS>EPSG:4326</SRS><GeoTransform>10, 1, 0, 50, 0, -1</GeoTransform>"
            '<Metadata><MDI key="FROM_SIDECAR">yes</MDI></Metadata>'
            '<PAMRasterBand band="1"><NoDataValue>7</NoDataValue></PAMRasterBand></PAMDataset>'
        )
    world = path[: -len(".tif")] + ".tfw"
    with open(world, "w") as f:
        f.write("10\n0\n0\n-10\n500000\n4600000\n")
    mask, overview = path + ".msk", path + ".ovr"
    with rasterio.open(mask, "w", driver="GTiff", width=300, height=200, count=1, dtype="uint8") as dst:
        dst.write(np.zeros((1, 200, 300), dtype="uint8"))
    shutil.copy(mask, overview)
    return [aux, world, mask, overview]
