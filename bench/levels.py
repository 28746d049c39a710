"""The default profile's DEFLATE level: CPU and size of real tiles at each level, on two scenes.

Each window is read once, then encoded by the tile encoder itself (``encode_tile``: the COG with
its overviews, as a tile activity makes it) with the default profile and ``level`` set on top,
on one thread, so the CPU is the process's own (``time.process_time``). Levels 1-9 of libdeflate,
the DEFLATE GDAL uses; the default profile pins 6 (tilecommit/profiles.py).

    python -m bench.levels [SIZE] [WINDOWS]   # default 10240, 8 windows on the diagonal of each scene
"""

from __future__ import annotations

import json
import sys
import time

from .common import RESULTS, scene_path, table
from .terrain import terrain_path

LEVELS = range(1, 10)
WINDOW = 1024


def measure(path, windows: int, window_size: int = WINDOW) -> dict[str, dict[str, float]]:
    import rasterio
    from rasterio.windows import Window

    from tilecommit import profiles
    from tilecommit.raster.tiling.encode import encode_tile, read_window
    from tilecommit.spec import OutputSpec

    specs = {
        level: OutputSpec.with_choice(
            window_size, profiles.choose(profiles.DEFAULT, {"level": level}, where="bench.levels")
        )
        for level in LEVELS
    }
    totals = {level: {"cpu_s": 0.0, "bytes": 0} for level in LEVELS}
    with rasterio.open(path) as src:
        step = (min(src.width, src.height) - window_size) // max(windows - 1, 1)
        for k in range(windows):
            window = Window(k * step, k * step, window_size, window_size)
            pixels = read_window(src, window, choice=specs[LEVELS[0]].choice)  # the level is not read
            for level, spec in specs.items():
                started = time.process_time()
                body, _ = encode_tile(src, window, spec=spec, num_threads=1, pixels=pixels)
                totals[level]["cpu_s"] += time.process_time() - started
                totals[level]["bytes"] += len(body)
    return {
        f"level_{level}": {"cpu_s_per_window": t["cpu_s"] / windows, "bytes": t["bytes"]} for level, t in totals.items()
    }


def run(size: int, windows: int) -> dict:
    scenes = {"noisy": scene_path(size), "terrain": terrain_path(size)}
    return {
        "size": size,
        "windows": windows,
        "window_size": WINDOW,
        "scenes": {k: measure(p, windows) for k, p in scenes.items()},
    }


def print_report(report: dict) -> None:
    rows = []
    for kind, levels in report["scenes"].items():
        six = levels["level_6"]
        for level, m in levels.items():
            rows.append(
                [
                    kind,
                    level.removeprefix("level_"),
                    f"{m['cpu_s_per_window']:.3f}",
                    f"{m['cpu_s_per_window'] / six['cpu_s_per_window']:.2f}x",
                    f"{m['bytes'] / 2**20:.1f}",
                    f"{m['bytes'] / six['bytes']:.3f}x",
                ]
            )
    print(f"\n## DEFLATE level of the default profile, {report['windows']} tiles of {report['window_size']}² per scene")
    print(table(rows, ["scene", "level", "CPU-s a tile", "vs 6", "MiB of tiles", "vs 6"]))


if __name__ == "__main__":
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 10240
    windows = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    report = run(size, windows)
    out = RESULTS / f"levels_{size}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print_report(report)
    print(f"wrote {out}")
