"""Memory: peak RSS of a tile worker and of assembly at each scene size, against the 1.5 GB limit.

Each figure is a fresh child process's own ru_maxrss (wait4), run through the bench's worker
processes (``python -m bench.workers imports | render | assemble``) on the scene
the end-to-end bench uploaded (same Azurite, same run):
- baseline: a process that only imports the raster library and builds its storage clients;
- tile worker: one process rendering a few 1024² windows (read from /vsiaz/, COG, commit, row);
- assembly: ``assemble_mosaic`` (method "auto", as the activity calls it) in a fresh process,
  over the end-to-end job's tiles (its manifest rows copied to a new job id, so the mosaic is
  built again from identical tiles).

An instance runs up to ``maxConcurrentActivityFunctions`` (host.json: 4) activities in one
process, so the arithmetic is baseline + 4 x tile increment (tiling), baseline + assembly
increment (assembly alone) and baseline + assembly increment + 3 x tile increment (the worst
mix: another job's tiles beside an assembly). Threads of one process share GDAL's block cache,
so the sums are upper bounds; the end-to-end run's ``devhost process`` peak (the whole local
host, 4 activities at once, then assembly) is the measured counterpart.
"""

from __future__ import annotations

import json

from tilecommit.settings import CONSUMPTION_INSTANCE_MB

from .common import MACHINE_NOTE, PYTHON, Context, run_measured, say, table
from .e2e import KeptRun
from .workers import copy_manifest

#: How far a figure may grow from the smaller scene to the larger one and still count as flat.
FLAT_TOLERANCE = 1.25


def host_concurrency() -> int:
    from devhost.durable.host import read_host_json

    return int(read_host_json().get("extensions", {}).get("durableTask", {}).get("maxConcurrentActivityFunctions", 10))


