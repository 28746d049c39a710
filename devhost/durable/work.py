"""The host's work items: start messages, activity executions (with the function timeout) and
the patience the host has with its own storage."""

from __future__ import annotations

import functools
import json
import logging
import os
import queue
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

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
    #: The version stamped on the instance (:mod:`devhost.durable.versioning`); "" unversioned.
    version: str = ""


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


#: Seconds the host waits, after a function passed its timeout, for it to end before it restarts
#: the worker process running it: TimeoutAttribute's GracePeriod, 2 s unless set (azure-webjobs-sdk
#: ``src/Microsoft.Azure.WebJobs/TimeoutAttribute.cs``), which WebScriptHostExceptionHandler waits.
TIMEOUT_GRACE_S = 2.0


#: The Python worker's setting for the size of the thread pool its synchronous functions run in.
THREAD_COUNT_SETTING = "PYTHON_THREADPOOL_THREAD_COUNT"


def worker_thread_count() -> int:
    """The threads of the Python worker's pool for synchronous functions: the app setting when
    set, else (Python 3.9 and later) no limit of the worker's own, so ``ThreadPoolExecutor``'s
    default, ``min(32, cpus + 4)`` (azure-functions-python-worker ``dispatcher.py``,
    ``_get_sync_tp_max_workers`` and ``_create_sync_call_tp``)."""
    value = os.environ.get(THREAD_COUNT_SETTING, "")
    if value.strip().isdigit() and int(value) >= 1:
        return int(value)
    return min(32, (os.cpu_count() or 1) + 4)


class WorkerThreads:
    """The worker's pool for synchronous functions: a thread that ran one function runs the next.

    The real worker runs every ``def`` function on one ``ThreadPoolExecutor`` for its lifetime,
    so an activity finds the thread-local state of the ones before it: GDAL's PROJ context above
    all (OSR keeps one per thread, and a new one opens proj.db again: about 10 ms of CPU under
    the GIL for the first CRS a thread reads, measured here). A thread per activity paid that for
    every window. The pool is ``ThreadPoolExecutor``'s rule (reuse an idle thread, else start one
    up to the limit, else queue), written here because its threads must be daemons: the code of a
    restarted worker runs on with no one to wait for it (:class:`ActivityRunner`), and
    ``ThreadPoolExecutor`` joins its threads at interpreter exit.
    """

    def __init__(self, number: int, limit: int):
        self.number, self.limit = number, limit
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads = 0

    def submit(self, function: Callable[[], None]) -> None:
        self._tasks.put(function)
        if self._idle.acquire(blocking=False):
            return  # an idle thread takes it
        with self._lock:
            if self._threads >= self.limit:
                return  # queued until a thread is free, as in the worker's executor
            self._threads += 1
            started = self._threads
        name = f"devhost-worker{self.number}-{started}"
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def close(self) -> None:
        """The worker is gone: each thread ends after what it was given (see :class:`ActivityRunner`)."""
        with self._lock:
            for _ in range(self._threads):
                self._tasks.put(None)

    def _serve(self) -> None:
        while (function := self._tasks.get()) is not None:
            function()  # ActivityRunner._run: it catches what the function raises
            self._idle.release()


@dataclass
class Worker:
    """The language worker process activities run in (one per instance, as
    FUNCTIONS_WORKER_PROCESS_COUNT's default of 1 has it), with its pool of threads for
    synchronous functions. A function timeout restarts it."""

    number: int
    #: time.monotonic() when it started (the first, or the restart that replaced the one before).
    started: float = field(default_factory=time.monotonic)
    restarted: bool = False
    threads: WorkerThreads = field(init=False)

    def __post_init__(self) -> None:
        self.threads = WorkerThreads(self.number, worker_thread_count())


