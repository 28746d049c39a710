"""Band files of a Sentinel-2-like scene and the scene document naming them: one uint16 GeoTIFF
per band at 10, 20 and 60 m on one UTM grid, as the tests and benches stack them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import rasterio
from rasterio.transform import from_origin

#: Band name, description and pixel size (m) of the trio, Sentinel-2's B04, B8A and B01.
TRIO = (("B04", "red, 10 m", 10), ("B8A", "narrow NIR, 20 m", 20), ("B01", "coastal aerosol, 60 m", 60))
#: Upper-left corner of every band (a Sentinel-2 tile's, EPSG:32633).
ORIGIN = (300000.0, 5000040.0)


def write_band(
    path: Path,
    width: int,
    height: int,
    pixel: float,
    *,
    seed: int,
    origin=ORIGIN,
    crs="EPSG:32633",
    nodata: float | None = None,
    blocksize: int = 256,
) -> Path:
    """One band file: ``width`` x ``height`` uint16 pixels of ``pixel`` metres, tiled."""
    values = np.random.default_rng(seed).integers(0, 10000, size=(1, height, width), dtype="uint16")
    tiled = width >= blocksize and height >= blocksize
    profile = dict(
        driver="GTiff",
        width=width,
        height=height,
        count=1,
        dtype="uint16",
        crs=crs,
        nodata=nodata,
        transform=from_origin(origin[0], origin[1], pixel, pixel),
        compress="deflate",
    )
    if tiled:
        profile.update(tiled=True, blockxsize=blocksize, blockysize=blocksize)
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(values)
    return path


def write_trio(folder: Path, width: int = 1200, height: int = 900, *, seed: int = 0) -> list[Path]:
    """The trio's band files in ``folder`` covering ``width`` x ``height`` 10 m pixels (multiples of 6)."""
    folder.mkdir(parents=True, exist_ok=True)
    return [
        write_band(folder / f"{name}.tif", width * 10 // pixel, height * 10 // pixel, pixel, seed=seed + i)
        for i, (name, _, pixel) in enumerate(TRIO)
    ]


def scene_list(hrefs: list[str], *, names=None, descriptions=None, resampling: str | None = None) -> bytes:
    """A ``tilecommit:scene`` list naming ``hrefs`` in order."""
    bands = []
    for i, href in enumerate(hrefs):
        band = {"href": href}
        if names:
            band["name"] = names[i]
        if descriptions:
            band["description"] = descriptions[i]
        bands.append(band)
    document: dict = {"tilecommit:scene": 1, "bands": bands}
    if resampling:
        document["resampling"] = resampling
    return json.dumps(document).encode()


def stac_item(hrefs: list[str], *, names, descriptions, resampling: str | None = None) -> bytes:
    """A STAC item whose data assets are ``hrefs`` (eo:bands naming them), with a thumbnail asset
    naming a URL that is never read."""
    assets: dict = {"thumbnail": {"href": "https://example.invalid/thumb.png", "roles": ["thumbnail"]}}
    for href, name, description in zip(hrefs, names, descriptions, strict=True):
        assets[name] = {
            "href": href,
            "type": "image/tiff; application=geotiff",
            "roles": ["data"],
            "eo:bands": [{"name": name, "description": description}],
        }
    properties: dict = {"datetime": "2026-06-01T10:00:00Z"}
    if resampling:
        properties["tilecommit:resampling"] = resampling
    item = {
        "type": "Feature",
        "stac_version": "1.0.0",
        "id": "scene",
        "geometry": None,
        "properties": properties,
        "links": [],
        "assets": assets,
    }
    return json.dumps(item).encode()


def write_trio_document(
    folder: Path,
    *,
    resampling: str | None = None,
    stac: bool = False,
    seed: int = 0,
    width: int = 1200,
    height: int = 900,
) -> Path:
    """The trio and its document ``scene.json`` in ``folder``."""
    paths = write_trio(folder, width, height, seed=seed)
    hrefs = [p.name for p in paths]
    names, descriptions = [n for n, _, _ in TRIO], [d for _, d, _ in TRIO]
    body = (
        stac_item(hrefs, names=names, descriptions=descriptions, resampling=resampling)
        if stac
        else scene_list(hrefs, names=names, descriptions=descriptions, resampling=resampling)
    )
    document = folder / "scene.json"
    document.write_bytes(body)
    return document
