"""The mosaic's staging in shares against the one-activity assembly, on the same tiles.

    python -m bench.split [--size 4096] [--share-mb 32] [--slots 4] [--repeats 2]

One scene of ``size``² x 3 uint16 (the cached bench scene) is uploaded to a private Azurite 3.37
(on disk) and tiled once in 1024-pixel windows by 2 worker processes (``bench.workers render``);
its manifest rows are copied to a second job, so both paths build a mosaic of their own from the
same tile blobs. Then, alternately, each in a fresh process (:func:`bench.common.run_measured`):

- single: ``assemble_mosaic(method="server")``, the one activity of a small scene;
- shares: ``plan_shares``, the shares staged ``slots`` at a time by threads of one process (the
  local host runs activities as threads of its process, at most host.json's
  ``maxConcurrentActivityFunctions`` = 4 at once), then the commit (``assemble_mosaic(shares=)``).

Printed: the wall of each process (and of the plan, the shares and the commit; of the one
activity's staging step), peak RSS, whether the
two mosaics are the same bytes, and the 1-minute load average before and after each run.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

from .common import PYTHON, BenchStorage, load1, run_measured, say, scene_path, table
from .workers import copy_manifest

WORKERS = 2


def _tile(storage: BenchStorage, env: dict, size: int) -> tuple[str, dict, float]:
    """Upload and tile the scene once; (job id, scene dict, tiling wall)."""
    from tilecommit.grid import plan_windows
    from tilecommit.raster import PinnedBlob, inspect_source
    from tilecommit.settings import Settings
    from tilecommit.spec import OutputSpec

    settings = Settings.from_env(env)
    blob = storage.connection.blob_service().get_blob_client(settings.input_container, f"scene{size}.tif")
    with open(scene_path(size), "rb") as data:
        blob.upload_blob(data, overwrite=True, max_concurrency=4)
    scene = inspect_source(
        PinnedBlob(blob, blob.get_blob_properties().etag), settings=settings, spec=OutputSpec.from_settings(settings)
    )
    windows = plan_windows(scene.width, scene.height, settings.window_size)
    job = f"{size:08x}5b1e0000"[:16]
    child_env = {**os.environ, **env}
    started = time.perf_counter()
    with ThreadPoolExecutor(WORKERS) as pool:
        list(
            pool.map(
                lambda ids: run_measured(
                    [PYTHON, "-m", "bench.workers", "render", job, blob.blob_name, ",".join(ids)]
                    + [str(scene.width), str(scene.height)],
                    env=child_env,
                ),
                [[w.id for w in windows[i::WORKERS]] for i in range(WORKERS)],
            )
        )
    return job, scene.to_dict(), time.perf_counter() - started


def _remove_outputs(output, job_id: str) -> None:
    from tilecommit import jobs

    for name in (jobs.mosaic_blob_name(job_id), jobs.stac_blob_name(job_id), jobs.quicklook_blob_name(job_id)):
        output.get_blob_client(name).delete_blob()


def _sha256(output, job_id: str) -> str:
    from tilecommit import jobs

    digest = hashlib.sha256()
    for chunk in output.get_blob_client(jobs.mosaic_blob_name(job_id)).download_blob(max_concurrency=4).chunks():
        digest.update(chunk)
    return digest.hexdigest()


def run(storage: BenchStorage, size: int, share_mb: int, slots: int, repeats: int) -> dict:
    from tilecommit import settings as names

    env = storage.app_env("split", window_size=1024)
    storage.ensure(env)
    say(f"split {size}²: upload and tile once ({WORKERS} workers) ...")
    single_job, scene, tiling_s = _tile(storage, env, size)
    shares_job = f"{single_job[:12]}5a5e"
    copy_manifest(storage.connection.table_service(), env[names.SETTING_MANIFEST_TABLE], single_job, shares_job)
    output = storage.connection.blob_service().get_container_client(env[names.SETTING_OUTPUT_CONTAINER])
    child_env = {**os.environ, **env}
    scene_json = json.dumps(scene)
    runs: list[dict] = []
    for repeat in range(repeats):
        order = ("single", "shares") if repeat % 2 == 0 else ("shares", "single")
        for path in order:
            job = single_job if path == "single" else shares_job
            args = (
                ["assemble", job, scene_json, "server"]
                if path == "single"
                else ["assemble-shares", job, scene_json, str(share_mb * 2**20), str(slots)]
            )
            load_before = load1()
            say(f"  repeat {repeat + 1}: {path} (load {load_before:.1f}) ...")
            measured = run_measured([PYTHON, "-m", "bench.workers", *args], env=child_env)
            result = measured.json()
            runs.append(
                {
                    "repeat": repeat + 1,
                    "path": path,
                    **measured.summary(),
                    "outcome": result["outcome"],
                    "nbytes": result["nbytes"],
                    "transfer": result.get("transfer", {}),
                    "steps_s": result.get("steps_s", {}),
                    "timings": {k: round(v, 2) for k, v in result.get("timings", {}).items()},
                    "load_before": load_before,
                    "load_after": load1(),
                }
            )
        same = _sha256(output, single_job) == _sha256(output, shares_job)
        runs[-1]["same_bytes_as_other_path"] = runs[-2]["same_bytes_as_other_path"] = same
        _remove_outputs(output, single_job)
        _remove_outputs(output, shares_job)
    storage.drop(env)
    return {"size": size, "share_mb": share_mb, "slots": slots, "tiling_s": round(tiling_s, 1), "runs": runs}


def print_report(report: dict) -> None:
    print(
        f"\n## Mosaic staging: one activity vs shares ({report['size']}², shares of {report['share_mb']} MiB, "
        f"{report['slots']} at a time; tiling once {report['tiling_s']} s)"
    )
    rows = []
    for r in report["runs"]:
        steps = r["steps_s"]
        detail = (
            f"plan {steps['plan']} + shares {steps['shares']} (each {min(steps['share_walls'])}-"
            f"{max(steps['share_walls'])}) + commit {steps['commit']}"
            if steps
            else f"staging (every range and the local blocks) {r['timings'].get('write', 0)}"
        )
        rows.append(
            [
                r["repeat"],
                r["path"],
                r["transfer"].get("shares", 1),
                r["transfer"].get("copy_ranges", ""),
                f"{r['wall_s']:.1f}",
                detail,
                f"{r['peak_rss_mb']:.0f}",
                "yes" if r.get("same_bytes_as_other_path") else "NO",
                f"{r['load_before']:.1f} -> {r['load_after']:.1f}",
            ]
        )
    print(
        table(
            rows,
            ["repeat", "path", "shares", "ranges", "wall s", "steps s", "peak RSS MiB", "same bytes", "load (1 min)"],
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.split")
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--share-mb", type=int, default=32)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    with BenchStorage() as storage:
        report = run(storage, args.size, args.share_mb, args.slots, args.repeats)
    print_report(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
