"""JPEG 2000 uploads, file to file: our pipeline against ``rio cogeo create`` and ``gdal_translate -of COG``.

Each case is a Sentinel-2-like band made by GDAL here (uint16, lossless 5/3 wavelet, 1024² tiles,
TLM markers): 2048² by default, 10980² (a real band's size) with ``--full``, which is what shows
a band fits the function's 10-minute limit and an instance's 1536 MB. Ours is ``python -m devhost
process`` (upload, validate, tiles, mosaic, on the bench's Azurite, as bench/e2e.py runs it for
GeoTIFFs); each tool is a child process measured by ``wait4`` (bench/common.py). The mosaic must
equal gdal_translate's COG pixel for pixel. ``rio cogeo create`` (rio-cogeo 7.0.4) refuses a GeoJP2
file ("Cannot invert geotransform": it reads the GCP CRS GDAL's JP2 driver reports beside zero
GCPs as GCP georeferencing), which the row records; gdal_translate stands in as the reference time.

Also measured on the small case: the bytes the app's reader fetches to render every window, with
windows on the JPEG 2000 tiles (1024) and windows of half a tile (512), over the file's size.

    python -m bench.formats_jp2 [--full] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from .common import RIO, BenchStorage, Context, run_measured, say, table

#: The function's limits a band must fit (Consumption plan: host.json's timeout, an instance's memory).
FUNCTION_LIMIT_S = 600
INSTANCE_MB = 1536
SMALL, FULL = 2048, 10980
TILE = 1024


def make_band(path: Path, size: int) -> Path:
    """A Sentinel-2-like band: smooth terrain and noise, uint16, lossless, 1024² tiles, TLM."""
    import rasterio
    from rasterio.transform import from_origin

    rng = np.random.default_rng(size)
    profile = dict(driver="JP2OpenJPEG", width=size, height=size, count=1, dtype="uint16", crs="EPSG:32633")
    profile.update(transform=from_origin(300000, 5000040, 10, 10), QUALITY=100, REVERSIBLE="YES", TLM="YES")
    profile.update(blockxsize=TILE, blockysize=TILE)  # rasterio passes its own over a BLOCKXSIZE option
    with rasterio.Env(GDAL_PAM_ENABLED="NO"), rasterio.open(path, "w", **profile) as dst:
        for row in range(0, size, TILE):
            height = min(TILE, size - row)
            rows, cols = np.mgrid[row : row + height, 0:size]
            band = (cols * 3 + rows * 5) % 4000 + rng.integers(0, 64, (height, size))
            dst.write(band.astype("uint16")[None], window=((row, row + height), (0, size)))
    return path


def gdal_translate(src: Path, workdir: Path) -> tuple[dict, Path]:
    out = workdir / "gdal_translate_cog.tif"
    measured = run_measured(["gdal_translate", "-q", "-of", "COG", "-co", "COMPRESS=DEFLATE", str(src), str(out)])
    return measured.summary(), out


def rio_cogeo(src: Path, workdir: Path) -> dict:
    out = workdir / "rio_cog.tif"
    measured = run_measured(
        [RIO, "cogeo", "create", str(src), str(out), "--cog-profile", "deflate", "--quiet"], check=False
    )
    if measured.returncode != 0:
        return {"error": measured.stderr.strip().splitlines()[-1] if measured.stderr.strip() else "failed"}
    return measured.summary()


def ours(ctx: Context, src: Path) -> tuple[dict, Path]:
    from tilecommit import settings as names

    from .e2e import pipeline

    env = ctx.storage.app_env("jp2", window_size=TILE)
    result = pipeline(ctx, src, env)
    mosaic = src.with_suffix(".mosaic.tif")
    blob = ctx.storage.connection.blob_service().get_blob_client(
        env[names.SETTING_OUTPUT_CONTAINER], f"mosaics/{result['job_id']}/mosaic.tif"
    )
    mosaic.write_bytes(blob.download_blob().readall())
    ctx.storage.drop(env)
    return result, mosaic


def same_pixels(a: Path, b: Path) -> bool:
    import rasterio

    with rasterio.open(a) as x, rasterio.open(b) as y:
        return x.transform == y.transform and bool(np.array_equal(x.read(), y.read()))


def fetched_over_size(ctx: Context, src: Path, window_size: int) -> float:
    """Bytes the app's reader fetches to render every window of ``src`` at ``window_size``, each
    window opened afresh as an activity opens it, over the file's size."""
    from tilecommit import settings as names
    from tilecommit.grid import plan_windows
    from tilecommit.jobs import Job
    from tilecommit.raster import inspect_source, render_tile
    from tilecommit.raster.reading.source import LocalFile
    from tilecommit.settings import Settings
    from tilecommit.spec import OutputSpec
    from tilecommit.stores import JobStores

    settings = Settings(window_size=window_size)
    spec = OutputSpec.from_settings(settings)
    scene = inspect_source(str(src), settings=settings, spec=spec)
    env = ctx.storage.app_env("jp2reads", window_size=window_size)
    ctx.storage.ensure(env)
    blobs, tables = ctx.storage.connection.blob_service(), ctx.storage.connection.table_service()
    stores = JobStores(
        blobs.get_container_client(env[names.SETTING_TILES_CONTAINER]),
        blobs.get_container_client(env[names.SETTING_OUTPUT_CONTAINER]),
        tables.get_table_client(env[names.SETTING_MANIFEST_TABLE]),
        settings,
    )
    fetched = 0

    class Counted(LocalFile):
        def _get(self, offset: int, length: int) -> bytes:
            nonlocal fetched
            fetched += length
            return super()._get(offset, length)

    job = Job(f"{window_size:016x}", src.name, url="", etag="", size=0, spec=spec, batch_size=settings.batch_size)
    for window in plan_windows(scene.width, scene.height, window_size):
        render_tile(job, stores, Counted(src), window)
    ctx.storage.drop(env)
    return round(fetched / src.stat().st_size, 2)


