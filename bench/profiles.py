"""Each output profile against ``rio cogeo create`` with the same profile, side by side in one run:
``python -m bench.profiles [--size 4096]``.

For each lossless profile (tilecommit/profiles.py): rio-cogeo on the local scene (256-pixel blocks
and overview blocks, average overviews, as bench.e2e) in a child process, then our pipeline on the
bench's own Azurite, in process (upload, job, mosaic committed), with the upload's metadata naming
the profile. Prints wall time, CPU seconds (ours: this process, and Azurite beside it) and output
size; writes bench/results/profiles.json. Nothing is asserted: the tests check the outputs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time

from .common import RESULTS, RIO, BenchStorage, run_measured, say, scene_path, table
from .instrumented import local_host, process

#: Our profile, the metadata that names it, and rio-cogeo's options for the same output: its
#: profiles set only COMPRESS, so the level and the predictor ours use (2: the scene is uint16)
#: are given to it too.
PROFILES = {
    "default": ({}, ["--cog-profile", "deflate", "--co", "LEVEL=6", "--co", "PREDICTOR=2"]),
    "zstd": ({"tilecommit_profile": "zstd"}, ["--cog-profile", "zstd", "--co", "LEVEL=9", "--co", "PREDICTOR=2"]),
    "lzw": ({"tilecommit_profile": "lzw"}, ["--cog-profile", "lzw", "--co", "PREDICTOR=2"]),
    "raw": ({"tilecommit_profile": "raw"}, ["--cog-profile", "raw"]),
}
COMMON = ["--blocksize", "256", "--overview-blocksize", "256", "--overview-resampling", "average", "--quiet"]


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rio(src, options: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-profiles-") as workdir:
        out = os.path.join(workdir, "rio.tif")
        measured = run_measured([RIO, "cogeo", "create", str(src), out, *options, *COMMON])
        return {**measured.summary(), "nbytes": os.path.getsize(out)}


def ours(storage: BenchStorage, src, name: str, metadata: dict) -> dict:
    env = storage.app_env(f"profiles-{name}")
    with local_host(storage, env) as inst:
        azurite_before, cpu_before, started = storage.azurite_cpu_s(), cpu_s(), time.perf_counter()
        summary = process(inst, src, metadata=metadata)
        wall, cpu = time.perf_counter() - started, cpu_s() - cpu_before
        azurite = storage.azurite_cpu_s()
        mosaic = inst.host.blobs.get_blob_client(
            inst.host.settings.output_container, f"mosaics/{summary['job_id']}/mosaic.tif"
        )
        nbytes = mosaic.get_blob_properties().size
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "azurite_cpu_s": None if azurite is None else round(azurite - azurite_before, 2),
        "nbytes": nbytes,
        "job_id": summary["job_id"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profiles", description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=4096, help="scene edge in pixels (default 4096)")
    args = parser.parse_args(argv)
    src = scene_path(args.size)
    runs = {}
    with BenchStorage() as storage:
        for name, (metadata, rio_options) in PROFILES.items():
            runs[name] = {"rio": rio(src, rio_options), "ours": ours(storage, src, name, metadata)}
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
            ]
        )
    headers = ["profile", "rio wall s", "ours wall s", "ratio", "rio CPU s", "ours CPU s + Azurite"]
    headers += ["rio MiB", "ours MiB", "size ratio"]
    say(f"{args.size}² x 3 uint16, file to file (ours: upload, job, mosaic committed in the bench's Azurite)")
    say(table(rows, headers))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "profiles.json").write_text(json.dumps({"size": args.size, "runs": runs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
