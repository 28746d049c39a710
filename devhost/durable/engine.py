"""The replay driver: runs the app's orchestrators through the real Durable SDK.

It plays the part of the Durable extension and the Durable Task Framework (DTFx) with the Azure
Storage provider. For each orchestration episode it hands the registered orchestrator the
history JSON the extension would send, walks the returned actions as the extension's shim does
(:mod:`devhost.durable.shim`: in order, awaiting each top-level action), appends the events DTFx
would append, executes the work (activities in a bounded pool, sub-orchestrations, timers,
retries), and replays again when results arrive.

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
  executions in that worker lose their results and fail at their own timeouts;
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
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from azure.core.exceptions import ResourceNotFoundError

from . import shim
from .episode import EpisodePlan, order_new_events, plan_episode
from .functions import FunctionIndex
from .handover import STALLED_START_S, WATCHDOG_INTERVAL_S, PartitionHandover
from .history import (
    COMPLETED,
    EXECUTION_COMPLETED,
    EXECUTION_STARTED,
    EXECUTION_TERMINATED,
    FAILED,
    ORCHESTRATION_STATUS_CODE,
    ORCHESTRATOR_COMPLETED,
    ORCHESTRATOR_STARTED,
    OUT_OF_PROC_MARKER,
    PENDING,
    RUNNING,
    SUB_ORCHESTRATION_COMPLETED,
    SUB_ORCHESTRATION_FAILED,
    TERMINAL,
    TERMINATED,
    InstanceAlreadyExists,
    InstanceFinished,
    InstanceNotFound,
    check_instance_id,
    completion_task_id,
    event,
    iso,
    now,
    top_level_actions,
)
from .instance import ActivityExecution, EngineStats, Instance, new_execution_id
from .messaging import Messaging, event_body, start_body
from .partitions import PROVIDER_LEASE, LeaseTimings, PartitionManager
from .queues import Received
from .receivers import ControlReader, WorkItemReader
from .store import Episode, EpisodeAlreadyCommitted, HistoryStore
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


class Engine(Messaging, PartitionHandover):
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
        )
        self.partitions = PartitionManager(
            store.partition_table,
            self.partition_count,
            self.worker_id,
            acquired=self._acquired,
            drain=self._drain,
            lost=self._lost,
            crowded=self._crowded,
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

    # ------------------------------------------------------------------ client API

    def start_new(self, name: str, instance_id: str, input_value: Any = None, *, input_json: str | None = None) -> str:
        """The client's ``start_new``, in the Azure Storage provider's steps
        (AzureStorageOrchestrationService.CreateTaskOrchestrationAsync): read the instance row;
        refuse if it is Pending/Running; queue the ExecutionStarted message; then write the row,
        create-only for a new id (a conflict from a concurrent starter is ignored). So starters
        that race on a new id all succeed; the host drops the later ExecutionStarted."""
        check_instance_id(instance_id)
        self.index.orchestrator(name)
        if input_json is None and input_value is not None:
            input_json = json.dumps(input_value)
        existing, etag = self.store.read_state_and_etag(instance_id)
        if existing is not None and existing["status"] in (PENDING, RUNNING):
            raise InstanceAlreadyExists(
                f"An Orchestration instance with the status {existing['status']} already exists."
            )
        message = StartMessage(name, instance_id, input_json, None, new_execution_id())
        self._send(instance_id, start_body(message))
        row = Instance(instance_id, name, input_json, execution_id=message.execution_id).state()
        self.store.write_new_state(instance_id, row, etag)
        with self._lock:
            finished = self._instances.get(instance_id)
            if finished is not None and finished.status in TERMINAL:
                del self._instances[instance_id]  # its status is the new row's now (Pending)
        return instance_id

    def terminate(self, instance_id: str, reason: str) -> None:
        """The client's ``terminate``: an ExecutionTerminated message to the instance's current
        execution (AzureStorageOrchestrationService.ForceTerminateTaskOrchestrationAsync sends it
        to the control queue; the extension's HttpApiHandler answers 404 for an unknown id and 410
        for a finished one before it sends anything). Its activities already queued still run;
        their results reach a finished instance and are dropped."""
        state = self.status(instance_id)
        if state is None:
            raise InstanceNotFound(f"No instance with ID '{instance_id}' found.")
        if state["status"] in TERMINAL:
            raise InstanceFinished(f"Instance '{instance_id}' is already {state['status']}.")
        item = event(EXECUTION_TERMINATED, now(), Input=json.dumps(reason))
        self._send(instance_id, event_body(instance_id, state["execution_id"], item))

    def list_instances(
        self,
        *,
        created_from: str | None = None,
        created_to: str | None = None,
        statuses: tuple[str, ...] = (),
        prefix: str | None = None,
    ) -> list[dict]:
        """The instances matching the query, oldest first (the Instances table's order is the
        provider's; ours is by creation time, then id, so a page boundary is stable)."""
        try:
            stored = self.store.instances()
        except ResourceNotFoundError:  # no instance has ever run in this task hub
            return []
        with self._lock:  # an instance this host runs is newer in memory than in its row
            states = [self._instances[s["id"]].state() if s["id"] in self._instances else s for s in stored]
        chosen = [
            s
            for s in states
            if (created_from is None or s["created"] >= created_from)
            and (created_to is None or s["created"] <= created_to)
            and (not statuses or s["status"] in statuses)
            and (prefix is None or s["id"].startswith(prefix))
        ]
        return sorted(chosen, key=lambda s: (s["created"], s["id"]))

    def purge(self, instance_id: str) -> int:
        """The client's ``purge_instance_history``: the instance's rows and large-message blobs
        are deleted, whatever its state (AzureTableTrackingStore.PurgeInstanceHistoryAsync does not
        look at it; callers purge finished instances). How many instances were deleted: 0 or 1."""
        if self.status(instance_id) is None:
            return 0
        self.store.purge_history(instance_id)
        with self._lock:
            self._instances.pop(instance_id, None)
        return 1

    def status(self, instance_id: str) -> dict | None:
        with self._lock:
            inst = self._instances.get(instance_id)
            if inst is not None:
                return inst.state()
        return self.store.read_state(instance_id)

    def wait_for(
        self, instance_id: str, timeout: float | None = None, progress: Callable[[dict], None] | None = None
    ) -> dict:
        """Block until the instance is finished (on whichever host runs it); returns its state."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                state = self.status(instance_id)
                if state is not None and state["status"] in TERMINAL:
                    return state
                if progress and state is not None:
                    progress(state)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"instance {instance_id} not finished after {timeout} s")
                self._changed.wait(timeout=0.5 if remaining is None else min(0.5, remaining))

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
            logger.info("dropping a duplicate start event for %s", message.instance_id)
            return [], None
        stored = None if current is not None else self.store.read_state(message.instance_id)
        if (
            stored is not None
            and message.parent
            and stored.get("parent") == message.parent
            and stored["status"] in TERMINAL
        ):
            # The child finished before the host stopped, but its parent never heard: tell it now.
            finished = Instance.from_state(stored)
            with self._lock:
                self._instances[finished.id] = finished
            return [self._report_to_parent(finished)], None
        if stored is not None or current is not None:
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

    def _run_episode(self, inst: Instance, events: list[dict]) -> list[tuple]:
        """Replay, plan and commit one episode; what it sends (``_send_all``) once committed."""
        moment = now()
        ordered = order_new_events(inst, events)
        retry_failures, retry_timers, rest = ordered
        new_events: list[dict] = [event(ORCHESTRATOR_STARTED, moment)]
        if not inst.history:
            new_events.append(
                event(
                    EXECUTION_STARTED, moment, Name=inst.name, Input=inst.input, Version="", ParentInstance=inst.parent
                )
            )
        new_events += retry_failures + retry_timers + rest

        context = {
            "history": inst.history + new_events,
            "instanceId": inst.id,
            "isReplaying": bool(inst.history),
            "parentInstanceId": inst.parent["id"] if inst.parent else None,
            "input": inst.input,
            "upperSchemaVersion": 1,
            "upperSchemaVersionNew": 2,
        }
        terminated = next((e for e in events if e["EventType"] == EXECUTION_TERMINATED), None)
        started = time.perf_counter()
        error = None
        if terminated is not None:
            # TaskOrchestrationContext.HandleExecutionTerminatedEvent: the execution ends Terminated
            # with the reason as its output, and nothing the orchestrator would do is scheduled.
            state = {
                "actions": [],
                "isDone": True,
                "output": json.loads(terminated["Input"]),
                "customStatus": inst.custom_status,
            }
        else:
            try:
                state = json.loads(self.index.orchestrator(inst.name)(json.dumps(context)))
            except Exception as exc:  # the SDK reports a failed orchestrator as an exception
                message, _, state_json = str(exc).partition(OUT_OF_PROC_MARKER)
                state = json.loads(state_json) if state_json else {"actions": [], "isDone": False}
                error = shim.orchestrator_failure(inst.name, state.get("error") or message)
        elapsed = time.perf_counter() - started

        custom_status = state.get("customStatus")
        too_big = shim.custom_status_error(custom_status)
        if terminated is not None:
            plan = EpisodePlan([], {}, [], [], inst.next_id)
        elif too_big:
            # The extension rejects it in SetCustomStatus, before it replays any action.
            plan = EpisodePlan([], {}, [], [], inst.next_id)
            error, custom_status = shim.orchestrator_failure(inst.name, too_big), inst.custom_status
        else:
            plan = plan_episode(
                inst,
                moment,
                ordered,
                top_level_actions(state),
                timer_scale=self.timer_scale,
                strict=self.strict_determinism,
            )
            if plan.nondeterminism:  # DTFx fails the instance during replay: nothing new is scheduled
                error = shim.orchestrator_failure(inst.name, plan.nondeterminism)

        status, output = RUNNING, None
        appended = plan.appended
        if error is not None:
            status = FAILED
        elif state.get("isDone"):
            status, output = TERMINATED if terminated is not None else COMPLETED, state.get("output")
        if status in TERMINAL:
            result = json.dumps(error if status == FAILED else output)
            code = ORCHESTRATION_STATUS_CODE[status]
            appended.append(event(EXECUTION_COMPLETED, moment, OrchestrationStatus=code, Result=result))
        appended.append(event(ORCHESTRATOR_COMPLETED, moment))

        # Only the dispatcher holding this instance writes its fields, so the new state can be built and
        # committed without the engine lock (deliveries keep flowing during the transaction).
        new_state = {
            **inst.state(),
            "episodes": inst.episodes + 1,
            "next_id": plan.next_id,
            "status": status,
            "output": output,
            "error": error.strip() if error else None,
            "custom_status": custom_status,
            "updated": iso(moment),
        }
        episode = Episode(
            new_state["episodes"],
            new_events + appended,
            {str(k): v for k, v in plan.scheduled.items()},
            plan.new_leaves,
            plan.finished,
            inst.execution_id,
        )
        try:
            # Commit first: if storage fails, the instance is untouched and the episode replays.
            self.store.commit_episode(inst.id, episode, new_state)
        except EpisodeAlreadyCommitted:
            # An earlier attempt was committed although its answer was lost: carry on from storage.
            episode, new_state = self.store.read_episode(inst.id, episode.number), self.store.read_state(inst.id)
            self._requeue_undelivered(inst, events, episode)
            with self._lock:
                self.stats.episodes_found_committed += 1
        outbound: list[tuple] = []
        with self._lock:
            inst.episodes, inst.next_id = new_state["episodes"], new_state["next_id"]
            inst.status, inst.output, inst.error = new_state["status"], new_state["output"], new_state["error"]
            inst.custom_status, inst.updated = new_state["custom_status"], new_state["updated"]
            inst.apply(episode.events, episode.scheduled, episode.actions, episode.finished)
            self.stats.episodes += 1
            self.stats.replay_seconds += elapsed
            self.stats.history_events += len(episode.events)
            # DTFx sends every decision of the episode, also when the orchestrator failed in it.
            for task_id, meta in sorted((int(k), v) for k, v in episode.scheduled.items()):
                outbound += self._work_for(inst, task_id, meta)
                inst.dispatched[task_id] = time.monotonic()
            if inst.status in TERMINAL:
                outbound.append(self._report_to_parent(inst))
            elif inst.pending:
                self._mark_ready(inst.id)
            self._changed.notify_all()
        return outbound

    def _requeue_undelivered(self, inst: Instance, events: list[dict], committed: Episode) -> None:
        landed = {completion_task_id(e) for e in committed.events} - {None}
        with self._lock:
            inst.pending = [e for e in events if completion_task_id(e) not in landed] + inst.pending

    def _report_to_parent(self, inst: Instance) -> tuple | None:
        """DTFx sends a finished sub-orchestration's outcome to its parent's execution."""
        self._changed.notify_all()
        if not inst.parent:
            return None
        moment = now()
        if inst.status == COMPLETED:
            item = event(
                SUB_ORCHESTRATION_COMPLETED,
                moment,
                TaskScheduledId=inst.parent["task_id"],
                Result=json.dumps(inst.output),
            )
        else:
            # SubOrchestrationInstanceFailed carries the child's result: its failure message, or
            # the reason it was terminated (TaskOrchestrationDispatcher sends the same event for both).
            item = event(
                SUB_ORCHESTRATION_FAILED,
                moment,
                TaskScheduledId=inst.parent["task_id"],
                Reason=inst.error if inst.status == FAILED else json.dumps(inst.output),
                Details=None,
            )
        parent = inst.parent["id"]
        return ("control", parent, event_body(parent, inst.parent["execution_id"], item), 0.0)

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
