"""The CPU our bytes cost at the least, against ``rio cogeo create``, side by side in one run.

    python -m bench.cpu_floor [--size 10240] [--repeats 2]

Three child processes a repeat, each measured by ``wait4`` (``common.run_measured``; their order
alternates between repeats, so drift in the machine's load favours neither):

- **ours, decode and encode only**: this module run with ``--encode-only``: every window of the
  bench scene read from the local file and encoded by the tile encoder itself (``encode_tile``:
  the tile with its overviews, as a tile activity makes it, under the app's GDAL settings), one
  window after the other, GDAL's two compression threads as in the app. No storage, no host,
  no upload, no mosaic: the decoding and encoding every tile of the job needs, and the
  interpreter's start with the imports they take;
- **rio**: ``rio cogeo create`` on the same file, as ``bench.e2e`` runs it (its default mode);
- **rio, our encoding**: the same with ``--co PREDICTOR=2``, the horizontal predictor our
  default profile encodes with (rio-cogeo's ``deflate`` profile has none): the same codec,
  level and predictor as ours (the bytes each made are printed beside its CPU).

What the whole job costs our process (``bench.e2e``) minus the first is everything the pipeline
does besides decoding and encoding: the reads over HTTP, the tiles' writes and rows, the
mosaic's copies, the coarse levels, the companions, the host. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from .common import PYTHON, RESULTS, RIO, load1, run_measured, say, scene_path, spread, table
from .e2e import RIO_OPTIONS


def encode_only(size: int) -> int:
    """Every window of the ``size``² bench scene encoded as a tile activity encodes it; bytes made."""
    import rasterio

    from tilecommit.grid import plan_windows
    from tilecommit.raster.env import gdal_env
    from tilecommit.raster.tiling.encode import encode_tile
    from tilecommit.settings import Settings
    from tilecommit.spec import OutputSpec

    settings = Settings()
    spec = OutputSpec.from_settings(settings)
    made = 0
    with gdal_env(settings), rasterio.open(scene_path(size)) as src:
        for window in plan_windows(src.width, src.height, spec.window_size):
            body, _ = encode_tile(src, window, spec=spec)
            made += len(body)
    return made


def run(size: int, repeats: int) -> dict:
    source = scene_path(size)
    runs: dict[str, list] = {"ours_encode_only": [], "rio": [], "rio_predictor": []}
    with tempfile.TemporaryDirectory(prefix="cpu-floor-") as workdir:
        rio = [RIO, "cogeo", "create", str(source), f"{workdir}/rio.tif", *RIO_OPTIONS]
        commands = {
            "ours_encode_only": [PYTHON, "-m", "bench.cpu_floor", "--encode-only", "--size", str(size)],
            "rio": rio,
            "rio_predictor": [*rio, "--co", "PREDICTOR=2"],
        }
        for repeat in range(repeats):
            order = list(commands) if repeat % 2 == 0 else list(reversed(commands))
            for name in order:
                measured = run_measured(commands[name])
                made = os.path.getsize(f"{workdir}/rio.tif") if name != "ours_encode_only" else measured.json()["bytes"]
                runs[name].append({**measured.summary(), "bytes": made})
                say(f"  repeat {repeat + 1}/{repeats} {name}: {measured.cpu_s:.1f} CPU-s, {measured.wall_s:.1f} s")
    ours = runs["ours_encode_only"]
    return {
        "size": size,
        "repeats": repeats,
        "runs": runs,
        "ratio_cpu": spread([o["cpu_s"] / r["cpu_s"] for o, r in zip(ours, runs["rio"], strict=True)]),
        "ratio_cpu_predictor": spread(
            [o["cpu_s"] / r["cpu_s"] for o, r in zip(ours, runs["rio_predictor"], strict=True)]
        ),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_floor")
    parser.add_argument("--size", type=int, default=10240)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--encode-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.encode_only:
        print(json.dumps({"bytes": encode_only(args.size)}))
        return
    before = load1()
    result = {**run(args.size, args.repeats), "load1_before": before, "load1_after": load1()}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "cpu_floor.json").write_text(json.dumps(result, indent=2) + "\n")
    rows = [
        [
            name,
            f"{spread([r['cpu_s'] for r in runs])['median']:.1f}",
            ", ".join(f"{r['cpu_s']:.1f}" for r in runs),
            f"{runs[0]['bytes'] / 2**20:.0f}",
        ]
        for name, runs in result["runs"].items()
    ]
    print(table(rows, ["run", "CPU-s median", "each repeat", "MiB made"]))
    for key, against in (("ratio_cpu", "rio"), ("ratio_cpu_predictor", "rio with the predictor")):
        ratio = result[key]
        print(
            f"ours (decode and encode only) / {against}: {ratio['median']:.2f}x [{ratio['min']:.2f}-{ratio['max']:.2f}]"
        )


if __name__ == "__main__":
    main()
