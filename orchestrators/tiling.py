"""The job orchestration: validate -> plan windows -> render in batches -> assemble.

Orchestrator code is replayed from history many times, so everything here is deterministic:
no clock, no random, no I/O. The window plan is a pure function of the validated scene size
and the window size the starter put in the input.
"""

from __future__ import annotations

from typing import Any, Generator

import azure.durable_functions as df

from tilecommit.grid import Window, plan_windows

from . import names

#: Genuine faults (storage hiccups, a worker that died) are retried; bad input never reaches a retry
#: because activities return it as a value. 4 attempts, 5 s apart: ~15 s of patience per activity.
ACTIVITY_RETRY = df.RetryOptions(first_retry_interval_in_milliseconds=5000, max_number_of_attempts=4)
#: Batches in flight at once: enough to keep every activity slot of the host busy, few enough
#: that progress is reported in order and the parent's history stays small.
PARALLEL_BATCHES = 4


class BadInputFailure(Exception):
    """The job's input is wrong: fail the orchestration at once with the message."""


class MosaicFailure(Exception):
    """The assembled mosaic failed its checks: a bug, not worth a retry."""


def batch_instance_id(job_id: str, index: int) -> str:
    """Deterministic sub-orchestration id (no '/', '\\', '#', '?'; at most 256 characters)."""
    return f"{job_id}-batch-{index:05d}"


def chunk(windows: list[Window], size: int) -> list[list[Window]]:
    return [windows[i : i + size] for i in range(0, len(windows), size)]


def tile_scene(context: df.DurableOrchestrationContext) -> Generator[Any, Any, dict]:
    """One job. Input: the job dict made by the starter (job id, source blob, etag, sizes)."""
    job: dict = context.get_input()
    job_id = job["job_id"]
    context.set_custom_status({"stage": "validating", "windows_done": 0, "windows_total": None})

    validated = yield context.call_activity_with_retry(names.VALIDATE_SOURCE, ACTIVITY_RETRY, job)
    if not validated["ok"]:
        raise BadInputFailure(f"job {job_id}: bad input {job['blob']!r}: {validated['error']}")
    scene = validated["scene"]

    windows = plan_windows(scene["width"], scene["height"], job["window_size"])
    batches = chunk(windows, job["batch_size"])
    totals = {"windows": len(windows), "written": 0, "already_present": 0, "skipped": 0, "bytes": 0}
    done = 0
    status = {"stage": "tiling", "windows_done": 0, "windows_total": len(windows), "batches_done": 0,
              "batches_total": len(batches)}
    context.set_custom_status(status)

    pending: list = []
    next_batch = 0
    while next_batch < len(batches) or pending:
        while next_batch < len(batches) and len(pending) < PARALLEL_BATCHES:
            batch_input = {"job": job, "windows": [w.to_dict() for w in batches[next_batch]]}
            pending.append(
                context.call_sub_orchestrator(
                    names.RENDER_BATCH, batch_input, batch_instance_id(job_id, next_batch)
                )
            )
            next_batch += 1
        finished = yield context.task_any(pending)
        pending.remove(finished)
        summary = finished.result
        if isinstance(summary, Exception):  # task_any hands back a failed batch instead of raising
            raise summary
        if summary["errors"]:
            raise BadInputFailure(f"job {job_id}: bad input {job['blob']!r}: {summary['errors'][0]}")
        for key in ("written", "already_present", "skipped", "bytes"):
            totals[key] += summary[key]
        done += summary["windows"]
        status = {**status, "windows_done": done, "batches_done": status["batches_done"] + 1}
        context.set_custom_status(status)

    context.set_custom_status({**status, "stage": "assembling"})
    mosaic = yield context.call_activity_with_retry(
        names.ASSEMBLE_MOSAIC, ACTIVITY_RETRY, {"job": job, "scene": scene}
    )
    if mosaic.get("error"):
        raise MosaicFailure(f"job {job_id}: {mosaic['error']}")
    context.set_custom_status({**status, "stage": "done"})
    return {
        "job_id": job_id,
        "source": job["blob"],
        **totals,
        "mosaic_outcome": mosaic["outcome"],
        "mosaic_url": mosaic["mosaic_url"],
        "stac_url": mosaic["stac_url"],
        "quicklook_url": mosaic["quicklook_url"],
    }


def render_batch(context: df.DurableOrchestrationContext) -> Generator[Any, Any, dict]:
    """One batch of windows: fan out one activity per window, fan in a small summary."""
    batch: dict = context.get_input()
    job = batch["job"]
    tasks = [
        context.call_activity_with_retry(names.RENDER_TILE, ACTIVITY_RETRY, {"job": job, "window": window})
        for window in batch["windows"]
    ]
    results = yield context.task_all(tasks)
    summary = {"windows": len(results), "written": 0, "already_present": 0, "skipped": 0, "bytes": 0, "errors": []}
    for result in results:
        if result.get("error"):
            summary["errors"].append(f"window {result['window']}: {result['error']}")
            continue
        if result["outcome"] == "written":
            summary["written"] += 1
        else:
            summary["already_present"] += 1
        if result.get("skipped"):
            summary["skipped"] += 1
        summary["bytes"] += result["nbytes"]
    return summary
