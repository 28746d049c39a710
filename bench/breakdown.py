"""Where the time of one job goes: validation, planning, tiles, orchestration, assembly.

The job runs through the local host in this process (the same code ``python -m devhost process``
runs), instrumented by :mod:`bench.instrumented`:
- the job's timeline: upload + event + start, validation, tiling (first window start to last
  window end), assembly, with the gaps between them;
- per window, from ``render_tile``'s own ``timings``: manifest check, read, encode, commit,
  manifest row; and the activity's wall time around them (source ETag check, clients, JSON);
- orchestration: the SDK's replay seconds (engine.stats and per orchestrator), whole episodes
  on the orchestrator thread (context JSON, replay, store commit, dispatch), episodes, history
  events;
- assembly: ``assemble_mosaic``'s own timings.

Overhead per window = (commit + manifest check + manifest row + orchestration episodes) / encode,
summed over the job's windows. To tell the conditional write's own cost from moving the bytes,
plain puts and conditional puts of the same sizes are timed alternately after the job.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from .common import MACHINE_NOTE, Context, fmt_spread, say, spread, table
from .instrumented import Instruments, local_host, process

TILE_STEPS = ("manifest_check", "read", "encode", "commit", "manifest")
OVERHEAD_TARGET = 0.10


def analyse(inst: Instruments, summary: dict, scene: Path) -> dict:
    """Figures of one completed job run by ``inst.host``."""
    from tilecommit.grid import plan_windows

    engine = inst.host.engine
    windows = summary["windows"]
    execs = [e for e in list(engine.executions) if e.name == "render_tile" and e.error is None]
    encoded = [e for e in execs if not e.result.get("skipped")]
    per_step = {step: [e.result["timings"].get(step, 0.0) for e in encoded] for step in TILE_STEPS}
    sums = {step: sum(v) for step, v in per_step.items()}
    activity_other = [e.seconds - sum(e.result["timings"].values()) for e in encoded]

    spans = inst.index.spans

    def span(name: str) -> list[tuple[float, float]]:
        return [(s, e) for n, s, e in spans if n == name]

    validate, tiles, assemble = span("validate_source"), span("render_tile"), span("assemble_mosaic")
    t0, t_end = summary["_submitted"], summary["_finished"]
    timeline = {
        "upload_event_start_s": validate[0][0] - t0,
        "validation_s": validate[0][1] - validate[0][0],
        "plan_and_dispatch_gap_s": min(s for s, _ in tiles) - validate[0][1],
        "tiling_s": max(e for _, e in tiles) - min(s for s, _ in tiles),
        "gap_before_assembly_s": assemble[0][0] - max(e for _, e in tiles),
        "assembly_s": assemble[0][1] - assemble[0][0],
        "after_assembly_s": t_end - assemble[0][1],
        "job_elapsed_s": t_end - t0,
    }
    # How busy the host's activity slots were during the tiling phase: what is not busy is
    # dispatch latency (episodes, the engine's lock, the pool's queue) or the tail of the phase.
    slots = inst.host.engine.max_activities
    tiling_start, tiling_end = min(s for s, _ in tiles), max(e for _, e in tiles)
    busy = sum(min(e, tiling_end) - max(s, tiling_start) for n, s, e in spans if e > tiling_start and s < tiling_end)
    slot_use = busy / (slots * (tiling_end - tiling_start)) if tiling_end > tiling_start else None
    # Planning is pure (no I/O), run inside the orchestrator: timed on its own here.
    validated = next(e for e in list(engine.executions) if e.name == "validate_source")
    scene_w, scene_h = validated.result["scene"]["width"], validated.result["scene"]["height"]
    window_size = int(inst.env.get("TILECOMMIT_WINDOW_SIZE", 1024))
    started = time.perf_counter()
    for _ in range(10):
        plan_windows(scene_w, scene_h, window_size)
    planning_s = (time.perf_counter() - started) / 10

    assembly = next(e for e in list(engine.executions) if e.name == "assemble_mosaic")
    orchestration = {
        "episodes": engine.stats.episodes,
        "history_events": engine.stats.history_events,
        "replay_s": engine.stats.replay_seconds,
        "replay_s_by_orchestrator": dict(inst.index.replay_s),
        "replays_by_orchestrator": dict(inst.index.replays),
        "episode_busy_s": inst.timer.seconds.get("episode", 0.0),
        "store_s": {k: v for k, v in inst.timer.seconds.items() if k.startswith("store.")},
        "activity_executions": engine.stats.activity_executions,
    }
    orch_total = orchestration["episode_busy_s"]
    overhead_parts = {
        "commit": sums["commit"],
        "manifest (check + row)": sums["manifest_check"] + sums["manifest"],
        "orchestration (episodes)": orch_total,
    }
    encode = sums["encode"] or float("nan")
    fractions = {k: v / encode for k, v in overhead_parts.items()}
    return {
        "scene": f"{scene_w}x{scene_h}",
        "windows": windows,
        "windows_encoded": len(encoded),
        "timeline": {k: round(v, 3) for k, v in timeline.items()},
        "planning_s": planning_s,
        "activity_slots": slots,
        "slot_use_during_tiling": None if slot_use is None else round(slot_use, 3),
        "tile_steps_per_window_s": {step: spread(v, 4) for step, v in per_step.items()},
        "tile_steps_sum_s": {k: round(v, 3) for k, v in sums.items()},
        "activity_other_per_window_s": spread(activity_other, 4),
        "render_tile_activity_s": spread((e.seconds for e in encoded), 4),
        "orchestration": orchestration,
        "assembly": {
            "activity_s": round(assembly.seconds, 3),
            "method": assembly.result.get("method"),
            "timings": {k: round(v, 3) for k, v in (assembly.result.get("timings") or {}).items()},
        },
        "overhead_s": {k: round(v, 3) for k, v in overhead_parts.items()},
        "overhead_fraction_of_encode": {k: round(v, 4) for k, v in fractions.items()},
        "overhead_fraction_total": round(sum(fractions.values()), 4),
        "tile_nbytes": spread((e.result["nbytes"] for e in encoded), 0),
    }


def gate_cost(inst: Instruments, job_id: str, samples: int = 8) -> dict:
    """Plain Put Blob vs the conditional one (commit_blob), same body sizes, alternated."""
    from tilecommit.gates import commit_blob

    settings = inst.host.settings
    tiles = inst.host.blobs.get_container_client(settings.tiles_container)
    sizes = [b.size for b in tiles.list_blobs(name_starts_with=f"tiles/{job_id}/")][:samples]
    plain, conditional = [], []
    for i, size in enumerate(sizes):
        body = os.urandom(size)
        started = time.perf_counter()
        tiles.get_blob_client(f"bench-gate/{job_id}/plain-{i}").upload_blob(body, overwrite=True, max_concurrency=1)
        plain.append(time.perf_counter() - started)
        started = time.perf_counter()
        commit_blob(tiles, f"bench-gate/{job_id}/cond-{i}", body, job_id=job_id)
        conditional.append(time.perf_counter() - started)
    return {
        "bodies": len(sizes),
        "median_bytes": statistics.median(sizes) if sizes else 0,
        "plain_put_s": spread(plain, 4),
        "commit_blob_s": spread(conditional, 4),
    }


def run(
    ctx: Context, scene: int | Path, *, window_size: int = 1024, host_options: dict | None = None, after=None
) -> dict:
    """One job in-process on ``scene`` (an edge in pixels: the cached scene; or a path).

    ``after(inst, summary)`` runs on the same host right after the job, before the host stops.
    """
    from .common import scene_path

    scene = scene_path(scene) if isinstance(scene, int) else Path(scene)
    env = ctx.storage.app_env(f"breakdown-{scene.stem}", window_size=window_size)
    say(f"breakdown: one job on {scene.name} in-process ...")
    with local_host(ctx.storage, env, **(host_options or {})) as inst:
        azurite_before = ctx.storage.azurite_cpu_s()
        summary = process(inst, scene)
        azurite_after = ctx.storage.azurite_cpu_s()
        summary["_blob"] = scene.name
        requests = inst.requests.snapshot()
        report = analyse(inst, summary, scene)
        report["requests"] = requests
        report["requests_total"] = sum(requests.values())
        report["requests_per_window"] = round(report["requests_total"] / max(1, report["windows"]), 2)
        report["azurite_cpu_s"] = None if azurite_before is None else round(azurite_after - azurite_before, 2)
        report["elapsed_s"] = summary["elapsed_s"]
        report["job_id"] = summary["job_id"]
        report["scene_path"] = str(scene)
        report["window_size"] = window_size
        report["gate_cost"] = gate_cost(inst, summary["job_id"])
        report["note"] = MACHINE_NOTE
        if after is not None:
            report["after"] = after(inst, summary)
    ctx.storage.drop(env)
    return report


def print_report(r: dict) -> None:
    print(
        f"\n## 2. Where the time goes: one job, {r['scene']}, {r['windows']} windows, in-process local host ({r['note']})"
    )
    t = r["timeline"]
    labels = {
        "upload_event_start_s": "upload + BlobCreated + starter + first episode",
        "validation_s": "validate_source",
        "plan_and_dispatch_gap_s": "plan + dispatch (until the first window starts)",
        "tiling_s": "tiling (first window start to last window end)",
        "gap_before_assembly_s": "batch fan-in until assembly starts",
        "assembly_s": "assemble_mosaic",
        "after_assembly_s": "after assembly until the job is seen completed",
        "job_elapsed_s": "job elapsed (upload to completion)",
    }
    rows = [[labels.get(k, k), f"{v:.2f} s", f"{v / t['job_elapsed_s']:.0%}"] for k, v in t.items()]
    rows.insert(3, ["(planning, pure, inside the orchestrator)", f"{r['planning_s'] * 1000:.2f} ms", ""])
    print(table(rows, ["job timeline", "wall", "share"]))
    rows = []
    for step in TILE_STEPS:
        rows.append(
            [step, fmt_spread(r["tile_steps_per_window_s"][step], " s", 3), f"{r['tile_steps_sum_s'][step]:.2f} s"]
        )
    rows.append(
        ["activity other (ETag check, clients, JSON)", fmt_spread(r["activity_other_per_window_s"], " s", 3), ""]
    )
    rows.append(["render_tile activity wall", fmt_spread(r["render_tile_activity_s"], " s", 3), ""])
    print(table(rows, ["per window (4 activities at once)", "median [min-max]", "sum"]))
    o = r["orchestration"]
    by_name = ", ".join(
        f"{k} {v:.2f} s in {o['replays_by_orchestrator'][k]} replays" for k, v in o["replay_s_by_orchestrator"].items()
    )
    print(
        f"orchestration: {o['episodes']} episodes, {o['history_events']} history events, replay {o['replay_s']:.2f} s "
        f"({by_name}), "
        f"episodes busy {o['episode_busy_s']:.2f} s of which store "
        f"{sum(o['store_s'].values()):.2f} s"
    )
    if r.get("slot_use_during_tiling") is not None:
        print(
            f"activity slots busy during tiling: {r['slot_use_during_tiling']:.0%} of {r['activity_slots']} slots x "
            f"{t['tiling_s']:.1f} s (the rest: waiting for dispatch, i.e. episodes and the engine's lock, or the phase's tail)"
        )
    a = r["assembly"]
    print(f"assembly ({a['method']}): {a['activity_s']:.2f} s; steps {a['timings']}")
    rows = [[k, f"{v:.2f} s", f"{r['overhead_fraction_of_encode'][k]:.1%}"] for k, v in r["overhead_s"].items()]
    rows.append(
        ["total vs encode " + f"{r['tile_steps_sum_s']['encode']:.2f} s", "", f"{r['overhead_fraction_total']:.1%}"]
    )
    print(table(rows, ["overhead over all windows", "seconds", "of encoding"]))
    print(
        f"storage: {r['requests_total']} SDK requests in the job ({r['requests_per_window']} per window; GDAL's /vsiaz/ "
        f"reads not counted) {r['requests']}; the Azurite process used {r['azurite_cpu_s']} CPU-s during the job"
    )
    g = r["gate_cost"]
    print(
        f"the condition itself: plain put {fmt_spread(g['plain_put_s'], ' s', 3)} vs commit_blob "
        f"{fmt_spread(g['commit_blob_s'], ' s', 3)} for {g['bodies']} bodies of ~{g['median_bytes'] / 2**20:.1f} MiB"
    )
