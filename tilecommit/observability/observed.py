"""Wrappers that record each activity execution and each job's end, around the app's own functions.

``function_app.py`` registers the wrapped functions, so orchestrators and activities stay plain
and the same recording runs under the Functions host and the local host.

- :func:`observed_activity`: one span per execution (child of the job's trace context, linked to
  the invocation's span when the host passed one), its duration on ``ActivityDuration``,
  whatever ``on_result`` counts from its result (the tile counters), and what it used (its
  storage requests and seconds, :mod:`tilecommit.usage`) added to its result as ``usage``.
- :func:`observed_job`: the orchestrator's end (completed, or failed with its error type) counted
  and logged once: only when the orchestrator is not replaying, since a replay re-runs the same
  code for events already recorded.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Generator
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from .. import usage
from . import telemetry


def job_id_of(payload: Any) -> str | None:
    """The job id in an activity's input: the job itself, or ``{"job": job, ...}``."""
    if not isinstance(payload, dict):
        return None
    job = payload["job"] if isinstance(payload.get("job"), dict) else payload
    return job.get("job_id")


def observed_activity(name: str, function: Callable[[Any], Any], on_result: Callable[[str, dict], None] | None = None):
    """``function`` (one input, one result) recorded as described in the module docstring."""

    # The hosts pass the input by the binding's name (``job``, ``payload``): functools.wraps keeps
    # the function's signature, which is what they read it from.
    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        payload = args[0] if args else next(iter(kwargs.values()), None)
        job_id = job_id_of(payload) or telemetry.NO_JOB
        invocation = trace.get_current_span().get_span_context()
        parent = trace.set_span_in_context(trace.NonRecordingSpan(telemetry.job_span_context(job_id)))
        attributes = telemetry.job_attributes(job_id, activity=name)
        token = telemetry.current_job.set(job_id)
        started = time.perf_counter()
        try:
            with (
                usage.measuring(name) as used,
                telemetry.tracer.start_as_current_span(
                    name,
                    context=parent,
                    kind=SpanKind.INTERNAL,
                    links=[Link(invocation)] if invocation.is_valid else [],
                    attributes=attributes,
                ) as span,
            ):
                # An exception raised here is recorded on the span, which ends failed, by the SDK.
                result = function(*args, **kwargs)
                error_type = _returned_error_type(result)
                if error_type:
                    span.set_status(Status(StatusCode.ERROR, str(result["error"].get("message"))[:200]))
                    span.set_attribute("error_type", error_type)
        except Exception as exc:
            outcome = {"outcome": "raised", "error_type": type(exc).__name__}
            telemetry.activity_duration.record(time.perf_counter() - started, {**attributes, **outcome})
            raise
        finally:
            telemetry.current_job.reset(token)
        seconds = time.perf_counter() - started
        outcome = {"outcome": "error" if error_type else "ok", "error_type": error_type}
        telemetry.activity_duration.record(seconds, {**attributes, **outcome})
        if isinstance(result, dict):
            # What this execution used rides back with its result, for the job's cost.
            result = {**result, "usage": used.to_dict(seconds)}
            if on_result is not None:
                on_result(job_id, result)
        return result

    return run


def _returned_error_type(result: Any) -> str:
    """Activities return a non-retryable error as a value, ``{"error": {"kind", "type", "message", "window"}}``
    (:func:`tilecommit.errors.error_value`), never raise it."""
    error = result.get("error") if isinstance(result, dict) else None
    return str(error.get("type") or "Error") if isinstance(error, dict) else ""


def observed_job(orchestrator: Callable[[Any], Generator[Any, Any, Any]]):
    """``orchestrator`` with its end recorded once (see the module docstring); same results."""

    @functools.wraps(orchestrator)
    def run(context: Any) -> Generator[Any, Any, Any]:
        job = context.get_input() or {}
        job_id = job.get("job_id") or context.instance_id
        started = context.current_utc_datetime
        try:
            result = yield from orchestrator(context)
        except Exception as exc:
            if not context.is_replaying:
                seconds = (context.current_utc_datetime - started).total_seconds()
                telemetry.record_job_finished(
                    job_id, status="failed", seconds=seconds, error_type=type(exc).__name__, error=str(exc)[:500]
                )
            raise
        if not context.is_replaying:
            seconds = (context.current_utc_datetime - started).total_seconds()
            telemetry.record_job_finished(job_id, status="completed", seconds=seconds)
        return result

    return run
