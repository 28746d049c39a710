"""What duplicates cost: a completed job delivered again, a completed job re-run, every activity twice.

All in-process through the local host, on the same scene as the first run (the breakdown's job,
same Azurite, same run):
- **redelivery**: ``LocalHost.deliver_blob_created`` of the same blob after the job completed
  (Event Grid delivering BlobCreated again). The starter reads the blob's properties, computes
  the job id, asks the Durable client for the status, sees Completed and does nothing;
- **forced re-run**: the completed instance id started again with its own input, bypassing the
  starter's check (what the host does for a Failed/Terminated id, or an operator's restart):
  every window is skipped by the manifest point read, the mosaic is found present;
- **every activity twice** (``HostOptions(duplicate_activities=True)``): a fresh job on the same
  scene where each activity runs twice, concurrently (at-least-once made visible).

Counted for each: wall time and its fraction of the first run; ``render_tile`` executions that
encoded (``skipped`` False) beyond one per window = tiles re-encoded; activity executions and
orchestration episodes; HTTP requests the Python storage SDKs sent (blob / table, by method;
GDAL's /vsiaz/ range reads are libcurl's and are not in that count).
"""

from __future__ import annotations

import time
from pathlib import Path

from .common import MACHINE_NOTE, Context, RequestCounter, fmt_spread, say, spread, table
from .instrumented import Instruments, local_host, process

REDELIVERY_TARGET = 0.05


def _counts(inst: Instruments) -> dict:
    engine = inst.host.engine
    tiles = [e for e in list(engine.executions) if e.name == "render_tile"]
    return {
        "executions": engine.stats.activity_executions,  # the execution log is bounded; the counter is not
        "render_tile": len(tiles),
        "encoded": sum(1 for e in tiles if e.result and not e.result.get("skipped")),
        "skipped": sum(1 for e in tiles if e.result and e.result.get("skipped")),
        "episodes": engine.stats.episodes,
        "failures": engine.stats.activity_failures,
        "requests": inst.requests.snapshot(),
        "decisions": len(inst.host.decisions),
    }


def _delta(after: dict, before: dict) -> dict:
    out = {k: after[k] - before[k] for k in after if k not in ("requests",)}
    out["requests"] = RequestCounter.delta(after["requests"], before["requests"])
    out["requests_total"] = sum(out["requests"].values())
    return out


def redeliver(inst: Instruments, summary: dict, blob: str, times: int) -> dict:
    first = summary["elapsed_s"]
    runs = []
    for _ in range(times):
        before = _counts(inst)
        started = time.perf_counter()
        delivered = inst.host.deliver_blob_created(blob)
        seconds = time.perf_counter() - started
        time.sleep(0.5)  # anything the starter had set off would show up in the counts now
        delta = _delta(_counts(inst), before)
        decision = inst.host.decisions[-1] if inst.host.decisions else {}
        runs.append(
            {
                "seconds": seconds,
                "delivered": delivered,
                "decision": decision.get("action"),
                "reason": decision.get("reason"),
                **delta,
            }
        )
    return {
        "first_run_s": first,
        "runs": runs,
        "seconds": spread((r["seconds"] for r in runs), 4),
        "fraction_of_first": spread((r["seconds"] / first for r in runs), 5),
        "tiles_reencoded": sum(r["encoded"] for r in runs),
        "activity_executions": sum(r["executions"] for r in runs),
        "episodes": sum(r["episodes"] for r in runs),
        "requests_per_delivery": spread((r["requests_total"] for r in runs), 1),
        "request_kinds": runs[-1]["requests"],
        "decisions": sorted({r["decision"] for r in runs}),
    }


def forced_rerun(inst: Instruments, summary: dict) -> dict:
    from orchestrators import names

    engine = inst.host.engine
    job_id = summary["job_id"]
    state = engine.status(job_id)
    before = _counts(inst)
    started = time.perf_counter()
    engine.start_new(names.TILE_SCENE, job_id, input_json=state["input"])
    final = engine.wait_for(job_id, timeout=3600)
    seconds = time.perf_counter() - started
    delta = _delta(_counts(inst), before)
    output = final.get("output") or {}
    return {
        "seconds": seconds,
        "fraction_of_first": seconds / summary["elapsed_s"],
        "status": final["status"],
        "tiles_reencoded": delta["encoded"],
        "windows_skipped": delta["skipped"],
        "mosaic_outcome": output.get("mosaic_outcome"),
        "written": output.get("written"),
        "already_present": output.get("already_present"),
        **{k: delta[k] for k in ("executions", "episodes", "requests", "requests_total")},
    }


