"""Partitions coming and going, and work that stalls (mixed into :class:`devhost.durable.engine.Engine`).

- **Acquired**: the partition's unfinished instances are loaded from storage before the host
  counts it as owned; after a crash (the row expired under its owner) their open work is sent
  again, since the owner may have died between committing an episode and sending what it
  scheduled, or while holding results in memory.
- **Drained** (another host takes it, or this one stops): once no episode of it is in hand,
  every start, result and timer held in memory for it goes back to its queue.
- **Lost** (another host holds it after this one's lease lapsed): what is held of it is dropped;
  the new owner claimed an expired row, so it sends the open work again.
- **Watchdog**: every round, open work of idle instances with no answer past its bound is sent
  again (never a sub-orchestration start the child's host dropped as a duplicate: the real host
  sends nothing again either), an instance stored Pending with no first episode that no host
  holds is started, and jobs that make no progress are reported (:mod:`devhost.durable.progress`).
"""

from __future__ import annotations

import logging
import time
from collections import deque

from .history import PENDING, RUNNING, TERMINAL, now, parse_iso
from .instance import Instance
from .messaging import event_body, start_body
from .work import StartMessage

logger = logging.getLogger(__name__)

#: The watchdog's round: an unfinished instance of an owned partition that makes no progress is
#: looked at this often.
WATCHDOG_INTERVAL_S = 10.0
#: A stored instance still Pending, with no first episode and not held by its partition's owner,
#: this long after it was created is started from its stored row (its start message was lost).
STALLED_START_S = 30.0
#: An open timer this long past its due time is sent again.
OVERDUE_TIMER_S = 30.0
#: A sub-orchestration with no result for this long has its start sent again; a child that runs
#: drops it, a finished one reports its result again.
QUIET_CHILD_S = 120.0
#: An activity with no result this long past the function timeout (plus the worker restart's
#: grace) is sent again: its outcome cannot come any more.
QUIET_ACTIVITY_MARGIN_S = 60.0


