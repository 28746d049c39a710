"""The host's work items: start messages, activity executions (with the function timeout) and
the patience the host has with its own storage."""

from __future__ import annotations

import json
import logging
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from . import shim
from .history import TASK_COMPLETED, TASK_FAILED, event, now
from .instance import ActivityExecution

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
    """Runs activities in a bounded pool (host.json's maxConcurrentActivityFunctions).

    With a function timeout (host.json's ``functionTimeout``), an execution past it fails as on
    the real host: TaskActivityShim turns the host's FunctionTimeoutError into ``Activity function
    'X' failed: Timeout value of ... was exceeded by function: Functions.X``, and the task is
    retried per its RetryOptions. The real host also restarts the worker process that ran it; a
    thread cannot be killed, so here the late execution runs to its end and its result is
    dropped as a duplicate completion.

    It knows the engine only through the callables it is given: ``invoke(name, input)`` runs the
    function, ``deliver(instance, execution, event)`` hands back its completion, ``later(delay,
    callback)`` schedules the timeout, ``record(execution, timed_out)`` keeps the bookkeeping,
    ``stopping()`` says the host is shutting down.
    """

    def __init__(
        self,
        slots: int,
        function_timeout: float | None,
        *,
        invoke: Callable[[str, str | None], str],
        deliver: Callable[[str, str, dict], None],
        later: Callable[[float, Callable[[], None]], None],
        record: Callable[[ActivityExecution | None, bool], None],
        stopping: Callable[[], bool],
    ):
        self.pool = ThreadPoolExecutor(slots, thread_name_prefix="activity")
        self.function_timeout = function_timeout
        self.invoke, self.deliver, self.later, self.record, self.stopping = invoke, deliver, later, record, stopping

    def submit(self, instance_id: str, execution_id: str, task_id: int, name: str, input_json: str | None) -> None:
        self.pool.submit(self._run, instance_id, execution_id, task_id, name, input_json)

    def _run(self, instance_id: str, execution_id: str, task_id: int, name: str, input_json: str | None) -> None:
        if self.stopping():
            return
        started = time.monotonic()
        settled = threading.Event()
        lock = threading.Lock()

        def settle(item: dict) -> bool:
            with lock:
                if settled.is_set():
                    return False
                settled.set()
            self.deliver(instance_id, execution_id, item)
            return True

        if self.function_timeout is not None:
            limit = format_timeout(self.function_timeout)
            reason = shim.activity_failure_reason(
                name, f"Timeout value of {limit} was exceeded by function: Functions.{name}"
            )
            details = json.dumps({"$type": "FunctionTimeoutException"})

            def timed_out() -> None:
                if settle(event(TASK_FAILED, now(), TaskScheduledId=task_id, Reason=reason, Details=details)):
                    logger.warning(
                        "activity %s (%s #%d) passed the function timeout %s", name, instance_id, task_id, limit
                    )
                    self.record(None, True)

            self.later(self.function_timeout, timed_out)

        result = error = None
        try:
            result = self.invoke(name, input_json)
            item = event(TASK_COMPLETED, now(), TaskScheduledId=task_id, Result=result)
        except Exception as exc:
            error = shim.activity_failure_reason(name, f"{type(exc).__name__}: {exc}")
            logger.warning("activity %s (%s #%d) failed: %s", name, instance_id, task_id, error)
            details = shim.activity_failure_details(exc) + "\n" + traceback.format_exc()
            item = event(TASK_FAILED, now(), TaskScheduledId=task_id, Reason=error, Details=details)
        value = json.loads(input_json) if input_json else None
        execution = ActivityExecution(
            instance_id,
            task_id,
            name,
            value,
            json.loads(result) if result else None,
            error,
            time.monotonic() - started,
            started,
        )
        self.record(execution, False)
        if not settle(item):
            self.record(None, False)  # a late result after the timeout: a duplicate completion
