"""The scrub orchestration: validate -> plan windows -> verify in batches -> rebuild the mosaic.

The same shape as the job (:mod:`orchestrators.tiling`): the same window plan, batches of
windows as sub-orchestrations started at once (grouped above ``GROUP_BATCHES``), one activity
per window, and one fan-in. Deterministic: no clock, no random, no I/O.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import azure.durable_functions as df

from tilecommit.errors import BadInputFailure

from . import names
from .tiling import (
    ACTIVITY_RETRY,
    GROUP_BATCHES,
    exhausted,
    failure_for,
    fan_out,
    plan_batches,
)


def batch_instance_id(verify_id: str, index: int) -> str:
    return f"{verify_id}-batch-{index:05d}"


def group_instance_id(verify_id: str, index: int) -> str:
    return f"{verify_id}-group-{index:04d}"


def _batch_input(request: dict, batch: list) -> dict:
    return {"job": request["job"], "repair": request["repair"], "windows": [w.to_dict() for w in batch]}


def _empty() -> dict:
    return {"windows": 0, "batches": 0, "reports": [], "errors": []}


def _add(total: dict, part: dict) -> None:
    for key in ("windows", "batches"):
        total[key] += part[key]
    total["reports"].extend(part["reports"])
    total["errors"].extend(part["errors"])


def verify_scene(context: df.DurableOrchestrationContext) -> Generator[Any, Any, dict]:
    """Input ``{"job": the job's own input, "repair": bool}``; output the differences found and,
    with ``repair``, what was written for each and the mosaic's rebuild."""
    request: dict = context.get_input()
    job = request["job"]
    try:
        validated = yield context.call_activity_with_retry(names.VALIDATE_SOURCE, ACTIVITY_RETRY, job)
    except Exception as exc:
        raise exhausted(job, "validating the upload", exc) from exc
    if validated.get("error"):
        raise failure_for(job, validated["error"])
    scene = validated["scene"]
    batches = plan_batches(job, scene)
    status = {"stage": "verifying", "windows_done": 0, "windows_total": sum(len(b) for b in batches)}
    context.set_custom_status(status)
    total = _empty()

    def finished(summary: dict) -> None:
        if summary["errors"]:
            raise failure_for(job, summary["errors"][0])
        _add(total, summary)
        status["windows_done"] = total["windows"]
        context.set_custom_status(status)

    if len(batches) <= GROUP_BATCHES:
        children = [
            (batch_instance_id(context.instance_id, i), _batch_input(request, b)) for i, b in enumerate(batches)
        ]
        fanned_out = fan_out(context, names.VERIFY_BATCH, children, finished)
    else:
        children = [
            (
                group_instance_id(context.instance_id, g),
                {
                    **request,
                    "verify_id": context.instance_id,
                    "scene": {"width": scene["width"], "height": scene["height"]},
                    "first_batch": first,
                    "batch_count": min(GROUP_BATCHES, len(batches) - first),
                },
            )
            for g, first in enumerate(range(0, len(batches), GROUP_BATCHES))
        ]
        fanned_out = fan_out(context, names.VERIFY_GROUP, children, finished)
    try:
        yield from fanned_out
    except BadInputFailure:
        raise
    except Exception as exc:
        raise exhausted(job, "verifying the tiles", exc) from exc

    reports = sorted(total["reports"], key=lambda r: r["window"])
    # The outputs are checked too (after the windows' repairs, if any): a mosaic replaced or damaged
    # while its tiles are fine, or one a repair left unrebuilt, is found here and rebuilt below.
    context.set_custom_status({**status, "stage": "verifying the mosaic"})
    try:
        outputs = yield context.call_activity_with_retry(
            names.VERIFY_OUTPUTS, ACTIVITY_RETRY, {"job": job, "scene": scene}
        )
    except Exception as exc:
        raise exhausted(job, "verifying the mosaic", exc) from exc
    if outputs.get("error"):
        raise failure_for(job, outputs["error"])
    mosaic = None
    if request["repair"] and (reports or outputs["differences"]):
        context.set_custom_status({**status, "stage": "rebuilding the mosaic"})
        try:
            mosaic = yield context.call_activity_with_retry(
                names.REBUILD_MOSAIC, ACTIVITY_RETRY, {"job": job, "scene": scene}
            )
        except Exception as exc:
            raise exhausted(job, "rebuilding the mosaic", exc) from exc
        if mosaic.get("error"):
            raise failure_for(job, mosaic["error"])
    context.set_custom_status({**status, "stage": "done"})
    return {
        "job_id": job["job_id"],
        "verify_id": context.instance_id,
        "repair": request["repair"],
        "windows": total["windows"],
        "windows_differing": len(reports),
        "reports": reports,
        "outputs_differing": outputs["differences"],
        "mosaic": mosaic and {k: mosaic[k] for k in ("outcome", "mosaic", "stac", "quicklook", "nbytes", "mosaic_url")},
    }


def verify_group(context: df.DurableOrchestrationContext) -> Generator[Any, Any, dict]:
    """A group of consecutive batches (large scenes), as ``render_group`` is for the job."""
    group: dict = context.get_input()
    batches = plan_batches(group["job"], group["scene"])
    first, count = group["first_batch"], group["batch_count"]
    children = [
        (batch_instance_id(group["verify_id"], i), _batch_input(group, batches[i])) for i in range(first, first + count)
    ]
    total = _empty()
    yield from fan_out(context, names.VERIFY_BATCH, children, lambda summary: _add(total, summary))
    return total


def verify_batch(context: df.DurableOrchestrationContext) -> Generator[Any, Any, dict]:
    """One batch of windows: one verify activity per window; the fan-in keeps only the differences."""
    batch: dict = context.get_input()
    payload = {"job": batch["job"], "repair": batch["repair"]}
    tasks = [
        context.call_activity_with_retry(names.VERIFY_WINDOW, ACTIVITY_RETRY, {**payload, "window": window})
        for window in batch["windows"]
    ]
    results = yield context.task_all(tasks)
    summary = {**_empty(), "windows": len(results), "batches": 1}
    for result in results:
        if result.get("error"):
            summary["errors"].append(result["error"])
        elif result["differences"]:
            summary["reports"].append(result)
    return summary