def duplicate_activities(ctx: Context, first: dict, *, host_options: dict | None = None) -> dict:
    """A fresh job on the first run's scene (``first``: the breakdown report) with every activity
    run twice, concurrently."""
    scene = Path(first["scene_path"])
    env = ctx.storage.app_env("dup-activities", window_size=first["window_size"])
    say("duplicates: every activity twice, a fresh job on the same scene ...")
    with local_host(ctx.storage, env, duplicate_activities=True, **(host_options or {})) as inst:
        before = _counts(inst)
        summary = process(inst, scene)
        started = time.perf_counter()
        inst.host.engine.activities.drain()  # let the second copies finish before counting
        drain = time.perf_counter() - started
        delta = _delta(_counts(inst), before)
        tiles = [e for e in list(inst.host.engine.executions) if e.name == "render_tile"]
        outcomes: dict[str, int] = {}
        for e in tiles:
            if e.result:
                outcomes[e.result["outcome"]] = outcomes.get(e.result["outcome"], 0) + 1
        errors = sorted({(e.name, (e.error or "")[:160]) for e in list(inst.host.engine.executions) if e.error})
        spans = inst.index.spans
        tile_spans = [(a, b) for n, a, b in spans if n == "render_tile"]
        asm_spans = sorted((a, b) for n, a, b in spans if n == "assemble_mosaic")
        phases = {
            "tiling_s": max(b for _, b in tile_spans) - min(a for a, _ in tile_spans),
            "assembly_executions": len(asm_spans),
            # From the first assembly start to the job's completion: includes any retry wait.
            "assembly_to_completion_s": summary["_finished"] - asm_spans[0][0],
            "assembly_span_s": [round(b - a, 2) for a, b in asm_spans],
        }
    ctx.storage.drop(env)
    windows = summary["windows"]
    return {
        "seconds": summary["elapsed_s"],
        "drain_after_completion_s": drain,
        "first_run_s": first["elapsed_s"],
        "extra_fraction": summary["elapsed_s"] / first["elapsed_s"] - 1,
        "windows": windows,
        "render_tile_executions": delta["render_tile"],
        "encoded": delta["encoded"],
        "tiles_reencoded": delta["encoded"] - windows,
        "skipped_by_manifest_check": delta["skipped"],
        "outcomes": outcomes,
        "activity_failures": delta["failures"],
        "failed_copies": [list(x) for x in errors],
        "executions": delta["executions"],
        "episodes": delta["episodes"],
        "requests": delta["requests"],
        "requests_total": delta["requests_total"],
        "first_run_requests_total": first.get("requests_total"),
        "phases": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in phases.items()},
        "summary_written": summary["written"],
        "summary_already_present": summary["already_present"],
    }


def after_first_run(times: int):
    """The part that runs on the breakdown's host, right after its job completed."""

    def after(inst: Instruments, summary: dict) -> dict:
        blob = summary["_blob"]
        # The watcher (Event Grid's stand-in) polls the input container; stop it so that its
        # listings are not counted as requests of the redelivery. Deliveries below are explicit.
        inst.host.watcher.stop()
        say(f"duplicates: the completed job delivered again x{times}, then re-run by id ...")
        return {"redelivery": redeliver(inst, summary, blob, times), "forced_rerun": forced_rerun(inst, summary)}

    return after


def print_report(r: dict) -> None:
    red, rerun, dup = r["redelivery"], r["forced_rerun"], r.get("duplicate_activities")
    print(f"\n## 3. Duplicates, same scene, same run ({MACHINE_NOTE})")
    rows = [
        [
            "completed job delivered again (starter sees Completed)",
            fmt_spread(red["seconds"], " s", 3),
            fmt_spread(
                {k: (v * 100 if isinstance(v, float) else v) for k, v in red["fraction_of_first"].items()}, " %", 3
            ),
            red["tiles_reencoded"],
            red["activity_executions"],
            red["episodes"],
            f"{fmt_spread(red['requests_per_delivery'], '', 0)} per delivery {red['request_kinds']}",
        ],
        [
            "completed job id re-run (starter bypassed)",
            f"{rerun['seconds']:.2f} s",
            f"{rerun['fraction_of_first']:.1%}",
            rerun["tiles_reencoded"],
            rerun["executions"],
            rerun["episodes"],
            f"{rerun['requests_total']} {rerun['requests']}",
        ],
    ]
    if dup:
        rows.append(
            [
                "every activity twice (fresh job)",
                f"{dup['seconds']:.2f} s (+{dup['drain_after_completion_s']:.1f} s drain)",
                f"+{dup['extra_fraction']:.0%}",
                dup["tiles_reencoded"],
                dup["executions"],
                dup["episodes"],
                f"{dup['requests_total']} vs {dup['first_run_requests_total']} first run",
            ]
        )
    print(f"first run (in-process, upload to mosaic): {red['first_run_s']:.2f} s")
    print(
        table(rows, ["case", "time", "vs first run", "tiles re-encoded", "activity execs", "episodes", "SDK requests"])
    )
    if dup:
        print(
            f"every activity twice: {dup['render_tile_executions']} render_tile executions for {dup['windows']} windows, "
            f"{dup['encoded']} encoded, {dup['skipped_by_manifest_check']} skipped by the manifest check, outcomes "
            f"{dup['outcomes']}, {dup['activity_failures']} failed copies {dup['failed_copies'][:3]}"
        )
        ph = dup["phases"]
        retried = any(name == "assemble_mosaic" for name, _ in dup["failed_copies"])
        print(
            f"every activity twice, phases: tiling {ph['tiling_s']:.1f} s; {ph['assembly_executions']} assemble_mosaic "
            f"executions ({ph['assembly_span_s']} s each), first assembly start to job completion "
            f"{ph['assembly_to_completion_s']:.1f} s"
            + (
                " (a copy failed first: a TaskFailed, so the orchestrator waited its retry interval before another "
                "attempt)"
                if retried
                else " (no claim: the second copy assembles beside the first, or stops when it sees the first's mosaic, "
                "and returns already-present)"
            )
        )
    print(
        "requests = HTTP requests of the Python storage SDKs (blob/table) counted at requests' HTTPAdapter.send; "
        "GDAL's /vsiaz/ reads are not included"
    )
