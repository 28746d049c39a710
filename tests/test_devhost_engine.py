"""The local host's replay driver on a small app, with state in Azurite."""

from __future__ import annotations

import logging
import time

import pytest

from devhost.durable.engine import Engine
from devhost.durable.functions import FunctionIndex
from devhost.durable.history import InstanceAlreadyExists, InvalidInstanceId
from devhost.durable.instance import Instance, new_execution_id
from devhost.durable.messaging import start_body
from devhost.durable.partitions import LeaseTimings
from devhost.durable.queues import queue_service
from devhost.durable.store import HistoryStore
from devhost.durable.work import StartMessage
from tests.apps import toy_app


def hub_store(storage, request) -> HistoryStore:
    """A task hub of this test's own."""
    hub = "T" + format(abs(hash(request.node.nodeid)) % 10**10, "010d")
    store = HistoryStore(storage.blob_service(), storage.table_service(), hub, queue_service(storage))
    store.ensure()
    return store


@pytest.fixture
def store(storage, request):
    return hub_store(storage, request)


def make_engine(store, **options) -> Engine:
    options.setdefault("timer_scale", 0.01)
    return Engine(FunctionIndex.from_app(toy_app.app), store, **options)


def test_fan_out_with_sub_orchestrations_task_any_and_retry(store):
    toy_app.set_failures("fan-1", 2)
    with make_engine(store, max_activities=4) as engine:
        engine.start_new("fan", "job-1", {"count": 50, "batch": 8, "flaky_key": "fan-1"})
        state = engine.wait_for("job-1", timeout=60)
    assert state["status"] == "Completed", state
    assert state["output"] == {"total": sum(n * n for n in range(50)), "flaky": True}
    assert state["custom_status"] == {"batches_done": 7, "batches_total": 7}
    flaky_runs = [e for e in engine.executions if e.name == "flaky"]
    assert [e.error is not None for e in flaky_runs] == [True, True, False]
    children = [s for s in store.instances() if s["id"].startswith("job-1-b")]
    assert len(children) == 7 and all(c["status"] == "Completed" for c in children)


def test_retries_exhausted_fail_the_orchestration_after_the_last_timer(store):
    toy_app.set_failures("always", 99)
    with make_engine(store) as engine:
        engine.start_new("retry_then_fail", "job-2", {"key": "always"})
        state = engine.wait_for("job-2", timeout=60)
    assert state["status"] == "Failed"
    assert "transient fault" in state["error"]
    assert len([e for e in engine.executions if e.name == "flaky"]) == 3


def test_every_activity_twice_still_one_result_each(store):
    with make_engine(store, duplicate_activities=True) as engine:
        engine.start_new("batch", "job-3", {"numbers": list(range(20))})
        state = engine.wait_for("job-3", timeout=60)
        # Wait for the second copies too, then count.
        engine.activities.drain()
    assert state["status"] == "Completed" and state["output"] == sum(n * n for n in range(20))
    assert len([e for e in engine.executions if e.name == "square"]) == 40
    assert engine.stats.duplicate_completions_dropped == 20


def test_instance_id_rules(store):
    with make_engine(store) as engine:
        for bad in ("a/b", "a#b", "a?b", "a\\b", "@a", "x" * 257, ""):
            with pytest.raises(InvalidInstanceId):
                engine.start_new("batch", bad, {"numbers": []})


def test_running_instance_cannot_be_started_again_but_finished_one_is_rerun(store):
    toy_app.set_failures("slow", 0)
    with make_engine(store) as engine:
        engine.start_new("batch", "job-4", {"numbers": list(range(200))})
        with pytest.raises(InstanceAlreadyExists):
            engine.start_new("batch", "job-4", {"numbers": [1]})
        assert engine.wait_for("job-4", timeout=60)["status"] == "Completed"
        engine.start_new("batch", "job-4", {"numbers": [3]})
        state = engine.wait_for("job-4", timeout=60)
    assert state["status"] == "Completed" and state["output"] == 9


