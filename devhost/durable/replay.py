"""One orchestration episode: the orchestrator replayed through the SDK on its history, the
episode planned as DTFx would (:mod:`devhost.durable.episode`), committed
(:mod:`devhost.durable.store`), and what it sends once committed, a finished sub-orchestration's
outcome to its parent included."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from . import shim
from .episode import EpisodePlan, order_new_events, plan_episode
from .history import (
    COMPLETED,
    CONTINUE_AS_NEW,
    CONTINUED_AS_NEW,
    EXECUTION_COMPLETED,
    EXECUTION_STARTED,
    EXECUTION_TERMINATED,
    FAILED,
    ORCHESTRATION_STATUS_CODE,
    ORCHESTRATOR_COMPLETED,
    ORCHESTRATOR_STARTED,
    OUT_OF_PROC_MARKER,
    RUNNING,
    SUB_ORCHESTRATION_COMPLETED,
    SUB_ORCHESTRATION_FAILED,
    TERMINAL,
    TERMINATED,
    completion_task_id,
    continue_as_new_action,
    event,
    iso,
    now,
    top_level_actions,
)
from .instance import EngineStats, HeldInstances, Instance, new_execution_id
from .messaging import Outbound, event_body, start_body
from .store import Episode, EpisodeAlreadyCommitted, HistoryStore
from .versioning import VERSION_MISMATCH, Versioning
from .work import StartMessage

if TYPE_CHECKING:
    from .dispatch import EpisodeQueue
    from .functions import FunctionIndex

#: The messages that carry out one scheduled task (:meth:`devhost.durable.messaging.Messaging.work_for`).
WorkFor = Callable[[Instance, int, dict], list[Outbound]]


def report_to_parent(inst: Instance) -> Outbound:
    """The message DTFx sends a finished sub-orchestration's parent execution with its outcome."""
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


def continue_as_new(inst: Instance) -> Outbound:
    """The start of the execution that goes on from one ended by ``continue_as_new``: the same
    instance, name, parent and version (DTFx's ContinueAsNewOrchestratorAction keeps the version
    unless it names a new one, which the Python SDK's ``continue_as_new`` never does), a new
    execution id, the new input (``inst.output`` until then).

    DTFx starts it in the same work item as the episode that asked for it, so no client ever
    sees the gap; here it is a start message to the instance's own partition, applied by
    :class:`devhost.durable.starts.Starts` like any start (the ended execution's history goes).
    Until it lands the instance reads ContinuedAsNew, which every caller treats as live."""
    message = StartMessage(inst.name, inst.id, inst.output, inst.parent, new_execution_id(), version=inst.version)
    return ("control", inst.id, start_body(message), 0.0)


