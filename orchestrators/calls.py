"""How an orchestration calls its activities and children, and how their ends become its failures.

Every helper here is a generator to ``yield from`` inside an orchestrator: it yields the SDK's
tasks and nothing else, so it replays as the orchestrator does (no clock, no random, no I/O).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import azure.durable_functions as df

from .failures import JobFailure, checked, exhausted
from .retries import ACTIVITY_RETRY_OPTIONS
from .versions import child_version


def activity_task(context: df.DurableOrchestrationContext, name: str, payload: Any) -> Any:
    """The task of activity ``name`` under the retry policy every activity of the app gets: a
    genuine fault (throttling, an outage, a worker that died) is retried with backoff; an error
    that is not retryable never reaches a retry, because the activity returns it as a value."""
    return context.call_activity_with_retry(name, ACTIVITY_RETRY_OPTIONS, payload)


def in_stage(job: dict, stage: str, steps: Generator[Any, Any, Any]) -> Generator[Any, Any, Any]:
    """Run ``steps``; what they return. A task that failed for good in them (an activity whose
    retries ran out, a child orchestration that failed so) fails the job as the retries of
    ``stage`` exhausted; a failure already the job's passes as it is."""
    try:
        return (yield from steps)
    except JobFailure:
        raise
    except Exception as exc:
        raise exhausted(job, stage, exc) from exc


def call_activity(
    context: df.DurableOrchestrationContext,
    job: dict,
    name: str,
    payload: Any,
    *,
    stage: str,
    used: dict | None = None,
) -> Generator[Any, Any, dict]:
    """Call activity ``name`` with the retry policy; its result, its usage added to ``used``.
    Its retries running out fail the job naming ``stage``; an error value it returns fails the
    job with the failure of that error's kind (:func:`orchestrators.failures.checked`)."""

    def attempt() -> Generator[Any, Any, dict]:
        return (yield activity_task(context, name, payload))

    result = yield from in_stage(job, stage, attempt())
    return checked(job, result, used)


def fan_in(
    context: df.DurableOrchestrationContext, tasks: list, on_done: Callable[[dict], None]
) -> Generator[Any, Any, None]:
    """Hand each task's result to ``on_done`` as it lands; a failed task raises its error.

    Every task is started at once: the first ``task_any`` holds them all in one compound action,
    and the extension's shim invokes all of a compound action's children before it awaits it.
    Later ``task_any`` calls are over children already scheduled, so they add no action, and
    nothing new ever queues behind the shim's in-order await of top-level actions (a sliding
    window would: its n-th new child is not even scheduled until the one before it finished).
    How many activities run at once is the host's to bound (host.json's
    maxConcurrentActivityFunctions); the work-item queue keeps every slot busy.
    """
    pending = list(tasks)
    while pending:
        finished = yield context.task_any(pending)
        pending.remove(finished)
        if isinstance(finished.result, Exception):  # task_any hands back a failed child instead of raising
            raise finished.result
        on_done(finished.result)


def fan_out(
    context: df.DurableOrchestrationContext, name: str, children: list[tuple[str, Any]], on_done: Callable[[dict], None]
) -> Generator[Any, Any, None]:
    """Run sub-orchestrations ``(instance id, input)`` through :func:`fan_in`, so progress moves
    after each one; each is started with the parent's orchestration version
    (:func:`orchestrators.versions.child_version`)."""
    version = child_version(context.version)
    yield from fan_in(
        context,
        [
            context.call_sub_orchestrator(name, child_input, instance_id, version=version)
            for instance_id, child_input in children
        ],
        on_done,
    )