def test_replay_is_checked_by_kind_and_name_as_the_real_host_does_and_strictly_on_request(store):
    with make_engine(store) as engine:
        engine.start_new("changes_its_mind", "job-5a", {})
        renamed = engine.wait_for("job-5a", timeout=60)
        # Inputs that depend on the clock are not compared by DurableTask.Core: it completes.
        engine.start_new("uses_clock", "job-5b", {})
        clocked = engine.wait_for("job-5b", timeout=60)
    assert renamed["status"] == "Failed"
    assert renamed["error"].startswith("Orchestrator function 'changes_its_mind' failed: Non-Deterministic workflow")
    assert clocked["status"] == "Completed"
    with make_engine(store, strict_determinism=True) as engine:
        engine.start_new("uses_clock", "job-5c", {})
        strict = engine.wait_for("job-5c", timeout=60)
    assert strict["status"] == "Failed" and "Non-Deterministic" in strict["error"]


def test_history_survives_a_new_engine(store):
    """A second engine on the same task hub sees the finished instance and its history."""
    with make_engine(store) as engine:
        engine.start_new("batch", "job-6", {"numbers": [2, 3]})
        engine.wait_for("job-6", timeout=60)
    with make_engine(store) as engine:
        assert engine.status("job-6")["output"] == 13
    events = [e for ep in store.episodes("job-6") for e in ep.events]
    kinds = [e["EventType"] for e in events]
    assert kinds[:2] == [12, 0] and kinds.count(4) == 2 and kinds.count(5) == 2 and kinds[-1] == 13


def test_the_real_durable_client_talks_to_the_local_http_api(store):
    """start_new / get_status through azure-functions-durable's client over the local HTTP API."""
    import azure.durable_functions as df

    from devhost.durable.functions import EventLoopThread
    from devhost.durable.rpc import DurableHttpApi

    with make_engine(store) as engine:
        api = DurableHttpApi(engine, store.hub).start()
        try:
            client = df.DurableOrchestrationClient(api.client_binding())
            loop = EventLoopThread.shared()
            missing = loop.run(client.get_status("nobody"))
            assert missing.runtime_status is None
            assert loop.run(client.start_new("batch", "job-7", {"numbers": list(range(300))})) == "job-7"
            with pytest.raises(Exception, match="already exists"):
                loop.run(client.start_new("batch", "job-7", {"numbers": [1]}))
            with pytest.raises(Exception, match="no orchestrator function named"):
                loop.run(client.start_new("nope", "job-8", {}))
            engine.wait_for("job-7", timeout=60)
            status = loop.run(client.get_status("job-7"))
            assert status.runtime_status == df.OrchestrationRuntimeStatus.Completed
            assert status.output == sum(n * n for n in range(300))
        finally:
            api.stop()


def test_terminate_through_the_real_client_ends_the_instance_and_fails_its_parents_task(store):
    """terminate: 404 for an unknown id (the SDK raises), 202 for a running instance, which ends
    Terminated with the reason as its output and schedules nothing more; 410 for a finished one
    (the SDK accepts it). A terminated child is a failed task to its parent, as DTFx sends
    SubOrchestrationInstanceFailed for both. The list answers pages with a continuation token."""
    import azure.durable_functions as df

    from devhost.durable.functions import EventLoopThread
    from devhost.durable.rpc import DurableHttpApi

    with make_engine(store) as engine:
        api = DurableHttpApi(engine, store.hub).start()
        try:
            client = df.DurableOrchestrationClient(api.client_binding())
            loop = EventLoopThread.shared()
            with pytest.raises(Exception, match="No instance with ID 'nobody' found"):
                loop.run(client.terminate("nobody", "why"))
            job = {"seconds": 3, "run": 1, "child": 1, "fail": False, "key": "t"}
            engine.start_new("parent_of_slow_child", "job-t", job)
            child = "job-t-child-1"
            deadline = time.monotonic() + 30
            while (engine.status(child) or {}).get("status") != "Running" and time.monotonic() < deadline:
                time.sleep(0.05)
            loop.run(client.terminate(child, "stop, child"))
            child_state = engine.wait_for(child, timeout=2)  # its 3 s activity is not waited for
            parent_state = engine.wait_for("job-t", timeout=2)
            loop.run(client.terminate("job-t", "too late"))  # 410: finished, accepted by the SDK
            pages = [loop.run(client.get_status_by(instance_id_prefix="job-t"))]
        finally:
            api.stop()
    assert (child_state["status"], child_state["output"]) == ("Terminated", "stop, child")
    kinds = [e["EventType"] for ep in store.episodes(child) for e in ep.events]
    assert kinds[-3:] == [3, 1, 13]  # ExecutionTerminated, ExecutionCompleted, OrchestratorCompleted
    assert parent_state["status"] == "Failed" and "stop, child" in parent_state["error"], parent_state
    assert sorted(s.instance_id for s in pages[0]) == ["job-t", child]


