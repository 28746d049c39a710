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
    mosaic, levels_written = None, None
    if request["repair"] and (reports or outputs["differences"]):
        if versions.steps_for(context.version).repair_level_tree:
            # Its nodes over a tile the repair gave other bytes (a release whose encoder makes
            # other bytes of the same pixels), or whose intermediate was damaged, make and write
            # theirs again; the others find theirs verified. Without this, the rebuild refuses a
            # tree computed from other contents than the rows name.
            levels, levels_written = {**status, "stage": REPAIRING_LEVELS}, []
            yield from reduce_levels(context, job, scene, levels, {}, REPAIRING_LEVELS, levels_written)
        context.set_custom_status({**status, "stage": "rebuilding the mosaic"})
        mosaic = yield from call_activity(
            context, job, names.REBUILD_MOSAIC, {"job": job, "scene": scene}, stage="rebuilding the mosaic"
        )
    context.set_custom_status({**status, "stage": "done"})
    # The nodes the repair's tree wrote (version 4.0 on, when it ran): an output key of its own,
    # so that the output of an older version's scrub stays what its history recorded.
    tree = (
        {}
        if levels_written is None
        else {"levels_written": sorted(levels_written, key=lambda n: (n["stage"], n["row"], n["col"]))}
    )
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


def verify_group(context: df.DurableOrchestrationContext) -> Generator[Any, Any, dict]:
    """A group of consecutive batches (large scenes), as ``render_group`` is for the job."""
    return (yield from run_group(context, VERIFY))


def verify_batch(context: df.DurableOrchestrationContext) -> Generator[Any, Any, dict]:
    """One batch of windows: one verify activity per window; the fan-in keeps only the differences."""
    return (yield from run_batch(context, VERIFY))
