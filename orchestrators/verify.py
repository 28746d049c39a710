"""The scrub orchestration: validate -> plan windows -> verify in batches -> verify the outputs ->
with a repair: (version 4.0 on) the coarse levels' reduction tree -> rebuild the mosaic.

The same fan-out as the job's (:mod:`orchestrators.batches`): the same window plan, batches of
windows as sub-orchestrations started at once (grouped above ``GROUP_BATCHES``), one activity
per window, and one fan-in. Deterministic: no clock, no random, no I/O.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import azure.durable_functions as df

from . import names, versions
from .batches import WindowWork, over_windows, plan_batches, run_batch, run_group
from .calls import call_activity, in_stage
from .failures import checked
from .tiling import reduce_levels

#: The stage named when the repair's run of the reduction tree runs out of retries.
REPAIRING_LEVELS = "repairing the coarse levels"


def _empty() -> dict:
    return {"windows": 0, "batches": 0, "reports": [], "errors": []}


def _add(total: dict, part: dict) -> None:
    for key in ("windows", "batches"):
        total[key] += part[key]
    total["reports"].extend(part["reports"])
    total["errors"].extend(part["errors"])


def summarise_differences(results: list[dict]) -> dict:
    """A batch's summary of its windows' ``verify_window`` results: only the differences are kept."""
    summary = {**_empty(), "windows": len(results), "batches": 1}
    for result in results:
        if result.get("error"):
            summary["errors"].append(result["error"])
        elif result["differences"]:
            summary["reports"].append(result)
    return summary


#: The scrub's windows: batches of ``verify_window``, each handed the job and whether to repair,
#: named after the scrub's own instance id (a job may be scrubbed many times).
VERIFY = WindowWork(
    batch=names.VERIFY_BATCH,
    group=names.VERIFY_GROUP,
    activity=names.VERIFY_WINDOW,
    shared=("job", "repair"),
    summarise=summarise_differences,
    empty=_empty,
    add=_add,
    parent_key="verify_id",
)


def verify_scene(context: df.DurableOrchestrationContext) -> Generator[Any, Any, dict]:
    """Input ``{"job": the job's own input, "repair": bool}``; output the differences found and,
    with ``repair``, what was written for each and the mosaic's rebuild."""
    request: dict = context.get_input()
    job = request["job"]
    validated = yield from call_activity(context, job, names.VALIDATE_SOURCE, job, stage="validating the upload")
    scene = validated["scene"]
    batches = plan_batches(job, scene)
    status = {"stage": "verifying", "windows_done": 0, "windows_total": sum(len(b) for b in batches)}
    context.set_custom_status(status)
    total = _empty()

    def finished(summary: dict) -> None:
        checked(job, summary)
        _add(total, summary)
        status["windows_done"] = total["windows"]
        context.set_custom_status(status)

    verified = over_windows(context, VERIFY, request, context.instance_id, scene, batches, finished)
    yield from in_stage(job, "verifying the tiles", verified)

    reports = sorted(total["reports"], key=lambda r: r["window"])
    # The outputs are checked too (after the windows' repairs, if any): a mosaic replaced or damaged
    # while its tiles are fine, or one a repair left unrebuilt, is found here and rebuilt below.
    context.set_custom_status({**status, "stage": "verifying the mosaic"})
    outputs = yield from call_activity(
        context, job, names.VERIFY_OUTPUTS, {"job": job, "scene": scene}, stage="verifying the mosaic"
    )
    mosaic: dict | None = None
    tree: dict = {}
    if request["repair"] and (reports or outputs["differences"]):
        mosaic, tree = yield from rebuild(context, job, scene, status)
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
        **tree,
    }


def rebuild(
    context: df.DurableOrchestrationContext, job: dict, scene: dict, status: dict
) -> Generator[Any, Any, tuple[dict, dict]]:
    """After a repair: (version 4.0 on) the job's reduction tree, then the mosaic rebuilt; the
    rebuild's result and, when the tree ran, ``{"levels_written": [...]}``: the nodes that wrote
    their intermediate (an output key of its own, so that an older version's scrub keeps the
    output its history recorded).

    The nodes over a repaired tile write theirs again (they carry its row's new version, and
    other pixels' levels where the repair gave it other bytes: an encoder changed since), as does
    a node whose intermediate was damaged; the others find theirs verified. Without the tree, the
    rebuild refuses one computed from other contents than the rows name."""
    tree: dict = {}
    if versions.steps_for(context.version).repair_level_tree:
        written: list[dict] = []
        levels = {**status, "stage": REPAIRING_LEVELS}
        yield from reduce_levels(context, job, scene, levels, {}, REPAIRING_LEVELS, written)
        tree = {"levels_written": sorted(written, key=lambda n: (n["stage"], n["row"], n["col"]))}
    context.set_custom_status({**status, "stage": "rebuilding the mosaic"})
    mosaic = yield from call_activity(
        context, job, names.REBUILD_MOSAIC, {"job": job, "scene": scene}, stage="rebuilding the mosaic"
    )
    return mosaic, tree


def verify_group(context: df.DurableOrchestrationContext) -> Generator[Any, Any, dict]:
    """A group of consecutive batches (large scenes), as ``render_group`` is for the job."""
    return (yield from run_group(context, VERIFY))


def verify_batch(context: df.DurableOrchestrationContext) -> Generator[Any, Any, dict]:
    """One batch of windows: one verify activity per window; the fan-in keeps only the differences."""
    return (yield from run_batch(context, VERIFY))