def test_a_terminate_sent_before_the_start_ran_still_ends_the_instance(store):
    """The terminate may reach the host before the instance's start has run (both are control
    messages, the start first): it waits for the start instead of being dropped as a stray."""
    with make_engine(store) as engine:
        process_start = engine.starts.process

        def slow_start(message):  # a busy host: the start runs after the terminate has arrived
            time.sleep(0.5)
            return process_start(message)

        engine.starts.process = slow_start
        engine.start_new("nap_once", "job-early", {"seconds": 3, "i": 1})
        engine.terminate("job-early", "changed my mind")
        state = engine.wait_for("job-early", timeout=2)  # not the 3 s nap
    assert (state["status"], state["output"]) == ("Terminated", "changed my mind")


def test_a_new_instance_found_ready_by_another_dispatcher_while_its_start_is_held_still_runs(store):
    """A start marks its new instance ready while its dispatcher still holds it; an idle
    dispatcher that wakes then finds it held and passes it by. The start's dispatcher is slowed
    after that point (as a busy machine can), so the other one always gets there first: the
    instance must run once released, not wait forever as Pending."""
    engine = make_engine(store, max_orchestrators=2, episode_linger=0.0)
    process_start = engine.starts.process
    passed_by = []

    def slow_start(message):
        process_start(message)  # the instance is ready from here on, and still held
        deadline = time.monotonic() + 5
        while not passed_by and time.monotonic() < deadline:
            with engine.instances.lock:  # popped from the ready queue while held: passed by
                if not engine.queue.is_ready(message.instance_id) and engine.queue.holds(message.instance_id):
                    passed_by.append(message.instance_id)
            time.sleep(0.01)

    engine.starts.process = slow_start
    with engine:
        engine.start_new("nap_once", "held-start", {"i": 7, "seconds": 0.0})
        state = engine.wait_for("held-start", timeout=30)
    assert passed_by == ["held-start"], "the other dispatcher never found the held instance ready"
    assert state["status"] == "Completed" and state["output"] == 7


def test_a_stored_instance_no_host_ever_heard_of_is_started_by_the_watchdog(store):
    """The hang a host must never give: an instance row, Pending, no episode, and no start message
    anywhere (its starter's host died between writing the row and its message reaching a queue).
    The partition owner's watchdog starts it from the row, past the stated bound."""
    with make_engine(store, watchdog_interval=0.2, stalled_start_s=1.0) as engine:
        row = Instance("orphan", "fan", '{"count": 4, "batch": 2}').state()
        assert store.write_new_state("orphan", row, None)
        state = engine.wait_for("orphan", timeout=60)
    assert state["status"] == "Completed" and state["output"]["total"] == sum(n * n for n in range(4))
    assert engine.stats.watchdog_redispatches >= 1


@pytest.mark.parametrize("where", ["on the host that ran it", "on a host that took over"])
def test_a_start_sent_again_for_a_child_that_already_finished_reports_it_to_the_parent(store, where):
    """A host that takes over a partition sends its instances' open tasks again, the start of a
    sub-orchestration among them. When that child already finished (on this host, or on a host
    that stopped before its parent heard), its outcome is reported to the parent instead of the
    child being run again. The report from storage used to raise in the host (it woke waiters
    without the lock held), and the start's retry then purged the finished child and re-ran it."""
    first = make_engine(store).start()
    try:
        first.start_new("fan", "job-12", {"count": 4, "batch": 2})
        assert first.wait_for("job-12", timeout=60)["status"] == "Completed"
        child = store.read_state("job-12-b000")
        assert child["status"] == "Completed" and child["parent"]["id"] == "job-12"
        episodes_before = len(list(store.episodes("job-12-b000")))
        if where == "on a host that took over":
            first.stop()
            engine = make_engine(store).start()
        else:
            engine = first
        dropped_before, ran_before = engine.stats.duplicate_completions_dropped, engine.stats.episodes
        again = StartMessage(child["name"], child["id"], child["input"], child["parent"], new_execution_id())
        engine.queues.send_control(engine.partitions.partition_for(child["id"]), start_body(again))
        deadline = time.monotonic() + 30
        while engine.stats.duplicate_completions_dropped == dropped_before and time.monotonic() < deadline:
            time.sleep(0.05)
        # The report reached the parent's partition: the parent has finished, so it is dropped there.
        assert engine.stats.duplicate_completions_dropped == dropped_before + 1
        assert engine.stats.episodes == ran_before  # the child was not run again
        assert engine.backoff._failures == {}  # and its start did not fail
    finally:
        engine.stop()
        first.stop()
    assert len(list(store.episodes("job-12-b000"))) == episodes_before
    assert store.read_state("job-12-b000")["execution_id"] == child["execution_id"]


