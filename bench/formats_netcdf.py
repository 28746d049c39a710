"""NetCDF file to file against ``rio cogeo create`` on the same variable, side by side in one run:
``python -m bench.formats_netcdf [--size 2048] [--steps 3]``.

For each kind of NetCDF file (netCDF-4 with DEFLATE, classic; testkit/netcdf_scenes.py: int16, a
time dimension of ``steps`` bands, GDAL's netCDF driver writes them), on one scene:

- rio: ``rio cogeo create NETCDF:"file":tas out.tif`` with the options of bench.e2e (deflate,
  256-pixel blocks, average overviews), in a child process;
- ours: ``python -m devhost process file.nc`` in a child process (upload to the bench's Azurite,
  the job on the local host, mosaic committed), as bench.e2e runs the pipeline on a GeoTIFF.

Each row: wall and CPU seconds of both children (wait4), and whether the mosaic's pixels equal
rio's. Nothing is asserted: tests/test_netcdf.py checks the outputs.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np
import rasterio

from testkit.netcdf_scenes import write_netcdf

from .common import RIO, BenchStorage, Context, run_measured, table
from .e2e import RIO_OPTIONS, pipeline

KINDS = ("netcdf4", "classic")


def _rio(source: Path, out: Path) -> dict:
    measured = run_measured([RIO, "cogeo", "create", f'NETCDF:"{source}":tas', str(out), *RIO_OPTIONS])
    return measured.summary()


def _ours(ctx: Context, source: Path, out: Path) -> dict:
    from tilecommit import settings as names

    env = ctx.storage.app_env(f"netcdf-{source.stem}", window_size=1024)
    try:
        measured = pipeline(ctx, source, env)
        blob = ctx.storage.connection.blob_service().get_blob_client(
            env[names.SETTING_OUTPUT_CONTAINER], f"mosaics/{measured['job_id']}/mosaic.tif"
        )
        with out.open("wb") as f:
            blob.download_blob().readinto(f)
    finally:
        ctx.storage.drop(env)
    return measured


def _same_pixels(a: Path, b: Path) -> bool:
    with rasterio.open(a) as one, rasterio.open(b) as other:
        return one.shape == other.shape and np.array_equal(one.read(), other.read())


def measure(workdir: Path, *, size: int = 2048, steps: int = 3) -> list[dict]:
    """One row per kind of NetCDF file: ours and rio cogeo create, file to file, on ``size``² x ``steps``."""
    rows = []
    with BenchStorage() as storage:
        ctx = Context(storage=storage, quick=True)
        for kind in KINDS:
            source = write_netcdf(workdir / f"{kind}.nc", width=size, height=size, steps=steps, kind=kind)
            rio_out, ours_out = workdir / f"{kind}-rio.tif", workdir / f"{kind}-ours.tif"
            rio = _rio(source, rio_out)
            ours = _ours(ctx, source, ours_out)
            rows.append(
                {
                    "format": f"NetCDF ({kind})",
                    "case": f"{size}x{size}x{steps} int16, {os.path.getsize(source)} bytes",
                    "pixels": size * size,
                    "ours_s": ours["wall_s"],
                    "ours_cpu_s": ours["cpu_s"],
                    "rio_s": rio["wall_s"],
                    "rio_cpu_s": rio["cpu_s"],
                    "pixel_equal": _same_pixels(ours_out, rio_out),
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-netcdf-") as workdir:
        rows = measure(Path(workdir), size=args.size, steps=args.steps)
    keys = ["format", "case", "ours_s", "ours_cpu_s", "rio_s", "rio_cpu_s", "pixel_equal"]
    print(table([[row[key] for key in keys] for row in rows], keys))


if __name__ == "__main__":
    main()