@dataclass(eq=False)
class Execution:
    """One execution of one activity task, from the slot it takes to the result the host hears."""

    instance_id: str
    execution_id: str
    task_id: int
    name: str
    input_json: str | None
    worker: Worker
    #: The work-item message it came from (deleted once the host has its outcome).
    token: object = None
    started: float = field(default_factory=time.monotonic)
    #: The host has its outcome (a result, a failure or the timeout): its slot is free again.
    settled: bool = False
    #: The function's code has returned (or raised).
    ended: bool = False


class ActivityRunner:
    """Runs activities in host.json's ``maxConcurrentActivityFunctions`` slots, as the extension's
    work-item dispatcher does: a slot is taken when an execution starts and given back when the
    host has its outcome.

    With a function timeout (host.json's ``functionTimeout``) an execution past it fails as on the
    real host: the WebJobs executor throws ``FunctionTimeoutException`` ("Timeout value of
    hh:mm:ss was exceeded by function: Functions.X", azure-webjobs-sdk ``FunctionExecutor.cs``,
    ``TryHandleTimeoutAsync``); TaskActivityShim makes it ``Activity function 'X' failed: ...``
    and the task is retried per its RetryOptions. Its slot is free from that moment.

    If the function has not ended ``grace`` seconds later, the host restarts the worker process
    running it (azure-functions-host ``WebScriptHostExceptionHandler.OnTimeoutExceptionAsync``,
    ``RpcFunctionInvocationDispatcher.RestartWorkerWithInvocationIdAsync``). The other executions
    in that worker are removed without a result (``GrpcWorkerChannel.Dispose``): each keeps its
    slot and fails when its own timeout passes. Here the worker is a generation number: a Python
    thread cannot be killed, so the code of a restarted worker's executions runs on, and whatever
    it returns is dropped, as the dead process's answer would never arrive. Its side effects are
    ones a killed process could also have left (it may be killed just after any write).

    A function that has not ended by then may never end (a thread stuck in native code, such as
    a GDAL deadlock, holds its memory, file handles and connections for good), so it is reported
    at ERROR and counted (``stuck_functions``; :meth:`left_running` lists them), and with
    ``recycle`` (``python -m devhost serve``, a process of its own, as the worker is) the process
    is ended as the real host ends the worker: ``recycle()`` kills it
    (:func:`devhost.durable.limits.recycle`), and the work it held is taken up again when a host
    starts on the task hub.

    It knows the engine only through the callables it is given: ``invoke(name, input)`` runs the
    function, ``deliver(instance, execution, event, token)`` hands back its outcome (``token``: the
    work item it came from), ``freed()`` says a slot is free again, ``later(delay,
    callback)`` schedules the timeout, ``record(execution)`` keeps each execution's record,
    ``count(stat)`` counts one of the host's events, ``stopping()`` says the host is shutting down,
    ``recycle()`` (if given) ends the process when a function did not end after its timeout.
    """

    def __init__(
        self,
        slots: int,
        function_timeout: float | None,
        *,
        invoke: Callable[[str, str | None], str],
        deliver: Callable[[str, str, dict, object], None],
        freed: Callable[[], None],
        later: Callable[[float, Callable[[], None]], None],
        record: Callable[[ActivityExecution], None],
        count: Callable[[str], None],
        stopping: Callable[[], bool],
        grace: float = TIMEOUT_GRACE_S,
        recycle: Callable[[], None] | None = None,
    ):
        self.slots = slots
        self.function_timeout = function_timeout
        self.grace = grace
        self.invoke, self.deliver, self.freed, self.later = invoke, deliver, freed, later
        self.record, self.count, self.stopping = record, count, stopping
        self.recycle = recycle
        self.worker = Worker(1)
        self._free = slots
        self._queue: deque[tuple[str, str, int, str, str | None, object]] = deque()
        #: Executions whose function code is running, in any worker (a restarted one's too).
        self._running: set[Execution] = set()
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)

    def submit(
        self, instance_id: str, execution_id: str, task_id: int, name: str, input_json: str | None, token: object
    ) -> None:
        with self._lock:
            self._queue.append((instance_id, execution_id, task_id, name, input_json, token))
        self._pump()

    def try_submit(
        self,
        instance_id: str,
        execution_id: str,
        task_id: int,
        name: str,
        input_json: str | None,
        *,
        wait: bool = False,
    ) -> bool:
        """Start an execution here at once if a slot is free (and nothing waits for one); with
        ``wait``, else queue it here for the next free slot. False if it was not taken."""
        with self._lock:
            if self.stopping() or (self._free - len(self._queue) <= 0 and not wait):
                return False
            self._queue.append((instance_id, execution_id, task_id, name, input_json, None))
        self._pump()
        return True

    def take_waiting(self) -> list[tuple[str, str, int, str, str | None]]:
        """Remove and return the executions queued here without a work item (``try_submit`` with
        ``wait``): they are for the shared queue now."""
        with self._lock:
            kept = [task for task in self._queue if task[-1] is None]
            for task in kept:
                self._queue.remove(task)
        return [task[:-1] for task in kept]

    def attach_work_items(
        self, chosen: Callable[[str], bool], send_held: Callable[[tuple], Any], delete: Callable[[Any], None]
    ) -> int:
        """Give each execution of the ``chosen`` instances that runs here without a work item one
        now (``send_held(task)`` sends it, taken by this host): its outcome is then awaited through
        the queue, which brings it back to any host if this one dies first. One that settled while
        its work item was sent has it deleted (``delete``). How many were given one."""
        with self._lock:
            bare = [r for r in self._running if r.token is None and not r.settled and chosen(r.instance_id)]
        for run in bare:
            token = send_held((run.instance_id, run.execution_id, run.task_id, run.name, run.input_json))
            with self._lock:
                if not run.settled:
                    run.token = token  # _settle marks a run settled under this lock before it reads the token
                    continue
            delete(token)
        return len(bare)

    def free(self) -> int:
        """Slots no execution holds or waits for (negative: more are waiting than slots are free)."""
        with self._lock:
            return self._free - len(self._queue)

    def running_tokens(self) -> list:
        """The work items of executions the host still waits for, running or waiting for a slot."""
        with self._lock:
            running = [run.token for run in self._running if not run.settled]
            return [token for token in running + [task[-1] for task in self._queue] if token is not None]

    def _pump(self) -> None:
        """Start queued executions while slots are free."""
        while True:
            with self._lock:
                if self.stopping() or not self._free or not self._queue:
                    return
                self._free -= 1
                instance_id, execution_id, task_id, name, input_json, token = self._queue.popleft()
                run = Execution(instance_id, execution_id, task_id, name, input_json, self.worker, token)
                self._running.add(run)
            if self.function_timeout is not None:
                # The host's clock runs from the invocation it sends, a wait in the worker's pool included.
                self.later(self.function_timeout, functools.partial(self._timed_out, run, self.function_timeout))
            run.worker.threads.submit(functools.partial(self._run, run))

    def _settle(self, run: Execution, item: dict) -> bool:
        """Hand the host the execution's outcome, once; its slot is free again."""
        with self._lock:
            if run.settled:
                return False
            run.settled = True
        self.deliver(run.instance_id, run.execution_id, item, run.token)
        with self._lock:
            self._free += 1
        self._pump()
        self.freed()
        return True

    def _run(self, run: Execution) -> None:
        result = error = None
        thread = threading.current_thread().name
        try:
            result = self.invoke(run.name, run.input_json)
            item = event(TASK_COMPLETED, now(), TaskScheduledId=run.task_id, Result=result)
        except Exception as exc:
            error = shim.activity_failure_reason(run.name, f"{type(exc).__name__}: {exc}")
            logger.warning("activity %s (%s #%d) failed: %s", run.name, run.instance_id, run.task_id, error)
            details = shim.activity_failure_details(exc) + "\n" + traceback.format_exc()
            item = event(TASK_FAILED, now(), TaskScheduledId=run.task_id, Reason=error, Details=details)
        finally:
            with self._lock:
                run.ended = True
                self._running.discard(run)
                self._ended.notify_all()
                # Decided with the end: a restart after it no longer concerns this execution.
                lost_with_worker = run.worker.restarted
        value = json.loads(run.input_json) if run.input_json else None
        output = json.loads(result) if result else None
        seconds = time.monotonic() - run.started
        self.record(
            ActivityExecution(
                run.instance_id, run.task_id, run.name, value, output, error, seconds, run.started, thread
            )
        )
        if lost_with_worker:
            # Its worker process was restarted under it: the host never hears this answer.
            self.count("results_lost_with_worker")
        elif not self._settle(run, item):
            self.count("duplicate_completions_dropped")  # a late result after the timeout

    def _timed_out(self, run: Execution, timeout: float) -> None:
        limit = format_timeout(timeout)
        reason = shim.activity_failure_reason(
            run.name, f"Timeout value of {limit} was exceeded by function: Functions.{run.name}"
        )
        details = json.dumps({"$type": "FunctionTimeoutException"})
        if self._settle(run, event(TASK_FAILED, now(), TaskScheduledId=run.task_id, Reason=reason, Details=details)):
            logger.warning(
                "activity %s (%s #%d) passed the function timeout %s", run.name, run.instance_id, run.task_id, limit
            )
            self.count("activity_timeouts")
            self.later(self.grace, functools.partial(self._restart_worker, run, timeout))

    def _restart_worker(self, run: Execution, timeout: float) -> None:
        """The timed-out execution has not ended within the grace period: restart its worker."""
        with self._lock:
            if run.ended or run.worker.restarted:
                return  # it ended in time, or its worker is already gone: nothing to do
            run.worker.restarted = True
            lost = sorted(f"{r.name} #{r.task_id}" for r in self._running if r.worker is run.worker and r is not run)
            self.worker = Worker(run.worker.number + 1)
            # A stop waiting for the old worker's executions (shutdown) waits no more: the real
            # host's worker process, and all it ran, is gone now.
            self._ended.notify_all()
        run.worker.threads.close()
        logger.warning(
            "A function timeout has occurred. Restarting worker process executing %s (%s #%d); "
            "also running there, now without a result until their own timeout: %s",
            run.name,
            run.instance_id,
            run.task_id,
            ", ".join(lost) or "nothing",
        )
        self.count("worker_restarts")
        self.count("stuck_functions")
        logger.error(
            "activity %s (%s #%d) has not ended %.0f s after its function timeout of %s: the real host kills "
            "the worker process running it; %s",
            run.name,
            run.instance_id,
            run.task_id,
            self.grace,
            format_timeout(timeout),
            "recycling this host's process"
            if self.recycle is not None
            else "a thread cannot be killed, so it runs on in this process, holding whatever it holds",
        )
        if self.recycle is not None:
            self.recycle()

    def left_running(self) -> list[Execution]:
        """Executions whose worker was restarted under them and whose code has not ended (threads
        a real host would have killed with their worker process)."""
        with self._lock:
            return [run for run in self._running if run.worker.restarted]

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until no function code is running (a restarted worker's too). True if none is."""
        with self._lock:
            return self._ended.wait_for(lambda: not self._running, timeout)

    def shutdown(self) -> list:
        """Start nothing more; wait for the current worker's executions to end (or their worker to
        be restarted: a function stuck past its timeout and grace does not hold the stop). Returns
        the tokens of the executions that were waiting for a slot and will not run here."""
        with self._lock:
            dropped = [task[-1] for task in self._queue if task[-1] is not None]
            self._queue.clear()
            self._ended.wait_for(lambda: not any(r.worker is self.worker for r in self._running))
        return dropped
