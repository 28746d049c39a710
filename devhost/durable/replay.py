"""One orchestration episode (mixed into :class:`devhost.durable.engine.Engine`): the orchestrator
replayed through the SDK on its history, the episode planned as DTFx would
(:mod:`devhost.durable.episode`), committed (:mod:`devhost.durable.store`), and what it sends once
committed, a finished sub-orchestration's outcome to its parent included."""

from __future__ import annotations

import json
import time

from . import shim
from .episode import EpisodePlan, order_new_events, plan_episode
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
    RUNNING,
    SUB_ORCHESTRATION_COMPLETED,
    SUB_ORCHESTRATION_FAILED,
    TERMINAL,
    TERMINATED,
    completion_task_id,
    event,
    iso,
    now,
    top_level_actions,
)
from .instance import Instance
from .messaging import event_body
from .store import Episode, EpisodeAlreadyCommitted


class EpisodeRunner:
    """Runs one episode of an instance the calling dispatcher holds; uses the engine's lock,
    instances, index, store and stats."""

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
        """DTFx sends a finished sub-orchestration's outcome to its parent's execution (and wakes
        the instance's waiters, under the engine's lock, which is reentrant: callers may hold it)."""
        with self._lock:
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
