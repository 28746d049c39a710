"""The replay driver: runs the app's orchestrators through the real Durable SDK.

It plays the part of the Durable extension. For each orchestration episode it hands the
registered orchestrator the history JSON the extension would send, reads back the actions,
appends the events the extension would append, executes the work (activities in a bounded
pool, sub-orchestrations, timers, retries), and replays again when results arrive.

Rules of the real host it imitates:
- activities run at least once (``duplicate_activities`` runs every one twice, concurrently);
- all results available when an orchestrator goes idle are delivered in one episode;
- retries are the host's job: TaskFailed -> TimerCreated -> TimerFired -> a new TaskScheduled,
  with a timer even after the last failed attempt (the SDK waits for it);
- starting an instance id that is Pending/Running fails; a finished one is overwritten and re-run;
- instance ids: at most 256 characters, none of / \\ # ?, not starting with @;
- custom status at most 16 KB; large payloads are moved to blobs by the store;
- an orchestrator whose actions differ from what its history recorded fails loudly.

Sequence numbers: the SDK numbers tasks in the order it meets them while replaying. Retry
timers and rescheduled attempts get their numbers while the SDK processes the failure or timer
event, before user code asks for anything new; new events are therefore appended in the order
[retry failures, retry timers with attempts left, everything else], and ids are handed out in
that same order, then to the new actions in the order the SDK listed them.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from .functions import FunctionIndex
from .store import Episode, HistoryStore

logger = logging.getLogger(__name__)

# History event types (DurableTask.Core EventType).
EXECUTION_STARTED = 0
EXECUTION_COMPLETED = 1
EXECUTION_FAILED = 2
TASK_SCHEDULED = 4
TASK_COMPLETED = 5
TASK_FAILED = 6
SUB_ORCHESTRATION_CREATED = 7
SUB_ORCHESTRATION_COMPLETED = 8
SUB_ORCHESTRATION_FAILED = 9
TIMER_CREATED = 10
TIMER_FIRED = 11
ORCHESTRATOR_STARTED = 12
ORCHESTRATOR_COMPLETED = 13

# Action types (azure.durable_functions ActionType).
CALL_ACTIVITY = 0
CALL_ACTIVITY_WITH_RETRY = 1
CALL_SUB_ORCHESTRATOR = 2
CALL_SUB_ORCHESTRATOR_WITH_RETRY = 3
CREATE_TIMER = 5
WHEN_ANY = 11
WHEN_ALL = 12

PENDING, RUNNING, COMPLETED, FAILED, TERMINATED = "Pending", "Running", "Completed", "Failed", "Terminated"
TERMINAL = (COMPLETED, FAILED, TERMINATED)

MAX_INSTANCE_ID_CHARS = 256
#: Episodes that fail inside the host (not the orchestrator: e.g. storage unavailable) are retried.
EPISODE_ATTEMPTS = 3
#: Activity executions kept for inspection (tests, benchmarks); older ones are dropped.
MAX_EXECUTION_RECORDS = 200_000
MAX_CUSTOM_STATUS_BYTES = 16 * 1024
OUT_OF_PROC_MARKER = "\n\n$OutOfProcData$:"


class InstanceAlreadyExists(Exception):
    pass


class InvalidInstanceId(ValueError):
    pass


class NonDeterminismError(Exception):
    pass


def _now() -> datetime:
    return datetime.now(UTC)


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def check_instance_id(instance_id: str) -> str:
    if not instance_id or len(instance_id) > MAX_INSTANCE_ID_CHARS:
        raise InvalidInstanceId(f"instance id must be 1..{MAX_INSTANCE_ID_CHARS} characters: {instance_id!r}")
    if any(ch in instance_id for ch in "/\\#?") or instance_id.startswith("@"):
        raise InvalidInstanceId(f"instance id may not contain / \\ # ? or start with @: {instance_id!r}")
    if any(ord(ch) < 0x20 for ch in instance_id):
        raise InvalidInstanceId(f"instance id contains control characters: {instance_id!r}")
    return instance_id


def flatten_actions(actions: list) -> list[dict]:
    """The SDK's action payload as the ordered list of leaf actions (compound ones opened)."""
    flat: list[dict] = []

    def walk(action: Any) -> None:
        if isinstance(action, list):
            for item in action:
                walk(item)
        elif action.get("actionType") in (WHEN_ALL, WHEN_ANY):
            walk(action.get("compoundActions", []))
        else:
            flat.append(action)

    walk(actions)
    return flat


