"""Four warped windows rendered at once, beside a GDAL call that holds the GIL waiting for GDAL's
threads: the conditions under which four web-optimized jobs once deadlocked.

Run by ``tests/test_gdal_threads.py`` in a process of its own (``python -m tests.concurrent_warps
DIR BOUND``), so a deadlock cannot stop the test runner: every render reads its upload through the
app's reader and renders every window of its grid, as ``render_tile`` does (without the commit);
beside them, an overview build holds the GIL inside GDAL while it waits for GDAL's pool, as the
assembly's coarse levels do (rasterio 1.4 calls GDALBuildOverviews without releasing the GIL).
If GDAL's pool reads an upload, a worker waits for that GIL and the process stops.

The process prints one JSON line: how many windows each render did, every plugin call made
on a thread Python did not start (:class:`~tests.gdal_threads.GdalThreadReads`). A render not
done after BOUND seconds fails with every thread's stack; if a thread holds the GIL meanwhile,
no Python thread runs, and ``faulthandler`` dumps every stack and ends the process instead.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import threading
from pathlib import Path

import numpy as np
import rasterio
from rasterio.enums import Resampling

from testkit.scenes import SceneSpec, write_scene
from tilecommit.raster.env import gdal_env
from tilecommit.settings import Settings

from .gdal_threads import WARPED, GdalThreadReads, render_every_window, run_at_once
from .test_alpha_band import alpha_scene

SETTINGS = Settings()
#: Seconds past the bound after which faulthandler ends a process no Python thread can run in.
BACKSTOP = 30


def renders(directory: Path) -> dict[str, tuple[str, dict[str, str]]]:
    """The four warped renders (:data:`~tests.gdal_threads.WARPED`): their upload and profile options."""
    scene = write_scene(str(directory / "utm.tif"), SceneSpec(1024, 1024, nodata=0, blocksize=256))
    alpha = alpha_scene(directory / "alpha.tif", compress="deflate")
    return {name: (alpha if on_alpha else scene, options) for name, (options, on_alpha) in WARPED.items()}


def build_overviews_while(rendering: threading.Event, directory: Path) -> int:
    """Overviews of a local level copy built again and again while ``rendering`` is set, as the
    assembly's coarse levels are built (``block_copy.build_coarse_levels``); how many times."""
    path = str(directory / "level.tif")
    pixels = np.random.default_rng(3).integers(1, 4000, size=(3, 2048, 2048), dtype=np.uint16)
    profile = dict(driver="GTiff", width=2048, height=2048, count=3, dtype="uint16", tiled=True, compress="deflate")
    builds = 0
    while rendering.is_set() or builds == 0:
        with rasterio.open(path, "w", **profile) as level:
            level.write(pixels)
        with gdal_env(SETTINGS), rasterio.open(path, "r+") as level:
            level.build_overviews([2, 4, 8], Resampling.average)
        builds += 1
    return builds


def main(directory: str, bound: float) -> None:
    faulthandler.dump_traceback_later(bound + BACKSTOP, exit=True)
    watch = GdalThreadReads().install(setattr)
    rendering, remaining = threading.Event(), [0]
    rendering.set()
    lock = threading.Lock()

    def task(upload: str, options: dict[str, str]):
        def run() -> int:
            try:
                return render_every_window(upload, options, SETTINGS)
            finally:
                with lock:
                    remaining[0] -= 1
                    if remaining[0] == 0:
                        rendering.clear()

        return run

    tasks = {name: task(*render) for name, render in renders(Path(directory)).items()}
    remaining[0] = len(tasks)
    tasks["coarse levels"] = lambda: build_overviews_while(rendering, Path(directory))
    try:
        results = run_at_once(tasks, bound)
    except AssertionError as stuck:
        print(stuck, file=sys.stderr, flush=True)
        os._exit(1)
    report = {
        "renders": {name: r if isinstance(r, int) else repr(r) for name, r in results.items()},
        "gdal_thread_calls": watch.calls[:20],
        "gdal_thread_call_count": len(watch.calls),
    }
    print(json.dumps(report), flush=True)
    os._exit(0)  # GDAL's pool threads are not joined


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
