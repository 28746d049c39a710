"""Each output profile against ``rio cogeo create`` with the same profile, side by side in one run:
``python -m bench.profiles [--size 4096] [--only 'NAME;NAME'] [--out FILE]``.

For each profile (tilecommit/profiles.py): rio-cogeo on the local scene (256-pixel blocks and
overview blocks, average overviews, as bench.e2e) in a child process, then our pipeline on the
bench's own Azurite, in process (upload, job, mosaic committed), with the upload's metadata naming
the profile. The lossless ones run on the bench's uint16 scene (nodata 0); JPEG and WEBP on a
uint8 RGB scene of the same size (they take 8-bit data only); LERC with a ``max_z_error`` on the
uint16 scene with ``add_mask`` (on integers with a nodata value it is refused otherwise). Prints
wall time, CPU seconds (ours: this process, and Azurite beside it), output size and, for the lossy
ones, the full resolution's error against the source (PSNR over the valid pixels, and the largest
absolute error); writes bench/results/profiles.json. Nothing is asserted: the tests check the outputs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import tempfile
import time

import numpy as np
import rasterio

from .common import DATA, RESULTS, RIO, BenchStorage, run_measured, say, scene_path, table
from .instrumented import local_host, process

#: Our profile, the metadata that names it, and rio-cogeo's options for the same output: its
#: profiles set only COMPRESS, so the level and the predictor ours use (2: the scene is uint16)
#: are given to it too.
PROFILES = {
    "default": ({}, ["--cog-profile", "deflate", "--co", "LEVEL=6", "--co", "PREDICTOR=2"]),
    "zstd": ({"tilecommit_profile": "zstd"}, ["--cog-profile", "zstd", "--co", "LEVEL=9", "--co", "PREDICTOR=2"]),
    "lzw": ({"tilecommit_profile": "lzw"}, ["--cog-profile", "lzw", "--co", "PREDICTOR=2"]),
    "raw": ({"tilecommit_profile": "raw"}, ["--cog-profile", "raw"]),
    # rio-cogeo's jpeg and webp profiles leave QUALITY to GDAL (75), our default too.
    "jpeg": ({"tilecommit_profile": "jpeg"}, ["--cog-profile", "jpeg"]),
    "webp": ({"tilecommit_profile": "webp"}, ["--cog-profile", "webp"]),
    # Web-optimized: the same DEFLATE tiles on rio-cogeo's WebMercatorQuad grid; rio-cogeo warps
    # with nearest by default, as ours does (warp_resampling).
    "default,web_optimized": (
        {"tilecommit_web_optimized": "true"},
        ["--cog-profile", "deflate", "--co", "LEVEL=6", "--co", "PREDICTOR=2", "--web-optimized"],
    ),
    "lerc_zstd,max_z_error=1,add_mask": (
        {"tilecommit_profile": "lerc_zstd", "tilecommit_max_z_error": "1", "tilecommit_add_mask": "true"},
        ["--cog-profile", "lerc_zstd", "--co", "MAX_Z_ERROR=1", "--add-mask"],
    ),
}
#: The profiles that take 8-bit data only, run on the uint8 RGB scene.
EIGHT_BIT = ("jpeg", "webp")
COMMON = ["--blocksize", "256", "--overview-blocksize", "256", "--overview-resampling", "average", "--quiet"]


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rgb_scene_path(size: int):
    """The cached deterministic size x size uint8 RGB scene (no nodata) under bench/data/."""
    from testkit.scenes import SceneSpec, write_scene

    DATA.mkdir(parents=True, exist_ok=True)
    final = DATA / f"scene_{size}x{size}x3_uint8.tif"
    if not final.exists():
        partial = final.with_suffix(".partial.tif")
        write_scene(str(partial), SceneSpec(size, size, 3, "uint8"))
        partial.rename(final)
    return final


def error_against(src, out: str) -> dict:
    """The full resolution of ``out`` against the source: PSNR over the pixels valid in both
    (peak: the data type's largest value) and the largest absolute error."""
    with rasterio.open(src) as source, rasterio.open(out) as made:
        want, got = source.read().astype(np.float64), made.read().astype(np.float64)
        valid = (source.dataset_mask() > 0) & (made.dataset_mask() > 0)
        peak = float(np.iinfo(source.dtypes[0]).max)
    diff = (got - want)[:, valid]
    mse = float(np.mean(diff**2)) if diff.size else 0.0
    return {
        "psnr_db": None if mse == 0 else round(10 * math.log10(peak**2 / mse), 2),
        "max_abs_error": float(np.abs(diff).max()) if diff.size else 0.0,
    }


def rio(src, options: list[str], *, lossy: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-profiles-") as workdir:
        out = os.path.join(workdir, "rio.tif")
        measured = run_measured([RIO, "cogeo", "create", str(src), out, *options, *COMMON])
        return {**measured.summary(), "nbytes": os.path.getsize(out), **(error_against(src, out) if lossy else {})}


def ours(storage: BenchStorage, src, name: str, metadata: dict, *, lossy: bool) -> dict:
    env = storage.app_env(f"profiles-{name.split(',')[0]}")
    with local_host(storage, env) as inst:
        azurite_before, cpu_before, started = storage.azurite_cpu_s(), cpu_s(), time.perf_counter()
        summary = process(inst, src, metadata=metadata)
        wall, cpu = time.perf_counter() - started, cpu_s() - cpu_before
        azurite = storage.azurite_cpu_s()
        mosaic = inst.host.blobs.get_blob_client(
            inst.host.settings.output_container, f"mosaics/{summary['job_id']}/mosaic.tif"
        )
        nbytes = mosaic.get_blob_properties().size
        errors = {}
        if lossy:
            with tempfile.TemporaryDirectory(prefix="bench-profiles-") as workdir:
                out = os.path.join(workdir, "ours.tif")
                with open(out, "wb") as f:
                    mosaic.download_blob().readinto(f)
                errors = error_against(src, out)
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "azurite_cpu_s": None if azurite is None else round(azurite - azurite_before, 2),
        "nbytes": nbytes,
        # This process (the whole local host: up to 4 activities at once, then the assembly), over
        # its life so far: with --only one profile, that profile's job.
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "job_id": summary["job_id"],
        **errors,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profiles", description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=4096, help="scene edge in pixels (default 4096)")
    parser.add_argument("--only", help=f"profiles to run, separated by ';' (of {'; '.join(PROFILES)}; default all)")
    parser.add_argument(
        "--out", default="profiles.json", help="results file under bench/results/ (default profiles.json)"
    )
    args = parser.parse_args(argv)
    names = list(PROFILES) if not args.only else [name.strip() for name in args.only.split(";")]
    unknown = [name for name in names if name not in PROFILES]
    if unknown:
        parser.error(f"unknown profile(s) {', '.join(unknown)}: accepted {'; '.join(PROFILES)}")
    chosen = {name: PROFILES[name] for name in names}
    scenes = {"uint16": scene_path(args.size), "uint8": rgb_scene_path(args.size)}
    runs = {}
    with BenchStorage() as storage:
        for name, (metadata, rio_options) in chosen.items():
            src = scenes["uint8" if name in EIGHT_BIT else "uint16"]
            lossy = name in EIGHT_BIT or "max_z_error" in name
            # A warped output is on another grid than the source: no pixel error against it.
            warped = {"warped": True} if "web_optimized" in name else {}
            runs[name] = {
                "scene": src.name,
                "rio": {**rio(src, rio_options, lossy=lossy), **warped},
                "ours": {**ours(storage, src, name, metadata, lossy=lossy), **warped},
            }
    rows = []
    for name, run in runs.items():
        theirs, mine = run["rio"], run["ours"]
        rows.append(
            [
                name,
                f"{theirs['wall_s']:.2f}",
                f"{mine['wall_s']:.2f}",
                f"{mine['wall_s'] / theirs['wall_s']:.2f}x",
                f"{theirs['cpu_s']:.1f}",
                f"{mine['cpu_s']:.1f} + {mine['azurite_cpu_s']}",
                f"{theirs['nbytes'] / 2**20:.1f}",
                f"{mine['nbytes'] / 2**20:.1f}",
                f"{mine['nbytes'] / theirs['nbytes']:.3f}",
                _error_cell(theirs),
                _error_cell(mine),
            ]
        )
    headers = ["profile", "rio wall s", "ours wall s", "ratio", "rio CPU s", "ours CPU s + Azurite"]
    headers += ["rio MiB", "ours MiB", "size ratio", "rio PSNR dB / max err", "ours PSNR dB / max err"]
    say(f"{args.size}² x 3 (uint8 RGB for jpeg and webp, else uint16), file to file (ours: upload, job, mosaic")
    say("committed in the bench's Azurite)")
    say(table(rows, headers))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / args.out).write_text(json.dumps({"size": args.size, "runs": runs}, indent=2) + "\n")
    return 0


def _error_cell(run: dict) -> str:
    if run.get("warped"):
        return "warped (not comparable)"
    if "max_abs_error" not in run:
        return "lossless"
    psnr = "inf" if run["psnr_db"] is None else f"{run['psnr_db']:.2f}"
    return f"{psnr} / {run['max_abs_error']:g}"


if __name__ == "__main__":
    raise SystemExit(main())
