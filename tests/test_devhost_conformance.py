"""The local host behaves as the Durable extension and the Durable Task Framework do.

Each test names the behaviour; docs/local-host.md cites the real host's source for it.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest

from devhost.durable import watchdog
from devhost.durable.history import EXECUTION_STARTED, TASK_SCHEDULED, TIMER_CREATED, InstanceAlreadyExists, parse_iso
from devhost.durable.work import TIMEOUT_GRACE_S, worker_thread_count
from testkit.metrics import max_overlap, slot_use
from testkit.storage_proxy import FaultPlan, FaultProxy
from tests.apps import toy_app
from tests.test_devhost_engine import hub_store, make_engine
from tilecommit.storage import StorageConnection

NAP = 0.4


@pytest.fixture
def store(storage, request):
    return hub_store(storage, request)


def executions(engine, name):
    return sorted((e for e in engine.executions if e.name == name), key=lambda e: e.started)


def test_a_sliding_task_any_window_runs_one_new_child_at_a_time_on_the_real_shim(store):
    """12 naps, a window of 4: the shim awaits each top-level WhenAny before invoking the next, so
    after the first wave the naps run one after another (about 9 naps long, not 3)."""
    with make_engine(store, max_activities=4, timer_scale=1.0) as engine:
        started = time.monotonic()
        engine.start_new("sliding_window", "slide", {"count": 12, "window": 4, "seconds": NAP})
        state = engine.wait_for("slide", timeout=60)
        elapsed = time.monotonic() - started
        naps = executions(engine, "nap")
    assert state["status"] == "Completed" and state["output"] == 12
    assert max_overlap(naps[:4]) == 4
    assert max_overlap(naps[4:]) == 1  # never two of the later naps at once
    assert elapsed > 8 * NAP  # first wave + 8 in a row = 9 naps; parallel would be 3


def test_children_started_in_one_compound_action_keep_every_slot_busy(store):
    with make_engine(store, max_activities=4, timer_scale=1.0) as engine:
        started = time.monotonic()
        engine.start_new("all_at_once", "burst", {"count": 12, "seconds": NAP})
        state = engine.wait_for("burst", timeout=60)
        elapsed = time.monotonic() - started
        naps = executions(engine, "nap")
    assert state["status"] == "Completed" and state["custom_status"] == {"done": 12}
    assert max_overlap(naps) == 4
    assert slot_use(naps, 4) > 0.9
    assert elapsed < 6 * NAP  # 3 naps long, with room for a slow machine


def test_activities_run_on_the_worker_s_thread_pool_a_thread_running_one_after_another(store):
    """The Python worker runs synchronous functions on one ThreadPoolExecutor for its life (no
    limit of its own on Python 3.9+, so min(32, cpus + 4) threads): threads are reused, so an
    activity finds the thread-local state (GDAL's PROJ context) of the ones before it."""
    with make_engine(store, max_activities=4, timer_scale=1.0) as engine:
        engine.start_new("all_at_once", "pooled", {"count": 24, "seconds": 0.05})
        state = engine.wait_for("pooled", timeout=60)
        naps = executions(engine, "nap")
    threads = {n.thread for n in naps}
    assert state["status"] == "Completed" and len(naps) == 24
    assert all(t.startswith("devhost-worker1-") for t in threads), threads
    assert 4 <= len(threads) <= worker_thread_count() < 24


def test_retry_delays_grow_by_the_backoff_coefficient_up_to_the_max_interval(store):
    toy_app.set_failures("backoff", 3)
    job = {"key": "backoff", "first_ms": 200, "attempts": 4, "backoff": 2.0, "max_ms": 300}
    with make_engine(store, timer_scale=1.0) as engine:
        engine.start_new("backoff_retry", "retry-1", job)
        state = engine.wait_for("retry-1", timeout=60)
    assert state["status"] == "Completed" and state["output"] is True
    timers = [e for ep in store.episodes("retry-1") for e in ep.events if e["EventType"] == TIMER_CREATED]
    delays = [round((parse_iso(t["FireAt"]) - parse_iso(t["Timestamp"])).total_seconds(), 3) for t in timers]
    assert delays == [0.2, 0.3, 0.3]  # 200 ms, 400 ms capped at 300, 800 ms capped at 300


def test_after_the_last_attempt_the_timer_is_due_at_once_and_the_failure_has_the_hosts_wording(store):
    toy_app.set_failures("always-2", 99)
    with make_engine(store, timer_scale=1.0) as engine:
        engine.start_new("retry_then_fail", "retry-2", {"key": "always-2"})
        state = engine.wait_for("retry-2", timeout=60)
    events = [e for ep in store.episodes("retry-2") for e in ep.events]
    timers = [e for e in events if e["EventType"] == TIMER_CREATED]
    delays = [(parse_iso(t["FireAt"]) - parse_iso(t["Timestamp"])).total_seconds() for t in timers]
    assert delays == [1.0, 1.0, 0.0]  # RETRY: 1 s, 3 attempts; then DTFx's immediate timer
    failures = [e for e in events if e["EventType"] == 6]
    assert failures[0]["Reason"] == "Activity function 'flaky' failed: RuntimeError: transient fault, 99 left"
    assert state["status"] == "Failed"
    assert state["error"].startswith("Orchestrator function 'retry_then_fail' failed: Activity function 'flaky' failed")


def test_custom_status_limit_is_16_kb_of_utf16(store):
    with make_engine(store) as engine:
        engine.start_new("big_status", "status-ok", {"chars": 8000})  # 16,004 bytes of UTF-16: 15 KB
        fits = engine.wait_for("status-ok", timeout=60)
        engine.start_new("big_status", "status-big", {"chars": 9000})  # 18,004 bytes: 17 KB (UTF-8: 9 KB)
        too_big = engine.wait_for("status-big", timeout=60)
    assert fits["status"] == "Completed" and len(fits["custom_status"]) == 8000
    assert too_big["status"] == "Failed"
    assert "UTF-16 size of the JSON-serialized payload must not exceed 16 KB" in too_big["error"]


def test_concurrent_starts_of_a_new_id_all_succeed_or_see_it_and_it_runs_once(store):
    outcomes: list[str] = []
    barrier = threading.Barrier(3)
    with make_engine(store) as engine:

        def start() -> None:
            barrier.wait()
            try:
                engine.start_new("batch", "raced", {"numbers": list(range(10))})
                outcomes.append("started")
            except InstanceAlreadyExists:
                outcomes.append("already exists")

        threads = [threading.Thread(target=start) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        state = engine.wait_for("raced", timeout=60)
        dropped = engine.stats.duplicate_starts_dropped
        squares = len(executions(engine, "square"))
    assert state["status"] == "Completed" and state["output"] == sum(n * n for n in range(10))
    assert "started" in outcomes and len(outcomes) == 3
    assert dropped == outcomes.count("started") - 1  # every later ExecutionStarted was dropped
    started_events = [e for ep in store.episodes("raced") for e in ep.events if e["EventType"] == EXECUTION_STARTED]
    assert len(started_events) == 1 and squares == 10


def test_an_old_childs_completion_is_dropped_by_the_rerun_parent(store):
    """The first run fails while its child naps; the re-run (same id) gets a new ExecutionId, so
    the old child's completion, for the same task id, never reaches it."""
    toy_app.set_failures("parent-fails", 1)
    with make_engine(store, timer_scale=1.0) as engine:
        engine.start_new(
            "parent_of_slow_child",
            "rerun",
            {"seconds": 1.0, "run": 1, "child": "a", "fail": True, "key": "parent-fails"},
        )
        first = engine.wait_for("rerun", timeout=60)
        engine.start_new(
            "parent_of_slow_child", "rerun", {"seconds": 2.0, "run": 2, "child": "b", "fail": False, "key": "none"}
        )
        second = engine.wait_for("rerun", timeout=60)
        dropped = engine.stats.execution_id_mismatches_dropped
    assert first["status"] == "Failed"
    assert second["status"] == "Completed" and second["output"] == 2
    assert dropped == 1


def test_a_child_start_meeting_its_id_running_for_another_parent_is_dropped_and_never_sent_again(store, monkeypatch):
    """The first run fails while its child naps; started again, the parent starts a child of the
    same id while that one still runs. DTFx drops the start ("Duplicate start event"), and the
    running child reports to the first execution only (ExecutionId mismatch): the new parent's
    task never completes, on the real host as here. Nothing sends that start again, not even the
    local host's watchdog once the old child has finished (its 2 minutes shortened to 0.3 s):
    it used to, and so finished a job the real host leaves waiting forever."""
    monkeypatch.setattr(watchdog, "QUIET_CHILD_S", 0.3)
    toy_app.set_failures("parent-fails-first", 1)
    first = {"seconds": 2.0, "run": 1, "child": "a", "fail": True, "key": "parent-fails-first"}
    with make_engine(store, timer_scale=1.0, watchdog_interval=0.1) as engine:
        engine.start_new("parent_of_slow_child", "same-child", first)
        failed = engine.wait_for("same-child", timeout=60)
        engine.start_new(
            "parent_of_slow_child", "same-child", {**first, "seconds": 0.1, "run": 2, "fail": False, "key": "none"}
        )
        old_child = engine.wait_for("same-child-child-a", timeout=60)
        with pytest.raises(TimeoutError):
            engine.wait_for("same-child", timeout=2.0)  # some 20 watchdog rounds after the old child ended
        waiting = engine.status("same-child")
        stats = engine.stats
        engine.terminate("same-child", "the test is over")
        engine.wait_for("same-child", timeout=30)
    assert failed["status"] == "Failed" and old_child["status"] == "Completed" and old_child["output"] == 1
    assert old_child["parent"]["execution_id"] == failed["execution_id"] != waiting["execution_id"]
    assert waiting["status"] == "Running"
    assert stats.duplicate_starts_dropped == stats.foreign_child_starts_dropped == 1
    assert stats.execution_id_mismatches_dropped >= 1  # the old child's report, for the first execution


def test_a_failed_instance_started_again_reruns_its_recorded_children_and_completes(store):
    toy_app.set_failures("fan-rerun", 3)  # the retried activity fails all 3 attempts: the job fails
    job = {"count": 12, "batch": 4, "flaky_key": "fan-rerun"}
    with make_engine(store) as engine:
        engine.start_new("fan", "again", job)
        failed = engine.wait_for("again", timeout=60)
        children = {s["id"]: s["status"] for s in store.instances() if s["id"].startswith("again-b")}
        engine.start_new("fan", "again", job)
        state = engine.wait_for("again", timeout=60)
    assert failed["status"] == "Failed" and children == {f"again-b{i:03d}": "Completed" for i in range(3)}
    assert state["status"] == "Completed" and state["output"] == {"total": sum(n * n for n in range(12)), "flaky": True}
    assert len(executions(engine, "square")) == 24  # every child ran again for the new execution


def test_an_activity_past_the_function_timeout_fails_and_is_retried(store):
    toy_app.set_failures("slow-key", 1)
    job = {"key": "slow-key", "seconds": 2.0, "first_ms": 100, "attempts": 2}
    with make_engine(store, timer_scale=1.0, function_timeout=1.0) as engine:
        engine.start_new("times_out_once", "timeout", job)
        state = engine.wait_for("timeout", timeout=60)
        assert engine.activities.drain(timeout=30)
        stats = engine.stats
    assert state["status"] == "Completed" and state["output"] == {"key": "slow-key", "slow": False}
    assert stats.activity_timeouts == 1
    # It ended 1 s after its timeout, inside the host's 2 s grace: no restart, and its late
    # result is dropped as a duplicate completion.
    assert stats.worker_restarts == 0 and stats.duplicate_completions_dropped == 1
    failures = [e for ep in store.episodes("timeout") for e in ep.events if e["EventType"] == 6]
    assert [f["Reason"] for f in failures] == [
        "Activity function 'slow_first_time' failed: Timeout value of 00:00:01 was exceeded by function: "
        "Functions.slow_first_time"
    ]


def test_a_function_still_running_after_the_grace_period_restarts_its_worker_and_its_neighbours_fail(store):
    """The host restarts the worker 2 s after the timeout; executions running there never report,
    keep their slots and fail at their own timeouts; every failed task is retried and the job
    completes."""
    toy_app.set_failures("stuck", 1)
    job = {"key": "stuck", "stuck_s": 8.0, "naps": 60, "nap_s": 0.5, "first_ms": 100, "attempts": 3}
    with make_engine(store, max_activities=4, timer_scale=1.0, function_timeout=3.0) as engine:
        engine.start_new("busy_worker_times_out", "restart", job)
        state = engine.wait_for("restart", timeout=120)
        assert engine.activities.drain(timeout=30)
        stats, worker = engine.stats, engine.activities.worker
        naps = executions(engine, "nap")
    assert state["status"] == "Completed", state
    assert state["output"] == {"stuck": {"key": "stuck", "slow": False}, "naps": 60}
    assert stats.worker_restarts == 1 and worker.number == 2
    failures = [e for ep in store.episodes("restart") for e in ep.events if e["EventType"] == 6]
    reasons = sorted({f["Reason"] for f in failures})
    assert reasons == [
        "Activity function 'nap' failed: Timeout value of 00:00:03 was exceeded by function: Functions.nap",
        "Activity function 'slow_first_time' failed: Timeout value of 00:00:03 was exceeded by function: "
        "Functions.slow_first_time",
    ]
    lost = [n for n in naps if n.started < worker.started < n.started + n.seconds]
    assert lost, "no nap was running in the worker when it restarted"
    # The restarted worker is a new process: its functions run on threads of a new pool.
    assert {n.thread.rsplit("-", 1)[0] for n in lost} == {"devhost-worker1"}
    assert {n.thread.rsplit("-", 1)[0] for n in naps if n.started > worker.started} == {"devhost-worker2"}
    # The stuck function's result and those of the naps in the old worker never reached the host.
    assert stats.results_lost_with_worker == len(lost) + 1
    assert stats.activity_timeouts == len(lost) + 1 == len(failures)
    # Their slots stayed taken until their own timeouts: no nap started in the meantime.
    freed = min(n.started for n in lost) + 3.0
    assert not [n for n in naps if worker.started < n.started < freed - 0.1]


def test_a_function_that_has_not_ended_after_the_grace_period_is_reported_at_error_and_left_running(store, caplog):
    """A function stuck in native code never ends: the real host kills the worker process running
    it (row 25). A thread cannot be killed, so the in-process host reports it at ERROR, counts it
    and lists it among the functions left running; the task itself was failed at its timeout and
    retried, and the job completes. (``python -m devhost serve`` recycles its process instead:
    test_host_limits.py.)"""
    caplog.set_level(logging.ERROR, logger="devhost.durable.work")
    toy_app.set_failures("stuck-in-native-code", 1)
    job = {"key": "stuck-in-native-code", "first_ms": 100, "attempts": 2}
    try:
        with make_engine(store, timer_scale=1.0, function_timeout=1.0) as engine:
            engine.start_new("stuck_once", "stuck", job)
            state = engine.wait_for("stuck", timeout=60)
            deadline = time.monotonic() + 30
            while engine.stats.stuck_functions == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            left = [(run.name, run.instance_id) for run in engine.activities.left_running()]
            stats = engine.stats
    finally:
        toy_app.release("stuck-in-native-code")
    assert state["status"] == "Completed" and state["output"] == {"key": "stuck-in-native-code", "stuck": False}
    assert stats.activity_timeouts == stats.worker_restarts == stats.stuck_functions == 1
    assert left == [("stuck_first_time", "stuck")]
    errors = [r for r in caplog.records if r.name == "devhost.durable.work" and r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "stuck_first_time (stuck #" in errors[0].getMessage() and "has not ended" in errors[0].getMessage()


def test_task_hub_names_are_the_local_hosts_own(store):
    real_provider = {f"{store.hub}History", f"{store.hub}Instances"}
    assert store.table.table_name not in real_provider and store.table.table_name.startswith("DevHost")
    assert store.large.container_name != f"{store.hub.lower()}-largemessages"


def test_continue_as_new_goes_on_as_a_new_execution_with_its_input_and_its_own_history(storage, request):
    """Row 48: each execution of ``countdown`` ends ContinuedAsNew and the next starts with its input."""
    store = hub_store(storage, request)
    with make_engine(store) as engine:
        engine.start_new("countdown", "cd-1", {"left": 4, "done": []})
        first = engine.status("cd-1")["execution_id"]
        state = engine.wait_for("cd-1", timeout=60)
    assert state["status"] == "Completed" and state["output"] == {"done": [16, 9, 4, 1]}
    assert json.loads(state["input"]) == {"left": 0, "done": [16, 9, 4, 1]}
    assert state["execution_id"] != first
    # Only the last execution's history is kept: it scheduled nothing.
    events = [e for episode in store.episodes("cd-1") for e in episode.events]
    assert [e["EventType"] for e in events if e["EventType"] == EXECUTION_STARTED] == [EXECUTION_STARTED]
    assert not [e for e in events if e["EventType"] == TASK_SCHEDULED]


def test_a_finished_instance_started_again_never_goes_missing_from_its_status(azurite, request):
    """DTFx overwrites a finished instance's Instances row (InsertOrMerge) and its old history
    gradually; it never deletes the row, so a status read while the instance is started again
    finds the old execution or the new one, never nothing. The client's write of the new row is
    held 1 s and the host's listing of the old execution's large messages 2 s, so the host takes
    the start up between the client's message and its write, the moment a status read fell into
    a gap (a 404 from the backfill API)."""
    held_write = FaultPlan(delay=1.0, applies=lambda method, path: method == "PUT" and "state" in path)
    held_listing = FaultPlan(delay=2.0, applies=lambda method, path: method == "GET" and "comp=list" in path)
    with (
        FaultProxy(f"http://127.0.0.1:{azurite.blob_port}", held_listing) as blobs,
        FaultProxy(f"http://127.0.0.1:{azurite.table_port}", held_write) as tables,
    ):
        proxied = StorageConnection.from_connection_string(
            azurite.connection_string.replace(f":{azurite.blob_port}/", f":{blobs.port}/").replace(
                f":{azurite.table_port}/", f":{tables.port}/"
            )
        )
        store = hub_store(proxied, request)
        seen: list[str | None] = []
        with make_engine(store) as engine:
            engine.start_new("batch", "again", {"numbers": [2]})
            first = engine.wait_for("again", timeout=60)
            stop = threading.Event()

            def watch() -> None:
                while not stop.is_set():
                    state = engine.status("again")
                    seen.append(state["status"] if state else None)
                    time.sleep(0.002)

            watcher = threading.Thread(target=watch)
            watcher.start()
            try:
                engine.start_new("batch", "again", {"numbers": [3]})
                second = engine.wait_for("again", timeout=60)
            finally:
                stop.set()
                watcher.join()
    assert first["output"] == 4 and second["output"] == 9 and second["execution_id"] != first["execution_id"]
    assert seen and None not in seen, f"{seen.count(None)} of {len(seen)} status reads found no instance"
    # The first execution's end, then the second's start: the reads saw both, and nothing else.
    assert set(seen) <= {"Completed", "Pending", "Running"} and {"Pending", "Running"} & set(seen), set(seen)


def test_a_host_stopped_while_a_function_is_stuck_stops_once_its_worker_is_restarted(store):
    """Stopping waits for the functions running in the current worker. One stuck in native code
    never ends: the host restarts its worker 2 s after its timeout (row 25), and the stop goes on
    then, instead of waiting for a thread that will not end."""
    toy_app.set_failures("stuck-at-stop", 1)
    job = {"key": "stuck-at-stop", "first_ms": 100, "attempts": 2}
    try:
        engine = make_engine(store, timer_scale=1.0, function_timeout=1.0).start()
        engine.start_new("stuck_once", "stuck-at-stop", job)
        assert toy_app.stuck_now("stuck-at-stop").wait(timeout=30), "the stuck function never started"
        stopping = threading.Thread(target=engine.stop, daemon=True)
        started = time.monotonic()
        stopping.start()
        stopping.join(timeout=30)
        stopped_after = time.monotonic() - started
        stats = engine.stats
    finally:
        toy_app.release("stuck-at-stop")
    assert not stopping.is_alive(), "the host's stop waited for a function its restarted worker left running"
    assert stats.worker_restarts == stats.stuck_functions == 1
    assert stopped_after < 1.0 + TIMEOUT_GRACE_S + 10, stopped_after
