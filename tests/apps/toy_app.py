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
