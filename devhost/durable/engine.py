"""The replay driver: runs the app's orchestrators through the real Durable SDK.

It plays the part of the Durable extension and the Durable Task Framework (DTFx) with the Azure
Storage provider. For each orchestration episode it hands the registered orchestrator the
history JSON the extension would send, walks the returned actions as the extension's shim does
(:mod:`devhost.durable.shim`: in order, awaiting each top-level action), appends the events DTFx
would append, executes the work (activities in a bounded pool, sub-orchestrations, timers,
retries), and replays again when results arrive.

The engine is its parts, each with its own state and a small interface, wired here:

- :class:`~devhost.durable.instance.HeldInstances`: the instances this host holds, under the
  host's one lock;
- :class:`~devhost.durable.dispatch.EpisodeQueue` and :class:`~devhost.durable.dispatch.Dispatcher`:
  what waits for an orchestration dispatcher, and the dispatchers;
- :class:`~devhost.durable.starts.Starts`: start messages applied;
- :class:`~devhost.durable.replay.EpisodeRunner`: one episode replayed, committed and applied;
- :class:`~devhost.durable.messaging.Messaging`: where each message goes (memory, a control
  queue, the work-item queue or a slot of this host), with the timers held in memory;
- :class:`~devhost.durable.partitions.PartitionManager` (leases) and
  :class:`~devhost.durable.handover.Handover` (what is loaded, handed on or dropped with a partition);
- :class:`~devhost.durable.work.ActivityRunner` (the activity slots) and the queue readers of
  :mod:`devhost.durable.receivers`;
- :class:`~devhost.durable.watchdog.Watchdog` and :class:`~devhost.durable.progress.ProgressWatch`;
- :class:`~devhost.durable.timers.Timers`: callbacks after a delay;
- :class:`~devhost.durable.client.TaskHubClient`: the client's operations, which the engine offers.

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

import logging
import os
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from .client import TaskHubClient
from .dispatch import EPISODE_LINGER_S, Dispatcher, EpisodeQueue
from .functions import FunctionIndex
from .handover import Handover
from .instance import ActivityExecution, EngineStats, HeldInstances
from .messaging import Messaging
from .partitions import PROVIDER_LEASE, LeaseTimings, PartitionManager
from .progress import ProgressWatch, default_stall_bound
from .receivers import ControlReader, WorkItemReader
from .replay import EpisodeRunner
from .starts import Starts
from .store import HistoryStore
from .timers import Timers
from .versioning import Versioning
from .watchdog import STALLED_START_S, WATCHDOG_INTERVAL_S, Watchdog
from .work import ActivityRunner, HostBackoff

logger = logging.getLogger(__name__)

#: Activity executions kept for inspection (tests, benchmarks); older ones are dropped.
MAX_EXECUTION_RECORDS = 200_000


def new_worker_id() -> str:
    """This host's name in the partition table: one per process, since two commands on one machine
    are two hosts. (The provider's default ``WorkerId`` is the machine name: one host a machine.)"""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def wired_partitions(parts: Any, store: HistoryStore, worker_id: str, lease: LeaseTimings) -> PartitionManager:
    """The partition manager of a host whose ``handover`` and ``messaging`` are attributes of
    ``parts`` (the engine, or a test's rig of the parts): the links are looked up when called,
    since those parts are built after the partitions they serve."""
    return PartitionManager(
        store.partition_table,
        store.queues.partitions,
        worker_id,
        acquired=lambda partition, after_crash: parts.handover.acquired(partition, after_crash),
        drain=lambda partition: parts.handover.drain(partition),
        lost=lambda partition: parts.handover.lost(partition),
        crowded=lambda: parts.messaging.crowded(),
        taken_up=lambda partition: parts.handover.taken_up(partition),
        timings=lease,
    )


class Engine:
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
        versioning: Versioning | None = None,
    ):
        self.index, self.store, self.queues = index, store, store.queues
        #: The ``durableClient`` binding's JSON for activities that take one; the host that serves
        #: the Durable HTTP API sets it (:class:`devhost.durable.host.LocalHost`).
        self.client_binding: Callable[[], str] | None = None
        self.max_activities = max_activities
        self.worker_id = worker_id or new_worker_id()
        self.stats = EngineStats()
        #: host.json's defaultVersion and version strategies (:mod:`devhost.durable.versioning`).
        self.versioning = versioning or Versioning()
        self.executions: deque[ActivityExecution] = deque(maxlen=MAX_EXECUTION_RECORDS)
        self.backoff = HostBackoff()
        self.instances = HeldInstances()
        self.timers = Timers()
        self._stopping = self._closing = False
        self.activities = ActivityRunner(
            max_activities,
            function_timeout,
            invoke=lambda name, data: self.index.invoke_activity(name, data, self.client_binding),
            deliver=lambda *outcome: self.messaging.activity_outcome(*outcome),
            freed=lambda: self.work_items.wake(),
            later=self.timers.later,
            record=self._record_activity,
            count=self._count,
            stopping=lambda: self._closing,
            recycle=on_stuck_function,
        )
        self.partitions = wired_partitions(self, store, self.worker_id, lease)
        self._build_orchestration(
            max_orchestrators, episode_linger, duplicate_activities, timer_scale, strict_determinism
        )
        stall_bound = default_stall_bound(function_timeout) if stall_report_s is None else stall_report_s
        self._build_watch(function_timeout, watchdog_interval, stalled_start_s, stall_bound)
        self._offer_client()

    def _build_orchestration(
        self, dispatchers: int, linger: float, duplicate_activities: bool, timer_scale: float, strict: bool
    ) -> None:
        """The parts that carry an orchestration: its messages, starts, episodes and dispatchers."""
        self.queue = EpisodeQueue(
            self.instances, owns=self.partitions.owns_instance, linger=linger, later=self.timers.later
        )
        self.messaging = Messaging(
            self.instances,
            self.queue,
            self.partitions,
            self.store,
            self.activities,
            backoff=self.backoff,
            later=self.timers.later,
            wake_work_items=lambda: self.work_items.wake(),
            stats=self.stats,
            duplicate_activities=duplicate_activities,
        )
        self.control = ControlReader(self.queues, self.partitions.owns, self.messaging.accept)
        self.work_items = WorkItemReader(
            self.queues,
            self.activities.free,
            self.messaging.take_work_item,
            self.activities.running_tokens,
            time.monotonic,
        )
        self.starts = Starts(self.instances, self.queue, self.store, self.stats)
        self.episodes = EpisodeRunner(
            self.instances,
            self.queue,
            self.store,
            self.index,
            work_for=self.messaging.work_for,
            stats=self.stats,
            timer_scale=timer_scale,
            strict_determinism=strict,
            versioning=self.versioning,
        )
        self.dispatcher = Dispatcher(
            self.queue,
            count=dispatchers,
            starts=self.starts,
            episodes=self.episodes,
            messaging=self.messaging,
            backoff=self.backoff,
            stats=self.stats,
            versioning=self.versioning,
        )
        self.handover = Handover(
            self.instances,
            self.queue,
            self.messaging,
            self.partitions,
            self.store,
            backoff=self.backoff,
            stopping=lambda: self._stopping,
        )

    def _offer_client(self) -> None:
        """The client's operations on the task hub, which the engine answers as its own."""
        self.client = TaskHubClient(
            self.instances, self.store, self.index, self.messaging.send, versioning=self.versioning
        )
        self.start_new = self.client.start_new
        self.terminate = self.client.terminate
        self.list_instances = self.client.list_instances
        self.purge = self.client.purge
        self.status = self.client.status
        self.wait_for = self.client.wait_for

    def _build_watch(
        self, function_timeout: float | None, interval: float, stalled_start_s: float, bound: float
    ) -> None:
        """The watchdog and the progress watch of the jobs this host runs."""
        self.progress = ProgressWatch(self.instances, self.partitions, self.store, stats=self.stats, bound=bound)
        self.watchdog = Watchdog(
            self.instances,
            self.queue,
            self.messaging,
            self.starts,
            self.progress,
            self.partitions,
            self.store,
            stats=self.stats,
            function_timeout=function_timeout,
            interval=interval,
            stalled_start_s=stalled_start_s,
        )

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Engine:
        self.backoff.call("ensure the task hub", self._ensure, lambda: self._stopping)
        self.dispatcher.start()
        self.timers.start()
        self.watchdog.start()
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
        self.messaging.crowded()  # what waits here for a slot runs on another host, or on the next one
        for token in self.activities.shutdown():
            try:
                self.queues.extend(token, 0)  # visible again at once for the other hosts
            except Exception:  # noqa: BLE001 - it shows up by itself when its visibility runs out
                logger.warning("could not hand a waiting work item back", exc_info=True)
        self.work_items.stop()
        self.partitions.stop()
        self.control.stop()
        self._stopping = True
        self.dispatcher.stop()
        self.watchdog.stop()
        self.timers.stop()

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _record_activity(self, execution: ActivityExecution) -> None:
        with self.instances.lock:
            self.stats.activity_executions += 1
            self.stats.activity_failures += execution.error is not None
            self.executions.append(execution)

    def _count(self, stat: str) -> None:
        with self.instances.lock:
            setattr(self.stats, stat, getattr(self.stats, stat) + 1)
