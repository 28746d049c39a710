"""A small Durable app for testing the local host's engine without rasters.

It uses the same SDK features as the real app: fan-out/fan-in, sub-orchestrations with
explicit ids, task_any, retries, custom status and a failing activity.
"""

import threading

import azure.durable_functions as df

app = df.DFApp()

RETRY = df.RetryOptions(first_retry_interval_in_milliseconds=1000, max_number_of_attempts=3)
_failures_left: dict[str, int] = {}
_lock = threading.Lock()


def set_failures(key: str, count: int) -> None:
    with _lock:
        _failures_left[key] = count


@app.activity_trigger(input_name="payload")
def square(payload: dict) -> dict:
    return {"n": payload["n"], "square": payload["n"] ** 2}


@app.activity_trigger(input_name="payload")
def flaky(payload: dict) -> dict:
    """Fails ``set_failures(key, k)`` times, then succeeds."""
    with _lock:
        left = _failures_left.get(payload["key"], 0)
        if left > 0:
            _failures_left[payload["key"]] = left - 1
            raise RuntimeError(f"transient fault, {left} left")
    return {"key": payload["key"], "ok": True}


@app.orchestration_trigger(context_name="context")
def batch(context: df.DurableOrchestrationContext):
    numbers = context.get_input()["numbers"]
    results = yield context.task_all([context.call_activity("square", {"n": n}) for n in numbers])
    return sum(r["square"] for r in results)


@app.orchestration_trigger(context_name="context")
def fan(context: df.DurableOrchestrationContext):
    job = context.get_input()
    numbers = list(range(job["count"]))
    size = job["batch"]
    chunks = [numbers[i : i + size] for i in range(0, len(numbers), size)]
    pending = [
        context.call_sub_orchestrator("batch", {"numbers": c}, f"{context.instance_id}-b{i:03d}")
        for i, c in enumerate(chunks)
    ]
    total, done = 0, 0
    while pending:
        finished = yield context.task_any(pending)
        pending.remove(finished)
        total += finished.result
        done += 1
        context.set_custom_status({"batches_done": done, "batches_total": len(chunks)})
    flaky_result = yield context.call_activity_with_retry("flaky", RETRY, {"key": job.get("flaky_key", "none")})
    return {"total": total, "flaky": flaky_result["ok"]}


@app.orchestration_trigger(context_name="context")
def retry_then_fail(context: df.DurableOrchestrationContext):
    yield context.call_activity_with_retry("flaky", RETRY, {"key": context.get_input()["key"]})
    return "unreachable"


@app.orchestration_trigger(context_name="context")
def uses_clock(context: df.DurableOrchestrationContext):
    """Non-deterministic on purpose: the activity input depends on wall-clock time."""
    import time

    yield context.call_activity("square", {"n": int(time.time() * 1000)})
    yield context.call_activity("square", {"n": int(time.time() * 1000)})
    return "done"


# ---------------------------------------------------------------------- shapes of fan-out


@app.activity_trigger(input_name="payload")
def nap(payload: dict) -> dict:
    import time

    time.sleep(payload["seconds"])
    return {"i": payload["i"]}


@app.orchestration_trigger(context_name="context")
def sliding_window(context: df.DurableOrchestrationContext):
    """A window of ``window`` naps in flight, topped up by one as each finishes (task_any over a
    list that gains one new child at a time)."""
    job = context.get_input()
    naps = [{"i": i, "seconds": job["seconds"]} for i in range(job["count"])]
    pending, started, done = [], 0, 0
    while started < len(naps) or pending:
        while started < len(naps) and len(pending) < job["window"]:
            pending.append(context.call_activity("nap", naps[started]))
            started += 1
        finished = yield context.task_any(pending)
        pending.remove(finished)
        done += 1
    return done


@app.orchestration_trigger(context_name="context")
def all_at_once(context: df.DurableOrchestrationContext):
    """Every nap scheduled in one compound action; taken as they finish (progress after each)."""
    job = context.get_input()
    pending = [context.call_activity("nap", {"i": i, "seconds": job["seconds"]}) for i in range(job["count"])]
    done = 0
    while pending:
        finished = yield context.task_any(pending)
        pending.remove(finished)
        done += 1
        context.set_custom_status({"done": done})
    return done


# ---------------------------------------------------------------------- host behaviours


class BackoffRetry(df.RetryOptions):
    """RetryOptions with the fields the extension's RetryOptionsConverter also reads."""

    def __init__(self, first_ms: int, attempts: int, backoff: float, max_ms: int):
        super().__init__(first_ms, attempts)
        self.backoff, self.max_ms = backoff, max_ms

    def to_json(self) -> dict:
        return {**super().to_json(), "backoffCoefficient": self.backoff, "maxRetryIntervalInMilliseconds": self.max_ms}


@app.orchestration_trigger(context_name="context")
def backoff_retry(context: df.DurableOrchestrationContext):
    job = context.get_input()
    retry = BackoffRetry(job["first_ms"], job["attempts"], job["backoff"], job["max_ms"])
    result = yield context.call_activity_with_retry("flaky", retry, {"key": job["key"]})
    return result["ok"]


@app.orchestration_trigger(context_name="context")
def big_status(context: df.DurableOrchestrationContext):
    context.set_custom_status("x" * context.get_input()["chars"])
    yield context.call_activity("square", {"n": 1})
    return "done"


