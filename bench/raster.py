"""The raster half alone, on the scene the end-to-end bench uploaded (same Azurite, same run).

- tiling: every window rendered by ``WORKERS`` worker processes at once (``bench.workers
  render``), reading the uploaded scene through /vsiaz/ as that many Function instances would;
- assembly: ``assemble_mosaic`` in a fresh process for each method, side by side: the storage
  service's block copy (``server``, Put Block From URL), block copy through the process
  (``blocks``) and the tuned VRT -> COG path, each into its own job (the manifest rows copied, so every method builds its
  mosaic from the same tiles).

Wall time, peak RSS and CPU seconds of each process come from :func:`bench.common.run_measured`.
The whole-scene baseline (``rio cogeo create``) is the end-to-end bench's.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

from .common import MACHINE_NOTE, PYTHON, Context, run_measured, say, table
from .e2e import KeptRun
from .workers import copy_manifest

WORKERS = 2
METHODS = ("server", "blocks", "vrt")


def measure(ctx: Context, size: int, kept: dict, methods: tuple[str, ...] = METHODS) -> dict:
    pipeline_run = KeptRun.of(ctx, kept)
    settings, scene, windows = pipeline_run.settings, pipeline_run.scene, pipeline_run.windows
    connection = ctx.storage.connection

    say(f"raster {size}²: {len(windows)} windows by {WORKERS} worker processes, assembly by {', '.join(methods)} ...")
    job = f"{size:08x}7a11{len(windows) % 0xFFFF:04x}"[:16]
    shares = [[w.id for w in windows[i::WORKERS]] for i in range(WORKERS)]
    started = time.perf_counter()
    with ThreadPoolExecutor(WORKERS) as pool:
        workers = list(
            pool.map(
                lambda share: run_measured(
                    [
                        PYTHON,
                        "-m",
                        "bench.workers",
                        "render",
                        job,
                        pipeline_run.source,
                        ",".join(share),
                        str(scene.width),
                        str(scene.height),
                    ],
                    env=pipeline_run.child_env,
                ),
                shares,
            )
        )
    tiling_wall = time.perf_counter() - started
    steps: dict[str, float] = {}
    for worker in workers:
        for key, value in worker.json()["timings"].items():
            steps[key] = round(steps.get(key, 0.0) + value, 2)

    assembly = {}
    for i, method in enumerate(methods):
        assembly_job = job if i == 0 else f"{job[:12]}{i:04x}"
        if assembly_job != job:
            copy_manifest(connection.table_service(), settings.manifest_table, job, assembly_job)
        measured = run_measured(
            [PYTHON, "-m", "bench.workers", "assemble", assembly_job, json.dumps(scene.to_dict()), method],
            env={**pipeline_run.child_env, "CPL_VSIL_NETWORK_STATS_ENABLED": "YES"},
        )
        mosaic = measured.json()
        assembly[method] = {
            **measured.summary(),
            "nbytes": mosaic["nbytes"],
            "overview_levels": mosaic["overview_levels"],
            "method": mosaic["method"],
            "transfer": mosaic.get("transfer", {}),
            "http_bodies": mosaic.get("http_bodies", {}),
            "timings": {k: round(v, 2) for k, v in mosaic["timings"].items()},
        }
    return {
        "scene": f"{scene.width}x{scene.height}",
        "window_size": settings.window_size,
        "windows": len(windows),
        "tiling": {
            "wall_s": round(tiling_wall, 2),
            "workers": WORKERS,
            "tiles_nbytes": sum(w.json()["nbytes"] for w in workers),
            "summed_step_s": steps,
            "worker": [w.summary() for w in workers],
        },
        "assembly": assembly,
        "pipeline_wall_s": round(tiling_wall + assembly[methods[0]]["wall_s"], 2),
    }


def run(ctx: Context, sizes: list[int], kept: dict, methods: tuple[str, ...] = METHODS) -> dict:
    return {"sizes": {str(size): measure(ctx, size, kept[str(size)], methods) for size in sizes}, "note": MACHINE_NOTE}


def print_report(r: dict) -> None:
    print(f"\n## Raster half: tiling by {WORKERS} worker processes, assembly by method ({r['note']})")
    rows = []
    for size, e in r["sizes"].items():
        t = e["tiling"]
        rss = ", ".join(f"{w['peak_rss_mb']:.0f}" for w in t["worker"])
        rows.append(
            [
                f"{size}²",
                f"tiling, {e['windows']} windows of {e['window_size']}², {t['workers']} workers",
                f"{t['wall_s']:.1f}",
                rss,
                f"{t['tiles_nbytes'] / 2**20:.0f} (tiles)",
                "",
            ]
        )
        for method, a in e["assembly"].items():
            bodies = a.get("http_bodies") or {}
            moved = sum(part.get("sent", 0) + part.get("received", 0) for part in bodies.values())
            through = f"{100 * moved / a['nbytes']:.1f} %" if bodies and a["nbytes"] else ""
            rows.append(
                [
                    f"{size}²",
                    f"assembly ({method}), {a['overview_levels']} overview levels",
                    f"{a['wall_s']:.1f}",
                    f"{a['peak_rss_mb']:.0f}",
                    f"{a['nbytes'] / 2**20:.0f}",
                    through,
                ]
            )
        rows.append([f"{size}²", "tiling + first method's assembly", f"{e['pipeline_wall_s']:.1f}", "", "", ""])
    print(table(rows, ["scene", "step", "wall s", "peak RSS MiB", "mosaic MiB", "HTTP bodies in+out / mosaic"]))
