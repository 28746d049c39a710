"""The contention lab: n workers race to create the same keys through ``tilecommit.gates.commit_blob``.

Each round, every worker waits at a barrier, then tries to create each of the round's keys
(``lab/{run}/{round}/{key}``, the same body for a key whatever the worker, as with
deterministic tiles), all in the same key order or each in its own shuffled order, and records when its attempt was sent and answered
(CLOCK_MONOTONIC, comparable across processes) and the outcome. Workers are separate processes
by default (separate Function instances); ``threads`` mode runs them as threads of one process.

Per key and round exactly one attempt should be ``written`` and n - 1 ``already-present``:
storage decides the race, so *losers* are always n - 1. What varies is how many of those losers
actually *raced*: an attempt sent before the winner's answer came back (``sent < winner's
answered``) overlapped the winner's in-flight window, a genuine conflict the conditional write
had to settle; one sent after it could have been saved by a cheap existence check.

Model: each of the n - 1 other attempts overlaps the winner's in-flight window independently,
with the same probability p, so the conflicts per key per round C ~ Binomial(n - 1, p).
p is measured as (overlapping losers) / (all losers) over the whole run, and the observed
distribution of C is printed and plotted next to Binomial(n - 1, p). The departure is given as
the dispersion index var(C) / ((n - 1) p (1 - p)) (1 for the model; > 1: attempts cluster,
all overlapping or none), the total-variation distance, and p by the key's position in the
round (the model assumes it constant).
"""

from __future__ import annotations

import hashlib
import math
import multiprocessing
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from .common import MACHINE_NOTE, Context, pyplot, say, table


