"""How the host's messages travel.

A control message (an instance's start, a task's result, a due timer) goes straight into this
host's memory when the host owns the instance's partition, else into the partition's control
queue. An activity starts at once on the host that scheduled it when one of its slots is free
(what a host with a free slot would do with the work item anyway, without the queue's round
trips), else it goes to the shared work-item queue, which any host with a free slot reads. What
runs or waits only in a host's memory is sent again by the next owner if that host dies (one that
still runs when its partition is handed over is given a work item then: the next owner did not
take it after a crash, so it would not send it again). What a
message carries is kept until what it led to is committed; then it is deleted, and one that
shows up again is dropped as a duplicate. Sends that meet a storage fault are tried again until
they land (:class:`devhost.durable.work.HostBackoff`): nothing is dropped.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .history import (
    EXECUTION_TERMINATED,
    TERMINAL,
    TIMER_FIRED,
    completion_task_id,
    event,
    iso,
    now,
    parse_iso,
)
from .instance import EngineStats, HeldInstances, Instance, new_execution_id
from .partitions import PartitionManager
from .queues import Received
from .receivers import WORK_ITEM_VISIBILITY_S
from .store import HistoryStore
from .work import ActivityRunner, HostBackoff, StartMessage

if TYPE_CHECKING:
    from .dispatch import EpisodeQueue

logger = logging.getLogger(__name__)

#: What a work item carries, in ActivityRunner.submit's order.
WORK_ITEM_FIELDS = ("instance_id", "execution_id", "task_id", "name", "input_json")

#: A message to send: ``("work", body)`` for the work-item queue, ``("control", instance id,
#: body, delay)`` for an instance's partition; None stands for nothing to send.
Outbound = tuple | None


def start_body(message: StartMessage) -> dict:
    return {"type": "start", **message.__dict__}


def event_body(instance_id: str, execution_id: str, item: dict) -> dict:
    return {"type": "event", "instance_id": instance_id, "execution_id": execution_id, "item": item}


class Messaging:
    """Routing, acceptance and sending of one host's messages on the task hub: starts and events
    accepted here go to the :class:`EpisodeQueue`, work items to the :class:`ActivityRunner` (or
    the shared queue), everything for another host's partition to that partition's queue.
    ``later`` schedules a held timer, ``wake_work_items`` wakes this host's work-item reader."""

    def __init__(
        self,
        instances: HeldInstances,
        queue: EpisodeQueue,
        partitions: PartitionManager,
        store: HistoryStore,
        activities: ActivityRunner,
        *,
        backoff: HostBackoff,
        later: Callable[[float, Callable[[], None]], None],
        wake_work_items: Callable[[], None],
        stats: EngineStats,
        duplicate_activities: bool = False,
    ):
        self.instances, self.queue, self.partitions = instances, queue, partitions
        self.store, self.queues, self.activities = store, store.queues, activities
        self.backoff, self.later, self.wake_work_items = backoff, later, wake_work_items
        self.stats, self.duplicate_activities = stats, duplicate_activities
        #: Timer messages for owned partitions held in memory until due: key -> (partition, due, body).
        self._held: dict[int, tuple[int, float, dict]] = {}
        self._held_keys = itertools.count()

    def _count(self, stat: str) -> None:
        with self.instances.lock:
            setattr(self.stats, stat, getattr(self.stats, stat) + 1)

    def send(self, instance_id: str, body: dict, delay: float = 0.0) -> None:
        """A control message for an instance: straight into this host's memory when it owns the
        instance's partition (a timer waits there until due), else into the partition's queue.
        A send that meets a storage fault is tried again until it lands: nothing is dropped."""
        partition = self.partitions.partition_for(instance_id)
        if self.partitions.owns(partition):
            if delay > 0:
                key = next(self._held_keys)
                with self.instances.lock:
                    self._held[key] = (partition, time.monotonic() + delay, body)
                self.later(delay, lambda: self._release_held(key))
            else:
                self.accept(body, None)
            return
        self.backoff.call(
            f"send to partition {partition}",
            lambda: self.queues.send_control(partition, body, delay=delay),
            lambda: False,
        )

    def _release_held(self, key: int) -> None:
        with self.instances.lock:
            held = self._held.pop(key, None)
        if held is not None:
            self.accept(held[2], None)

    def take_held(self, partition: int) -> list[tuple[float, dict]]:
        """Remove the timers held in memory for ``partition``: (monotonic due time, message) each."""
        with self.instances.lock:
            keys = [key for key, held in self._held.items() if held[0] == partition]
            return [self._held.pop(key)[1:] for key in keys]

    def accept(self, body: dict, receipt: Received | None) -> None:
        """One control message, from this host's memory or from a control queue."""
        instance_id = body["instance_id"]
        if not self.partitions.owns_instance(instance_id):
            self.forward(body, receipt)  # read just before the partition went to another host
            return
        if body["type"] == "start":
            fields = {k: v for k, v in body.items() if k != "type"}
            self.queue.queue_start(StartMessage(**fields), receipt)
            return
        item = body["item"]
        if item["EventType"] == TIMER_FIRED:
            early = (parse_iso(item["FireAt"]) - now()).total_seconds()
            if early > 1.0:  # a timer longer than the queue's longest delay: wait again
                self.send(instance_id, body, delay=early)
                self.delete(receipt)
                return
            item = {**item, "Timestamp": iso(now())}
        self.deliver(instance_id, body["execution_id"], item, receipt)

    def forward(self, body: dict, receipt: Received | None) -> None:
        self.send(body["instance_id"], body)
        self.delete(receipt)
        self._count("messages_forwarded")

    def delete(self, receipt: Received | None) -> None:
        """Delete a consumed message. If this fails it shows up again and is dropped as a duplicate."""
        if receipt is None:
            return
        try:
            self.queues.delete(receipt)
        except Exception:  # noqa: BLE001
            logger.warning("could not delete a consumed control message; it will be dropped when seen again")

    def deliver(self, instance_id: str, execution_id: str, item: dict, receipt: Received | None = None) -> None:
        """A completion message for one execution of an instance."""
        with self.instances.lock:
            inst = self.instances.get(instance_id)
            task_id = completion_task_id(item)
            if inst is not None and inst.execution_id != execution_id:
                # DTFx: "ExecutionId of event does not match current executionId" -- dropped.
                self.stats.execution_id_mismatches_dropped += 1
                accepted = False
            elif item["EventType"] == EXECUTION_TERMINATED and inst is None:
                # Sent just after its start, which this host has not run yet: it waits its turn,
                # as it would in the control queue behind the ExecutionStarted message.
                self.later(0.2, lambda: self._terminate_later(instance_id, execution_id, item, receipt))
                return
            elif item["EventType"] == EXECUTION_TERMINATED and inst is not None and inst.status not in TERMINAL:
                accepted = self._queue_event(inst, item, receipt)
            elif inst is None or inst.status in TERMINAL or task_id in inst.delivered or task_id not in inst.open:
                # A second execution of an at-least-once activity (possibly landing after the
                # instance finished): the first result stands.
                self.stats.duplicate_completions_dropped += 1
                accepted = False
            else:
                inst.delivered.add(task_id)
                accepted = self._queue_event(inst, item, receipt)
        if not accepted:
            self.delete(receipt)

    def _terminate_later(self, instance_id: str, execution_id: str, item: dict, receipt: Received | None) -> None:
        """A terminate that came before its instance's start ran: delivered once the start has
        run, dropped if that execution is gone or already finished (read from storage, not
        under the host's lock)."""
        state = self.store.read_state(instance_id)
        if state is None or state.get("execution_id") != execution_id or state["status"] in TERMINAL:
            self.delete(receipt)
            return
        self.accept(event_body(instance_id, execution_id, item), receipt)

    def _queue_event(self, inst: Instance, item: dict, receipt: Received | None) -> bool:
        """Hold an accepted message for the instance's next episode (under the host's lock)."""
        if not inst.pending:
            inst.pending_since = time.monotonic()
        inst.pending.append(item)
        if receipt is not None:
            inst.receipts.append(receipt)
        self.queue.mark_ready(inst.id)
        return True

    def activity_outcome(self, instance_id: str, execution_id: str, item: dict, token: Received | None) -> None:
        """An activity's result reaches its instance's partition before its work item goes."""
        self.send(instance_id, event_body(instance_id, execution_id, item))
        self.delete(token)

    def take_work_item(self, body: dict, received: Received) -> None:
        instance_id, execution_id, task_id, name, input_json = (body[k] for k in WORK_ITEM_FIELDS)
        self.activities.submit(instance_id, execution_id, task_id, name, input_json, received)

    def _send_work_item(self, body: dict) -> None:
        self.backoff.call("send a work item", lambda: self.queues.send_work_item(body), lambda: False)
        self._count("work_items_sent")
        self.wake_work_items()  # this host's free slots need not wait for the next poll

    def attach_work_items(self, chosen: Callable[[str], bool]) -> None:
        """The activities of the ``chosen`` instances (a partition going to another host) that run
        here without a work item are given one, taken by this host: the partition's next owner
        got it by a handover, not after a crash, so it sends nothing again if this host dies
        before they end; the queue then brings them back once their visibility runs out."""

        def send_held(task: tuple) -> Received:
            body = {"type": "activity", **dict(zip(WORK_ITEM_FIELDS, task, strict=True))}
            return self.backoff.call(
                "send a work item", lambda: self.queues.send_work_item_held(body, WORK_ITEM_VISIBILITY_S), lambda: False
            )

        attached = self.activities.attach_work_items(chosen, send_held, self.delete)
        with self.instances.lock:
            self.stats.work_items_attached += attached

    def crowded(self) -> None:
        """Another host is on the task hub (or this one stops): the activities kept here for a
        slot go to the shared queue, for whichever host has a slot free first."""
        for task in self.activities.take_waiting():
            self._send_work_item({"type": "activity", **dict(zip(WORK_ITEM_FIELDS, task, strict=True))})

    def work_for(self, inst: Instance, task_id: int, meta: dict) -> list[Outbound]:
        """The messages that carry out one scheduled task: ``("work", body)`` for the work-item
        queue, ``("control", instance, body, delay)`` for an instance's partition."""
        if meta["kind"] == "activity":
            task = (inst.id, inst.execution_id, task_id, meta["name"], meta["input"])
            body = {"type": "activity", **dict(zip(WORK_ITEM_FIELDS, task, strict=True))}
            return [("work", body)] * (2 if self.duplicate_activities else 1)
        if meta["kind"] == "timer":
            delay = max(0.0, (parse_iso(meta["fire_at"]) - now()).total_seconds())
            item = event(TIMER_FIRED, now(), TimerId=task_id, FireAt=meta["fire_at"])
            return [("control", inst.id, event_body(inst.id, inst.execution_id, item), delay)]
        if meta["kind"] == "suborchestration":
            link = {"id": inst.id, "task_id": task_id, "execution_id": inst.execution_id}
            start = StartMessage(
                meta["name"], meta["instance_id"], meta["input"], link, new_execution_id(), meta.get("version", "")
            )
            return [("control", meta["instance_id"], start_body(start), 0.0)]
        return []

    def send_all(self, outbound: list[Outbound]) -> None:
        for message in outbound:
            if message is None:
                continue
            if message[0] == "work":
                body = message[1]
                task = tuple(body[k] for k in WORK_ITEM_FIELDS)
                if self.activities.try_submit(*task):
                    continue  # a slot of this host was free: it runs here, as if taken from the queue at once
                if self.partitions.alone() and self.activities.try_submit(*task, wait=True):
                    self._count("work_items_kept")  # nobody else could take it from the queue
                    continue
                self._send_work_item(body)
            else:
                _, instance_id, body, delay = message
                self.send(instance_id, body, delay)
