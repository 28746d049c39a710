"""Azure's answers under load, seeded, on every kind of request a job makes: no lost job, no stuck
job, no wrong pixel, no wrong outcome.

A fault proxy (testkit/storage_proxy.py) stands in front of the app's storage (its tiles and
output containers and its manifest table; not the upload being sent, not the local host's own
store, which is the Durable extension's). Exactly 1 in K requests of one REST operation (from a
seeded offset) gets an answer Azure gives under load, drawn from the same seed: 503 ServerBusy,
500 OperationTimedOut before the operation or after it was carried out, a reset connection before
storage saw the request or after it carried it out (the answer lost), 500 CannotVerifyCopySource
to a Put Block From URL, a GET's answer cut half-way. In the episode runs, every request of an
operation gets one such answer for longer than the SDK's own retries last, as a throttled account
does for seconds to minutes.

Each job must complete (its inputs are all valid, so no failure is right), within the bound; then:
- every tile is decoded and compared with its window of the source, and the mosaic with the
  whole source (no wrong pixel);
- for each gate, the writes the app counted as ``written`` are exactly the objects storage holds
  for the job, and storage created each of them once (no write that landed reported refused).

``TILECOMMIT_STORAGE_FAULT_JOBS`` sets the jobs per operation and rate (the suite runs one rate
with all operations at once, and one episode; docs/faults.md has the long run's figures, made
with both cores busy).
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from devhost.session import process_file
from testkit import storage_ops as ops
from testkit.storage_proxy import (
    BUSY,
    CANNOT_VERIFY,
    CUT,
    RESET_AFTER,
    RESET_BEFORE,
    TIMEOUT_AFTER,
    TIMEOUT_BEFORE,
    Episode,
    FaultPlan,
)
from tilecommit.manifest import count_manifest

from .app_jobs import check_outputs, local_host
from .conftest import counter_total
from .fault_jobs import app_behind_proxy, app_storage
from .test_seeded_read_faults import scenes, wrong_tiles

pytestmark = pytest.mark.slow

#: The operations a job sends to its own storage, each broken in turn in the long run.
JOB_WRITES = (ops.PUT_BLOB, ops.PUT_BLOCK, ops.PUT_BLOCK_FROM_URL, ops.PUT_BLOCK_LIST, ops.INSERT_ENTITY)
JOB_READS = (ops.GET_BLOB, ops.GET_BLOB_PROPERTIES, ops.QUERY_ENTITIES)
#: Every answer Azure gives under load; each request draws one that fits it (a cut only for a
#: GET, CannotVerifyCopySource only for a Put Block From URL).
ANSWERS = (BUSY, TIMEOUT_BEFORE, TIMEOUT_AFTER, RESET_BEFORE, RESET_AFTER, CANNOT_VERIFY, CUT)
RATES = (3, 10, 50)
JOBS = int(os.environ.get("TILECOMMIT_STORAGE_FAULT_JOBS", "0"))
CONCURRENT_JOBS = 3
#: An episode's length: longer than the SDK's own retries (about 20 s of sleeps for a blob
#: request), shorter than the orchestrator's patience (135 s of durable timers).
EPISODE_S = 40.0
#: Every job ends within this (a stuck job fails the run): six attempts of the slowest activity
#: with the retry policy's waits, far above what any job here takes.
JOB_BOUND_S = 600
#: The gates a job writes through, and what storage holds of each for a job of ``windows`` windows.
GATES = {"tile": "windows", "manifest": "windows", "mosaic": 1, "stac": 1, "quicklook": 1}


def app_data(app_env):
    """The proxy's selector: the app's tiles and outputs and its manifest table, never the upload."""
    app = app_storage(app_env)

    def applies(method: str, path: str) -> bool:
        segments = path.split("?", 1)[0].split("/")
        return app(method, path) and not (len(segments) > 2 and segments[2] == app_env.input)

    return applies


def created_twice(proxy, job_id: str) -> list[str]:
    """Paths of the job's blobs that storage created more than once (a 201 to a create)."""
    created = Counter(
        path.split("?", 1)[0]
        for method, path, status in proxy.carried_out
        if method == "PUT" and status == 201 and job_id in path and "comp=block&" not in path
    )
    return [path for path, n in created.items() if n > 1]


def outcome_errors(storage, app_env, job_id: str, windows: int, blobs) -> list[str]:
    """Where the outcomes the app counted differ from what storage holds for the job."""
    errors = []
    for gate, held in GATES.items():
        stored = windows if held == "windows" else held
        written = counter_total("ConditionalWrites", gate=gate, outcome="written", job_id=job_id)
        if written != stored:
            errors.append(f"{gate}: {written} counted written, {stored} stored")
    rows = count_manifest(storage.table_service().get_table_client(app_env.manifest), job_id).rows
    if rows != windows:
        errors.append(f"manifest rows: {rows}, windows {windows}")
    errors += [f"created twice: {path}" for path in created_twice(blobs, job_id)]
    return errors


