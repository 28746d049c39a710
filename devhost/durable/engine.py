"""The replay driver: runs the app's orchestrators through the real Durable SDK.

It plays the part of the Durable extension and the Durable Task Framework (DTFx) with the Azure
Storage provider. For each orchestration episode it hands the registered orchestrator the
history JSON the extension would send, walks the returned actions as the extension's shim does
(:mod:`devhost.durable.shim`: in order, awaiting each top-level action), appends the events DTFx
would append, executes the work (activities in a bounded pool, sub-orchestrations, timers,
retries), and replays again when results arrive. Here: the dispatchers, starts and timers; one
episode is :mod:`devhost.durable.replay`, the client's operations :mod:`devhost.durable.client`.

Rules of the real host it imitates (docs/local-host.md has the sources, row by row):
- activities run at least once (``duplicate_activities`` runs every one twice, concurrently);
- all results available when an orchestrator goes idle are delivered in one episode;
- retries are the host's job: TaskFailed -> TimerCreated -> TimerFired -> a new TaskScheduled,
  delays as DTFx's RetryInterceptor computes them, an immediate timer after the last attempt;
- a start for an id that is Pending/Running fails at the client when the client sees it; starts
  that race all succeed and the later ExecutionStarted is dropped; a finished id is re-run;
- messages for an earlier execution of an instance id are dropped (ExecutionId mismatch);
- a fault of the host's own storage costs time, never the instance: the episode is retried with
  backoff until storage answers, from what was committed;
- an activity past ``function_timeout`` fails with the host's timeout message (and is retried
  per its RetryOptions); one still running 2 s later has its worker restarted, and the other
  executions in that worker lose their results and fail at their own timeouts (and with
  ``on_stuck_function``, this process is recycled, as the real host kills the worker);
- a sub-orchestration start for an id that runs for another parent task is dropped, and that
  task never completes; nothing sends that start again;
- instance ids, custom status and failure wording as the extension's;
- any number of hosts share one task hub: an instance's starts, results and timers go to its
  partition's control queue and only the partition's owner runs its episodes (leases as the
  provider's table partition manager keeps them, :mod:`devhost.durable.partitions`); activities
  go to one work-item queue that every host reads (:mod:`devhost.durable.messaging`,
  :mod:`devhost.durable.receivers`); partitions move between hosts without losing a message
  (:mod:`devhost.durable.handover`).

Sequence numbers: the SDK numbers tasks in the order it meets them while replaying. Retry
timers and rescheduled attempts get their numbers while the SDK processes the failure or timer
event, before user code asks for anything new; new events are therefore appended in the order
[retry failures, retry timers with attempts left, everything else], and ids are handed out in
that same order, then to the new actions in the order the shim invokes them.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from .client import TaskHubClient
from .functions import FunctionIndex
from .handover import STALLED_START_S, WATCHDOG_INTERVAL_S, PartitionHandover
from .history import TERMINAL
from .instance import ActivityExecution, EngineStats, Instance
from .messaging import Messaging, start_body
from .partitions import PROVIDER_LEASE, LeaseTimings, PartitionManager
from .progress import ProgressWatch, default_stall_bound
from .queues import Received
from .receivers import ControlReader, WorkItemReader
from .replay import EpisodeRunner
from .store import HistoryStore
from .work import ActivityRunner, HostBackoff, StartMessage

logger = logging.getLogger(__name__)

#: Activity executions kept for inspection (tests, benchmarks); older ones are dropped.
MAX_EXECUTION_RECORDS = 200_000
#: How long a result waits for the other results its instance still waits for, so that one
#: episode replays for all that land meanwhile (the result awaited last runs at once). Every
#: episode replays the instance's whole history, so a fan-in of n results in n episodes costs
#: n^2 / 2 event replays. Measured on the 10240² job (100 windows in 2 batches of 64, 2 slots,
#: one result about every 0.4 s): 0.05 s gave 78-96 episodes and 3.0-3.9 s of replay, 0.5 s
#: 40-43 episodes and 0.7-0.8 s, and the job used about 6 CPU-s less; 1.0 s 27-30 episodes,
#: no further gain in CPU. In Azure, too, results reach an episode in batches: what the
#: control queue holds when it is read (docs/local-host.md, row 29).
EPISODE_LINGER_S = 0.5


def new_worker_id() -> str:
    """This host's name in the partition table: one per process, since two commands on one machine
    are two hosts. (The provider's default ``WorkerId`` is the machine name: one host a machine.)"""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Engine(TaskHubClient, EpisodeRunner, Messaging, PartitionHandover, ProgressWatch):
    """Runs orchestrations and activities of one app against one task hub, as one of any number of
    hosts sharing it: episodes of the partitions this host owns (:mod:`devhost.durable.partitions`),
    activities from the shared work-item queue (:mod:`devhost.durable.receivers`)."""

    def __init__(
        self,
        index: FunctionIndex,
        store: HistoryStore,
        *,
        max_activities: int = 4,
        duplicate_activities: bool = False,
        timer_scale: float = 1.0,
        episode_linger: float = EPISODE_LINGER_S,
        function_timeout: float | None = None,
        strict_determinism: bool = False,
        max_orchestrators: int = 1,
        worker_id: str | None = None,
        lease: LeaseTimings = PROVIDER_LEASE,
        watchdog_interval: float = WATCHDOG_INTERVAL_S,
        stalled_start_s: float = STALLED_START_S,
        stall_report_s: float | None = None,
        on_stuck_function: Callable[[], None] | None = None,
    ):
        self.index = index
        self.store = store
        self.max_activities = max_activities
        self.max_orchestrators = max_orchestrators
        self.duplicate_activities = duplicate_activities
        self.timer_scale = timer_scale
        self.episode_linger = episode_linger
        self.function_timeout = function_timeout
        #: Stricter than the real host (which compares only kind and name): also inputs and ids.
        self.strict_determinism = strict_determinism
        self.watchdog_interval = watchdog_interval
        self.stalled_start_s = stalled_start_s
        #: A job with no episode committed in its family for this long is reported (:mod:`.progress`).
        self.stall_report_s = default_stall_bound(function_timeout) if stall_report_s is None else stall_report_s
        #: Jobs reported as making no progress: id -> time.monotonic() of the last report.
        self._stall_reported: dict[str, float] = {}
        #: Sub-orchestration starts dropped because the id runs for another parent task:
        #: (child id, parent id, parent execution id, task id). The watchdog never sends them again.
        self._refused_starts: set[tuple[str, str, str, int]] = set()
        self.stats = EngineStats()
        self.executions: deque[ActivityExecution] = deque(maxlen=MAX_EXECUTION_RECORDS)
        self.backoff = HostBackoff()
        self._instances: dict[str, Instance] = {}
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._ready: deque[str] = deque()
        self._starts: deque[tuple[StartMessage, Received | None]] = deque()
        #: Instances backing off after a fault of the host's storage: not before this monotonic time.
        self._resting: dict[str, float] = {}
        #: Instances a dispatcher holds (one episode or start at a time per instance).
        self._busy: set[str] = set()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._timer_seq = itertools.count()
        #: Timer messages for owned partitions held in memory until due: key -> (partition, due, body).
        self._held: dict[int, tuple[int, float, dict]] = {}
        self._stopping = False
        self._closing = False
        self._threads: list[threading.Thread] = []
        self.worker_id = worker_id or new_worker_id()
        self.queues = store.queues
        self.partition_count = store.queues.partitions
        self.activities = ActivityRunner(
            max_activities,
            function_timeout,
            invoke=lambda name, data: self.index.invoke_activity(name, data),
            deliver=self._activity_outcome,
            freed=lambda: self.work_items.wake(),
            later=self.later,
            record=self._record_activity,
            count=self._count,
            stopping=lambda: self._closing,
            recycle=on_stuck_function,
        )
        self.partitions = PartitionManager(
            store.partition_table,
            self.partition_count,
            self.worker_id,
            acquired=self._acquired,
            drain=self._drain,
            lost=self._lost,
            crowded=self._crowded,
            taken_up=self._taken_up,
            timings=lease,
        )
        self.control = ControlReader(self.queues, self.partitions.owns, self._accept)
        self.work_items = WorkItemReader(
            self.queues, self.activities.free, self._take_work_item, self.activities.running_tokens, time.monotonic
        )

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Engine:
        self.backoff.call("ensure the task hub", self._ensure, lambda: self._stopping)
        loops = [(self._orchestrator_loop, f"orchestrator-{n}") for n in range(self.max_orchestrators)]
        for target, name in [*loops, (self._timer_loop, "timers"), (self._watchdog_loop, "watchdog")]:
            thread = threading.Thread(target=target, name=f"devhost-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        self.backoff.call("claim partitions", self.partitions.start, lambda: self._stopping)
        self.control.start()
        self.work_items.start()
        return self

    def _ensure(self) -> None:
        self.store.ensure()
        self.queues.ensure()

    def stop(self) -> None:
        """Take no more work, let the running activities end, hand the partitions on, stop."""
        self.work_items.taking = False
        self._closing = True
        self._crowded()  # what waits here for a slot runs on another host, or on the next one
        for token in self.activities.shutdown():
            try:
                self.queues.extend(token, 0)  # visible again at once for the other hosts
            except Exception:  # noqa: BLE001 - it shows up by itself when its visibility runs out
                logger.warning("could not hand a waiting work item back", exc_info=True)
        self.work_items.stop()
        self.partitions.stop()
        self.control.stop()
        with self._lock:
            self._stopping = True
            self._changed.notify_all()
        for thread in self._threads:
            thread.join(timeout=10)

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _record_activity(self, execution: ActivityExecution) -> None:
        with self._lock:
            self.stats.activity_executions += 1
            self.stats.activity_failures += execution.error is not None
            self.executions.append(execution)

    def _count(self, stat: str) -> None:
        with self._lock:
            setattr(self.stats, stat, getattr(self.stats, stat) + 1)

    def later(self, delay: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the timer thread after ``delay`` seconds."""
        with self._lock:
            heapq.heappush(self._timers, (time.monotonic() + delay, next(self._timer_seq), callback))
            self._changed.notify_all()

    def _mark_ready(self, instance_id: str) -> None:
        if instance_id not in self._ready:
            self._ready.append(instance_id)
        self._changed.notify_all()

    # ------------------------------------------------------------------ starts

    def _process_start(self, message: StartMessage) -> tuple[list[tuple], Instance | None]:
        """Apply one ExecutionStarted message (client start or sub-orchestration create); the
        messages it leads to, and the new instance if it made one."""
        with self._lock:
            current = self._instances.get(message.instance_id)
        if current is not None and current.status not in TERMINAL:
            # DTFx TaskOrchestrationDispatcher: "Duplicate start event" while an execution is live.
            if message.parent and current.parent == message.parent:
                return [], None  # already running for this very parent task (recovered); it reports when done
            with self._lock:
                self.stats.duplicate_starts_dropped += 1
            if not message.parent:
                logger.info("dropping a duplicate start event for %s", message.instance_id)
                return [], None
            # A parent starting a child whose id runs for another parent task (a job restarted over
            # its last run's batch): the start is dropped, and the running child reports to its own
            # parent's execution only, so this task never completes (docs/local-host.md, row 47).
            parent = message.parent
            with self._lock:
                self.stats.foreign_child_starts_dropped += 1
                self._refused_starts.add(
                    (message.instance_id, parent["id"], parent["execution_id"], int(parent["task_id"]))
                )
            logger.warning(
                "dropping the start of sub-orchestration %s from %s (task %s): it is %s for %s, a duplicate start "
                "event; that task never completes",
                message.instance_id,
                parent["id"],
                parent["task_id"],
                current.status,
                (current.parent or {}).get("id") or "a client",
            )
            return [], None
        previous = current.state() if current is not None else self.store.read_state(message.instance_id)
        if (
            previous is not None
            and message.parent
            and previous.get("parent") == message.parent
            and previous["status"] in TERMINAL
        ):
            # The child finished (here, or on a host that stopped), and its parent's start of it
            # came again (sent again when the parent's partition changed hands): the parent may
            # never have heard, so tell it now instead of running the child a second time.
            finished = current or Instance.from_state(previous)
            with self._lock:
                self._instances[finished.id] = finished
            return [self._report_to_parent(finished)], None
        if previous is not None:
            # An earlier execution of this id: its history goes; the new one starts from scratch.
            self.store.purge_history(message.instance_id, keep_execution=message.execution_id)
        inst = Instance(
            message.instance_id,
            message.name,
            message.input_json,
            parent=message.parent,
            execution_id=message.execution_id,
        )
        with self._lock:
            self._instances[inst.id] = inst
            self._mark_ready(inst.id)
        return [], inst

    def _run_start(self, message: StartMessage, receipt: Received | None) -> None:
        try:
            outbound, made = self._process_start(message)
            self.backoff.succeeded(message.instance_id)
        except Exception:
            delay = self.backoff.failed(message.instance_id)
            logger.warning(
                "start of %s failed in the host; trying again in %.1f s", message.instance_id, delay, exc_info=True
            )

            def again() -> None:
                with self._lock:
                    self._starts.append((message, receipt))
                    self._changed.notify_all()

            self.later(delay, again)
            return
        self._send_all(outbound)
        if made is not None and receipt is not None:
            with self._lock:
                made.receipts.append(receipt)  # deleted once the first episode is committed
        else:
            self._delete(receipt)

    # ------------------------------------------------------------------ orchestrations

    def _next_work(self) -> tuple[str | None, Callable[[], None]] | None:
        """Under the lock: the next start or episode of an instance no dispatcher holds, of an owned partition."""
        if self._starts:
            message, receipt = self._starts.popleft()
            if message.instance_id in self._busy:
                self._starts.append((message, receipt))  # after the episode that holds the instance
                return None
            if not self.partitions.owns(self.partition(message.instance_id)):
                return None, lambda: self._forward(start_body(message), receipt)  # to the partition's owner
            self._busy.add(message.instance_id)
            return message.instance_id, lambda: self._run_start(message, receipt)
        if not self._ready:
            return None
        instance_id = self._ready.popleft()
        inst = self._instances.get(instance_id)
        if inst is None or inst.status in TERMINAL or instance_id in self._busy:
            return None  # a held instance is made ready again when it is released
        if not self.partitions.owns(self.partition(instance_id)):
            return None  # the partition is being handed on: the drain takes its results
        if self._resting.get(instance_id, 0.0) > time.monotonic():
            return None  # backing off after a storage fault; ``later`` makes it ready again
        linger = inst.pending_since + self.episode_linger - time.monotonic()
        if inst.pending and len(inst.open) > len(inst.pending) and linger > 0:
            # More results are due: a moment for them to land, so one episode replays for them all.
            # The result the instance waits for last runs at once (nothing else is open).
            self.later(linger, lambda: self._ready_again(instance_id))
            return None
        events, inst.pending = inst.pending, []
        receipts, inst.receipts = inst.receipts, []
        self._busy.add(instance_id)
        return instance_id, lambda: self._try_episode(inst, events, receipts)

    def _orchestrator_loop(self) -> None:
        """One of ``max_orchestrators`` dispatchers (host.json's maxConcurrentOrchestratorFunctions):
        each takes the next start or episode of an instance no other dispatcher holds."""
        while True:
            with self._lock:
                while not self._ready and not self._starts and not self._stopping:
                    self._changed.wait()
                if self._stopping:
                    return
            with self._lock:
                picked = self._next_work()
            if picked is None:
                continue
            held, work = picked
            try:
                work()
            finally:
                if held is not None:
                    self._let_go(held)

    def _let_go(self, instance_id: str) -> None:
        with self._lock:
            self._busy.discard(instance_id)
            inst = self._instances.get(instance_id)
            # Ready again if results wait in ``pending``, or if it has not run its first episode:
            # a start marks its new instance ready while still holding it, and a dispatcher that
            # looked then passed it by.
            if inst is not None and (inst.pending or not inst.history) and inst.status not in TERMINAL:
                self._mark_ready(instance_id)

    def _try_episode(self, inst: Instance, events: list[dict], receipts: list[Received]) -> None:
        instance_id = inst.id
        try:
            outbound = self._run_episode(inst, events)
            self.backoff.succeeded(instance_id)
        except Exception:  # the host's own storage failed: the work item stays, as in DTFx
            delay = self.backoff.failed(instance_id)
            logger.warning(
                "episode of %s failed in the host; trying again in %.1f s", instance_id, delay, exc_info=True
            )
            with self._lock:
                self.stats.episode_retries += 1
                inst.pending = events + inst.pending
                inst.receipts = receipts + inst.receipts
                self._resting[instance_id] = time.monotonic() + delay
            self.later(delay, lambda: self._ready_again(instance_id))
            return
        # As the provider: the episode is committed, then what it scheduled is sent, then the
        # messages it consumed are deleted (a crash in between sends or delivers them again).
        self._send_all(outbound)
        for receipt in receipts:
            self._delete(receipt)

    def _ready_again(self, instance_id: str) -> None:
        with self._lock:
            self._resting.pop(instance_id, None)
            self._mark_ready(instance_id)

    def _timer_loop(self) -> None:
        while True:
            with self._lock:
                if self._stopping:
                    return
                if not self._timers:
                    self._changed.wait(timeout=0.5)
                    continue
                due, _, callback = self._timers[0]
                wait = due - time.monotonic()
                if wait > 0:
                    self._changed.wait(timeout=min(wait, 0.5))
                    continue
                heapq.heappop(self._timers)
            try:
                callback()
            except Exception:  # noqa: BLE001 - one timer's failure must not end the timer thread
                # An exception here used to end the thread, and with it every later timer (retry
                # delays, backoffs): the job stalled. The work is tried again shortly instead.
                logger.warning("timer callback failed; trying it again in 0.5 s", exc_info=True)
                self.later(0.5, callback)
