"""The job orchestration: validate -> plan windows -> render in batches -> assemble (a large
mosaic: plan its staging -> stage the shares -> commit).

Orchestrator code is replayed from history many times, so everything here is deterministic:
no clock, no random, no I/O. The window plan is a pure function of the validated scene size
and the window size of the output spec the starter put in the input (never the app settings).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import azure.durable_functions as df

from tilecommit import usage
from tilecommit.errors import BAD_INPUT, CHECK, FAULT, BadInputFailure, MosaicFailure, RetriesExhaustedFailure
from tilecommit.grid import Window, plan_windows
from tilecommit.jobs import Job
from tilecommit.retries import ACTIVITY_RETRY as RETRY_POLICY

from . import names
from .retries import ACTIVITY_RETRY_OPTIONS

#: Genuine faults (throttling, an outage, a worker that died) are retried with backoff (see
#: orchestrators/retries.py); errors that are not retryable never reach a retry, because
#: activities return them as a value.
ACTIVITY_RETRY = ACTIVITY_RETRY_OPTIONS
#: Above this many batches, batches are grouped under ``render_group`` sub-orchestrations, so
#: the job's own history grows with the number of groups, not with the scene: every instance
#: replays at most ~GROUP_BATCHES children (measured: one flat level of 157 batches made the
#: parent's replay grow quadratically, 0.06 s -> 4.7 s from 1,000 to 10,000 windows).
GROUP_BATCHES = 16


def describe_error(error: dict) -> str:
    """An activity's error value (type, message, window) as one line."""
    where = f"window {error['window']}: " if error.get("window") else ""
    return f"{where}{error['message']} ({error['type']})"


def failure_for(job: dict, error: dict) -> BadInputFailure:
    """The failure of a job whose activity returned ``error``, worded by its kind (who is to
    blame, :func:`tilecommit.errors.error_value`). An error value without one, from an activity
    of an older release still in a job's history, is a fault."""
    kind = error.get("kind", FAULT)
    if kind == CHECK:
        return MosaicFailure(f"job {job['job_id']}: mosaic check failed: {describe_error(error)}")
    if kind == BAD_INPUT:
        return BadInputFailure(f"job {job['job_id']}: bad input {job['blob']!r}: {describe_error(error)}")
    return BadInputFailure(f"job {job['job_id']}: failed, not retryable: {describe_error(error)}")


def exhausted(job: dict, stage: str, exc: Exception) -> RetriesExhaustedFailure:
    return RetriesExhaustedFailure(
        f"job {job['job_id']}: {stage} still failed after {RETRY_POLICY.max_attempts} attempts over "
        f"{RETRY_POLICY.patience_s():.0f} s of retries: storage stayed unavailable or throttled longer than "
        f"the retry policy waits; deliver the upload again to resume: {exc}"
    )


def batch_instance_id(job_id: str, index: int) -> str:
    """Deterministic sub-orchestration id (no '/', '\\', '#', '?'; at most 256 characters)."""
    return f"{job_id}-batch-{index:05d}"


def group_instance_id(job_id: str, index: int) -> str:
    return f"{job_id}-group-{index:04d}"


