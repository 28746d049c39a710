"""One orchestration instance as the local host keeps it in memory, the instances it holds, and
the host's counters."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .history import PENDING, completion_task_id, iso, now


def new_execution_id() -> str:
    """Each start of an instance id is a new execution (DurableTask.Core's ExecutionId, a GUID)."""
    return uuid.uuid4().hex


@dataclass
class Instance:
    id: str
    name: str
    input: str | None
    #: ``{"id": parent id, "task_id": event id in the parent, "execution_id": the parent's execution}``
    parent: dict | None = None
    execution_id: str = field(default_factory=new_execution_id)
    #: The orchestration version stamped at creation (ExecutionStarted's ``Version``); "" unversioned.
    version: str = ""
    status: str = PENDING
    created: str = field(default_factory=lambda: iso(now()))
    updated: str = field(default_factory=lambda: iso(now()))
    output: Any = None
    error: str | None = None
    custom_status: Any = None
    history: list[dict] = field(default_factory=list)
    next_id: int = 0
    episodes: int = 0
    #: Leaf actions the shim has invoked, in invocation order (what history recorded).
    leaves: list[dict] = field(default_factory=list)
    #: Positions in ``leaves`` whose task has finished (for a retried task: its final outcome).
    finished_leaves: set[int] = field(default_factory=set)
    scheduled: dict[int, dict] = field(default_factory=dict)  # event id -> what was scheduled
    open: set[int] = field(default_factory=set)  # scheduled, no completion in history yet
    delivered: set[int] = field(default_factory=set)  # completion pending or in history
    pending: list[dict] = field(default_factory=list)  # completions waiting for the next episode
    #: time.monotonic() when the first of ``pending`` arrived.
    pending_since: float = 0.0
    #: Queue messages whose content is in ``pending`` (or made the instance): deleted once committed.
    receipts: list = field(default_factory=list)
    #: time.monotonic() when each open task was last sent (the watchdog's clock).
    dispatched: dict[int, float] = field(default_factory=dict)

    def state(self) -> dict:
        return {
            "id": self.id,
            "name": self.name,
            "input": self.input,
            "parent": self.parent,
            "execution_id": self.execution_id,
            "version": self.version,
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
            execution_id=state.get("execution_id") or new_execution_id(),
            version=state.get("version") or "",
            status=state["status"],
            created=state["created"],
            updated=state["updated"],
            output=state.get("output"),
            error=state.get("error"),
            custom_status=state.get("custom_status"),
            next_id=state.get("next_id", 0),
            episodes=state.get("episodes", 0),
        )

    def apply(self, events: list[dict], scheduled: dict, leaves: list[dict], finished: list[int]) -> None:
        """Apply one committed episode."""
        for item in events:
            item["IsPlayed"] = True
            self.history.append(item)
            task_id = completion_task_id(item)
            if task_id is not None:
                self.open.discard(task_id)
                self.delivered.add(task_id)
        for key, meta in scheduled.items():
            self.scheduled[int(key)] = meta
            self.open.add(int(key))
        self.leaves.extend(leaves)
        self.finished_leaves.update(finished)


class HeldInstances:
    """The instances this host holds in memory: those of the partitions it owns, and finished ones
    it ran or was asked about.

    Its lock is the host's one lock: whatever reads or changes an instance holds it, and so does
    any change to several parts' state at once (a partition handed on takes its instances, its
    starts and its timers together). It is reentrant, so a part holding it may call another that
    takes it too. ``changed`` wakes the dispatchers and the client's waiters."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self._by_id: dict[str, Instance] = {}

    def get(self, instance_id: str) -> Instance | None:
        with self.lock:
            return self._by_id.get(instance_id)

    def put(self, inst: Instance) -> None:
        with self.lock:
            self._by_id[inst.id] = inst

    def pop(self, instance_id: str) -> Instance | None:
        with self.lock:
            return self._by_id.pop(instance_id, None)

    def all(self) -> list[Instance]:
        with self.lock:
            return list(self._by_id.values())

    def ids(self) -> set[str]:
        with self.lock:
            return set(self._by_id)

    def take(self, chosen: Callable[[str], bool]) -> list[Instance]:
        """Remove and return the instances whose id is ``chosen``."""
        with self.lock:
            taken = [inst for key, inst in self._by_id.items() if chosen(key)]
            for inst in taken:
                del self._by_id[inst.id]
        return taken

    def wake(self) -> None:
        with self.lock:
            self.changed.notify_all()


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
    #: time.monotonic() when it started, so slot use over time can be measured.
    started: float = 0.0
    #: The worker thread the function ran on (``devhost-worker<N>-<K>``: worker N's pool).
    thread: str = ""


@dataclass
class EngineStats:
    episodes: int = 0
    replay_seconds: float = 0.0
    history_events: int = 0
    activity_executions: int = 0
    activity_failures: int = 0
    activity_timeouts: int = 0
    #: Worker processes restarted because a function passed its timeout and did not end.
    worker_restarts: int = 0
    #: Results of executions whose worker was restarted under them: the host never hears them.
    results_lost_with_worker: int = 0
    #: Functions that had not ended when their worker was restarted (reported at ERROR; a thread
    #: cannot be killed, so in a host that is not recycled each runs on).
    stuck_functions: int = 0
    #: Jobs (top-level instances) reported at ERROR for making no progress for the stated bound.
    stalled_jobs_reported: int = 0
    duplicate_completions_dropped: int = 0
    #: DurableTask.Core's "Duplicate start event": a second ExecutionStarted for a started instance.
    duplicate_starts_dropped: int = 0
    #: Of those, sub-orchestration starts from another parent task than the one the running
    #: instance reports to: that task never completes (docs/local-host.md, row 47).
    foreign_child_starts_dropped: int = 0
    #: DurableTask.Core's "ExecutionId of event does not match current executionId".
    execution_id_mismatches_dropped: int = 0
    #: Episodes not run because the instance's orchestration version is one this host may not
    #: run (versionFailureStrategy Reject): left for a host that may.
    version_rejections: int = 0
    #: Episodes the host could not commit (its own storage failed) and tried again later.
    episode_retries: int = 0
    #: Episodes whose commit had landed although its answer was lost: carried on from storage.
    episodes_found_committed: int = 0
    #: Messages for a partition this host no longer owns, sent on to its queue.
    messages_forwarded: int = 0
    #: Activities sent through the shared work-item queue (no slot of this host was free).
    work_items_sent: int = 0
    #: Activities kept in memory for a slot because this host was alone on the task hub.
    work_items_kept: int = 0
    #: Activities running here without a work item given one as their partition went to another host.
    work_items_attached: int = 0
    #: Stalled starts and unanswered tasks the watchdog sent again.
    watchdog_redispatches: int = 0
