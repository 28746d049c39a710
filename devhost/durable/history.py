"""The vocabulary the Durable extension and the Python SDK exchange: history events, actions,
runtime statuses, instance-id rules. Plain data and small helpers, no behaviour of the host.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

# History event types (DurableTask.Core EventType).
EXECUTION_STARTED = 0
EXECUTION_COMPLETED = 1
EXECUTION_FAILED = 2
EXECUTION_TERMINATED = 3
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

# Action types (azure.durable_functions ActionType; the extension's AsyncActionType).
CALL_ACTIVITY = 0
CALL_ACTIVITY_WITH_RETRY = 1
CALL_SUB_ORCHESTRATOR = 2
CALL_SUB_ORCHESTRATOR_WITH_RETRY = 3
CONTINUE_AS_NEW = 4
CREATE_TIMER = 5
WHEN_ANY = 11
WHEN_ALL = 12
COMPOUND = (WHEN_ANY, WHEN_ALL)

PENDING, RUNNING, COMPLETED, FAILED, TERMINATED = "Pending", "Running", "Completed", "Failed", "Terminated"
TERMINAL = (COMPLETED, FAILED, TERMINATED)
#: An execution that ended by ``continue_as_new``: its instance goes on as a new execution
#: (DurableTask.Core OrchestrationStatus.ContinuedAsNew), which its start message begins.
CONTINUED_AS_NEW = "ContinuedAsNew"
#: DurableTask.Core OrchestrationStatus numbers, as ExecutionCompleted carries them.
ORCHESTRATION_STATUS_CODE = {COMPLETED: 1, FAILED: 3, CONTINUED_AS_NEW: 4, TERMINATED: 5}

MAX_INSTANCE_ID_CHARS = 256
OUT_OF_PROC_MARKER = "\n\n$OutOfProcData$:"


class InstanceAlreadyExists(Exception):
    pass


class InstanceNotFound(LookupError):
    pass


class InstanceFinished(Exception):
    """An operation that needs a running instance met a finished one (the extension's 410 Gone)."""


class InvalidInstanceId(ValueError):
    pass


def now() -> datetime:
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def check_instance_id(instance_id: str) -> str:
    if not instance_id or len(instance_id) > MAX_INSTANCE_ID_CHARS:
        raise InvalidInstanceId(f"instance id must be 1..{MAX_INSTANCE_ID_CHARS} characters: {instance_id!r}")
    if any(ch in instance_id for ch in "/\\#?") or instance_id.startswith("@"):
        raise InvalidInstanceId(f"instance id may not contain / \\ # ? or start with @: {instance_id!r}")
    if any(ord(ch) < 0x20 for ch in instance_id):
        raise InvalidInstanceId(f"instance id contains control characters: {instance_id!r}")
    return instance_id


def flatten_actions(actions: Any) -> list[dict]:
    """The SDK's action payload as the ordered list of leaf actions (compound ones opened)."""
    flat: list[dict] = []

    def walk(action: Any) -> None:
        if isinstance(action, list):
            for item in action:
                walk(item)
        elif action.get("actionType") in COMPOUND:
            walk(action.get("compoundActions", []))
        else:
            flat.append(action)

    walk(actions)
    return flat


def top_level_actions(state: dict) -> list[dict]:
    """The actions the extension walks in order: ``actions[0]`` for the SDK's schemas V2/V3."""
    actions = state.get("actions") or []
    if actions and isinstance(actions[0], list):
        if len(actions) != 1:
            raise ValueError(f"expected one list of actions (schema V2/V3), got {len(actions)}")
        return actions[0]
    return actions


def continue_as_new_action(state: dict) -> dict | None:
    """The ``continue_as_new`` action of a finished episode's state, if the orchestrator called it
    (the SDK records it as a fire-and-forget action and reports the execution done)."""
    if not state.get("isDone"):
        return None
    return next((a for a in top_level_actions(state) if a.get("actionType") == CONTINUE_AS_NEW), None)


def completion_task_id(event: dict) -> int | None:
    kind = event["EventType"]
    if kind in (TASK_COMPLETED, TASK_FAILED, SUB_ORCHESTRATION_COMPLETED, SUB_ORCHESTRATION_FAILED):
        return event["TaskScheduledId"]
    if kind == TIMER_FIRED:
        return event["TimerId"]
    return None


def event(kind: int, moment: datetime, EventId: int = -1, **fields: Any) -> dict:
    return {"EventType": kind, "EventId": EventId, "IsPlayed": False, "Timestamp": iso(moment), **fields}
