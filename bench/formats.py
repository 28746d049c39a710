"""Every accepted input format, file to file, against ``rio cogeo create`` on the same file, side by
side in one run: each format's own bench (:mod:`bench.formats_jp2`, :mod:`bench.formats_netcdf`,
:mod:`bench.formats_scene`) measured one after the other on this machine, its rows in one table.

    python -m bench.formats [--full]

``--full`` adds the 10980² JPEG 2000 band (a Sentinel-2 10 m band's size: minutes). Where
``rio cogeo create`` refuses the file, the row says so and carries ``gdal_translate -of COG``'s time.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from . import formats_jp2, formats_netcdf, formats_scene
from .common import table

KEYS = ("format", "case", "ours_s", "ours_cpu_s", "rio_s", "rio_cpu_s", "pixel_equal")


def measure(workdir: Path, *, full: bool = False) -> list[dict]:
    rows = []
    for name, run in (
        ("jp2", lambda folder: formats_jp2.measure(folder, full=full)),
        ("netcdf", formats_netcdf.measure),
        ("scene", formats_scene.measure),
    ):
        folder = workdir / name
        folder.mkdir(parents=True, exist_ok=True)
        rows.extend(run(folder))
    return rows


def cell(row: dict, key: str) -> str:
    value = row.get(key)
    if key == "rio_s" and row.get("rio_error"):
        return f"refused ({row.get('gdal_translate_s')} s gdal_translate)"
    return "" if value is None else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="add the 10980² JPEG 2000 band (minutes)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-formats-") as workdir:
        rows = measure(Path(workdir), full=args.full)
    print(table([[cell(row, key) for key in KEYS] for row in rows], list(KEYS)))
    for row in rows:
        if row.get("rio_error"):
            print(f"rio cogeo create on {row['case']}: {row['rio_error']}")


if __name__ == "__main__":
    main()