def run_jobs(storage, app_env, azurite, monkeypatch, tmp_path, plan: FaultPlan, count: int, label: str, **host):
    """``count`` jobs under ``plan``, three at once: the figures, every check made."""
    figures: Counter = Counter()
    started = time.perf_counter()
    safe = re.sub(r"[^a-z0-9]+", "-", label.lower())
    with app_behind_proxy(azurite, monkeypatch, plan) as (blobs, tables), local_host(app_env, **host) as h:
        paths = scenes(tmp_path / safe, count)

        def one(path):
            began = time.perf_counter()
            return process_file(h, path, name=f"{safe}/{path.name}", timeout=JOB_BOUND_S), time.perf_counter() - began

        with ThreadPoolExecutor(CONCURRENT_JOBS) as pool:
            results = list(pool.map(one, paths))
        for path, (summary, took) in zip(paths, results, strict=True):
            figures["jobs"] += 1
            figures["slowest_job_s"] = max(figures["slowest_job_s"], round(took))
            assert summary["status"] == "completed", f"{label}: a lost job: {summary}"
            check_outputs(storage, app_env, summary, path)
            checked, wrong = wrong_tiles(storage, app_env, summary["job_id"], path)
            figures["tiles_checked"] += checked
            assert wrong == [], f"{label}: job {summary['job_id']}: tiles differ from the source: {wrong}"
            errors = outcome_errors(storage, app_env, summary["job_id"], summary["windows"], blobs)
            assert errors == [], f"{label}: job {summary['job_id']}: wrong outcomes: {errors}"
    for proxy in (blobs, tables):
        for (operation, answer), n in proxy.injected_by_operation.items():
            figures[f"{operation}: {answer}"] += n
    figures["injected"] = sum(blobs.injected.values()) + sum(tables.injected.values())
    figures["wall_s"] = round(time.perf_counter() - started, 1)
    print(f"\n{label}: {dict(figures)}")
    return figures


def run_episode(storage, app_env, azurite, monkeypatch, tmp_path, operation: str, answer: str, *, jobs: int = 1):
    """For :data:`EPISODE_S` from its first request, every request of ``operation`` is answered
    ``answer``; durable timers at their real length, so the orchestrator's patience is the real one."""
    plan = FaultPlan(episodes=[Episode(frozenset({operation}), answer, EPISODE_S)], applies=app_data(app_env))
    label = f"episode {operation} {answer}"
    figures = run_jobs(storage, app_env, azurite, monkeypatch, tmp_path, plan, jobs, label, timer_scale=1.0)
    assert figures[f"{operation}: {answer}"] >= 4, figures
    return figures


def test_one_in_three_of_every_request_a_job_sends_answered_as_azure_does_under_load(
    storage, app_env, azurite, monkeypatch, tmp_path
):
    """The suite's run: every operation at once, 1 in 3 of each broken, three jobs."""
    plan = FaultPlan(
        every=3, answers=ANSWERS, operations=frozenset(JOB_WRITES + JOB_READS), applies=app_data(app_env), seed=5
    )
    figures = run_jobs(storage, app_env, azurite, monkeypatch, tmp_path, plan, 3, "each operation 1 in 3")
    assert figures["jobs"] == 3 and figures["injected"] >= 20
    for operation in JOB_WRITES:  # every kind of write was broken at least once
        assert any(key.startswith(f"{operation}: ") for key in figures), (operation, figures)


if JOBS:  # the long run (TILECOMMIT_STORAGE_FAULT_JOBS=N): each operation alone, at each rate

    @pytest.mark.parametrize("k", RATES)
    @pytest.mark.parametrize("operation", JOB_WRITES + JOB_READS)
    def test_long_run_one_operation_at_a_time(storage, app_env, azurite, monkeypatch, tmp_path, operation, k):
        plan = FaultPlan(
            every=k, answers=ANSWERS, operations=frozenset({operation}), applies=app_data(app_env), seed=k * 7 + 1
        )
        figures = run_jobs(storage, app_env, azurite, monkeypatch, tmp_path, plan, JOBS, f"{operation} 1 in {k}")
        assert figures["jobs"] == JOBS

    @pytest.mark.parametrize("answer", [BUSY, TIMEOUT_BEFORE, TIMEOUT_AFTER, RESET_AFTER])
    @pytest.mark.parametrize("operation", JOB_WRITES)
    def test_long_run_episodes(storage, app_env, azurite, monkeypatch, tmp_path, operation, answer):
        run_episode(storage, app_env, azurite, monkeypatch, tmp_path, operation, answer, jobs=JOBS)