def _now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def _body(key: int, nbytes: int) -> bytes:
    seed = hashlib.sha256(f"lab-key-{key}".encode()).digest()
    return (seed * (nbytes // len(seed) + 1))[:nbytes]


def worker(
    conn_str: str,
    container: str,
    run_id: str,
    worker_id: int,
    keys: int,
    rounds: int,
    body_bytes: int,
    barrier: Any,
    results: Any,
    order: str = "same",
) -> None:
    """One racer: ``rounds`` x (barrier, then every key). Puts its records on ``results``.

    ``order``: "same" (every worker walks the keys 0, 1, 2 ..., as copies of one job walk its
    windows) or "shuffled" (each worker its own seeded permutation per round)."""
    import logging
    import random

    logging.getLogger("tilecommit.conditional").setLevel(logging.WARNING)  # refusals are logged at INFO
    from tilecommit.gates import commit_blob
    from tilecommit.storage import StorageConnection

    client = StorageConnection.from_connection_string(conn_str).blob_service().get_container_client(container)
    bodies = [_body(k, body_bytes) for k in range(keys)]
    client.get_container_properties()  # warm the connection pool before the first barrier
    records = []
    for rnd in range(rounds):
        sequence = list(range(keys))
        if order == "shuffled":
            random.Random(f"{run_id}-{worker_id}-{rnd}").shuffle(sequence)
        barrier.wait()
        for position, key in enumerate(sequence):
            sent = _now()
            try:
                outcome = str(commit_blob(client, f"lab/{run_id}/{rnd:05d}/{key:03d}", bodies[key], job_id="lab"))
            except Exception as exc:  # a genuine fault is a result too
                outcome = f"error: {type(exc).__name__}"
            records.append((rnd, key, worker_id, sent, _now(), outcome, position))
    results.put(records)


def race(
    conn_str: str,
    container: str,
    *,
    workers: int,
    keys: int,
    rounds: int,
    body_bytes: int,
    mode: str = "process",
    order: str = "same",
) -> list[tuple]:
    run_id = f"{time.time_ns():x}"
    if mode == "process":
        mp = multiprocessing.get_context("spawn")
        barrier, results, runner = mp.Barrier(workers), mp.Queue(), mp.Process
    else:
        import queue

        barrier, results, runner = threading.Barrier(workers), queue.Queue(), threading.Thread
    runs = [
        runner(target=worker, args=(conn_str, container, run_id, i, keys, rounds, body_bytes, barrier, results, order))
        for i in range(workers)
    ]
    for run in runs:
        run.start()
    records = []
    for _ in runs:  # each worker puts its records once, at its end
        records.extend(results.get(timeout=1800))
    for run in runs:
        run.join(timeout=60)
    return records


def binomial_pmf(n: int, p: float) -> list[float]:
    return [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]


def analyse(records: list[tuple], workers: int, keys: int, rounds: int) -> dict:
    groups: dict[tuple[int, int], list[tuple]] = {}
    for rec in records:
        groups.setdefault((rec[0], rec[1]), []).append(rec)
    winners_per_round = [0] * rounds
    losers_per_round = [0] * rounds
    errors = 0
    conflicts: list[int] = []
    by_position: dict[int, list[int]] = {k: [0, 0] for k in range(keys)}  # loser's position -> [overlapping, losers]
    first_key: list[int] = []  # conflicts on key 0 (with order "same": the key every worker starts on)
    winner_latency, loser_latency, late_by = [], [], []
    multi_winner = 0
    for (rnd, key), attempts in sorted(groups.items()):
        won = [a for a in attempts if a[5] == "written"]
        lost = [a for a in attempts if a[5] == "already-present"]
        errors += sum(1 for a in attempts if a[5].startswith("error"))
        winners_per_round[rnd] += len(won)
        losers_per_round[rnd] += len(lost)
        if len(won) != 1:
            multi_winner += 1
            continue
        w = won[0]
        winner_latency.append(w[4] - w[3])
        overlapping = sum(1 for a in lost if a[3] < w[4])
        conflicts.append(overlapping)
        if key == 0:
            first_key.append(overlapping)
        for a in lost:
            by_position[a[6]][0] += a[3] < w[4]
            by_position[a[6]][1] += 1
            loser_latency.append(a[4] - a[3])
            if a[3] >= w[4]:
                late_by.append(a[3] - w[4])
    m = workers - 1
    total_losers = sum(losers_per_round)
    p = (sum(conflicts) / (len(conflicts) * m)) if conflicts and m else 0.0
    observed = [conflicts.count(k) for k in range(m + 1)]
    expected = [len(conflicts) * q for q in binomial_pmf(m, p)] if m else [len(conflicts)]
    var = statistics.pvariance(conflicts) if len(conflicts) > 1 else 0.0
    model_var = m * p * (1 - p)
    tvd = (
        0.5 * sum(abs(o / len(conflicts) - e / len(conflicts)) for o, e in zip(observed, expected, strict=True))
        if conflicts
        else 0.0
    )
    p0 = (sum(first_key) / (len(first_key) * m)) if first_key and m else 0.0
    var0 = statistics.pvariance(first_key) if len(first_key) > 1 else 0.0
    return {
        "workers": workers,
        "keys": keys,
        "rounds": rounds,
        "attempts": len(records),
        "winners_per_round": winners_per_round,
        "losers_per_round": losers_per_round,
        "winners_total": sum(winners_per_round),
        "losers_total": total_losers,
        "errors": errors,
        "keys_without_exactly_one_winner": multi_winner,
        "p_overlap": round(p, 4),
        "conflicts_mean": round(statistics.fmean(conflicts), 3) if conflicts else 0.0,
        "conflicts_var": round(var, 3),
        "binomial_var": round(model_var, 3),
        "dispersion_index": round(var / model_var, 3) if model_var else None,
        "tv_distance": round(tvd, 4),
        "observed": observed,
        "expected": [round(e, 2) for e in expected],
        "first_key": {
            "p_overlap": round(p0, 4),
            "observed": [first_key.count(k) for k in range(m + 1)],
            "expected": [round(len(first_key) * q, 2) for q in binomial_pmf(m, p0)] if m else [],
            "dispersion_index": round(var0 / (m * p0 * (1 - p0)), 3) if m and 0 < p0 < 1 else None,
        },
        "p_by_key_position": [round(o / n, 3) if n else None for o, n in (by_position[k] for k in range(keys))],
        "winner_latency_ms": round(1000 * statistics.median(winner_latency), 2) if winner_latency else None,
        "loser_latency_ms": round(1000 * statistics.median(loser_latency), 2) if loser_latency else None,
        "late_losers_sent_after_answer_ms": round(1000 * statistics.median(late_by), 2) if late_by else None,
    }


def run(
    ctx: Context,
    *,
    workers: int = 10,
    keys: int = 8,
    rounds: int = 40,
    body_kib: list[int] | int = 64,
    mode: str = "process",
    orders: list[str] | str = "same",
) -> dict:
    from azure.core.exceptions import ResourceExistsError

    blobs = ctx.storage.connection.blob_service()
    container = f"lab-{time.time_ns() % 10**10}"
    try:
        blobs.create_container(container)
    except ResourceExistsError:
        pass
    report: dict = {"note": MACHINE_NOTE, "mode": mode, "runs": []}
    try:
        configs = [
            (kib, order)
            for order in ([orders] if isinstance(orders, str) else orders)
            for kib in ([body_kib] if isinstance(body_kib, int) else body_kib)
        ]
        for kib, order in configs:
            say(
                f"contention lab: {workers} {mode} workers x {keys} keys x {rounds} rounds, {kib} KiB bodies, "
                f"key order {order} ..."
            )
            started = time.perf_counter()
            records = race(
                ctx.storage.connection_string,
                container,
                workers=workers,
                keys=keys,
                rounds=rounds,
                body_bytes=kib * 1024,
                mode=mode,
                order=order,
            )
            result = analyse(records, workers, keys, rounds)
            result.update(body_kib=kib, order=order, seconds=round(time.perf_counter() - started, 2))
            report["runs"].append(result)
    finally:
        try:
            blobs.delete_container(container)
        except Exception:
            pass
    return report


def print_report(r: dict) -> None:
    print(f"\n## 6. Contention lab ({r['mode']} workers; {r['note']})")
    for x in r["runs"]:
        m = x["workers"] - 1
        print(
            f"{x['workers']} workers x {x['keys']} keys x {x['rounds']} rounds, {x['body_kib']} KiB bodies, key order "
            f"{x['order']}, "
            f"{x['seconds']} s: winners {x['winners_total']} (= keys x rounds {x['keys'] * x['rounds']}), "
            f"losers {x['losers_total']} (= (n-1) x keys x rounds {m * x['keys'] * x['rounds']}), "
            f"errors {x['errors']}, keys without exactly one winner {x['keys_without_exactly_one_winner']}"
        )
        print(
            f"  p (an attempt overlapped the winner's in-flight put) = {x['p_overlap']}; conflicts per key per round: "
            f"mean {x['conflicts_mean']} (model {m * x['p_overlap']:.3f}), variance {x['conflicts_var']} "
            f"(Binomial({m}, p) {x['binomial_var']}), dispersion x{x['dispersion_index']}, TV distance {x['tv_distance']}"
        )
        f0 = x["first_key"]
        rows = [
            [k, x["observed"][k], f"{x['expected'][k]:.1f}", f0["observed"][k], f"{f0['expected'][k]:.1f}"]
            for k in range(m + 1)
        ]
        print(
            table(
                rows,
                [
                    "conflicts C",
                    "observed, all key-rounds",
                    f"Binomial({m}, {x['p_overlap']})",
                    "observed, key 0 only",
                    f"Binomial({m}, {f0['p_overlap']})",
                ],
            )
        )
        print(f"  key 0 only: p = {f0['p_overlap']}, dispersion x{f0['dispersion_index']}")
        print(
            f"  p by the loser's position in its round: {x['p_by_key_position']}; median put latency: winner "
            f"{x['winner_latency_ms']} ms, loser (409 + HEAD for the sha256) {x['loser_latency_ms']} ms; "
            f"late losers were sent {x['late_losers_sent_after_answer_ms']} ms after the winner's answer (median)"
        )


def chart(r: dict, path: Path) -> Path:
    """Per configuration: observed conflicts vs Binomial(n - 1, p) (top), p by position in the round (bottom)."""
    plt = pyplot()
    runs = r["runs"]
    fig, axes = plt.subplots(2, len(runs), figsize=(max(7.0, 5.2 * len(runs)), 7.4), squeeze=False)
    for col, x in enumerate(runs):
        ax = axes[0][col]
        m = x["workers"] - 1
        ks = list(range(m + 1))
        ax.bar([k - 0.2 for k in ks], x["observed"], 0.4, label="observed")
        ax.bar([k + 0.2 for k in ks], x["expected"], 0.4, label=f"Binomial({m}, p={x['p_overlap']:.3f})")
        ax.set_xlabel("conflicts per key per round\n(losers whose put overlapped the winner's)", fontsize=8)
        ax.set_ylabel(f"key-rounds (of {x['keys'] * x['rounds']})", fontsize=8)
        ax.set_xticks(ks)
        ax.set_title(
            f"{x['workers']} {r['mode']} workers, {x['body_kib']} KiB, key order {x['order']}\n"
            f"dispersion x{x['dispersion_index']}, TV distance {x['tv_distance']}",
            fontsize=9,
        )
        ax.legend(fontsize=8)
        ax = axes[1][col]
        positions = list(range(len(x["p_by_key_position"])))
        ax.bar(positions, [v or 0 for v in x["p_by_key_position"]], 0.6, color="tab:green", label="measured")
        ax.axhline(x["p_overlap"], color="tab:orange", linestyle="--", label=f"pooled p = {x['p_overlap']:.3f} (model)")
        ax.set_xlabel("loser's position in its round (0 = first key after the barrier)", fontsize=8)
        ax.set_ylabel("P(loser overlapped the winner)", fontsize=8)
        ax.set_ylim(0, 1)
        ax.set_xticks(positions)
        ax.legend(fontsize=8)
    fig.suptitle(f"commit_blob contention vs the independent-attempt model\n({MACHINE_NOTE})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