class EpisodeRunner:
    """Runs one episode of an instance a dispatcher holds: replays the app's orchestrator
    (``index``), commits the episode (``store``), applies it to the instance in memory and says
    what it sends (``work_for`` each task it scheduled, the report to a parent)."""

    def __init__(
        self,
        instances: HeldInstances,
        queue: EpisodeQueue,
        store: HistoryStore,
        index: FunctionIndex,
        *,
        work_for: WorkFor,
        stats: EngineStats,
        timer_scale: float = 1.0,
        strict_determinism: bool = False,
        versioning: Versioning | None = None,
    ):
        self.instances, self.queue, self.store, self.index = instances, queue, store, index
        self.work_for, self.stats = work_for, stats
        self.timer_scale = timer_scale
        #: Stricter than the real host (which compares only kind and name): also inputs and ids.
        self.strict_determinism = strict_determinism
        self.versioning = versioning or Versioning()

    def run(self, inst: Instance, events: list[dict]) -> list[Outbound]:
        """Replay, plan and commit one episode; what it sends (``Messaging.send_all``) once committed."""
        moment = now()
        ordered = order_new_events(inst, events)
        retry_failures, retry_timers, rest = ordered
        new_events: list[dict] = [event(ORCHESTRATOR_STARTED, moment)]
        if not inst.history:
            new_events.append(
                event(
                    EXECUTION_STARTED,
                    moment,
                    Name=inst.name,
                    Input=inst.input,
                    Version=inst.version,
                    ParentInstance=inst.parent,
                )
            )
        new_events += retry_failures + retry_timers + rest
        terminated = next((e for e in events if e["EventType"] == EXECUTION_TERMINATED), None)
        started = time.perf_counter()
        state, error = self._replay(inst, new_events, terminated)
        elapsed = time.perf_counter() - started
        plan, error, custom_status = self._plan(inst, moment, ordered, state, error, terminated)
        status, output = self._ending(plan, state, error, terminated, moment)
        # Only the dispatcher holding this instance writes its fields, so the new state can be built and
        # committed without the host's lock (deliveries keep flowing during the transaction).
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
            new_events + plan.appended,
            {str(k): v for k, v in plan.scheduled.items()},
            plan.new_leaves,
            plan.finished,
            inst.execution_id,
        )
        episode, new_state = self._commit(inst, events, episode, new_state)
        return self._apply(inst, episode, new_state, elapsed)

    def _replay(self, inst: Instance, new_events: list[dict], terminated: dict | None) -> tuple[dict, str | None]:
        """The orchestrator's answer to its history (the SDK's state JSON), and its failure if it failed."""
        if self.versioning.fails(inst.version):
            # TaskOrchestrationDispatcher (versionFailureStrategy Fail): the orchestrator is not
            # run; the episode completes the instance Failed with a VersionMismatch.
            return {"actions": [], "isDone": False}, VERSION_MISMATCH
        if terminated is not None:
            # TaskOrchestrationContext.HandleExecutionTerminatedEvent: the execution ends Terminated
            # with the reason as its output, and nothing the orchestrator would do is scheduled.
            state = {
                "actions": [],
                "isDone": True,
                "output": json.loads(terminated["Input"]),
                "customStatus": inst.custom_status,
            }
            return state, None
        context = {
            "history": inst.history + new_events,
            "instanceId": inst.id,
            "isReplaying": bool(inst.history),
            "parentInstanceId": inst.parent["id"] if inst.parent else None,
            "input": inst.input,
            "upperSchemaVersion": 1,
            "upperSchemaVersionNew": 2,
        }
        try:
            return json.loads(self.index.orchestrator(inst.name)(json.dumps(context))), None
        except Exception as exc:  # the SDK reports a failed orchestrator as an exception
            message, _, state_json = str(exc).partition(OUT_OF_PROC_MARKER)
            state = json.loads(state_json) if state_json else {"actions": [], "isDone": False}
            return state, shim.orchestrator_failure(inst.name, state.get("error") or message)

    def _plan(
        self,
        inst: Instance,
        moment: datetime,
        ordered: tuple[list[dict], list[dict], list[dict]],
        state: dict,
        error: str | None,
        terminated: dict | None,
    ) -> tuple[EpisodePlan, str | None, Any]:
        """What the episode appends and schedules; the failure, and the custom status it keeps."""
        custom_status = state.get("customStatus")
        too_big = shim.custom_status_error(custom_status)
        if terminated is not None or error == VERSION_MISMATCH:
            return EpisodePlan([], {}, [], [], inst.next_id), error, custom_status
        if too_big:
            # The extension rejects it in SetCustomStatus, before it replays any action.
            return (
                EpisodePlan([], {}, [], [], inst.next_id),
                shim.orchestrator_failure(inst.name, too_big),
                inst.custom_status,
            )
        # continue_as_new is no task: it ends the execution (:meth:`_ending`), and the new one's
        # start is sent once the episode is committed (:meth:`_apply`).
        tasks = [a for a in top_level_actions(state) if a.get("actionType") != CONTINUE_AS_NEW]
        plan = plan_episode(
            inst,
            moment,
            ordered,
            tasks,
            timer_scale=self.timer_scale,
            strict=self.strict_determinism,
            default_version=self.versioning.default_version,
        )
        if plan.nondeterminism:  # DTFx fails the instance during replay: nothing new is scheduled
            error = shim.orchestrator_failure(inst.name, plan.nondeterminism)
        return plan, error, custom_status

    @staticmethod
    def _ending(
        plan: EpisodePlan, state: dict, error: str | None, terminated: dict | None, moment: datetime
    ) -> tuple[str, Any]:
        """The instance's status and output after the episode; the events that end it are appended."""
        status, output = RUNNING, None
        continued = continue_as_new_action(state)
        if error is not None:
            status = FAILED
        elif continued is not None and terminated is None:
            # DTFx TaskOrchestrationDispatcher: the execution completes as ContinuedAsNew with the
            # new input as its result, and a new execution of the same instance starts with it.
            status, output = CONTINUED_AS_NEW, continued.get("input")
        elif state.get("isDone"):
            status, output = TERMINATED if terminated is not None else COMPLETED, state.get("output")
        if status == CONTINUED_AS_NEW:
            code = ORCHESTRATION_STATUS_CODE[status]
            plan.appended.append(event(EXECUTION_COMPLETED, moment, OrchestrationStatus=code, Result=output))
        elif status in TERMINAL:
            result = json.dumps(error if status == FAILED else output)
            code = ORCHESTRATION_STATUS_CODE[status]
            plan.appended.append(event(EXECUTION_COMPLETED, moment, OrchestrationStatus=code, Result=result))
        plan.appended.append(event(ORCHESTRATOR_COMPLETED, moment))
        return status, output

    def _commit(self, inst: Instance, events: list[dict], episode: Episode, new_state: dict) -> tuple[Episode, dict]:
        """Commit first: if storage fails, the instance is untouched and the episode replays."""
        try:
            self.store.commit_episode(inst.id, episode, new_state)
        except EpisodeAlreadyCommitted:
            # An earlier attempt was committed although its answer was lost: carry on from storage.
            episode, stored = self.store.read_episode(inst.id, episode.number), self.store.read_state(inst.id)
            assert stored is not None  # the state row is written in one transaction with the episode's
            new_state = stored
            self._requeue_undelivered(inst, events, episode)
            with self.instances.lock:
                self.stats.episodes_found_committed += 1
        return episode, new_state

    def _apply(self, inst: Instance, episode: Episode, new_state: dict, elapsed: float) -> list[Outbound]:
        """The committed episode applied to the instance in memory; what it sends."""
        outbound: list[Outbound] = []
        with self.instances.lock:
            inst.episodes, inst.next_id = new_state["episodes"], new_state["next_id"]
            inst.status, inst.output, inst.error = new_state["status"], new_state["output"], new_state["error"]
            inst.custom_status, inst.updated = new_state["custom_status"], new_state["updated"]
            inst.apply(episode.events, episode.scheduled, episode.actions, episode.finished)
            self.stats.episodes += 1
            self.stats.replay_seconds += elapsed
            self.stats.history_events += len(episode.events)
            # DTFx sends every decision of the episode, also when the orchestrator failed in it.
            for task_id, meta in sorted((int(k), v) for k, v in episode.scheduled.items()):
                outbound += self.work_for(inst, task_id, meta)
                inst.dispatched[task_id] = time.monotonic()
            if inst.status in TERMINAL:
                outbound.append(report_to_parent(inst))
            elif inst.status == CONTINUED_AS_NEW:
                outbound.append(continue_as_new(inst))
            elif inst.pending:
                self.queue.mark_ready(inst.id)
            self.instances.changed.notify_all()
        return outbound

    def _requeue_undelivered(self, inst: Instance, events: list[dict], committed: Episode) -> None:
        landed = {completion_task_id(e) for e in committed.events} - {None}
        with self.instances.lock:
            inst.pending = [e for e in events if completion_task_id(e) not in landed] + inst.pending