def _action_signature(action: dict) -> tuple:
    return (
        action.get("actionType"),
        action.get("functionName"),
        action.get("input"),
        action.get("instanceId"),
        action.get("fireAt"),
    )


@dataclass
class Instance:
    id: str
    name: str
    input: str | None
    parent: dict | None = None  # {"id": parent id, "task_id": event id in the parent}
    status: str = PENDING
    created: str = field(default_factory=lambda: _iso(_now()))
    updated: str = field(default_factory=lambda: _iso(_now()))
    output: Any = None
    error: str | None = None
    custom_status: Any = None
    history: list[dict] = field(default_factory=list)
    next_id: int = 0
    episodes: int = 0
    actions: list[dict] = field(default_factory=list)
    scheduled: dict[int, dict] = field(default_factory=dict)  # event id -> what was scheduled
    open: set[int] = field(default_factory=set)  # scheduled, no completion in history yet
    delivered: set[int] = field(default_factory=set)  # completion pending or in history
    pending: list[dict] = field(default_factory=list)  # completions waiting for the next episode

    def state(self) -> dict:
        return {
            "id": self.id,
            "name": self.name,
            "input": self.input,
            "parent": self.parent,
            "status": self.status,
            "created": self.created,
            "updated": self.updated,
            "output": self.output,
            "error": self.error,
            "custom_status": self.custom_status,
            "next_id": self.next_id,
            "episodes": self.episodes,
        }

    @classmethod
    def from_state(cls, state: dict) -> Instance:
        return cls(
            id=state["id"],
            name=state["name"],
            input=state["input"],
            parent=state.get("parent"),
            status=state["status"],
            created=state["created"],
            updated=state["updated"],
            output=state.get("output"),
            error=state.get("error"),
            custom_status=state.get("custom_status"),
            next_id=state.get("next_id", 0),
            episodes=state.get("episodes", 0),
        )


@dataclass
class ActivityExecution:
    """One execution of an activity (there may be several per scheduled task)."""

    instance_id: str
    task_id: int
    name: str
    input: Any
    result: Any
    error: str | None
    seconds: float


@dataclass
class EngineStats:
    episodes: int = 0
    replay_seconds: float = 0.0
    history_events: int = 0
    activity_executions: int = 0
    activity_failures: int = 0
    duplicate_completions_dropped: int = 0


def _completion_task_id(event: dict) -> int | None:
    kind = event["EventType"]
    if kind in (TASK_COMPLETED, TASK_FAILED, SUB_ORCHESTRATION_COMPLETED, SUB_ORCHESTRATION_FAILED):
        return event["TaskScheduledId"]
    if kind == TIMER_FIRED:
        return event["TimerId"]
    return None