def measure(ctx: Context, size: int, kept: dict, *, tile_windows: int = 4) -> dict:
    pipeline_run = KeptRun.of(ctx, kept)
    settings, scene, windows = pipeline_run.settings, pipeline_run.scene, pipeline_run.windows
    # Interior windows first (full size), spread over the scene.
    full = [w for w in windows if w.width == settings.window_size and w.height == settings.window_size] or windows
    step = max(1, len(full) // tile_windows)
    chosen = full[::step][:tile_windows]

    say(f"memory {size}²: baseline, tile worker ({len(chosen)} windows), assembly ...")
    baseline = run_measured([PYTHON, "-m", "bench.workers", "imports"], env=pipeline_run.child_env)
    tile_job = f"{size:08x}bee{len(chosen):05x}"[:16]
    tile = run_measured(
        [
            PYTHON,
            "-m",
            "bench.workers",
            "render",
            tile_job,
            pipeline_run.source,
            ",".join(w.id for w in chosen),
            str(scene.width),
            str(scene.height),
        ],
        env=pipeline_run.child_env,
    )
    asm_job = f"{size:08x}a55e{len(windows) % 0xFFFF:04x}"[:16]
    copy_manifest(ctx.storage.connection.table_service(), settings.manifest_table, pipeline_run.job_id, asm_job)
    assembly = run_measured(
        [PYTHON, "-m", "bench.workers", "assemble", asm_job, json.dumps(scene.to_dict()), "auto"],
        env=pipeline_run.child_env,
    )
    asm = assembly.json()
    n = host_concurrency()
    base = baseline.peak_rss_mb
    tile_inc = tile.peak_rss_mb - base
    asm_inc = assembly.peak_rss_mb - base
    return {
        "scene": f"{scene.width}x{scene.height}",
        "window_size": settings.window_size,
        "windows": len(windows),
        "concurrency": n,
        "baseline": baseline.summary(),
        "tile_worker": {**tile.summary(), "windows_rendered": len(chosen), "result": tile.json()},
        "assembly": {
            **assembly.summary(),
            "method": asm.get("method"),
            "nbytes": asm.get("nbytes"),
            "overview_levels": asm.get("overview_levels"),
            "timings": {k: round(v, 2) for k, v in (asm.get("timings") or {}).items()},
        },
        "tile_increment_mb": round(tile_inc, 1),
        "assembly_increment_mb": round(asm_inc, 1),
        "tiling_instance_mb": round(base + n * tile_inc, 1),
        "assembly_instance_mb": round(base + asm_inc, 1),
        "worst_mix_instance_mb": round(base + asm_inc + (n - 1) * tile_inc, 1),
    }


def run(ctx: Context, sizes: list[int], kept: dict, e2e: dict | None, *, tile_windows: int = 4) -> dict:
    report: dict = {"sizes": {}, "note": MACHINE_NOTE, "limit_mb": float(CONSUMPTION_INSTANCE_MB)}
    for size in sizes:
        entry = measure(ctx, size, kept[str(size)], tile_windows=tile_windows)
        if e2e and str(size) in e2e.get("sizes", {}):
            entry["devhost_process_peak_rss_mb"] = e2e["sizes"][str(size)]["ours_peak_rss_mb"]
        report["sizes"][str(size)] = entry
    sizes_s = list(report["sizes"])
    if len(sizes_s) >= 2:
        small, large = report["sizes"][sizes_s[0]], report["sizes"][sizes_s[-1]]
        report["growth_tile_worker"] = round(
            large["tile_worker"]["peak_rss_mb"] / small["tile_worker"]["peak_rss_mb"], 3
        )
        report["growth_assembly"] = round(large["assembly"]["peak_rss_mb"] / small["assembly"]["peak_rss_mb"], 3)
    worst = max(
        max(
            e["tiling_instance_mb"],
            e["assembly_instance_mb"],
            e["worst_mix_instance_mb"],
            (e.get("devhost_process_peak_rss_mb") or {}).get("max") or 0,
        )
        for e in report["sizes"].values()
    )
    report["worst_instance_mb"] = worst
    report["under_limit"] = worst < CONSUMPTION_INSTANCE_MB
    report["flat"] = all(report.get(k, 1.0) <= FLAT_TOLERANCE for k in ("growth_tile_worker", "growth_assembly"))
    return report


def print_report(r: dict) -> None:
    print(f"\n## 4. Memory: peak RSS (own ru_maxrss of fresh processes), limit {r['limit_mb']:.0f} MiB ({r['note']})")
    rows = []
    for size, e in r["sizes"].items():
        n = e["concurrency"]
        base = e["baseline"]["peak_rss_mb"]
        rows.append([f"{size}²", "baseline (imports + clients)", f"{base:.0f}", ""])
        rows.append(
            [
                f"{size}²",
                f"tile worker ({e['tile_worker']['windows_rendered']} windows of {e['window_size']}²)",
                f"{e['tile_worker']['peak_rss_mb']:.0f}",
                f"+{e['tile_increment_mb']:.0f}",
            ]
        )
        rows.append(
            [
                f"{size}²",
                f"assembly ({e['assembly']['method']}, {e['assembly']['wall_s']:.1f} s)",
                f"{e['assembly']['peak_rss_mb']:.0f}",
                f"+{e['assembly_increment_mb']:.0f}",
            ]
        )
        rows.append(
            [
                f"{size}²",
                f"= tiling instance: {base:.0f} + {n} x {e['tile_increment_mb']:.0f}",
                f"{e['tiling_instance_mb']:.0f}",
                "PASS" if e["tiling_instance_mb"] < r["limit_mb"] else "MISS",
            ]
        )
        rows.append(
            [
                f"{size}²",
                f"= assembly instance: {base:.0f} + {e['assembly_increment_mb']:.0f}",
                f"{e['assembly_instance_mb']:.0f}",
                "PASS" if e["assembly_instance_mb"] < r["limit_mb"] else "MISS",
            ]
        )
        rows.append(
            [
                f"{size}²",
                f"= worst mix: {base:.0f} + {e['assembly_increment_mb']:.0f} + {n - 1} x {e['tile_increment_mb']:.0f}",
                f"{e['worst_mix_instance_mb']:.0f}",
                "PASS" if e["worst_mix_instance_mb"] < r["limit_mb"] else "MISS",
            ]
        )
        measured = e.get("devhost_process_peak_rss_mb")
        if measured and measured.get("n"):
            rows.append(
                [
                    f"{size}²",
                    "measured: whole local host (devhost process, e2e)",
                    f"{measured['median']:.0f} [{measured['min']:.0f}-{measured['max']:.0f}]",
                    "",
                ]
            )
    print(table(rows, ["scene", "process", "peak RSS MiB", "increment / verdict"]))
    if "growth_tile_worker" in r:
        print(
            f"growth from the smallest to the largest scene: tile worker x{r['growth_tile_worker']}, "
            f"assembly x{r['growth_assembly']} (flat = at most x{FLAT_TOLERANCE})"
        )
