"""Small real GeoTIFFs made with rasterio for the end-to-end tests (never committed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import rasterio
from rasterio.transform import from_origin


def make_scene(path: Path, width: int = 1000, height: int = 700, count: int = 3, dtype: str = "uint16",
               crs: str = "EPSG:32633", nodata: float | None = None, seed: int = 7) -> Path:
    """A north-up scene with smooth structure and noise (realistic compression), deterministic."""
    rng = np.random.default_rng(seed)
    rows, cols = np.mgrid[0:height, 0:width]
    bands = []
    for band in range(count):
        wave = np.sin(cols / (37.0 + 11 * band)) + np.cos(rows / (23.0 + 7 * band))
        data = (wave + 2.0) * 1000 + rng.normal(0, 20, size=(height, width))
        bands.append(data)
    array = np.clip(np.stack(bands), 0, np.iinfo(dtype).max if np.dtype(dtype).kind in "ui" else None).astype(dtype)
    if nodata is not None:
        array[:, : height // 10, : width // 10] = nodata
    profile = {
        "driver": "GTiff", "width": width, "height": height, "count": count, "dtype": dtype, "crs": crs,
        "transform": from_origin(500000.0, 5600000.0, 10.0, 10.0), "nodata": nodata,
        "tiled": True, "blockxsize": 256, "blockysize": 256, "compress": "deflate",
    }
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(array)
    return path


def read_pixels(path_or_bytes) -> np.ndarray:
    if isinstance(path_or_bytes, (bytes, bytearray)):
        from rasterio.io import MemoryFile

        with MemoryFile(bytes(path_or_bytes)) as memfile, memfile.open() as src:
            return src.read()
    with rasterio.open(path_or_bytes) as src:
        return src.read()
