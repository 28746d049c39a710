"""Each part of the local host's engine on its own, built here one by one as the engine wires them,
with no thread of the host running: the timers, what waits for a dispatcher, the starts, the
messaging, a partition's handover and the watchdog; the task hub in Azurite where a part uses it."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from devhost.durable import messaging as messaging_module
from devhost.durable.dispatch import EpisodeDue, EpisodeQueue, StartDue
from devhost.durable.engine import wired_partitions
from devhost.durable.handover import Handover
from devhost.durable.history import (
    COMPLETED,
    ORCHESTRATOR_STARTED,
    RUNNING,
    SUB_ORCHESTRATION_COMPLETED,
    TASK_COMPLETED,
    TIMER_FIRED,
    event,
    iso,
    now,
)
from devhost.durable.instance import EngineStats, HeldInstances, Instance, new_execution_id
from devhost.durable.messaging import Messaging, event_body, start_body
from devhost.durable.partitions import LeaseTimings, partition_of
from devhost.durable.progress import ProgressWatch
from devhost.durable.starts import Starts
from devhost.durable.store import Episode
from devhost.durable.timers import Timers
from devhost.durable.watchdog import Watchdog
from devhost.durable.work import ActivityRunner, HostBackoff, StartMessage
from tests.test_devhost_engine import hub_store, wait_until

#: Leases that outlast a test, looked at often while draining.
LONG_LEASE = LeaseTimings(lease_s=30.0, acquire_s=10.0, busy_s=0.1)
#: Leases short enough that a claim expires within the test (a claim lasts twice the lease).
SHORT_LEASE = LeaseTimings(lease_s=0.5, acquire_s=0.2, busy_s=0.1)


@pytest.fixture
def store(storage, request):
    hub = hub_store(storage, request)
    hub.queues.ensure()
    return hub


def ids_in(partition: int, count: int, partitions: int, prefix: str = "i") -> list[str]:
    """``count`` instance ids that fall in ``partition``."""
    found, n = [], 0
    while len(found) < count:
        if partition_of(f"{prefix}{n}", partitions) == partition:
            found.append(f"{prefix}{n}")
        n += 1
    return found


def control_bodies(store, partition: int) -> list[dict]:
    return [received.body for received in store.queues.receive_control(partition, 32, 30)]


class HostParts:
    """One host's parts on the test's task hub. By default its activity runner has no slot, so a
    work item waits in memory while the host is alone and goes to the shared queue once it is
    not; with ``slots``, activities run ``invoke`` and their outcomes land in ``outcomes`` (their
    work items deleted, as the engine's delivery does)."""

    def __init__(
        self, store, worker_id: str = "solo", lease: LeaseTimings = LONG_LEASE, *, slots: int = 0, invoke=None
    ):
        self.store, self.instances, self.stats, self.timers = store, HeldInstances(), EngineStats(), Timers()
        self.partitions = wired_partitions(self, store, worker_id, lease)
        self.partitions.ensure()
        self.queue = EpisodeQueue(
            self.instances, owns=self.partitions.owns_instance, linger=0.0, later=self.timers.later
        )
        self.outcomes: list[dict] = []

        def deliver(instance_id, execution_id, item, token) -> None:
            self.outcomes.append(item)
            self.messaging.delete(token)

        no_slot = ActivityRunner(
            slots,
            None,
            invoke=invoke or (lambda name, data: "null"),
            deliver=deliver,
            freed=lambda: None,
            later=self.timers.later,
            record=lambda execution: None,
            count=lambda stat: None,
            stopping=lambda: False,
        )
        self.messaging = Messaging(
            self.instances,
            self.queue,
            self.partitions,
            store,
            no_slot,
            backoff=HostBackoff(),
            later=self.timers.later,
            wake_work_items=lambda: None,
            stats=self.stats,
        )
        self.starts = Starts(self.instances, self.queue, store, self.stats)
        self.handover = Handover(
            self.instances,
            self.queue,
            self.messaging,
            self.partitions,
            store,
            backoff=HostBackoff(),
            stopping=lambda: False,
        )

    def hold(self, inst: Instance) -> Instance:
        self.instances.put(inst)
        return inst

    @property
    def count(self) -> int:
        return self.partitions.partitions


def running(instance_id: str, **fields) -> Instance:
    """A held instance past its first episode."""
    return Instance(instance_id, "fan", None, status=RUNNING, history=[event(ORCHESTRATOR_STARTED, now())], **fields)


# ---------------------------------------------------------------------- timers


def test_timers_run_callbacks_in_due_order_and_one_that_raises_runs_again_without_ending_the_others():
    timers = Timers()
    ran: list[tuple[str, float]] = []
    failures = [RuntimeError("storage down")]

    def flaky() -> None:
        if failures:
            raise failures.pop()
        ran.append(("flaky", time.monotonic() - began))

    began = time.monotonic()
    timers.later(0.3, lambda: ran.append(("late", time.monotonic() - began)))
    timers.later(0.1, lambda: ran.append(("early", time.monotonic() - began)))
    timers.later(0.0, flaky)
    timers.start()
    try:
        wait_until(lambda: len(ran) == 3, timeout=10)
    finally:
        timers.stop()
    assert [name for name, _ in ran] == ["early", "late", "flaky"]
    early, late, flaky_at = (at for _, at in ran)
    assert early >= 0.1 and late >= 0.3 and flaky_at >= 0.5  # the failed one again 0.5 s after it raised


# ---------------------------------------------------------------------- what waits for a dispatcher


def test_the_episode_queue_gives_one_start_or_episode_of_an_instance_at_a_time_and_passes_other_hosts_starts_on():
    instances = HeldInstances()
    queue = EpisodeQueue(instances, owns=lambda i: not i.startswith("theirs"), linger=0.0, later=Timers().later)
    mine = StartMessage("fan", "mine", None, None, new_execution_id())
    theirs = StartMessage("fan", "theirs", None, None, new_execution_id())
    queue.queue_start(mine, None)
    queue.queue_start(theirs, None)
    assert queue.next() == StartDue(mine, None, here=True) and queue.holds("mine")
    assert queue.next() == StartDue(theirs, None, here=False) and not queue.holds("theirs")
    again = StartMessage("fan", "mine", None, None, new_execution_id())
    queue.queue_start(again, None)
    assert queue.next() is None and queue.has_work()  # behind the start that holds the instance
    queue.let_go("mine")
    assert queue.next() == StartDue(again, None, here=True)


def test_a_result_lingers_for_its_siblings_and_the_last_one_runs_the_episode_at_once():
    instances, timers = HeldInstances(), Timers()
    queue = EpisodeQueue(instances, owns=lambda i: True, linger=0.3, later=timers.later)
    inst = running("fan-in", open={1, 2})
    instances.put(inst)
    first = event(TASK_COMPLETED, now(), TaskScheduledId=1, Result="1")
    inst.pending, inst.pending_since = [first], time.monotonic()
    queue.mark_ready("fan-in")
    timers.start()
    try:
        assert queue.next() is None  # task 2 is still open: wait for it a moment
        wait_until(queue.has_work, timeout=5)  # the linger ran out: ready again
        lingered = queue.next()
        assert isinstance(lingered, EpisodeDue) and lingered.events == [first]
        queue.let_go("fan-in")
        second = event(TASK_COMPLETED, now(), TaskScheduledId=2, Result="2")
        inst.pending, inst.pending_since = [second], time.monotonic()
        inst.open = {2}
        queue.mark_ready("fan-in")
        assert queue.next() == EpisodeDue(inst, [second], [])  # nothing else open: at once
    finally:
        timers.stop()


def test_an_instance_resting_after_a_storage_fault_runs_once_its_rest_is_over():
    instances, timers = HeldInstances(), Timers()
    queue = EpisodeQueue(instances, owns=lambda i: True, linger=0.0, later=timers.later)
    inst = running("tired")
    inst.pending = [event(TASK_COMPLETED, now(), TaskScheduledId=0, Result="0")]
    instances.put(inst)
    queue.rest("tired", 0.3)
    queue.mark_ready("tired")
    assert queue.next() is None
    timers.start()
    try:
        wait_until(queue.has_work, timeout=5)
    finally:
        timers.stop()
    assert isinstance(queue.next(), EpisodeDue)


# ---------------------------------------------------------------------- starts


def test_starts_drop_a_duplicate_remember_a_foreign_childs_start_and_report_a_finished_child_again(store):
    instances, stats = HeldInstances(), EngineStats()
    queue = EpisodeQueue(instances, owns=lambda i: True, linger=0.0, later=Timers().later)
    starts = Starts(instances, queue, store, stats)
    parent = {"id": "p", "task_id": 3, "execution_id": "first"}
    outbound, child = starts.process(StartMessage("fan", "p-c", None, parent, new_execution_id()))
    assert outbound == [] and child is not None and queue.is_ready("p-c")
    # Sent again for the same parent task (its partition changed hands): the running child reports when done.
    assert starts.process(StartMessage("fan", "p-c", None, parent, new_execution_id())) == ([], None)
    assert stats.duplicate_starts_dropped == 0
    foreign = {**parent, "execution_id": "second"}
    assert starts.process(StartMessage("fan", "p-c", None, foreign, new_execution_id())) == ([], None)
    assert stats.duplicate_starts_dropped == stats.foreign_child_starts_dropped == 1
    assert starts.refused(("p-c", "p", "second", 3)) and not starts.refused(("p-c", "p", "first", 3))
    starts.forget_refused_by({"p"})
    assert not starts.refused(("p-c", "p", "second", 3))
    child.status, child.output = COMPLETED, 7
    outbound, made = starts.process(StartMessage("fan", "p-c", None, parent, new_execution_id()))
    assert made is None and instances.get("p-c") is child  # not run a second time
    [(kind, to, body, delay)] = outbound
    assert (kind, to, body["execution_id"], delay) == ("control", "p", "first", 0.0)
    assert (body["item"]["EventType"], body["item"]["Result"]) == (SUB_ORCHESTRATION_COMPLETED, "7")


# ---------------------------------------------------------------------- messaging


def test_a_message_for_an_owned_partition_stays_in_memory_and_one_for_another_hosts_goes_to_its_queue(store):
    owner, other = HostParts(store, "owner"), HostParts(store, "other")
    owner.partitions.loop_once()  # claims every partition: the other host owns none
    start = StartMessage("fan", "routed", None, None, new_execution_id())
    partition = owner.partitions.partition_for("routed")
    owner.messaging.send("routed", start_body(start))
    assert owner.queue.next() == StartDue(start, None, here=True)
    assert control_bodies(store, partition) == []
    other.messaging.send("routed", start_body(start))
    assert control_bodies(store, partition) == [start_body(start)]


def test_messaging_drops_a_result_for_another_execution_and_a_second_result_of_a_task(store):
    parts = HostParts(store)
    parts.partitions.loop_once()
    inst = parts.hold(running("results", open={1}))
    result = event(TASK_COMPLETED, now(), TaskScheduledId=1, Result="1")
    parts.messaging.deliver("results", "an earlier execution", result)
    assert parts.stats.execution_id_mismatches_dropped == 1 and inst.pending == []
    parts.messaging.deliver("results", inst.execution_id, result)
    assert inst.pending == [result] and parts.queue.is_ready("results")
    parts.messaging.deliver("results", inst.execution_id, result)  # the at-least-once activity's second copy
    assert parts.stats.duplicate_completions_dropped == 1 and inst.pending == [result]


def test_a_timer_of_an_owned_partition_waits_in_memory_and_a_work_item_no_slot_takes_waits_for_another_host(store):
    parts = HostParts(store)
    parts.partitions.loop_once()
    inst = parts.hold(running("timed"))
    fired = event_body("timed", inst.execution_id, event(TIMER_FIRED, now(), TimerId=0, FireAt=iso(now())))
    parts.messaging.send("timed", fired, delay=30.0)
    partition = parts.partitions.partition_for("timed")
    assert control_bodies(store, partition) == [] and inst.pending == []
    [(due, body)] = parts.messaging.take_held(partition)
    assert body == fired and 29 < due - time.monotonic() <= 30
    work = parts.messaging.work_for(inst, 4, {"kind": "activity", "name": "square", "input": "2"})
    parts.messaging.send_all(work)  # alone on the task hub: nobody else could take it from the queue
    assert parts.stats.work_items_kept == 1 and store.queues.receive_work_items(32, 30) == []
    HostParts(store, "newcomer").partitions.loop_once()
    parts.partitions.loop_once()  # sees the newcomer
    [item] = store.queues.receive_work_items(32, 30)
    assert item.body == work[0][1] and parts.stats.work_items_sent == 1


# ---------------------------------------------------------------------- handover


def test_a_drained_partition_waits_for_its_episode_in_hand_then_sends_what_it_held_to_its_queue(store):
    parts = HostParts(store)
    parts.partitions.loop_once()
    partition = 0
    held_id, new_id, queued_id = ids_in(partition, 3, parts.count)
    result = event(TASK_COMPLETED, now(), TaskScheduledId=1, Result="1")
    held = parts.hold(running(held_id, open={1, 2}, pending=[result]))
    fresh = parts.hold(Instance(new_id, "fan", None))  # started here, no episode run yet
    parts.queue.queue_start(StartMessage("fan", held_id, None, None, held.execution_id), None)
    assert isinstance(parts.queue.next(), StartDue)  # a dispatcher holds it
    queued = StartMessage("fan", queued_id, None, None, new_execution_id())
    parts.queue.queue_start(queued, None)
    fired = event(TIMER_FIRED, now(), TimerId=2, FireAt=iso(now()))
    parts.messaging.send(held_id, event_body(held_id, held.execution_id, fired), delay=0.5)
    parts.partitions.stop(timeout=0.5)
    assert parts.partitions.owned() == [partition]  # the others are released; this one is in hand
    parts.queue.let_go(held_id)
    parts.partitions.stop(timeout=10)
    assert parts.partitions.owned() == [] and parts.instances.ids() == set() and not parts.queue.has_work()
    time.sleep(1.2)  # the timer goes with what was left of its delay
    fresh_start = StartMessage(fresh.name, new_id, None, None, fresh.execution_id)
    assert sorted(control_bodies(store, partition), key=str) == sorted(
        [
            start_body(queued),
            start_body(fresh_start),
            event_body(held_id, held.execution_id, result),
            event_body(held_id, held.execution_id, fired),
        ],
        key=str,
    )


def test_an_activity_running_without_a_work_item_gets_one_when_its_partition_is_handed_on(store, monkeypatch):
    """An activity started here without the queue (a slot was free) whose partition is handed on
    while it runs: the new owner took the partition by a handover, not after a crash, so it sends
    nothing again. The activity is given a work item taken by this host. If the host dies (nobody
    renews it), another host receives it once its visibility runs out; if the activity ends, its
    result deletes it."""
    monkeypatch.setattr(messaging_module, "WORK_ITEM_VISIBILITY_S", 1.0)  # 30 s in a host
    go = threading.Event()
    parts = HostParts(store, slots=1, invoke=lambda name, data: str(go.wait(30)).lower())
    parts.partitions.loop_once()
    partition = 0
    [first_id, second_id] = ids_in(partition, 2, parts.count)

    def run_here_then_hand_on(instance_id: str, task_id: int) -> dict:
        inst = parts.hold(running(instance_id, open={task_id}))
        work = parts.messaging.work_for(inst, task_id, {"kind": "activity", "name": "nap", "input": "1"})
        parts.messaging.send_all(work)
        assert parts.stats.work_items_sent == 0 and store.queues.receive_work_items(32, 30) == []  # no message
        assert parts.handover.drain(partition)
        assert store.queues.receive_work_items(32, 30) == []  # invisible: this host holds it
        return work[0][1]

    body = run_here_then_hand_on(first_id, 4)
    assert parts.stats.work_items_attached == 1
    time.sleep(1.5)  # the host "died": nobody renewed it
    [item] = store.queues.receive_work_items(32, 30)
    assert item.body == body and item.dequeue_count == 1
    store.queues.delete(item)

    go.set()  # the first ends (its late delete is refused: another host took its work item)
    wait_until(lambda: len(parts.outcomes) == 1, timeout=10)
    go.clear()
    run_here_then_hand_on(second_id, 5)
    assert parts.stats.work_items_attached == 2
    go.set()  # this one ends within its visibility: its result deletes its work item
    wait_until(lambda: len(parts.outcomes) == 2, timeout=10)
    time.sleep(1.5)
    assert store.queues.receive_work_items(32, 30) == []
    assert [o["Result"] for o in parts.outcomes] == ["true", "true"]


def test_a_lost_partition_is_dropped_from_memory_and_nothing_is_sent(store):
    parts = HostParts(store)
    parts.partitions.loop_once()
    [held_id, queued_id] = ids_in(1, 2, parts.count)
    held = parts.hold(running(held_id, pending=[event(TASK_COMPLETED, now(), TaskScheduledId=0, Result="0")]))
    parts.queue.queue_start(StartMessage("fan", queued_id, None, None, new_execution_id()), None)
    fired = event(TIMER_FIRED, now(), TimerId=0, FireAt=iso(now()))
    parts.messaging.send(held_id, event_body(held_id, held.execution_id, fired), delay=30.0)
    parts.handover.lost(1)
    assert parts.instances.ids() == set() and not parts.queue.has_work() and parts.messaging.take_held(1) == []
    assert control_bodies(store, 1) == []


def test_a_partition_claimed_after_its_owner_died_is_loaded_and_its_open_work_sent_again(store):
    dead = HostParts(store, "dead", SHORT_LEASE)
    dead.partitions.loop_once()  # claims every partition, then never renews
    [instance_id] = ids_in(2, 1, dead.count, prefix="orphaned")
    inst = Instance(instance_id, "fan", None, status=RUNNING, episodes=1)
    fire_at = iso(now() - timedelta(seconds=1))
    scheduled = {"0": {"kind": "timer", "fire_at": fire_at}}
    store.commit_episode(
        instance_id,
        Episode(1, [event(ORCHESTRATOR_STARTED, now())], scheduled, [], [], inst.execution_id),
        inst.state(),
    )
    time.sleep(2 * SHORT_LEASE.lease_s + 0.2)  # the claim expires
    heir = HostParts(store, "heir")
    heir.partitions.loop_once()
    loaded = heir.instances.get(instance_id)
    assert loaded is not None and loaded.open == {0} and heir.partitions.owns(2)
    [body] = control_bodies(store, 2)  # sent before the partition counted as owned: through its queue
    assert body["instance_id"] == instance_id and body["execution_id"] == inst.execution_id
    assert (body["item"]["EventType"], body["item"]["TimerId"], body["item"]["FireAt"]) == (TIMER_FIRED, 0, fire_at)


# ---------------------------------------------------------------------- watchdog


def test_the_watchdog_starts_a_stored_instance_no_host_holds_and_sends_unanswered_work_again_but_no_refused_start(
    store,
):
    parts = HostParts(store)
    parts.partitions.loop_once()
    progress = ProgressWatch(parts.instances, parts.partitions, store, stats=parts.stats, bound=3600)
    watchdog = Watchdog(
        parts.instances,
        parts.queue,
        parts.messaging,
        parts.starts,
        progress,
        parts.partitions,
        store,
        stats=parts.stats,
        function_timeout=None,
        stalled_start_s=0.0,
    )
    assert store.write_new_state("forgotten", Instance("forgotten", "fan", None).state(), None)
    long_ago = time.monotonic() - 1000
    late_timer = {"kind": "timer", "fire_at": iso(now() - timedelta(seconds=60))}
    child = {"kind": "suborchestration", "name": "fan", "instance_id": "waiting-c", "input": None}
    refused = {**child, "instance_id": "waiting-r"}
    waiting = parts.hold(running("waiting", open={0, 1, 2}, dispatched={0: long_ago, 1: long_ago, 2: long_ago}))
    waiting.scheduled = {0: late_timer, 1: child, 2: refused}
    # The child of task 2 runs for another parent task: its start from this one was refused.
    parts.hold(running("waiting-r", parent={"id": "elsewhere", "task_id": 0, "execution_id": "x"}))
    link = {"id": "waiting", "task_id": 2, "execution_id": waiting.execution_id}
    assert parts.starts.process(StartMessage("fan", "waiting-r", None, link, new_execution_id())) == ([], None)
    assert watchdog.run_round() == 3  # the stored instance, the timer, the quiet child
    assert parts.instances.get("forgotten") is not None
    assert [e["EventType"] for e in waiting.pending] == [TIMER_FIRED]
    taken = [parts.queue.next() for _ in range(4)]
    assert taken[0] == StartDue(taken[0].message, None, here=True) and taken[0].message.instance_id == "waiting-c"
    assert sorted(due.inst.id for due in taken[1:3]) == ["forgotten", "waiting"] and taken[3] is None
    assert parts.stats.watchdog_redispatches == 3
