"""The host's work items: start messages, activity executions (with the function timeout) and
the patience the host has with its own storage."""

from __future__ import annotations

import json
import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from . import shim
from .history import TASK_COMPLETED, TASK_FAILED, event, now
from .instance import ActivityExecution

if TYPE_CHECKING:
    from .engine import Engine

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class StartMessage:
    """An ExecutionStarted message: from a client's start_new or a parent's sub-orchestration."""

    name: str
    instance_id: str
    input_json: str | None
    parent: dict | None
    execution_id: str


class HostBackoff:
    """How long to wait before trying a failed host operation again: DTFx abandons a work item
    whose processing failed and takes it up again later, with a growing delay, for as long as it
    takes. Nothing is given up: a storage outage costs time, never the instance."""

    def __init__(self, first: float = 0.25, factor: float = 2.0, ceiling: float = 5.0):
        self.first, self.factor, self.ceiling = first, factor, ceiling
        self._failures: dict[str, int] = {}
        self._lock = threading.Lock()

    def failed(self, key: str) -> float:
        with self._lock:
            count = self._failures[key] = self._failures.get(key, 0) + 1
        return min(self.ceiling, self.first * self.factor ** (count - 1))

    def succeeded(self, key: str) -> None:
        with self._lock:
            self._failures.pop(key, None)

    def call(self, what: str, operation: Callable[[], T], stopping: Callable[[], bool]) -> T:
        """Run ``operation`` until it succeeds (or the host stops), waiting between attempts."""
        while True:
            try:
                result = operation()
                self.succeeded(what)
                return result
            except Exception:
                if stopping():
                    raise
                delay = self.failed(what)
                logger.warning("%s failed; trying again in %.1f s", what, delay, exc_info=True)
                time.sleep(delay)


def format_timeout(seconds: float) -> str:
    """A TimeSpan as .NET prints it: hh:mm:ss, with seven fraction digits when there is a fraction."""
    ticks = round(seconds * 10_000_000)
    whole, fraction = divmod(ticks, 10_000_000)
    text = f"{whole // 3600:02d}:{whole % 3600 // 60:02d}:{whole % 60:02d}"
    return f"{text}.{fraction:07d}" if fraction else text


class ActivityRunner:
    """Runs activities in the engine's bounded pool (host.json's maxConcurrentActivityFunctions).

    With a function timeout (host.json's ``functionTimeout``), an execution past it fails as on
    the real host: TaskActivityShim turns the host's FunctionTimeoutError into ``Activity function
    'X' failed: Timeout value of ... was exceeded by function: Functions.X``, and the task is
    retried per its RetryOptions. The real host also restarts the worker process that ran it; a
    thread cannot be killed, so here the late execution runs to its end and its result is
    dropped as a duplicate completion.
    """

    def __init__(self, engine: Engine, function_timeout: float | None):
        self.engine = engine
        self.function_timeout = function_timeout

    def submit(self, instance_id: str, execution_id: str, task_id: int, name: str, input_json: str | None) -> None:
        self.engine._pool.submit(self._run, instance_id, execution_id, task_id, name, input_json)

    def _run(self, instance_id: str, execution_id: str, task_id: int, name: str, input_json: str | None) -> None:
        engine = self.engine
        if engine._stopping:
            return
        started = time.monotonic()
        outcome = {"settled": False}
        lock = threading.Lock()

        def settle(item: dict) -> bool:
            with lock:
                if outcome["settled"]:
                    return False
                outcome["settled"] = True
            engine.deliver(instance_id, execution_id, item)
            return True

        if self.function_timeout is not None:
            limit = format_timeout(self.function_timeout)
            reason = shim.activity_failure_reason(
                name, f"Timeout value of {limit} was exceeded by function: Functions.{name}"
            )

            def timed_out() -> None:
                if settle(
                    event(
                        TASK_FAILED,
                        now(),
                        TaskScheduledId=task_id,
                        Reason=reason,
                        Details=json.dumps({"$type": "FunctionTimeoutException"}),
                    )
                ):
                    logger.warning(
                        "activity %s (%s #%d) passed the function timeout %s", name, instance_id, task_id, limit
                    )
                    with engine._lock:
                        engine.stats.activity_timeouts += 1

            engine.later(self.function_timeout, timed_out)

        result = error = None
        try:
            result = engine.index.invoke_activity(name, input_json)
            item = event(TASK_COMPLETED, now(), TaskScheduledId=task_id, Result=result)
        except Exception as exc:
            error = shim.activity_failure_reason(name, f"{type(exc).__name__}: {exc}")
            logger.warning("activity %s (%s #%d) failed: %s", name, instance_id, task_id, error)
            item = event(
                TASK_FAILED,
                now(),
                TaskScheduledId=task_id,
                Reason=error,
                Details=shim.activity_failure_details(exc) + "\n" + traceback.format_exc(),
            )
        seconds = time.monotonic() - started
        with engine._lock:
            engine.stats.activity_executions += 1
            engine.stats.activity_failures += error is not None
            engine.executions.append(
                ActivityExecution(
                    instance_id,
                    task_id,
                    name,
                    json.loads(input_json) if input_json else None,
                    json.loads(result) if result else None,
                    error,
                    seconds,
                    started,
                )
            )
        if not settle(item):
            with engine._lock:
                engine.stats.duplicate_completions_dropped += 1
