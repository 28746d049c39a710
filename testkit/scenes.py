"""Deterministic synthetic scenes: smooth terrain-like structure plus sensor-like noise.

The one scene generator of the project: the tests, the benchmarks and ``make demo`` make their
scenes here. Pure noise would not compress and a flat field would compress absurdly well; this mix gives
DEFLATE ratios close to real imagery. Every window's pixels depend only on the scene parameters
and the window position (the noise is seeded per window), and the scene is written window by
window, so a 20480² scene never needs more than one window in memory.

    python -m testkit.scenes OUT.tif --width 2048 --height 2048 --count 3 --dtype uint16
"""

from __future__ import annotations

import argparse
import hashlib
from dataclasses import dataclass

import numpy as np
import rasterio
from rasterio.transform import from_origin
from rasterio.windows import Window

#: Edge of the square windows the scene is generated and written in (bounds the generator's memory).
GENERATOR_WINDOW = 1024


@dataclass(frozen=True)
class SceneSpec:
    width: int
    height: int
    count: int = 3
    dtype: str = "uint16"
    crs: str = "EPSG:32633"
    #: Upper-left corner and pixel size, in CRS units.
    origin: tuple[float, float] = (500000.0, 4600000.0)
    resolution: float = 10.0
    nodata: float | None = None
    #: When nodata is set, a triangle in the upper-left corner holds it (the "outside the swath" area).
    nodata_corner: float = 0.15
    seed: int = 7
    #: How the file is written: block size and compression of the upload itself.
    blocksize: int = 512
    compress: str = "deflate"

    @property
    def transform(self):
        return from_origin(self.origin[0], self.origin[1], self.resolution, self.resolution)


def _window_seed(spec: SceneSpec, row_off: int, col_off: int, band: int) -> int:
    material = f"{spec.seed}:{spec.width}:{spec.height}:{row_off}:{col_off}:{band}".encode()
    return int.from_bytes(hashlib.sha256(material).digest()[:8], "little")


def generator_windows(spec: SceneSpec) -> list[Window]:
    step = GENERATOR_WINDOW
    return [
        Window(col, row, min(step, spec.width - col), min(step, spec.height - row))
        for row in range(0, spec.height, step)
        for col in range(0, spec.width, step)
    ]


def scene_window(spec: SceneSpec, window: Window) -> np.ndarray:
    """The pixels of one generator window (all bands); noise is seeded by the window's position."""
    row_off, col_off = int(window.row_off), int(window.col_off)
    height, width = int(window.height), int(window.width)
    rows = np.arange(row_off, row_off + height, dtype="float64")[:, None]
    cols = np.arange(col_off, col_off + width, dtype="float64")[None, :]
    info = np.iinfo(spec.dtype) if np.dtype(spec.dtype).kind in "ui" else None
    top = float(min(info.max, 12000)) if info else 1.0
    bottom = float(max(info.min, 0)) if info else 0.0
    planes = []
    for band in range(spec.count):
        phase = band * 0.7
        smooth = (
            0.45
            + 0.2 * np.sin(cols / 311.0 + phase) * np.cos(rows / 277.0 - phase)
            + 0.12 * np.sin((cols + rows) / 97.0 + 2 * phase)
            + 0.08 * np.cos(np.hypot(cols - spec.width / 3, rows - spec.height / 2) / 53.0)
        )
        rng = np.random.default_rng(_window_seed(spec, row_off, col_off, band))
        noise = rng.normal(0.0, 0.012, size=(height, width))
        value = np.clip(smooth + noise, 0.0, 1.0)
        if info is not None:
            plane = np.round(bottom + value * (top - bottom)).astype(spec.dtype)
        else:
            plane = (value * 100.0 - 20.0).astype(spec.dtype)
        planes.append(plane)
    data = np.stack(planes)
    if spec.nodata is not None:
        # A straight swath edge: pixels above the diagonal near the upper-left corner hold nodata.
        limit = spec.nodata_corner * (spec.width + spec.height)
        outside = (cols + rows) < limit
        data[:, np.broadcast_to(outside, (height, width))] = spec.nodata
    return data


def write_scene(path: str, spec: SceneSpec, *, num_threads: int = 2) -> str:
    """Write ``spec`` as a tiled GeoTIFF, window by window; returns ``path``."""
    profile = {
        "driver": "GTiff",
        "width": spec.width,
        "height": spec.height,
        "count": spec.count,
        "dtype": spec.dtype,
        "crs": spec.crs,
        "transform": spec.transform,
        "nodata": spec.nodata,
        "tiled": True,
        "blockxsize": spec.blocksize,
        "blockysize": spec.blocksize,
        "compress": spec.compress,
        "predictor": 3 if np.dtype(spec.dtype).kind == "f" else 2,
        "BIGTIFF": "IF_SAFER",
        "NUM_THREADS": num_threads,
    }
    # A cache holding one row of generator windows lets GDAL compress each block once.
    row_bytes = spec.width * GENERATOR_WINDOW * spec.count * np.dtype(spec.dtype).itemsize
    with rasterio.Env(GDAL_CACHEMAX=max(64, 2 * row_bytes // 2**20)), rasterio.open(path, "w", **profile) as dst:
        for window in generator_windows(spec):
            dst.write(scene_window(spec, window), window=window)
    return path


def read_scene(spec: SceneSpec) -> np.ndarray:
    """The whole scene in memory (for small test scenes), identical to what :func:`write_scene` writes."""
    data = np.empty((spec.count, spec.height, spec.width), dtype=spec.dtype)
    for window in generator_windows(spec):
        data[:, window.toslices()[0], window.toslices()[1]] = scene_window(spec, window)
    return data


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path")
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--height", type=int, default=2048)
    parser.add_argument("--count", type=int, default=3)
    parser.add_argument("--dtype", default="uint16")
    parser.add_argument("--crs", default="EPSG:32633")
    parser.add_argument("--nodata", type=float, default=None)
    args = parser.parse_args(argv)
    spec = SceneSpec(args.width, args.height, args.count, args.dtype, args.crs, nodata=args.nodata)
    write_scene(args.path, spec)
    print(f"wrote {args.path}: {spec.width}x{spec.height}x{spec.count} {spec.dtype}")


if __name__ == "__main__":
    main()
