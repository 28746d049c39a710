"""What the Durable extension does with an out-of-proc orchestrator's answer.

The Python SDK replays the orchestrator and returns *all* its actions so far; the extension's
``OutOfProcOrchestrationShim`` then replays them against the Durable Task Framework
(Azure/azure-functions-durable-extension, src/WebJobs.Extensions.DurableTask/Listener/
OutOfProcOrchestrationShim.cs, ``ProcessAsyncActionsV2``, schemas V2 and V3): for each top-level
action in order it invokes the action and *awaits* it before invoking the next. ``WhenAll`` and
``WhenAny`` become ``Task.WhenAll``/``Task.WhenAny`` over their compound actions, and the SDK
puts only not-yet-scheduled children into a compound action (azure-functions-durable,
azure/durable_functions/models/Task.py, ``CompoundTask.__init__``). So a top-level action after
one that has not finished is not scheduled at all in this episode, whatever the SDK returned.

Also here: the retry interceptor's delays (Azure/durabletask, src/DurableTask.Core/
RetryInterceptor.cs) and the failure and custom-status wording of the extension.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from .history import (
    CALL_ACTIVITY,
    CALL_ACTIVITY_WITH_RETRY,
    CALL_SUB_ORCHESTRATOR,
    CALL_SUB_ORCHESTRATOR_WITH_RETRY,
    COMPOUND,
    CREATE_TIMER,
    WHEN_ALL,
    parse_iso,
)

#: The extension's limit on a custom status (DurableOrchestrationContext.SetCustomStatus).
MAX_CUSTOM_STATUS_KB = 16
#: The extension's RetryOptions default for MaxRetryInterval (RetryOptions.cs); 6 days.
DEFAULT_MAX_RETRY_INTERVAL_MS = 6 * 24 * 3600 * 1000

#: Keyed by any JSON value: an action's ``actionType`` may be missing or unknown.
_KIND: dict[object, str] = {
    CALL_ACTIVITY: "activity",
    CALL_ACTIVITY_WITH_RETRY: "activity",
    CALL_SUB_ORCHESTRATOR: "sub-orchestration",
    CALL_SUB_ORCHESTRATOR_WITH_RETRY: "sub-orchestration",
    CREATE_TIMER: "timer",
}


@dataclass
class ShimReplay:
    """One episode's walk over the orchestrator's top-level actions."""

    #: Leaf actions the shim invokes for the first time in this episode, in invocation order.
    new_leaves: list[dict] = field(default_factory=list)
    #: Leaf actions the SDK returned that the shim did not reach (behind an unfinished action).
    unreached: int = 0
    #: DurableTask.Core's NonDeterministicOrchestrationException message, if replay disagreed.
    nondeterminism: str | None = None


def action_kind(action: dict) -> str:
    return _KIND.get(action.get("actionType"), f"action type {action.get('actionType')}")


def _differs(recorded: dict, current: dict, strict: bool) -> bool:
    """DurableTask.Core checks the kind and the name (case-insensitive) of each replayed task
    (TaskOrchestrationContext.HandleTaskScheduledEvent and friends); ``strict`` also compares
    inputs, instance ids and fire times, which the real host does not."""
    if action_kind(recorded) != action_kind(current):
        return True
    if (recorded.get("functionName") or "").lower() != (current.get("functionName") or "").lower():
        return True
    if strict:
        keys = ("input", "instanceId", "fireAt")
        return any(recorded.get(k) != current.get(k) for k in keys)
    return False


def replay_actions(
    top_level: list[dict], recorded: list[dict], leaf_done: Callable[[int], bool], *, strict: bool = False
) -> ShimReplay:
    """Walk the actions as ``ProcessAsyncActionsV2`` does; ``recorded`` are the leaves invoked in
    earlier episodes (in order), ``leaf_done(i)`` says whether leaf ``i`` has finished in history."""
    result = ShimReplay()
    position = 0

    def invoke(action: dict) -> bool:
        """Invoke one action (and its compound children); True if its task has finished."""
        nonlocal position
        if action.get("actionType") in COMPOUND:
            finished = [invoke(child) for child in action.get("compoundActions") or []]
            return all(finished) if action["actionType"] == WHEN_ALL else any(finished)
        index = position
        position += 1
        if index < len(recorded):
            if result.nondeterminism is None and _differs(recorded[index], action, strict):
                result.nondeterminism = (
                    "Non-Deterministic workflow detected: a previous execution of this orchestration scheduled "
                    f"{action_kind(recorded[index])} {recorded[index].get('functionName')!r} at position {index}, "
                    f"but the current replay produced {action_kind(action)} {action.get('functionName')!r}. "
                    "Was a change made to the orchestrator code after this instance had already started running?"
                )
            return leaf_done(index)
        result.new_leaves.append(action)
        return False  # just scheduled

    for number, action in enumerate(top_level):
        if not invoke(action):
            result.unreached = sum(len(_leaves(a)) for a in top_level[number + 1 :])
            break
    return result


def _leaves(action: dict) -> list[dict]:
    if action.get("actionType") in COMPOUND:
        return [leaf for child in action.get("compoundActions") or [] for leaf in _leaves(child)]
    return [action]


# ---------------------------------------------------------------------- retries


def retry_delay(retry: dict, failed_attempts: int, first_attempt_at: datetime, moment: datetime) -> timedelta | None:
    """The delay before the next attempt, as ``RetryInterceptor`` computes it, or None for none.

    After the last attempt DurableTask.Core still creates a timer, due at once ("Dummy timer for
    back-compat"), and the SDK waits for it. Otherwise: first interval x backoff^(n-1), capped
    by the max interval; no further attempt once the retry timeout has passed since the first.
    """
    if failed_attempts >= retry["maxNumberOfAttempts"]:
        return timedelta(0)
    timeout_ms = retry.get("retryTimeoutInMilliseconds")
    if timeout_ms is not None and moment >= first_attempt_at + timedelta(milliseconds=timeout_ms):
        return None
    delay_ms = retry["firstRetryIntervalInMilliseconds"] * retry.get("backoffCoefficient", 1) ** (failed_attempts - 1)
    delay_ms = min(delay_ms, retry.get("maxRetryIntervalInMilliseconds", DEFAULT_MAX_RETRY_INTERVAL_MS))
    return timedelta(milliseconds=delay_ms)


def first_attempt_time(meta: dict) -> datetime:
    return parse_iso(meta["first_attempt_at"])


# ---------------------------------------------------------------------- wording and limits


def activity_failure_reason(name: str, message: str) -> str:
    """TaskActivityShim: ``Activity function 'X' failed: <message>``."""
    return f"Activity function '{name}' failed: {message}"


def activity_failure_details(exc: BaseException) -> str:
    """The serialized cause (the extension's Utils.SerializeCause: the exception as JSON)."""
    return json.dumps({"$type": type(exc).__name__, "Message": str(exc)})


def orchestrator_failure(name: str, error: str) -> str:
    """OutOfProcOrchestrationShim: ``Orchestrator function 'X' failed: <error>``."""
    return f"Orchestrator function '{name}' failed: {error}"


def custom_status_error(custom_status: object) -> str | None:
    """MessagePayloadDataConverter: the compact JSON's UTF-16 size, in whole KB, may not exceed 16."""
    if custom_status is None:
        return None
    text = json.dumps(custom_status, separators=(",", ":"), ensure_ascii=False)
    size_kb = int(len(text.encode("utf-16-le")) / 1024)
    if size_kb > MAX_CUSTOM_STATUS_KB:
        return (
            f"The UTF-16 size of the JSON-serialized payload must not exceed {MAX_CUSTOM_STATUS_KB} KB. "
            f"The current payload size is {size_kb} KB."
        )
    return None
