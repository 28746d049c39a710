"""Scale of orchestration: 1,000 and 10,000 windows through the REAL orchestrators, no raster work.

``orchestrators.tiling.tile_scene`` and ``render_batch`` run in :mod:`bench.null_app` with
activities that answer at once, driven by :class:`devhost.durable.engine.Engine` (the replay driver over
the real Durable SDK) with a :class:`devhost.durable.store.HistoryStore` on the bench Azurite, with the
host's settings (4 activities at once, batches of 64, 4 batches in flight).

Measured per run: wall time from ``start_new`` to completion; the SDK's replay seconds (total,
and per orchestrator through a timing proxy on the function index); whole episodes on the
orchestrator thread (context JSON, replay, store commit, dispatch); episodes; history events;
the largest history of any one instance (and the parent's). Normalised per 1,000 windows, the
larger size's figure over the smaller's is the linearity ratio (1.0 = perfectly linear).
"""

from __future__ import annotations

import time

from .common import MACHINE_NOTE, Context, fmt_spread, say, spread, table
from .instrumented import MethodTimer, TimedIndex

LINEARITY_TARGET = 1.3


def one_run(ctx: Context, windows: int, *, batch_size: int = 64, max_activities: int = 4, tag: str = "") -> dict:
    from devhost.durable.engine import Engine
    from devhost.durable.functions import FunctionIndex
    from devhost.durable.queues import queue_service
    from devhost.durable.store import HistoryStore
    from orchestrators import names
    from tilecommit.jobs import Job

    from . import null_app

    connection = ctx.storage.connection
    hub = f"BenchOrch{windows}{tag}{time.time_ns() % 10**8}"
    store = HistoryStore(connection.blob_service(), connection.table_service(), hub, queue_service(connection))
    store.ensure()
    index = TimedIndex(FunctionIndex.from_app(null_app.app))
    engine = Engine(index, store, max_activities=max_activities)
    timer = MethodTimer()
    timer.wrap(engine.episodes, "run", "episode")
    timer.wrap(store, "commit_episode", "store.commit_episode")
    job = null_app.job_input(f"{windows:08x}{time.time_ns() % 16**8:08x}", windows, batch_size=batch_size)
    window_size = Job.from_dict(job).spec.window_size
    planned = (job["scene_width"] // window_size) * (job["scene_height"] // window_size)
    with engine:
        started = time.perf_counter()
        engine.start_new(names.TILE_SCENE, job["job_id"], job)
        state = engine.wait_for(job["job_id"], timeout=3600)
        wall = time.perf_counter() - started
        # The instances the engine holds, for the history length of each.
        histories = {inst.id: len(inst.history) for inst in engine.instances.all()}
        stats = engine.stats
    if state["status"] != "Completed":
        raise RuntimeError(f"null orchestration of {windows} windows: {state['status']}: {state.get('error')}")
    output = state["output"]
    tile_execs = sum(1 for e in list(engine.executions) if e.name == "render_tile")
    result = {
        "windows": planned,
        "output_windows": output["windows"],
        "output_written": output["written"],
        "render_tile_executions": tile_execs,
        "batches": -(-planned // batch_size),
        "wall_s": wall,
        "replay_s": stats.replay_seconds,
        "replay_s_by_orchestrator": dict(index.replay_s),
        "replays_by_orchestrator": dict(index.replays),
        "episode_busy_s": timer.seconds.get("episode", 0.0),
        "store_commit_s": timer.seconds.get("store.commit_episode", 0.0),
        "episodes": stats.episodes,
        "history_events": stats.history_events,
        "instances": len(histories),
        "largest_history": max(histories.values()),
        "parent_history": histories[job["job_id"]],
        "largest_batch_history": max((v for k, v in histories.items() if k != job["job_id"]), default=0),
        "large_messages": store.large_messages,
    }
    try:  # the bench Azurite lives for the whole run: drop this hub's history
        connection.table_service().delete_table(f"{hub}History")
        connection.blob_service().delete_container(f"{hub.lower()}-largemessages")
    except Exception:
        pass
    return result


def run(ctx: Context, sizes: list[int], repeats: dict[int, int] | int) -> dict:
    report: dict = {"sizes": {}, "note": MACHINE_NOTE, "batch_size": 64, "max_activities": 4}
    for windows in sizes:
        n = repeats.get(windows, 1) if isinstance(repeats, dict) else repeats
        runs = []
        for rep in range(n):
            r = one_run(ctx, windows, tag=f"r{rep}")
            runs.append(r)
            say(
                f"orchestration {windows} windows, repeat {rep + 1}/{n}: {r['wall_s']:.1f} s, replay {r['replay_s']:.2f} s, "
                f"{r['episodes']} episodes, largest history {r['largest_history']}"
            )
        per_k = r["windows"] / 1000.0
        report["sizes"][str(windows)] = {
            "runs": runs,
            "windows": runs[0]["windows"],
            "wall_per_1000_s": spread(x["wall_s"] / per_k for x in runs),
            "replay_per_1000_s": spread(x["replay_s"] / per_k for x in runs),
            "episode_busy_per_1000_s": spread(x["episode_busy_s"] / per_k for x in runs),
            "parent_replay_s": spread(x["replay_s_by_orchestrator"].get("tile_scene", 0.0) for x in runs),
            "batch_replay_per_1000_s": spread(
                x["replay_s_by_orchestrator"].get("render_batch", 0.0) / per_k for x in runs
            ),
            "history_events_per_1000": spread((x["history_events"] / per_k for x in runs), 1),
            "episodes": spread((x["episodes"] for x in runs), 0),
            "largest_history": max(x["largest_history"] for x in runs),
            "parent_history": max(x["parent_history"] for x in runs),
            "largest_batch_history": max(x["largest_batch_history"] for x in runs),
            "consistent": all(x["output_windows"] == x["windows"] == x["render_tile_executions"] for x in runs),
        }
    keys = list(report["sizes"])
    if len(keys) >= 2:
        small, large = report["sizes"][keys[0]], report["sizes"][keys[-1]]
        for key in (
            "wall_per_1000_s",
            "replay_per_1000_s",
            "episode_busy_per_1000_s",
            "batch_replay_per_1000_s",
            "history_events_per_1000",
        ):
            report[f"ratio_{key}"] = (
                round(large[key]["median"] / small[key]["median"], 3) if small[key]["median"] else None
            )
        report["ratio_sizes"] = f"{keys[-1]} / {keys[0]}"
    return report


def print_report(r: dict) -> None:
    print(f"\n## 5. Orchestration scale, real orchestrators, null activities, history on Azurite ({r['note']})")
    rows = []
    for windows, s in r["sizes"].items():
        rows.append(
            [
                windows,
                fmt_spread(s["wall_per_1000_s"], " s"),
                fmt_spread(s["replay_per_1000_s"], " s", 3),
                fmt_spread(s["episode_busy_per_1000_s"], " s", 3),
                f"{s['parent_replay_s']['median']:.2f} s",
                f"{s['batch_replay_per_1000_s']['median']:.3f} s",
                fmt_spread(s["history_events_per_1000"], "", 0),
                f"{s['episodes']['median']:.0f}",
                f"{s['largest_history']} (parent {s['parent_history']}, batch {s['largest_batch_history']})",
            ]
        )
    print(
        table(
            rows,
            [
                "windows",
                "wall / 1000 win",
                "replay / 1000 win",
                "episodes busy / 1000",
                "parent replay total",
                "batch replay / 1000",
                "history events / 1000",
                "episodes",
                "largest history / instance",
            ],
        )
    )
    if "ratio_replay_per_1000_s" in r:
        print(
            f"linearity ({r['ratio_sizes']}, per 1,000 windows, medians): replay x{r['ratio_replay_per_1000_s']}, "
            f"wall x{r['ratio_wall_per_1000_s']}, episodes busy x{r['ratio_episode_busy_per_1000_s']}, "
            f"batch replay x{r['ratio_batch_replay_per_1000_s']}, history events x{r['ratio_history_events_per_1000']}"
        )