def chunk(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def plan_batches(job: dict, scene: dict) -> list[list[Window]]:
    """The job's windows in batches: a pure function of the scene size and the job's sizes."""
    record = Job.from_dict(job)
    return chunk(plan_windows(scene["width"], scene["height"], record.spec.window_size), record.batch_size)


def empty_summary() -> dict:
    return {"windows": 0, "written": 0, "already_present": 0, "skipped": 0, "bytes": 0, "errors": [], "usage": {}}


def add_summary(total: dict, part: dict) -> None:
    for key in ("windows", "written", "already_present", "skipped", "bytes"):
        total[key] += part[key]
    total["errors"].extend(part["errors"])
    usage.add(total["usage"], part.get("usage"))


def fan_in(
    context: df.DurableOrchestrationContext, tasks: list, on_done: Callable[[dict], None]
) -> Generator[Any, Any, None]:
    """Hand each task's result to ``on_done`` as it lands (``yield from`` it); a failed task
    raises its error.

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
    after each one."""
    yield from fan_in(
        context,
        [context.call_sub_orchestrator(name, child_input, instance_id) for instance_id, child_input in children],
        on_done,
    )


def stage_in_shares(
    context: df.DurableOrchestrationContext, job: dict, scene: dict, share_bytes: int, status: dict, used: dict
) -> Generator[Any, Any, dict | None]:
    """Plan the mosaic's staging and stage its shares, one activity each, all at once; the plan
    (:class:`tilecommit.raster.assembly.shares.StagedShares`) for the commit, or None when one
    activity assembles the mosaic instead (the plan says why, or the service has no Put Block
    From URL). The plan is named by the tiles it copies, so every execution of the job over the
    same tiles meets the same plan and stages the same blocks. (An input written by an earlier
    release also carries an "attempt" id, which the activity no longer reads.)"""
    planned = yield context.call_activity_with_retry(
        names.PLAN_MOSAIC_SHARES, ACTIVITY_RETRY, {"job": job, "scene": scene, "share_bytes": share_bytes}
    )
    usage.add(used, planned.get("usage"))
    if planned.get("error"):
        raise failure_for(job, planned["error"])
    if not planned.get("shares"):
        return None
    staged = planned["shares"]
    status.update(shares_done=0, shares_total=staged["shares"])
    context.set_custom_status(status)
    unsupported = []

    def staged_one(result: dict) -> None:
        usage.add(used, result.get("usage"))
        if result.get("error"):
            raise failure_for(job, result["error"])
        unsupported.extend([result["unsupported"]] if result.get("unsupported") else [])
        status["shares_done"] += 1
        context.set_custom_status(status)

    tasks = [
        context.call_activity_with_retry(
            names.STAGE_MOSAIC_SHARE, ACTIVITY_RETRY, {"job": job, "shares": staged, "share": index}
        )
        for index in range(staged["shares"])
    ]
    yield from fan_in(context, tasks, staged_one)
    return None if unsupported else staged


def assemble(
    context: df.DurableOrchestrationContext, job: dict, scene: dict, tile_bytes: int, status: dict, used: dict
) -> Generator[Any, Any, dict]:
    """The mosaic, by one activity; when the tiles hold more than one activity may copy (the
    job's ``assembly_share_bytes``), its ranges are staged in shares first and that activity
    commits them. The activity is given what the job used until then, which its STAC item
    records with what the activity itself used until it made the item."""
    share_bytes = Job.from_dict(job).share_bytes
    payload = {"job": job, "scene": scene, "tile_bytes": tile_bytes}
    try:
        if tile_bytes > share_bytes:
            staged = yield from stage_in_shares(context, job, scene, share_bytes, status, used)
            if staged is not None:
                payload["shares"] = staged
        payload["usage"] = usage.add({}, used)  # a copy: what the job used until now, for its STAC item
        mosaic = yield context.call_activity_with_retry(names.ASSEMBLE_MOSAIC, ACTIVITY_RETRY, payload)
    except BadInputFailure:
        raise
    except Exception as exc:
        raise exhausted(job, "assembling the mosaic", exc) from exc
    usage.add(used, mosaic.get("usage"))
    if mosaic.get("error"):
        raise failure_for(job, mosaic["error"])
    return mosaic


def tile_scene(context: df.DurableOrchestrationContext) -> Generator[Any, Any, dict]:
    """One job, announced by its completion event when it ends, completed or failed (see
    :func:`announce`). Input: the job dict made by the starter (job id, source blob, etag, sizes)."""
    job: dict = context.get_input()
    started = context.current_utc_datetime  # the first episode's clock, in every replay
    used: dict = {}  # what every activity of the job used, added up as their results land
    try:
        result = yield from run_job(context, job, used)
    except Exception as exc:
        error = {"type": type(exc).__name__, "message": str(exc)}
        yield from announce(context, job, started, "failed", error=error, used=used)
        raise
    published = yield from announce(context, job, started, "completed", result=result, used=used)
    return {**result, "cost": published.get("cost")}


def announce(
    context: df.DurableOrchestrationContext,
    job: dict,
    started: Any,
    outcome: str,
    *,
    result: dict | None = None,
    error: dict | None = None,
    used: dict | None = None,
) -> Generator[Any, Any, dict]:
    """Publish the job's completion event (activity ``publish_job_event``, with the retry policy);
    what it answered, the job's cost estimate among it (from ``used``, the job's usage).

    A completed job whose event cannot be published fails, saying so, rather than end with
    nobody told: delivering the upload again finds every output present and publishes then. A
    failed job's own failure stands whatever becomes of its event.
    """
    ended = context.current_utc_datetime
    payload = {
        "job": job,
        "outcome": outcome,
        "started_at": started.isoformat(),
        "ended_at": ended.isoformat(),
        "duration_s": (ended - started).total_seconds(),
        "result": result,
        "error": error,
        "usage": used or {},
    }
    try:
        published = yield context.call_activity_with_retry(names.PUBLISH_JOB_EVENT, ACTIVITY_RETRY, payload)
    except Exception as exc:
        if outcome == "completed":
            raise exhausted(job, "publishing the completion event", exc) from exc
        return {}
    if published.get("error") and outcome == "completed":
        raise failure_for(job, published["error"])
    return published


def run_job(context: df.DurableOrchestrationContext, job: dict, used: dict) -> Generator[Any, Any, dict]:
    """Validate, render in batches, assemble; the job's summary."""
    job_id = job["job_id"]
    context.set_custom_status({"stage": "validating", "windows_done": 0, "windows_total": None})

    try:
        validated = yield context.call_activity_with_retry(names.VALIDATE_SOURCE, ACTIVITY_RETRY, job)
    except Exception as exc:
        raise exhausted(job, "validating the upload", exc) from exc
    usage.add(used, validated.get("usage"))
    if validated.get("error"):
        raise failure_for(job, validated["error"])
    scene = validated["scene"]

    batches = plan_batches(job, scene)
    windows = sum(len(b) for b in batches)
    totals = empty_summary()
    status = {
        "stage": "tiling",
        "windows_done": 0,
        "windows_total": windows,
        "batches_done": 0,
        "batches_total": len(batches),
    }
    context.set_custom_status(status)

    def finished(summary: dict) -> None:
        usage.add(used, summary.get("usage"))
        if summary["errors"]:
            raise failure_for(job, summary["errors"][0])
        add_summary(totals, summary)
        status.update(windows_done=totals["windows"], batches_done=status["batches_done"] + summary["batches"])
        context.set_custom_status(status)

    if len(batches) <= GROUP_BATCHES:
        children = [
            (batch_instance_id(job_id, i), {"job": job, "windows": [w.to_dict() for w in batch]})
            for i, batch in enumerate(batches)
        ]
        fanned_out = fan_out(context, names.RENDER_BATCH, children, finished)
    else:
        children = [
            (
                group_instance_id(job_id, g),
                {
                    "job": job,
                    "scene": {"width": scene["width"], "height": scene["height"]},
                    "first_batch": first,
                    "batch_count": min(GROUP_BATCHES, len(batches) - first),
                },
            )
            for g, first in enumerate(range(0, len(batches), GROUP_BATCHES))
        ]
        fanned_out = fan_out(context, names.RENDER_GROUP, children, finished)
    try:
        yield from fanned_out
    except BadInputFailure:
        raise
    except Exception as exc:  # a tile's retries ran out (the failure of its batch, or group)
        raise exhausted(job, "rendering the tiles", exc) from exc

    status["stage"] = "assembling"
    context.set_custom_status(status)
    mosaic = yield from assemble(context, job, scene, totals["bytes"], status, used)
    context.set_custom_status({**status, "stage": "done"})
    totals.pop("errors")
    totals["usage"] = used  # the whole job's, not only its tiles'
    return {
        "job_id": job_id,
        "source": job["blob"],
        "spec": Job.from_dict(job).spec.to_dict(),
        **totals,
        "mosaic_outcome": mosaic["outcome"],
        "mosaic_url": mosaic["mosaic_url"],
        "stac_url": mosaic["stac_url"],
        "quicklook_url": mosaic["quicklook_url"],
    }


def render_group(context: df.DurableOrchestrationContext) -> Generator[Any, Any, dict]:
    """A group of consecutive batches (large scenes): their batches as sub-orchestrations."""
    group: dict = context.get_input()
    job = group["job"]
    batches = plan_batches(job, group["scene"])
    first, count = group["first_batch"], group["batch_count"]
    children = [
        (batch_instance_id(job["job_id"], i), {"job": job, "windows": [w.to_dict() for w in batches[i]]})
        for i in range(first, first + count)
    ]
    total = {**empty_summary(), "batches": 0}

    def finished(summary: dict) -> None:
        add_summary(total, summary)
        total["batches"] += summary["batches"]

    yield from fan_out(context, names.RENDER_BATCH, children, finished)
    return total


def render_batch(context: df.DurableOrchestrationContext) -> Generator[Any, Any, dict]:
    """One batch of windows: fan out one activity per window, fan in a small summary."""
    batch: dict = context.get_input()
    job = batch["job"]
    tasks = [
        context.call_activity_with_retry(names.RENDER_TILE, ACTIVITY_RETRY, {"job": job, "window": window})
        for window in batch["windows"]
    ]
    results = yield context.task_all(tasks)
    summary = {**empty_summary(), "windows": len(results), "batches": 1}
    for result in results:
        usage.add(summary["usage"], result.get("usage"))
        if result.get("error"):
            summary["errors"].append(result["error"])
            continue
        if result["outcome"] == "written":
            summary["written"] += 1
        else:
            summary["already_present"] += 1
        if result.get("skipped"):
            summary["skipped"] += 1
        summary["bytes"] += result["nbytes"]
    return summary
