"""A scene that compresses like imagery: fractal terrain, 3 correlated uint16 bands, a little sensor noise.

The noisy bench scene (testkit.scenes) barely compresses; real imagery does, 2-4x with DEFLATE and
a horizontal predictor. This one is value noise summed over octaves (amplitude growing with the
cell size, as in fractional Brownian terrain), bilinear between grid nodes, so it is smooth at
every scale and deterministic; bands are the terrain under different gains plus independent
noise of a few counts. Written window by window (memory: one window and the octave grids).

    python -m bench.terrain SIZE   # writes (or finds) bench/data/terrain_SIZExSIZEx3_uint16.tif
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

#: Amplitude of an octave relative to its cell size (Hurst exponent).
HURST = 0.8
#: Smallest octave's cell, in pixels.
FINEST_CELL = 4
#: Standard deviation of each band's per-pixel noise, in counts (sets how well it compresses).
NOISE_COUNTS = 2.0
WINDOW = 1024


def _octaves(size: int, seed: int) -> list[tuple[int, np.ndarray, float]]:
    rng = np.random.default_rng(seed)
    cells, cell = [], size // 4
    while cell >= FINEST_CELL:
        nodes = size // cell + 2
        cells.append((cell, rng.standard_normal((nodes, nodes)).astype(np.float32), float(cell) ** HURST))
        cell //= 2
    return cells


def _terrain(octaves, row_off: int, col_off: int, height: int, width: int) -> np.ndarray:
    out = np.zeros((height, width), dtype=np.float32)
    rows = np.arange(row_off, row_off + height, dtype=np.float64)
    cols = np.arange(col_off, col_off + width, dtype=np.float64)
    for cell, grid, amplitude in octaves:
        gr, gc = rows / cell, cols / cell
        r0, c0 = gr.astype(np.int64), gc.astype(np.int64)
        fr, fc = (gr - r0).astype(np.float32)[:, None], (gc - c0).astype(np.float32)[None, :]
        top = grid[r0][:, c0] * (1 - fc) + grid[r0][:, c0 + 1] * fc
        bottom = grid[r0 + 1][:, c0] * (1 - fc) + grid[r0 + 1][:, c0 + 1] * fc
        out += amplitude * (top * (1 - fr) + bottom * fr)
    return out


def write_terrain(path: Path, size: int, seed: int = 7) -> Path:
    import rasterio
    from rasterio.transform import from_origin
    from rasterio.windows import Window

    octaves = _octaves(size, seed)
    scale = 9000.0 / (4 * float(size // 4) ** HURST)  # about +-9000 counts around the middle
    noise = np.random.default_rng(seed + 1)
    profile = dict(
        driver="GTiff",
        width=size,
        height=size,
        count=3,
        dtype="uint16",
        crs="EPSG:32633",
        transform=from_origin(500000, 6000000, 10, 10),
        nodata=0,
        tiled=True,
        blockxsize=256,
        blockysize=256,
        compress="deflate",
        predictor=2,
        BIGTIFF="IF_SAFER",
    )
    with rasterio.open(path, "w", **profile) as dst:
        for row in range(0, size, WINDOW):
            for col in range(0, size, WINDOW):
                h, w = min(WINDOW, size - row), min(WINDOW, size - col)
                base = _terrain(octaves, row, col, h, w) * scale
                bands = []
                for gain, offset in ((1.0, 20000.0), (0.8, 24000.0), (1.3, 18000.0)):
                    band = base * gain + offset + noise.normal(0.0, NOISE_COUNTS, (h, w)).astype(np.float32)
                    bands.append(np.clip(band, 1, 65535).astype(np.uint16))
                dst.write(np.stack(bands), window=Window(col, row, w, h))
    return path


def terrain_path(size: int) -> Path:
    from .common import DATA, say

    DATA.mkdir(parents=True, exist_ok=True)
    final = DATA / f"terrain_{size}x{size}x3_uint16.tif"
    if not final.exists():
        partial = final.with_suffix(".partial.tif")
        write_terrain(partial, size)
        partial.rename(final)
        say(f"  generated {final.name} ({final.stat().st_size / 2**20:.0f} MiB)")
    return final


if __name__ == "__main__":
    print(terrain_path(int(sys.argv[1])))