class Engine:
    """Runs orchestrations and activities of one app against one task hub."""

    def __init__(
        self,
        index: FunctionIndex,
        store: HistoryStore,
        *,
        max_activities: int = 4,
        duplicate_activities: bool = False,
        timer_scale: float = 1.0,
        episode_linger: float = 0.01,
    ):
        self.index = index
        self.store = store
        self.max_activities = max_activities
        self.duplicate_activities = duplicate_activities
        self.timer_scale = timer_scale
        self.episode_linger = episode_linger
        self.stats = EngineStats()
        self.executions: deque[ActivityExecution] = deque(maxlen=MAX_EXECUTION_RECORDS)
        self._episode_errors: dict[str, int] = {}
        self._instances: dict[str, Instance] = {}
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._ready: deque[str] = deque()
        self._timers: list[tuple[float, int, str, int]] = []
        self._timer_seq = itertools.count()
        self._pool = ThreadPoolExecutor(max_activities, thread_name_prefix="activity")
        self._stopping = False
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Engine:
        self.store.ensure()
        self.recover()
        for target, name in ((self._orchestrator_loop, "orchestrator"), (self._timer_loop, "timers")):
            thread = threading.Thread(target=target, name=f"devhost-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._changed.notify_all()
        for thread in self._threads:
            thread.join(timeout=10)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ client API

    def start_new(self, name: str, instance_id: str, input_value: Any = None, *, input_json: str | None = None) -> str:
        """Start an orchestration (the client's ``start_new``); input as a value or as JSON text."""
        check_instance_id(instance_id)
        self.index.orchestrator(name)
        if input_json is None and input_value is not None:
            input_json = json.dumps(input_value)
        with self._lock:
            self._create_instance(name, instance_id, input_json, parent=None)
        return instance_id

    def status(self, instance_id: str) -> dict | None:
        with self._lock:
            inst = self._instances.get(instance_id)
            if inst is not None:
                return inst.state()
        return self.store.read_state(instance_id)

    def wait_for(
        self, instance_id: str, timeout: float | None = None, progress: Callable[[dict], None] | None = None
    ) -> dict:
        """Block until the instance is finished; returns its state."""
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

    # ------------------------------------------------------------------ instances

    def _create_instance(self, name: str, instance_id: str, input_json: str | None, parent: dict | None) -> Instance:
        existing = self._instances.get(instance_id)
        state = existing.state() if existing else self.store.read_state(instance_id)
        if state is not None:
            if state["status"] in (PENDING, RUNNING):
                raise InstanceAlreadyExists(
                    f"An Orchestration instance with the status {state['status']} already exists."
                )
            # A finished instance started again is overwritten and re-run (what the host does).
            self.store.purge(instance_id)
        inst = Instance(id=instance_id, name=name, input=input_json, parent=parent)
        self.store.write_state(instance_id, inst.state())
        self._instances[instance_id] = inst
        self._mark_ready(instance_id)
        return inst

    def _mark_ready(self, instance_id: str) -> None:
        if instance_id not in self._ready:
            self._ready.append(instance_id)
        self._changed.notify_all()

    def _deliver(self, instance_id: str, event: dict) -> None:
        with self._lock:
            inst = self._instances.get(instance_id)
            task_id = _completion_task_id(event)
            if inst is None or inst.status in TERMINAL or task_id in inst.delivered or task_id not in inst.open:
                # A second execution of an at-least-once activity (possibly landing after the
                # instance finished): the first result stands.
                self.stats.duplicate_completions_dropped += 1
                return
            inst.delivered.add(task_id)
            inst.pending.append(event)
            self._mark_ready(instance_id)

    # ------------------------------------------------------------------ recovery

    def recover(self) -> int:
        """Load unfinished instances from the store and re-dispatch their open work."""
        resumed = 0
        for state in self.store.instances():
            if state["status"] not in (PENDING, RUNNING):
                continue
            inst = Instance.from_state(state)
            for episode in self.store.episodes(inst.id):
                self._apply_episode(inst, episode)
            with self._lock:
                self._instances[inst.id] = inst
            resumed += 1
        with self._lock:
            for inst in list(self._instances.values()):
                if inst.status == PENDING or not inst.history:
                    self._mark_ready(inst.id)
                    continue
                for task_id in sorted(inst.open):
                    self._dispatch(inst, task_id, inst.scheduled[task_id])
        if resumed:
            logger.info("resumed %d unfinished instance(s) from the task hub", resumed)
        return resumed

    @staticmethod
    def _apply_episode(inst: Instance, episode: Episode) -> None:
        for event in episode.events:
            event["IsPlayed"] = True
            inst.history.append(event)
            task_id = _completion_task_id(event)
            if task_id is not None:
                inst.open.discard(task_id)
                inst.delivered.add(task_id)
        for key, meta in episode.scheduled.items():
            inst.scheduled[int(key)] = meta
            inst.open.add(int(key))
        inst.actions.extend(episode.actions)

    # ------------------------------------------------------------------ orchestrations

    def _orchestrator_loop(self) -> None:
        while True:
            with self._lock:
                while not self._ready and not self._stopping:
                    self._changed.wait()
                if self._stopping:
                    return
            if self.episode_linger:
                time.sleep(self.episode_linger)  # let results that are about to land join this episode
            with self._lock:
                if not self._ready:
                    continue
                instance_id = self._ready.popleft()
                inst = self._instances.get(instance_id)
                if inst is None or inst.status in TERMINAL:
                    continue
                events, inst.pending = inst.pending, []
            try:
                self._run_episode(inst, events)
                self._episode_errors.pop(instance_id, None)
            except Exception:  # a storage hiccup or a host bug must not stop every other instance
                with self._lock:
                    errors = self._episode_errors[instance_id] = self._episode_errors.get(instance_id, 0) + 1
                    if errors < EPISODE_ATTEMPTS:
                        # Nothing of the episode was committed: replay it with the same events.
                        logger.warning(
                            "episode of %s failed in the host (attempt %d), retrying",
                            instance_id,
                            errors,
                            exc_info=True,
                        )
                        inst.pending = events + inst.pending
                        self._mark_ready(instance_id)
                    else:
                        logger.exception("episode of %s failed %d times in the host", instance_id, errors)
                        self._finish(inst, FAILED, error="local host error:\n" + traceback.format_exc())

    def _order_new_events(self, inst: Instance, events: list[dict]) -> tuple[list[dict], list[dict], list[dict]]:
        retry_failures, retry_timers, rest = [], [], []
        for event in events:
            task_id = _completion_task_id(event)
            meta = inst.scheduled.get(task_id, {})
            if event["EventType"] in (TASK_FAILED, SUB_ORCHESTRATION_FAILED) and meta.get("retry"):
                retry_failures.append(event)
            elif (
                event["EventType"] == TIMER_FIRED
                and meta.get("retry_of")
                and (meta["retry_of"]["attempt"] < meta["retry_of"]["retry"]["maxNumberOfAttempts"])
            ):
                retry_timers.append(event)
            else:
                rest.append(event)
        return retry_failures, retry_timers, rest

    def _run_episode(self, inst: Instance, events: list[dict]) -> None:
        now = _now()
        retry_failures, retry_timers, rest = self._order_new_events(inst, events)
        new_events: list[dict] = [self._event(ORCHESTRATOR_STARTED, now)]
        if not inst.history:
            new_events.append(
                self._event(
                    EXECUTION_STARTED, now, Name=inst.name, Input=inst.input, Version="", ParentInstance=inst.parent
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
        handle = self.index.orchestrator(inst.name)
        started = time.perf_counter()
        error = None
        try:
            state = json.loads(handle(json.dumps(context)))
        except Exception as exc:  # the SDK reports a failed orchestrator as an exception
            message = str(exc)
            error, _, state_json = message.partition(OUT_OF_PROC_MARKER)
            state = json.loads(state_json) if state_json else {"actions": [], "isDone": False}
        elapsed = time.perf_counter() - started

        flat = flatten_actions(state.get("actions") or [])
        known = len(inst.actions)
        if [_action_signature(a) for a in flat[:known]] != [_action_signature(a) for a in inst.actions]:
            error = error or (
                f"Non-deterministic orchestrator {inst.name!r} ({inst.id}): its actions no longer match "
                f"the {known} recorded in history. Orchestrator code must not read the clock, random "
                "numbers or I/O."
            )
            flat = inst.actions[:]  # schedule nothing new
        new_actions = flat[known:]

        custom_status = state.get("customStatus")
        if custom_status is not None and len(json.dumps(custom_status).encode()) > MAX_CUSTOM_STATUS_BYTES:
            error = error or f"custom status of {inst.id} is over the 16 KB limit"

        scheduled: dict[int, dict] = {}
        appended: list[dict] = []
        ids = itertools.count(inst.next_id)  # committed to the instance only with the episode
        if error is None:
            for event in retry_failures:
                meta = inst.scheduled[_completion_task_id(event)]
                timer_id = next(ids)
                fire_at = now + timedelta(
                    milliseconds=meta["retry"]["firstRetryIntervalInMilliseconds"] * self.timer_scale
                )
                appended.append(self._event(TIMER_CREATED, now, EventId=timer_id, FireAt=_iso(fire_at)))
                scheduled[timer_id] = {"kind": "timer", "fire_at": _iso(fire_at), "retry_of": meta}
            for event in retry_timers:
                meta = inst.scheduled[_completion_task_id(event)]["retry_of"]
                task_id = next(ids)
                again = {**meta, "attempt": meta["attempt"] + 1}
                appended.append(self._scheduled_event(task_id, again, now))
                scheduled[task_id] = again
            for action in new_actions:
                task_id = next(ids)
                meta = self._meta_for_action(inst, action, task_id)
                appended.append(self._scheduled_event(task_id, meta, now))
                scheduled[task_id] = meta

        status = RUNNING
        output = None
        if error is not None:
            status = FAILED
            appended.append(self._event(EXECUTION_COMPLETED, now, OrchestrationStatus=3, Result=json.dumps(error)))
        elif state.get("isDone"):
            status = COMPLETED
            output = state.get("output")
            appended.append(self._event(EXECUTION_COMPLETED, now, OrchestrationStatus=1, Result=json.dumps(output)))
        appended.append(self._event(ORCHESTRATOR_COMPLETED, now))

        # The instance's fields are written only by this thread, so the new state can be built and
        # committed without the engine lock (deliveries keep flowing during the transaction).
        new_state = {
            **inst.state(),
            "episodes": inst.episodes + 1,
            "next_id": next(ids),
            "status": status,
            "output": output,
            "error": error.strip() if error else None,
            "custom_status": custom_status,
            "updated": _iso(now),
        }
        episode = Episode(
            new_state["episodes"], new_events + appended, {str(k): v for k, v in scheduled.items()}, new_actions
        )
        # Commit first: if storage fails, the instance is untouched and the episode replays.
        self.store.commit_episode(inst.id, episode, new_state)
        with self._lock:
            inst.episodes, inst.next_id = new_state["episodes"], new_state["next_id"]
            inst.status, inst.output, inst.error = status, output, new_state["error"]
            inst.custom_status, inst.updated = custom_status, new_state["updated"]
            self._apply_episode(inst, episode)
            self.stats.episodes += 1
            self.stats.replay_seconds += elapsed
            self.stats.history_events += len(new_events) + len(appended)
            if status in TERMINAL:
                self._finish(inst, status, error=inst.error, persisted=True)
            else:
                for task_id, meta in scheduled.items():
                    self._dispatch(inst, task_id, meta)
                if inst.pending:
                    self._mark_ready(inst.id)
            self._changed.notify_all()

    def _meta_for_action(self, inst: Instance, action: dict, task_id: int) -> dict:
        kind = action["actionType"]
        if kind in (CALL_ACTIVITY, CALL_ACTIVITY_WITH_RETRY):
            return {
                "kind": "activity",
                "name": action["functionName"],
                "input": action.get("input"),
                "retry": action.get("retryOptions"),
                "attempt": 1,
            }
        if kind in (CALL_SUB_ORCHESTRATOR, CALL_SUB_ORCHESTRATOR_WITH_RETRY):
            child = action.get("instanceId") or f"{inst.id}:{task_id:04d}"
            check_instance_id(child)
            return {
                "kind": "suborchestration",
                "name": action["functionName"],
                "input": action.get("input"),
                "instance_id": child,
                "retry": action.get("retryOptions"),
                "attempt": 1,
            }
        if kind == CREATE_TIMER:
            return {"kind": "timer", "fire_at": action["fireAt"]}
        raise NonDeterminismError(f"the local host does not support action type {kind}: {action}")

    def _scheduled_event(self, task_id: int, meta: dict, now: datetime) -> dict:
        if meta["kind"] == "activity":
            return self._event(TASK_SCHEDULED, now, EventId=task_id, Name=meta["name"], Input=meta["input"])
        if meta["kind"] == "suborchestration":
            return self._event(
                SUB_ORCHESTRATION_CREATED,
                now,
                EventId=task_id,
                Name=meta["name"],
                InstanceId=meta["instance_id"],
                Input=meta["input"],
            )
        return self._event(TIMER_CREATED, now, EventId=task_id, FireAt=meta["fire_at"])

    @staticmethod
    def _event(kind: int, moment: datetime, EventId: int = -1, **fields: Any) -> dict:
        return {"EventType": kind, "EventId": EventId, "IsPlayed": False, "Timestamp": _iso(moment), **fields}

    def _finish(self, inst: Instance, status: str, *, error: str | None = None, persisted: bool = False) -> None:
        inst.status = status
        if not persisted:
            inst.error = error
            inst.updated = _iso(_now())
            self.store.write_state(inst.id, inst.state())
        if inst.parent:
            now = _now()
            if status == COMPLETED:
                event = self._event(
                    SUB_ORCHESTRATION_COMPLETED,
                    now,
                    TaskScheduledId=inst.parent["task_id"],
                    Result=json.dumps(inst.output),
                )
            else:
                event = self._event(
                    SUB_ORCHESTRATION_FAILED,
                    now,
                    TaskScheduledId=inst.parent["task_id"],
                    Reason=f"Sub-orchestration {inst.id} failed: {error}",
                    Details=None,
                )
            self._deliver(inst.parent["id"], event)
        self._changed.notify_all()

    # ------------------------------------------------------------------ work

    def _dispatch(self, inst: Instance, task_id: int, meta: dict) -> None:
        if meta["kind"] == "activity":
            copies = 2 if self.duplicate_activities else 1
            for _ in range(copies):
                self._pool.submit(self._run_activity, inst.id, task_id, meta["name"], meta["input"])
        elif meta["kind"] == "timer":
            fire_at = datetime.fromisoformat(meta["fire_at"].replace("Z", "+00:00"))
            delay = max(0.0, (fire_at - _now()).total_seconds())
            heapq.heappush(self._timers, (time.monotonic() + delay, next(self._timer_seq), inst.id, task_id))
            self._changed.notify_all()
        elif meta["kind"] == "suborchestration":
            self._start_child(inst, task_id, meta)

    def _start_child(self, parent: Instance, task_id: int, meta: dict) -> None:
        child_id = meta["instance_id"]
        # "run" tells this run of the parent from an earlier, overwritten one with the same id.
        link = {"id": parent.id, "task_id": task_id, "run": parent.created}
        existing = self._instances.get(child_id)
        state = existing.state() if existing else self.store.read_state(child_id)
        if state is not None and state.get("parent") == link:
            if state["status"] in (PENDING, RUNNING):
                return  # already running for this parent (recovered); it reports when done
            if state["status"] in TERMINAL and existing is None:
                # Finished before the host stopped, but the parent never heard: tell it now.
                inst = Instance.from_state(state)
                self._instances[child_id] = inst
                self._finish(inst, inst.status, error=inst.error, persisted=True)
                return
        self._create_instance(meta["name"], child_id, meta["input"], parent=link)

    def _run_activity(self, instance_id: str, task_id: int, name: str, input_json: str | None) -> None:
        if self._stopping:
            return
        started = time.perf_counter()
        result = error = None
        try:
            result = self.index.invoke_activity(name, input_json)
            event = self._event(TASK_COMPLETED, _now(), TaskScheduledId=task_id, Result=result)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            logger.warning("activity %s (%s #%d) failed: %s", name, instance_id, task_id, error)
            event = self._event(
                TASK_FAILED, _now(), TaskScheduledId=task_id, Reason=error, Details=traceback.format_exc()
            )
        seconds = time.perf_counter() - started
        with self._lock:
            self.stats.activity_executions += 1
            self.stats.activity_failures += error is not None
            self.executions.append(
                ActivityExecution(
                    instance_id,
                    task_id,
                    name,
                    json.loads(input_json) if input_json else None,
                    json.loads(result) if result else None,
                    error,
                    seconds,
                )
            )
        self._deliver(instance_id, event)

    def _timer_loop(self) -> None:
        while True:
            with self._lock:
                if self._stopping:
                    return
                if not self._timers:
                    self._changed.wait(timeout=0.5)
                    continue
                due, _, instance_id, timer_id = self._timers[0]
                wait = due - time.monotonic()
                if wait > 0:
                    self._changed.wait(timeout=min(wait, 0.5))
                    continue
                heapq.heappop(self._timers)
                inst = self._instances.get(instance_id)
                fire_at = inst.scheduled[timer_id]["fire_at"] if inst else _iso(_now())
            self._deliver(instance_id, self._event(TIMER_FIRED, _now(), TimerId=timer_id, FireAt=fire_at))