@app.orchestration_trigger(context_name="context")
def changes_its_mind(context: df.DurableOrchestrationContext):
    """Non-deterministic on purpose: a different activity name when replaying."""
    yield context.call_activity("flaky" if context.is_replaying else "square", {"n": 2, "key": "none"})
    yield context.call_activity("square", {"n": 3})
    return "done"


@app.orchestration_trigger(context_name="context")
def parent_of_slow_child(context: df.DurableOrchestrationContext):
    """A child that naps; with ``fail``, a flaky activity beside it fails the parent first."""
    job = context.get_input()
    child = context.call_sub_orchestrator(
        "nap_once", {"seconds": job["seconds"], "i": job["run"]}, f"{context.instance_id}-child-{job['child']}"
    )
    tasks = [child]
    if job["fail"]:
        tasks.append(context.call_activity("flaky", {"key": job["key"]}))
    results = yield context.task_all(tasks)
    return results[0]


@app.orchestration_trigger(context_name="context")
def nap_once(context: df.DurableOrchestrationContext):
    result = yield context.call_activity("nap", context.get_input())
    return result["i"]


@app.activity_trigger(input_name="payload")
def slow_first_time(payload: dict) -> dict:
    """Naps ``seconds`` the first time per key (past the function timeout), then answers at once."""
    import time

    with _lock:
        first = _failures_left.get(payload["key"], 0) > 0
        _failures_left[payload["key"]] = 0
    if first:
        time.sleep(payload["seconds"])
    return {"key": payload["key"], "slow": first}


def _with_retry(context: df.DurableOrchestrationContext, activity: str):
    """Call ``activity`` with the job as its input, retried as the job's ``first_ms`` and ``attempts`` say."""
    job = context.get_input()
    retry = df.RetryOptions(job["first_ms"], job["attempts"])
    result = yield context.call_activity_with_retry(activity, retry, job)
    return result


@app.orchestration_trigger(context_name="context")
def times_out_once(context: df.DurableOrchestrationContext):
    return (yield from _with_retry(context, "slow_first_time"))


@app.orchestration_trigger(context_name="context")
def busy_worker_times_out(context: df.DurableOrchestrationContext):
    """One activity stuck past the function timeout while naps keep the other slots busy."""
    job = context.get_input()
    retry = df.RetryOptions(job["first_ms"], job["attempts"])
    stuck = {"key": job["key"], "seconds": job["stuck_s"]}
    tasks = [context.call_activity_with_retry("slow_first_time", retry, stuck)]
    tasks += [
        context.call_activity_with_retry("nap", retry, {"i": i, "seconds": job["nap_s"]}) for i in range(job["naps"])
    ]
    results = yield context.task_all(tasks)
    return {"stuck": results[0], "naps": len(results) - 1}


_released: dict[str, threading.Event] = {}
_stuck: dict[str, threading.Event] = {}


def stuck_now(key: str) -> threading.Event:
    """Set once :func:`stuck_first_time` is stuck for ``key``."""
    with _lock:
        return _stuck.setdefault(key, threading.Event())


def release(key: str) -> None:
    """Let the function :func:`stuck_first_time` holds for ``key`` end (a test's cleanup)."""
    with _lock:
        _released.setdefault(key, threading.Event()).set()


@app.activity_trigger(input_name="payload")
def stuck_first_time(payload: dict) -> dict:
    """The first time per key, a function stuck as a thread in native code is: it sleeps in a loop
    and answers nothing the host does (no timeout, no cancellation reaches it) until the test
    releases it; later calls answer at once."""
    import time

    with _lock:
        first = _failures_left.get(payload["key"], 0) > 0
        _failures_left[payload["key"]] = 0
        released = _released.setdefault(payload["key"], threading.Event())
    if first:
        stuck_now(payload["key"]).set()
    while first and not released.is_set():
        time.sleep(0.05)
    return {"key": payload["key"], "stuck": first}


@app.orchestration_trigger(context_name="context")
def stuck_once(context: df.DurableOrchestrationContext):
    return (yield from _with_retry(context, "stuck_first_time"))


@app.orchestration_trigger(context_name="context")
def parent_of_busy_child(context: df.DurableOrchestrationContext):
    """A parent that waits, quiet, while its child makes progress nap after nap."""
    job = context.get_input()
    done = yield context.call_sub_orchestrator("all_at_once", job, f"{context.instance_id}-busy")
    return done


@app.orchestration_trigger(context_name="context")
def countdown(context: df.DurableOrchestrationContext):
    """One square per execution, then ``continue_as_new`` with one less to go."""
    state = context.get_input()
    if state["left"] == 0:
        return {"done": state["done"]}
    context.set_custom_status({"left": state["left"]})
    result = yield context.call_activity("square", {"n": state["left"]})
    context.continue_as_new({"left": state["left"] - 1, "done": state["done"] + [result["square"]]})


# ---------------------------------------------------------------------- orchestration versions


@app.orchestration_trigger(context_name="context")
def own_version(context: df.DurableOrchestrationContext):
    return context.version


@app.orchestration_trigger(context_name="context")
def versions_seen(context: df.DurableOrchestrationContext):
    """Its own version, a child's started with ``{"child_version": ...}`` and a child's started
    with none."""
    job = context.get_input() or {}
    asked = yield context.call_sub_orchestrator(
        "own_version", None, f"{context.instance_id}-asked", version=job.get("child_version")
    )
    default = yield context.call_sub_orchestrator("own_version", None, f"{context.instance_id}-default")
    return {"own": context.version, "asked": asked, "default": default}
