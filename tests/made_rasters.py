"""Rasters the tests make when they need one that no file of the corpus may stand for.

Each is a pure function of this code: the same bytes every run, written once per test process
into a folder of its own (never committed).

- ``polar_stereographic_south.tif``: the grid of a south polar stereographic product (25 km
  cells, 316 x 332, latitude of true scale 70 deg S, on the Hughes 1980 ellipsoid, written as WKT
  only and equivalent to EPSG:3412), float32, LZW in strips, with a synthetic concentration field
  (0 to 100 in steps of 0.4) on a disk around the pole and nodata outside it: a footprint around
  the pole. It stands in for a real product of that grid whose licence is not stated.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import rasterio
from rasterio.crs import CRS
from rasterio.transform import from_origin

#: The CRS of the south polar stereographic grid, as its products write it (no EPSG code in the file).
POLAR_SOUTH_WKT = (
    'PROJCS["unknown",GEOGCS["unknown",DATUM["unknown",SPHEROID["unknown",6378273,298.279411123064]],'
    'PRIMEM["Greenwich",0],UNIT["degree",0.0174532925199433,AUTHORITY["EPSG","9122"]]],'
    'PROJECTION["Polar_Stereographic"],PARAMETER["latitude_of_origin",-70],PARAMETER["central_meridian",0],'
    'PARAMETER["false_easting",0],PARAMETER["false_northing",0],UNIT["metre",1],'
    'AXIS["Easting",NORTH],AXIS["Northing",NORTH]]'
)
POLAR_NODATA = -3.3999999521443642e38
#: Radius of the valid disk around the pole, in metres of the projection.
POLAR_VALID_RADIUS_M = 4.25e6


def polar_stereographic_south(path: Path) -> None:
    width, height, cell = 316, 332, 25000.0
    transform = from_origin(-3950000.0, 4350000.0, cell, cell)
    cols, rows = np.meshgrid(np.arange(width) + 0.5, np.arange(height) + 0.5)
    x, y = transform * (cols, rows)
    radius = np.hypot(x, y)
    # Highest 2,500 km from the pole, falling to 0 over 1,500 km either side.
    field = np.clip(100.0 * (1.0 - np.abs(radius - 2.5e6) / 1.5e6), 0.0, 100.0)
    data = (np.round(field / 0.4) * 0.4).astype("float32")
    data[radius >= POLAR_VALID_RADIUS_M] = POLAR_NODATA
    profile = {
        "driver": "GTiff",
        "width": width,
        "height": height,
        "count": 1,
        "dtype": "float32",
        "crs": CRS.from_wkt(POLAR_SOUTH_WKT),
        "transform": transform,
        "nodata": POLAR_NODATA,
        "compress": "lzw",
        "tiled": False,
        "blockysize": 6,
    }
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(data, 1)


MAKERS: dict[str, Callable[[Path], None]] = {"polar_stereographic_south.tif": polar_stereographic_south}
_FOLDER: Path | None = None


def made(name: str) -> Path:
    """The made raster ``name``, written on first use in this process."""
    global _FOLDER
    if _FOLDER is None:
        _FOLDER = Path(tempfile.mkdtemp(prefix="tilecommit-made-"))
    path = _FOLDER / name
    if not path.exists():
        MAKERS[name](path)
    return path