def measure(workdir: Path, *, full: bool = False) -> list[dict]:
    """One row per case (see the module's docstring); ``full`` adds the 10980² band."""
    rows = []
    with BenchStorage() as storage:
        ctx = Context(storage=storage, quick=not full)
        for size in (SMALL, FULL) if full else (SMALL,):
            say(f"JPEG 2000 {size}²: making the band ...")
            src = make_band(workdir / f"S2_like_{size}.jp2", size)
            say(f"JPEG 2000 {size}²: ours, gdal_translate, rio cogeo create ...")
            mine, mosaic = ours(ctx, src)
            reference_figures, reference = gdal_translate(src, workdir)
            rio = rio_cogeo(src, workdir)
            row = {
                "format": "JPEG 2000",
                "case": f"{size}² uint16 lossless, {TILE}² tiles, TLM ({src.stat().st_size} bytes)",
                "pixels": size * size,
                "ours_s": mine["wall_s"],
                "ours_cpu_s": mine["cpu_s"],
                "ours_peak_rss_mb": mine["peak_rss_mb"],
                "ours_fits": mine["wall_s"] < FUNCTION_LIMIT_S and mine["peak_rss_mb"] < INSTANCE_MB,
                "rio_s": rio.get("wall_s"),
                "rio_cpu_s": rio.get("cpu_s"),
                "rio_error": rio.get("error"),
                "gdal_translate_s": reference_figures["wall_s"],
                "gdal_translate_cpu_s": reference_figures["cpu_s"],
                "pixel_equal": same_pixels(mosaic, reference),
            }
            if size == SMALL:
                row["fetched_over_size"] = {w: fetched_over_size(ctx, src, w) for w in (TILE, TILE // 2)}
            rows.append(row)
            for path in (src, mosaic, reference):
                path.unlink(missing_ok=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help=f"add the {FULL}² band (minutes)")
    parser.add_argument("--workdir", type=Path, help="where the bands are made (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-jp2-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        rows = measure(workdir, full=args.full)
    keys = ["case", "ours_s", "ours_cpu_s", "ours_peak_rss_mb", "rio_s", "gdal_translate_s", "pixel_equal"]
    print(table([[row[k] for k in keys] for row in rows], keys))
    for row in rows:
        if row["rio_error"]:
            print(f"rio cogeo create on {row['case']}: {row['rio_error']}")
        if "fetched_over_size" in row:
            print(f"bytes fetched over the file's size, by window size: {row['fetched_over_size']}")


if __name__ == "__main__":
    main()