def test_an_instance_loaded_with_its_partition_runs_at_once_not_at_the_watchdogs_next_round(store):
    """A host taking up a partition loads its Pending instances before the partition counts as
    its own. They used to be made ready then, and a dispatcher that took one in that moment found
    the partition not yet owned and put it aside: it ran only when the watchdog looked again (10 s
    later by default). Here the taking up is slowed, as on a busy machine, and the watchdog is
    kept out of the way: the instance must run without it."""

    engine = make_engine(store, watchdog_interval=600)
    acquired = engine.handover.acquired

    def slow_take_up(partition: int, after_crash: bool) -> None:
        acquired(partition, after_crash)
        time.sleep(0.3)  # between loading the partition and owning it, the dispatchers look

    engine.handover.acquired = slow_take_up
    row = Instance("loaded", "fan", '{"count": 4, "batch": 2}').state()
    assert store.write_new_state("loaded", row, None)
    with engine:
        state = engine.wait_for("loaded", timeout=30)
    assert state["status"] == "Completed" and state["output"]["total"] == sum(n * n for n in range(4))
    assert engine.stats.watchdog_redispatches == 0


def wait_until(predicate, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_a_job_that_makes_no_progress_is_reported_at_error_by_its_host_and_a_busy_family_is_not(store, caplog):
    """The host reports a job (a top-level instance) none of whose family committed an episode
    within the bound: at ERROR, with the job's id in the record's fields, whatever becomes of
    stderr. A parent waiting, quiet, on a child that makes progress is not reported; a job whose
    one activity is stuck (no function timeout here) is."""
    caplog.set_level(logging.ERROR, logger="devhost.durable.progress")
    toy_app.set_failures("quiet-job", 1)
    options = {"max_activities": 1, "timer_scale": 1.0, "watchdog_interval": 0.1, "stall_report_s": 1.5}
    try:
        with make_engine(store, **options) as engine:
            engine.start_new("parent_of_busy_child", "busy-family", {"count": 10, "seconds": 0.3})
            busy = engine.wait_for("busy-family", timeout=60)
            after_busy = engine.stats.stalled_jobs_reported
            engine.start_new("stuck_once", "quiet-job", {"key": "quiet-job", "first_ms": 100, "attempts": 2})
            wait_until(lambda: engine.stats.stalled_jobs_reported > after_busy)
            toy_app.release("quiet-job")
            quiet = engine.wait_for("quiet-job", timeout=60)
    finally:
        toy_app.release("quiet-job")
    assert busy["status"] == "Completed" and busy["output"] == 10 and after_busy == 0
    assert quiet["status"] == "Completed" and quiet["output"] == {"key": "quiet-job", "stuck": True}
    reports = [r for r in caplog.records if r.name == "devhost.durable.progress"]
    assert reports and all(r.levelno == logging.ERROR and r.job_id == "quiet-job" for r in reports)
    assert "job quiet-job has made no progress" in reports[0].getMessage()


def test_a_start_too_large_for_a_queue_message_reaches_the_owner_through_a_blob(store):
    """A client that owns no partition (an engine never started) sends its start to the control
    queue; an input over the 45 KB message limit travels in a blob, and the blob goes once the
    start is consumed."""
    client = make_engine(store)  # never started: it owns no partition, so its start goes to the queue
    with make_engine(store) as engine:
        client.start_new("fan", "large", {"count": 4, "batch": 2, "padding": "x" * 60_000})
        state = engine.wait_for("large", timeout=60)
    assert state["status"] == "Completed" and state["output"]["total"] == sum(n * n for n in range(4))
    assert store.queues.large_messages == 1  # the start went through a blob (client and host share the store)
    assert list(store.large.list_blobs(name_starts_with="messages/")) == []


def test_a_work_item_deleted_while_it_is_renewed_never_shows_up_again(store):
    """An activity's end deletes its work item while the reader may be renewing it; a renewal
    changes the pop receipt, so a delete sent with the old one would be refused and the item
    run again once visible. Both race here, item by item; afterwards the queue is empty, and a
    renewal after the delete reports the item as still ours (nothing to warn about)."""
    import threading

    queues = store.queues
    queues.ensure()
    for n in range(40):
        queues.send_work_item({"n": n})
    taken = []
    while len(taken) < 40:
        taken += queues.receive_work_items(32, 2)
    start = threading.Barrier(2)

    def renew_all() -> None:
        start.wait()
        for received in taken:
            queues.extend(received, 2)

    def delete_all() -> None:
        start.wait()
        for received in taken:
            queues.delete(received)

    threads = [threading.Thread(target=renew_all), threading.Thread(target=delete_all)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(3)  # past every visibility a renewal could have set
    shown_again = queues.receive_work_items(32, 30)
    assert [received.body["n"] for received in shown_again] == []
    assert all(queues.extend(received, 2) for received in taken)


def test_results_that_land_together_share_one_episode(store):
    """Twelve naps of 0.1 s on two slots: a pair of results lands every 0.1 s. Each waits for the
    others its instance still waits for (``EPISODE_LINGER_S``), so a few episodes replay for
    all twelve instead of one episode per pair."""
    with make_engine(store, max_activities=2) as engine:
        engine.start_new("all_at_once", "together", {"count": 12, "seconds": 0.1})
        state = engine.wait_for("together", timeout=60)
    assert state["status"] == "Completed" and state["output"] == 12
    assert engine.stats.episodes <= 4, engine.stats  # the start's episode, then the results in at most 3


def test_a_host_alone_on_its_task_hub_keeps_the_activities_its_slots_cannot_take_yet(store):
    """Alone, a host has nobody to share the work-item queue with: activities wait in its memory
    for a slot (no send, receive and delete each), and the job is the same."""
    with make_engine(store, max_activities=2) as engine:
        engine.start_new("all_at_once", "alone", {"count": 12, "seconds": 0.05})
        state = engine.wait_for("alone", timeout=60)
    assert state["status"] == "Completed" and state["output"] == 12
    assert engine.stats.work_items_sent == 0 and engine.stats.work_items_kept == 10, engine.stats
    assert store.queues.receive_work_items(32, 1) == []


QUICK_LEASE = LeaseTimings(lease_s=3.0, acquire_s=0.3, busy_s=0.1)


def test_a_second_host_gets_the_activities_the_first_kept_while_it_was_alone(store):
    """When another host shows up, what the first kept for its one slot goes to the shared queue
    and the newcomer runs part of it."""
    first = make_engine(store, max_activities=1, lease=QUICK_LEASE, worker_id="first").start()
    try:
        first.start_new("all_at_once", "shared", {"count": 16, "seconds": 0.3})
        deadline = time.monotonic() + 30
        while first.stats.work_items_kept < 15 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first.stats.work_items_kept == 15  # one slot runs, fifteen wait in memory
        with make_engine(store, max_activities=1, lease=QUICK_LEASE, worker_id="second") as second:
            state = first.wait_for("shared", timeout=60)
    finally:
        first.stop()
    assert state["status"] == "Completed" and state["output"] == 16
    assert first.stats.work_items_sent > 0
    assert any(e.name == "nap" for e in second.executions), "the newcomer ran none of the kept activities"
    ran = sorted(e.input["i"] for e in [*first.executions, *second.executions] if e.name == "nap")
    assert set(ran) == set(range(16))


def test_a_host_that_stops_hands_the_activities_it_kept_to_the_queue(store):
    """A host stopped while activities wait in its memory sends them to the queue before it
    releases its partitions, so the host after it (which takes released partitions without
    sending any work again) finishes the job."""
    first = make_engine(store, max_activities=1, lease=QUICK_LEASE, worker_id="first").start()
    first.start_new("all_at_once", "handed", {"count": 8, "seconds": 0.3})
    deadline = time.monotonic() + 30
    while first.stats.work_items_kept < 7 and time.monotonic() < deadline:
        time.sleep(0.05)
    first.stop()
    assert first.stats.work_items_sent >= 1
    with make_engine(store, max_activities=2, lease=QUICK_LEASE, worker_id="second") as second:
        state = second.wait_for("handed", timeout=60)
    assert state["status"] == "Completed" and state["output"] == 8
    assert second.stats.watchdog_redispatches == 0
