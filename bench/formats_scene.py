"""Scenes made of several files: our stacking of a scene document's band files against
``gdalbuildvrt -separate`` + ``rio cogeo create``, file to file, side by side in one run.

- ours: a child process that validates the document (every member checked as an upload, the
  stack opened through each member's counted reader) and encodes every window of the stack as
  a tile COG (:func:`tilecommit.raster.encode_tile`), the work a job's activities do with the
  pixels, files on local disk, storage and the mosaic's block copy left out;
- rio: ``gdalbuildvrt -separate -resolution highest -r KERNEL`` (Debian's gdal-bin), then
  ``rio cogeo create`` of that VRT (rio-cogeo takes one file; the VRT is how several become one).

Each row says whether our tiles hold the pixels of rio's COG, window by window.

    python -m bench.formats_scene            (prints the table)
    python -m bench.formats_scene ours DOC OUT   (the child; writes OUT/<window>.tif)
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import rasterio
from rasterio.io import MemoryFile

from testkit.band_files import TRIO, write_trio_document

from .common import PYTHON, RIO, run_measured, table
from .e2e import RIO_OPTIONS

#: Width and height of the 10 m band (a multiple of 6); TILECOMMIT_BENCH_SCENE_SIZE for a quick look.
SIZE = int(os.environ.get("TILECOMMIT_BENCH_SCENE_SIZE", "3000"))
#: (case, 10 m width, height, kernel); the 20 and 60 m bands cover the same ground.
CASES = tuple((f"S2 trio {SIZE}² {kernel}", SIZE, SIZE, kernel) for kernel in ("nearest", "bilinear"))
WINDOW = 1024


def _ours(document: Path, out: Path) -> None:
    from tilecommit.grid import plan_windows
    from tilecommit.raster import LocalFile, encode_tile, gdal_env, inspect_source
    from tilecommit.raster.reading.scene_document import open_any_upload
    from tilecommit.settings import Settings
    from tilecommit.spec import OutputSpec

    settings = Settings(window_size=WINDOW)
    spec = OutputSpec.from_settings(settings)
    scene = inspect_source(str(document), settings=settings, spec=spec)
    with gdal_env(settings), open_any_upload(LocalFile(document)) as stack:
        for window in plan_windows(scene.width, scene.height, WINDOW):
            body, _ = encode_tile(stack, window, spec=spec)
            (out / f"{window.id}.tif").write_bytes(body)


def _same_pixels(tiles: Path, rio_cog: Path) -> bool:
    with rasterio.open(rio_cog) as reference:
        for tile in sorted(tiles.glob("*.tif")):
            with MemoryFile(tile.read_bytes()) as memory, memory.open() as src:
                col, row = ~reference.transform * (src.transform.c, src.transform.f)
                window = ((round(row), round(row) + src.height), (round(col), round(col) + src.width))
                if not np.array_equal(src.read(), reference.read(window=window)):
                    return False
    return True


def measure(workdir: Path) -> list[dict]:
    rows = []
    for case, width, height, kernel in CASES:
        folder = workdir / case.replace(" ", "-").replace("²", "")
        document = write_trio_document(folder, resampling=kernel, width=width, height=height)
        tiles, vrt, rio_cog = folder / "tiles", folder / "stack.vrt", folder / "rio.tif"
        tiles.mkdir(exist_ok=True)
        ours = run_measured([PYTHON, "-m", "bench.formats_scene", "ours", str(document), str(tiles)])
        members = [str(folder / f"{name}.tif") for name, _, _ in TRIO]
        built = run_measured(
            ["gdalbuildvrt", "-q", "-separate", "-resolution", "highest", "-r", kernel, str(vrt), *members]
        )
        rio = run_measured([RIO, "cogeo", "create", str(vrt), str(rio_cog), *RIO_OPTIONS])
        rows.append(
            {
                "format": "scene document (3 GeoTIFF bands)",
                "case": case,
                "pixels": width * height,
                "ours_s": ours.summary()["wall_s"],
                "ours_cpu_s": ours.summary()["cpu_s"],
                "rio_s": round(built.summary()["wall_s"] + rio.summary()["wall_s"], 3),
                "rio_cpu_s": round(built.summary()["cpu_s"] + rio.summary()["cpu_s"], 2),
                "pixel_equal": _same_pixels(tiles, rio_cog),
            }
        )
    return rows


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "ours":
        _ours(Path(sys.argv[2]), Path(sys.argv[3]))
        return
    with tempfile.TemporaryDirectory() as workdir:
        rows = measure(Path(workdir))
    keys = ["case", "pixels", "ours_s", "ours_cpu_s", "rio_s", "rio_cpu_s", "pixel_equal"]
    print(table([[str(row[k]) for k in keys] for row in rows], keys))


if __name__ == "__main__":
    main()
