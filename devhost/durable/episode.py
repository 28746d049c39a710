"""What one orchestration episode appends to history and schedules, as DTFx would, before the
engine commits it: retry timers and re-attempts first (numbered while the failure or timer is
processed), then the leaf actions the extension's shim reaches (:mod:`devhost.durable.shim`)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import datetime, timedelta

from . import shim
from .history import (
    CALL_ACTIVITY,
    CALL_ACTIVITY_WITH_RETRY,
    CALL_SUB_ORCHESTRATOR,
    CALL_SUB_ORCHESTRATOR_WITH_RETRY,
    CREATE_TIMER,
    SUB_ORCHESTRATION_CREATED,
    SUB_ORCHESTRATION_FAILED,
    TASK_FAILED,
    TASK_SCHEDULED,
    TIMER_CREATED,
    TIMER_FIRED,
    check_instance_id,
    completion_task_id,
    event,
    iso,
    parse_iso,
)
from .instance import Instance


class UnsupportedAction(Exception):
    pass


@dataclass
class EpisodePlan:
    appended: list[dict]
    scheduled: dict[int, dict]
    new_leaves: list[dict]
    finished: list[int]
    next_id: int
    #: DTFx's complaint if replay disagreed with history (then nothing is scheduled).
    nondeterminism: str | None = None


def _scheduled_meta(inst: Instance, item: dict) -> dict:
    """What the host keeps about the task ``item`` completes; empty if it completes none (or one
    not scheduled here). Retry failures and retry timers are sorted out by what it holds, so it
    holds something for them."""
    task_id = completion_task_id(item)
    return inst.scheduled.get(task_id, {}) if task_id is not None else {}


def order_new_events(inst: Instance, events: list[dict]) -> tuple[list[dict], list[dict], list[dict]]:
    """[retry failures, retry timers with attempts left, everything else]: the order in which the
    SDK numbers the tasks these events make, so history is appended in that order too."""
    retry_failures, retry_timers, rest = [], [], []
    for item in events:
        meta = _scheduled_meta(inst, item)
        retry_of = meta.get("retry_of")
        if item["EventType"] in (TASK_FAILED, SUB_ORCHESTRATION_FAILED) and meta.get("retry"):
            retry_failures.append(item)
        elif (
            item["EventType"] == TIMER_FIRED
            and retry_of
            and retry_of["attempt"] < retry_of["retry"]["maxNumberOfAttempts"]
        ):
            retry_timers.append(item)
        else:
            rest.append(item)
    return retry_failures, retry_timers, rest


def plan_episode(
    inst: Instance,
    moment: datetime,
    ordered: tuple[list[dict], list[dict], list[dict]],
    top_level: list[dict],
    *,
    timer_scale: float = 1.0,
    strict: bool = False,
    default_version: str = "",
) -> EpisodePlan:
    retry_failures, retry_timers, rest = ordered
    scheduled: dict[int, dict] = {}
    appended: list[dict] = []
    finished: list[int] = []
    ids = itertools.count(inst.next_id)  # committed to the instance only with the episode
    for item in retry_failures:
        meta = _scheduled_meta(inst, item)
        delay = shim.retry_delay(meta["retry"], meta["attempt"], parse_iso(meta["first_attempt_at"]), moment)
        if delay is None:  # the retry timeout has passed: the failure is final, no timer
            finished.append(meta["leaf"])
            continue
        timer_id = next(ids)
        fire_at = moment + timedelta(seconds=delay.total_seconds() * timer_scale)
        appended.append(event(TIMER_CREATED, moment, EventId=timer_id, FireAt=iso(fire_at)))
        scheduled[timer_id] = {"kind": "timer", "fire_at": iso(fire_at), "retry_of": meta, "leaf": meta["leaf"]}
    for item in retry_timers:
        meta = _scheduled_meta(inst, item)["retry_of"]
        task_id = next(ids)
        again = {**meta, "attempt": meta["attempt"] + 1}
        appended.append(scheduled_event(task_id, again, moment))
        scheduled[task_id] = again
    for item in rest:
        meta = _scheduled_meta(inst, item)
        if "leaf" in meta:
            finished.append(meta["leaf"])
    done = inst.finished_leaves | set(finished)
    walk = shim.replay_actions(top_level, inst.leaves, done.__contains__, strict=strict)
    if walk.nondeterminism:
        return EpisodePlan([], {}, [], [], inst.next_id, walk.nondeterminism)
    for offset, action in enumerate(walk.new_leaves):
        task_id = next(ids)
        meta = meta_for_action(inst, action, task_id, len(inst.leaves) + offset, moment, default_version)
        appended.append(scheduled_event(task_id, meta, moment))
        scheduled[task_id] = meta
    return EpisodePlan(appended, scheduled, walk.new_leaves, finished, next(ids))


def meta_for_action(
    inst: Instance, action: dict, task_id: int, leaf: int, moment: datetime, default_version: str = ""
) -> dict:
    """What the host keeps about a scheduled task (to run it, retry it and see it finish). A
    sub-orchestration's version is its action's, else the default version of the host planning
    the episode (:mod:`devhost.durable.versioning`)."""
    kind = action["actionType"]
    common = {"leaf": leaf, "retry": action.get("retryOptions"), "attempt": 1, "first_attempt_at": iso(moment)}
    if kind in (CALL_ACTIVITY, CALL_ACTIVITY_WITH_RETRY):
        return {"kind": "activity", "name": action["functionName"], "input": action.get("input"), **common}
    if kind in (CALL_SUB_ORCHESTRATOR, CALL_SUB_ORCHESTRATOR_WITH_RETRY):
        child = action.get("instanceId") or f"{inst.id}:{task_id:04d}"
        check_instance_id(child)
        return {
            "kind": "suborchestration",
            "name": action["functionName"],
            "input": action.get("input"),
            "instance_id": child,
            "version": default_version if action.get("version") is None else action["version"],
            **common,
        }
    if kind == CREATE_TIMER:
        return {"kind": "timer", "fire_at": action["fireAt"], "leaf": leaf}
    raise UnsupportedAction(f"the local host does not support action type {kind}: {action}")


def scheduled_event(task_id: int, meta: dict, moment: datetime) -> dict:
    if meta["kind"] == "activity":
        return event(TASK_SCHEDULED, moment, EventId=task_id, Name=meta["name"], Input=meta["input"])
    if meta["kind"] == "suborchestration":
        return event(
            SUB_ORCHESTRATION_CREATED,
            moment,
            EventId=task_id,
            Name=meta["name"],
            InstanceId=meta["instance_id"],
            Input=meta["input"],
            Version=meta.get("version", ""),
        )
    return event(TIMER_CREATED, moment, EventId=task_id, FireAt=meta["fire_at"])
