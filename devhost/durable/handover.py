"""Partitions coming to this host and leaving it: the host's side of
:class:`devhost.durable.partitions.PartitionManager`'s callbacks.

- **Acquired**: the partition's unfinished instances are loaded from storage before the host
  counts it as owned; after a crash (the row expired under its owner) their open work is sent
  again, since the owner may have died between committing an episode and sending what it
  scheduled, or while holding results in memory.
- **Taken up**: the partition counts as owned from now on; its instances that have not run a
  first episode run now.
- **Drained** (another host takes it, or this one stops): once no episode of it is in hand,
  every start, result and timer held in memory for it goes back to its queue, and each of its
  activities running here without a work item is given one (the next owner takes the partition
  by a handover, so it would send nothing again if this host died before they end).
- **Lost** (another host holds it after this one's lease lapsed): what is held of it is dropped;
  the new owner claimed an expired row, so it sends the open work again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial

from .dispatch import EpisodeQueue
from .history import PENDING, RUNNING, TERMINAL
from .instance import HeldInstances, Instance
from .messaging import Messaging, Outbound, event_body, start_body
from .partitions import PartitionManager
from .queues import Received
from .replay import report_to_parent
from .store import Episode, HistoryStore
from .work import HostBackoff, StartMessage

logger = logging.getLogger(__name__)


class Handover:
    """Loads, hands on and drops what this host holds of a partition; ``stopping()`` says the host
    is stopping (a storage read that fails then is not tried again)."""

    def __init__(
        self,
        instances: HeldInstances,
        queue: EpisodeQueue,
        messaging: Messaging,
        partitions: PartitionManager,
        store: HistoryStore,
        *,
        backoff: HostBackoff,
        stopping: Callable[[], bool],
    ):
        self.instances, self.queue, self.messaging = instances, queue, messaging
        self.partitions, self.store = partitions, store
        self.backoff, self.stopping = backoff, stopping

    def _in(self, partition: int) -> Callable[[str], bool]:
        return lambda instance_id: self.partitions.partition_for(instance_id) == partition

    def _unfinished_of(self, partition: int, states: list[dict]) -> list[Instance]:
        """The partition's Pending and Running instances (of the task hub's ``states``), with their
        history, from storage."""
        found = []
        for state in states:
            if state["status"] not in (PENDING, RUNNING) or self.partitions.partition_for(state["id"]) != partition:
                continue
            inst = Instance.from_state(state)
            episodes = self.backoff.call("read history", partial(self._history, inst.id), self.stopping)
            for episode in episodes:
                if episode.execution_id in (None, inst.execution_id):
                    inst.apply(episode.events, episode.scheduled, episode.actions, episode.finished)
            found.append(inst)
        return found

    def _history(self, instance_id: str) -> list[Episode]:
        return list(self.store.episodes(instance_id))

    def acquired(self, partition: int, after_crash: bool) -> None:
        """A partition came to this host: load its unfinished instances. After a crash (the row
        expired under its owner) also send their open work again: the owner may have died between
        committing an episode and sending what it scheduled, or holding results in memory."""
        states = self.backoff.call("read the task hub", self.store.instances, self.stopping)
        outbound: list[Outbound] = self._reports_lost_with(partition, states) if after_crash else []
        resumed = 0
        for inst in self._unfinished_of(partition, states):
            with self.instances.lock:
                current = self.instances.get(inst.id)
                if current is not None and current.status not in TERMINAL:
                    continue
                self.instances.put(inst)
                resumed += 1
                if inst.status != PENDING and inst.history and after_crash:
                    for task_id in sorted(inst.open):
                        outbound += self.messaging.work_for(inst, task_id, inst.scheduled[task_id])
                for task_id in inst.open:
                    inst.dispatched[task_id] = time.monotonic()
        self.messaging.send_all(outbound)
        if resumed:
            logger.info("partition %d: %d unfinished instance(s) taken up", partition, resumed)

    def _reports_lost_with(self, partition: int, states: list[dict]) -> list[Outbound]:
        """The reports of the partition's finished sub-orchestrations whose parents still run, sent
        again. A host commits an episode before it sends what the episode made (docs/local-host.md
        says why), so a host that died in between took a finished child's report to its parent
        with it; when the parent is in another host's partition, nothing else sends it again (the
        open work sent again is this partition's). A parent that had the report drops the copy."""
        running = {s["id"]: s for s in states if s["status"] in (PENDING, RUNNING)}
        reports = []
        for state in states:
            parent = state.get("parent") or {}
            waiting = running.get(parent.get("id"))
            if (
                state["status"] in TERMINAL
                and self.partitions.partition_for(state["id"]) == partition
                and waiting is not None
                and waiting.get("execution_id") == parent.get("execution_id")
            ):
                reports.append(report_to_parent(Instance.from_state(state)))
        return reports

    def taken_up(self, partition: int) -> None:
        """The partition counts as owned from now on: its instances that have not run a first
        episode run now. (Made ready while it was being taken up, a dispatcher would have found
        the partition not yet this host's and put them aside until the watchdog's next round.)"""
        with self.instances.lock:
            for inst in self.instances.all():
                if self.partitions.partition_for(inst.id) == partition and (inst.status == PENDING or not inst.history):
                    self.queue.mark_ready(inst.id)

    def _take_partition(
        self, partition: int
    ) -> tuple[list[Instance], list[tuple[StartMessage, Received | None]], list[tuple[float, dict]]]:
        """Remove everything of ``partition`` from memory: its instances, starts and held timers."""
        chosen = self._in(partition)
        with self.instances.lock:
            instances = self.instances.take(chosen)
            starts = self.queue.take(chosen)
            held = self.messaging.take_held(partition)
        return instances, starts, held

    def drain(self, partition: int) -> bool:
        """Hand a partition on (another host takes it, or this one stops): once no episode of it is
        in hand, every start, result and timer held in memory for it goes back to its queue."""
        if self.queue.holds_any(self._in(partition)):
            return False
        self.messaging.attach_work_items(self._in(partition))
        instances, starts, held = self._take_partition(partition)
        for message, receipt in starts:
            self.messaging.forward(start_body(message), receipt)
        for inst in instances:
            if not inst.history and inst.status not in TERMINAL:
                # Started here but not run yet: its start message is consumed, so it goes again.
                start = StartMessage(inst.name, inst.id, inst.input, inst.parent, inst.execution_id, inst.version)
                self.messaging.send(inst.id, start_body(start))
            for item in inst.pending:
                self.messaging.send(inst.id, event_body(inst.id, inst.execution_id, item))
            for receipt in inst.receipts:
                self.messaging.delete(receipt)
        for due, body in held:
            self.messaging.send(body["instance_id"], body, delay=max(0.0, due - time.monotonic()))
        return True

    def lost(self, partition: int) -> None:
        """Another host claimed a partition whose lease lapsed here: drop what is held of it (the
        new owner sends its open work again); its unconsumed messages show up for the new owner."""
        self._take_partition(partition)
