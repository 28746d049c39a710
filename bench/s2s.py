"""Storage to storage and file to file, side by side in one run, on two scenes of one size: the
noisy bench scene and fractal terrain that compresses like imagery (:mod:`bench.terrain`).

- ours: ``python -m devhost process SRC`` (bench.e2e.pipeline); storage to storage is the time from
  the upload's commit to the mosaic's commit, both read from the blobs' Last-Modified (the
  service's clock, 1-second resolution); file to file is the whole process's wall time;
- rio, download way: download the uploaded blob, ``rio cogeo create`` on the local copy, upload
  its COG create-only (one child process, which runs rio as its own child);
- rio, /vsiaz/ way: ``rio cogeo create /vsiaz/...`` reading the uploaded blob, then the upload;
- rio, file to file: ``rio cogeo create`` on the local scene (bench.e2e.rio_cogeo).

Output sizes are reported next to each other. Ratios are ours / the best rio way.

    python -m bench.s2s rio download|vsiaz CONTAINER BLOB OUT_CONTAINER   (the child; prints JSON)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from .common import MACHINE_NOTE, PYTHON, RIO, Context, run_measured, say, scene_path, table
from .e2e import RIO_OPTIONS, pipeline, rio_cogeo
from .terrain import terrain_path


def rio_from_storage(way: str, container: str, blob: str, out_container: str) -> dict:
    """The child: rio's COG of a stored blob, uploaded create-only; its steps' seconds and sizes."""
    from tilecommit.storage import StorageConnection

    connection = StorageConnection.from_env()
    blobs = connection.blob_service()
    steps: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="tilecommit-bench-s2s-") as workdir:
        out = os.path.join(workdir, "cog.tif")
        env = dict(os.environ)
        if way == "download":
            started = time.perf_counter()
            src = os.path.join(workdir, "src.tif")
            with open(src, "wb") as f:
                blobs.get_blob_client(container, blob).download_blob(max_concurrency=4).readinto(f)
            steps["download_s"] = time.perf_counter() - started
        else:
            src = f"/vsiaz/{container}/{blob}"
            env.update(connection.gdal_options())
        started = time.perf_counter()
        subprocess.run([RIO, "cogeo", "create", src, out, *RIO_OPTIONS], check=True, env=env)
        steps["rio_s"] = time.perf_counter() - started
        started = time.perf_counter()
        with open(out, "rb") as body:
            # Content-MD5 per block, as devhost uploads the scene (Azurite hashes blocks sent
            # without one in JavaScript: rio's upload would pay what ours does not).
            blobs.get_blob_client(out_container, f"rio-{way}/{blob}").upload_blob(
                body, overwrite=False, max_concurrency=4, validate_content=True
            )
        steps["upload_s"] = time.perf_counter() - started
        return {"steps": {k: round(v, 2) for k, v in steps.items()}, "nbytes": os.path.getsize(out)}


def _blob_time(blobs, container: str, name: str) -> float:
    return blobs.get_blob_client(container, name).get_blob_properties().last_modified.timestamp()


def measure(ctx: Context, kind: str, src, size: int) -> dict:
    from tilecommit import settings as names

    env = ctx.storage.app_env(f"s2s-{kind}-{size}")
    ours = pipeline(ctx, src, env)
    blobs = ctx.storage.connection.blob_service()
    mosaic = f"mosaics/{ours['job_id']}/mosaic.tif"
    upload_to_mosaic = _blob_time(blobs, env[names.SETTING_OUTPUT_CONTAINER], mosaic) - _blob_time(
        blobs, env[names.SETTING_INPUT_CONTAINER], src.name
    )
    ours_bytes = blobs.get_blob_client(env[names.SETTING_OUTPUT_CONTAINER], mosaic).get_blob_properties().size
    say(
        f"  {kind} {size}²: ours {ours['wall_s']:.1f} s (upload committed -> mosaic committed {upload_to_mosaic:.0f} s)"
    )
    child_env = {**os.environ, **{k: v for k, v in env.items() if k != "BENCH_HUB"}}
    rio_ways = {}
    for way in ("download", "vsiaz"):
        measured = run_measured(
            [
                PYTHON,
                "-m",
                "bench.s2s",
                "rio",
                way,
                env[names.SETTING_INPUT_CONTAINER],
                src.name,
                env[names.SETTING_OUTPUT_CONTAINER],
            ],
            env=child_env,
        )
        rio_ways[way] = {**measured.summary(), **measured.json()}
        say(f"  {kind} {size}²: rio {way} way {measured.wall_s:.1f} s")
    with tempfile.TemporaryDirectory(prefix="tilecommit-bench-rio-") as workdir:
        rio_file = rio_cogeo(src, workdir, in_memory=None)
    ctx.storage.drop(env)
    best = min(rio_ways.values(), key=lambda r: r["wall_s"])
    return {
        "scene": f"{size}x{size}x3 uint16",
        "scene_bytes": src.stat().st_size,
        "raw_bytes": size * size * 3 * 2,
        "ours": {**ours, "upload_to_mosaic_s": round(upload_to_mosaic, 1), "mosaic_bytes": ours_bytes},
        "rio_storage": rio_ways,
        "rio_file": rio_file,
        "ratio_storage_to_storage": upload_to_mosaic / best["wall_s"],
        "ratio_file_to_file": ours["wall_s"] / rio_file["wall_s"],
    }


def run(ctx: Context, size: int) -> dict:
    scenes = {"noisy": scene_path(size), "terrain": terrain_path(size)}
    return {"size": size, "note": MACHINE_NOTE, "scenes": {k: measure(ctx, k, p, size) for k, p in scenes.items()}}


def print_report(r: dict) -> None:
    rows = []
    for kind, e in r["scenes"].items():
        ours, rio = e["ours"], e["rio_storage"]
        mib = 2**20
        rows.append(
            [
                kind,
                f"ours, upload committed -> mosaic committed (whole host {ours['peak_rss_mb']:.0f} MiB)",
                f"{ours['upload_to_mosaic_s']:.0f}",
                f"{ours['mosaic_bytes'] / mib:.0f}",
            ]
        )
        for way, label in (
            ("download", "download + rio cogeo create + upload"),
            ("vsiaz", "rio reading /vsiaz/ + upload"),
        ):
            steps = ", ".join(f"{k} {v:.1f}" for k, v in rio[way]["steps"].items())
            rows.append(
                [
                    kind,
                    f"{label} ({steps}; {rio[way]['peak_rss_mb']:.0f} MiB)",
                    f"{rio[way]['wall_s']:.1f}",
                    f"{rio[way]['nbytes'] / mib:.0f}",
                ]
            )
        rows.append(
            [
                kind,
                "storage to storage: ours / best rio way (target <= 1.0x)",
                f"{e['ratio_storage_to_storage']:.2f}x",
                "",
            ]
        )
        rows.append([kind, "ours, devhost process (file in, mosaic committed)", f"{ours['wall_s']:.1f}", ""])
        rows.append(
            [
                kind,
                "rio cogeo create, file to file",
                f"{e['rio_file']['wall_s']:.1f}",
                f"{e['rio_file']['nbytes'] / mib:.0f}",
            ]
        )
        rows.append([kind, "file to file: ours / rio (target <= 1.5x)", f"{e['ratio_file_to_file']:.2f}x", ""])
        rows.append(
            [
                kind,
                f"scene {e['scene_bytes'] / mib:.0f} MiB on disk, raw / DEFLATE+predictor",
                f"{e['raw_bytes'] / e['scene_bytes']:.1f}x",
                "",
            ]
        )
    print(f"\n## Storage to storage and file to file, {r['size']}² x 3 uint16 ({r['note']})")
    print(table(rows, ["scene", "what", "s", "output MiB"]))


if __name__ == "__main__":
    if sys.argv[1] != "rio":
        raise SystemExit("usage: python -m bench.s2s rio download|vsiaz CONTAINER BLOB OUT_CONTAINER")
    print(json.dumps(rio_from_storage(*sys.argv[2:6])))