class PartitionHandover:
    """The engine's side of :class:`devhost.durable.partitions.PartitionManager`'s callbacks, and its watchdog."""

    def _unfinished_of(self, partition: int, states: list[dict]) -> list[Instance]:
        """The partition's Pending and Running instances (of the task hub's ``states``), with their
        history, from storage."""
        found = []
        for state in states:
            if state["status"] not in (PENDING, RUNNING) or self.partition(state["id"]) != partition:
                continue
            inst = Instance.from_state(state)
            episodes = self.backoff.call(
                "read history", lambda inst=inst: list(self.store.episodes(inst.id)), lambda: self._stopping
            )
            for episode in episodes:
                if episode.execution_id in (None, inst.execution_id):
                    inst.apply(episode.events, episode.scheduled, episode.actions, episode.finished)
            found.append(inst)
        return found

    def _acquired(self, partition: int, after_crash: bool) -> None:
        """A partition came to this host: load its unfinished instances. After a crash (the row
        expired under its owner) also send their open work again: the owner may have died between
        committing an episode and sending what it scheduled, or holding results in memory."""
        states = self.backoff.call("read the task hub", self.store.instances, lambda: self._stopping)
        outbound: list[tuple] = self._reports_lost_with(partition, states) if after_crash else []
        resumed = 0
        for inst in self._unfinished_of(partition, states):
            with self._lock:
                current = self._instances.get(inst.id)
                if current is not None and current.status not in TERMINAL:
                    continue
                self._instances[inst.id] = inst
                resumed += 1
                if inst.status != PENDING and inst.history and after_crash:
                    for task_id in sorted(inst.open):
                        outbound += self._work_for(inst, task_id, inst.scheduled[task_id])
                for task_id in inst.open:
                    inst.dispatched[task_id] = time.monotonic()
        self._send_all(outbound)
        if resumed:
            logger.info("partition %d: %d unfinished instance(s) taken up", partition, resumed)

    def _reports_lost_with(self, partition: int, states: list[dict]) -> list[tuple]:
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
                and self.partition(state["id"]) == partition
                and waiting is not None
                and waiting.get("execution_id") == parent.get("execution_id")
            ):
                reports.append(self._report_to_parent(Instance.from_state(state)))
        return reports

    def _taken_up(self, partition: int) -> None:
        """The partition counts as owned from now on: its instances that have not run a first
        episode run now. (Made ready while it was being taken up, a dispatcher would have found
        the partition not yet this host's and put them aside until the watchdog's next round.)"""
        with self._lock:
            for inst in self._instances.values():
                if self.partition(inst.id) == partition and (inst.status == PENDING or not inst.history):
                    self._mark_ready(inst.id)

    def _take_partition(self, partition: int) -> tuple[list[Instance], list, list]:
        """Remove everything of ``partition`` from memory: its instances, starts and held timers."""
        with self._lock:
            instances = [i for key, i in self._instances.items() if self.partition(key) == partition]
            for inst in instances:
                del self._instances[inst.id]
            starts = [s for s in self._starts if self.partition(s[0].instance_id) == partition]
            self._starts = deque(s for s in self._starts if self.partition(s[0].instance_id) != partition)
            held = [(key, h) for key, h in self._held.items() if h[0] == partition]
            for key, _ in held:
                del self._held[key]
            self._ready = deque(i for i in self._ready if self.partition(i) != partition)
            self._changed.notify_all()
        return instances, starts, held

    def _drain(self, partition: int) -> bool:
        """Hand a partition on (another host takes it, or this one stops): once no episode of it is
        in hand, every start, result and timer held in memory for it goes back to its queue."""
        with self._lock:
            if any(self.partition(i) == partition for i in self._busy):
                return False
        instances, starts, held = self._take_partition(partition)
        for message, receipt in starts:
            self._forward(start_body(message), receipt)
        for inst in instances:
            if not inst.history and inst.status not in TERMINAL:
                # Started here but not run yet: its start message is consumed, so it goes again.
                start = StartMessage(inst.name, inst.id, inst.input, inst.parent, inst.execution_id)
                self._send(inst.id, start_body(start))
            for item in inst.pending:
                self._send(inst.id, event_body(inst.id, inst.execution_id, item))
            for receipt in inst.receipts:
                self._delete(receipt)
        for _, (_, due, body) in held:
            self._send(body["instance_id"], body, delay=max(0.0, due - time.monotonic()))
        return True

    def _lost(self, partition: int) -> None:
        """Another host claimed a partition whose lease lapsed here: drop what is held of it (the
        new owner sends its open work again); its unconsumed messages show up for the new owner."""
        self._take_partition(partition)

    def _watchdog_loop(self) -> None:
        while True:
            due = time.monotonic() + self.watchdog_interval
            with self._lock:
                while not self._stopping and time.monotonic() < due:
                    self._changed.wait(due - time.monotonic())
                if self._stopping:
                    return
            try:
                self.watchdog_round()
                self.report_stalled_jobs()
            except Exception:  # noqa: BLE001 - storage trouble: the next round looks again
                logger.warning("watchdog round failed", exc_info=True)

    def _overdue(self, inst: Instance, task_id: int, moment: float) -> bool:
        meta = inst.scheduled[task_id]
        since = moment - inst.dispatched.get(task_id, moment)
        if meta["kind"] == "timer":
            return (now() - parse_iso(meta["fire_at"])).total_seconds() > OVERDUE_TIMER_S
        if meta["kind"] == "suborchestration":
            refused = (meta["instance_id"], inst.id, inst.execution_id, task_id) in self._refused_starts
            return since > QUIET_CHILD_S and not refused
        limit = (self.function_timeout or 600.0) + self.activities.grace + QUIET_ACTIVITY_MARGIN_S
        return since > limit

    def watchdog_round(self) -> int:
        """No instance left waiting: send again the open work of idle instances of owned partitions
        that has had no answer past its bound, and start instances stored Pending with no first
        episode that no host took up. How many things it sent or started."""
        owned = set(self.partitions.owned())
        outbound: list[tuple] = []
        what: list[str] = []  # one line per thing sent or started, for the log
        moment = time.monotonic()
        with self._lock:
            finished = {i.id for i in self._instances.values() if i.status in TERMINAL}
            self._refused_starts = {r for r in self._refused_starts if r[1] not in finished}
            for inst in self._instances.values():
                if (
                    inst.status in TERMINAL
                    or inst.id in self._busy
                    or inst.pending
                    or self.partition(inst.id) not in owned
                ):
                    continue
                if not inst.history and inst.id not in self._ready:
                    self._mark_ready(inst.id)
                    outbound.append(None)
                    what.append(f"{inst.id}: held, never run")
                for task_id in sorted(inst.open):
                    if self._overdue(inst, task_id, moment):
                        meta = inst.scheduled[task_id]
                        silent = moment - inst.dispatched.get(task_id, moment)
                        what.append(
                            f"{inst.id}: task {task_id} ({meta['kind']} {meta.get('name', '')}) silent {silent:.0f} s"
                        )
                        outbound += self._work_for(inst, task_id, meta)
                        inst.dispatched[task_id] = moment
            known = set(self._instances)
        stalled = [
            state
            for state in self.store.instances(PENDING)
            if state["id"] not in known
            and self.partition(state["id"]) in owned
            and (now() - parse_iso(state["created"])).total_seconds() > self.stalled_start_s
        ]
        for state in stalled:
            inst = Instance.from_state(state)
            with self._lock:
                if inst.id not in self._instances:
                    self._instances[inst.id] = inst
                    self._mark_ready(inst.id)
                    outbound.append(None)
                    what.append(f"{inst.id}: stored Pending, held by no host")
        if outbound:
            with self._lock:
                self.stats.watchdog_redispatches += len(outbound)
            logger.warning(
                "watchdog: %d stalled start(s) or unanswered task(s) sent again: %s", len(outbound), "; ".join(what)
            )
        self._send_all(outbound)
        return len(outbound)
