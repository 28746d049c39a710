"""The job orchestration: validate -> plan windows -> render in batches -> assemble (version
3.0 on: the coarse levels' reduction tree, stage after stage; a large mosaic: plan its staging ->
stage the shares -> commit) -> add the item to its collection.

Orchestrator code is replayed from history many times, so everything here is deterministic:
no clock, no random, no I/O. The window plan is a pure function of the validated scene size
and the window size of the output spec the starter put in the input (never the app settings).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import azure.durable_functions as df

from tilecommit import usage
from tilecommit.jobs import Job
from tilecommit.raster.assembly.reduction import plan_level_tree

from . import names, versions
from .batches import WindowWork, over_windows, plan_batches, run_batch, run_group
from .calls import activity_task, call_activity, fan_in, in_stage
from .failures import JobFailure, checked

#: The stage named when the mosaic's staging or assembly runs out of retries.
ASSEMBLING = "assembling the mosaic"
#: The stage named when the item's publication to the catalog runs out of retries.
PUBLISHING = "publishing the STAC item to the catalog"


def empty_summary() -> dict:
    return {"windows": 0, "written": 0, "already_present": 0, "skipped": 0, "bytes": 0, "errors": [], "usage": {}}


def add_summary(total: dict, part: dict) -> None:
    for key in ("windows", "written", "already_present", "skipped", "bytes"):
        total[key] += part[key]
    total["errors"].extend(part["errors"])
    usage.add(total["usage"], part.get("usage"))


def empty_batches() -> dict:
    return {**empty_summary(), "batches": 0}


def add_batches(total: dict, part: dict) -> None:
    add_summary(total, part)
    total["batches"] += part["batches"]


def summarise_tiles(results: list[dict]) -> dict:
    """A batch's summary of its windows' ``render_tile`` results; errors are kept for the job to fail on."""
    summary = {**empty_batches(), "windows": len(results), "batches": 1}
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


#: The job's tiles: batches of ``render_tile``, each handed the job.
RENDER = WindowWork(
    batch=names.RENDER_BATCH,
    group=names.RENDER_GROUP,
    activity=names.RENDER_TILE,
    shared=("job",),
    summarise=summarise_tiles,
    empty=empty_batches,
    add=add_batches,
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
    planned = yield from call_activity(
        context,
        job,
        names.PLAN_MOSAIC_SHARES,
        {"job": job, "scene": scene, "share_bytes": share_bytes},
        stage=ASSEMBLING,
        used=used,
    )
    if not planned.get("shares"):
        return None
    staged = planned["shares"]
    status.update(shares_done=0, shares_total=staged["shares"])
    context.set_custom_status(status)
    unsupported = []

    def staged_one(result: dict) -> None:
        checked(job, result, used)
        unsupported.extend([result["unsupported"]] if result.get("unsupported") else [])
        status["shares_done"] += 1
        context.set_custom_status(status)

    tasks = [
        activity_task(context, names.STAGE_MOSAIC_SHARE, {"job": job, "shares": staged, "share": index})
        for index in range(staged["shares"])
    ]
    yield from in_stage(job, ASSEMBLING, fan_in(context, tasks, staged_one))
    return None if unsupported else staged


def reduce_levels(
    context: df.DurableOrchestrationContext,
    job: dict,
    scene: dict,
    status: dict,
    used: dict,
    stage_name: str = ASSEMBLING,
    written: list | None = None,
) -> Generator[Any, Any, None]:
    """The coarse levels' reduction tree the job's payload plans (a pure function of the scene's
    size and the job: none for a payload from before the tree), stage after stage, each stage's
    nodes all at once: the commit then only stitches their intermediates. Tiles that cannot be
    block-copied stop it (the commit falls back as it does for them). A node whose intermediate
    exists verifies it and repairs one that differs, so the scrub's repair runs it too
    (:mod:`orchestrators.verify`), its retries running out named as ``stage_name``; ``written``,
    if given, receives the position of each node that wrote its intermediate (new or repaired)."""
    parsed = Job.from_dict(job)
    tree = plan_level_tree(scene["width"], scene["height"], parsed.spec, parsed.coarse_levels_per_node)
    if tree is None:
        return
    status.update(levels_done=0, levels_total=sum(len(stage.nodes) for stage in tree.stages))
    context.set_custom_status(status)
    incompatible: list[str] = []

    def reduced(result: dict) -> None:
        checked(job, result, used)
        incompatible.extend([result["incompatible"]] if result.get("incompatible") else [])
        if written is not None and result.get("outcome") == "written":
            written.append({key: result[key] for key in ("stage", "row", "col")})
        status["levels_done"] += 1
        context.set_custom_status(status)

    for index, stage in enumerate(tree.stages):
        tasks = [
            activity_task(
                context, names.REDUCE_LEVEL_NODE, {"job": job, "scene": scene, "stage": index, "row": r, "col": c}
            )
            for r, c in stage.nodes
        ]
        yield from in_stage(job, stage_name, fan_in(context, tasks, reduced))
        if incompatible:
            return


def assemble(
    context: df.DurableOrchestrationContext, job: dict, scene: dict, tile_bytes: int, status: dict, used: dict
) -> Generator[Any, Any, dict]:
    """The mosaic, by one activity; when the tiles hold more than one activity may copy (the
    job's ``assembly_share_bytes``), its ranges are staged in shares first and that activity
    commits them. The activity is given what the job used until then, which its STAC item
    records with what the activity itself used until it made the item. Version 3.0 on, the
    coarse levels' reduction tree runs first (:func:`reduce_levels`)."""
    if versions.steps_for(context.version).level_tree:
        yield from reduce_levels(context, job, scene, status, used)
    share_bytes = Job.from_dict(job).share_bytes
    payload = {"job": job, "scene": scene, "tile_bytes": tile_bytes}
    if tile_bytes > share_bytes:
        staged = yield from stage_in_shares(context, job, scene, share_bytes, status, used)
        if staged is not None:
            payload["shares"] = staged
    payload["usage"] = usage.add({}, used)  # a copy: what the job used until now, for its STAC item
    return (yield from call_activity(context, job, names.ASSEMBLE_MOSAIC, payload, stage=ASSEMBLING, used=used))


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
        return (
            yield from call_activity(
                context, job, names.PUBLISH_JOB_EVENT, payload, stage="publishing the completion event"
            )
        )
    except JobFailure:
        if outcome == "completed":
            raise
        return {}


def run_job(context: df.DurableOrchestrationContext, job: dict, used: dict) -> Generator[Any, Any, dict]:
    """Validate, render in batches, assemble, add the item to its collection (as the instance's
    orchestration version says: :mod:`orchestrators.versions`), publish it to the catalog (a job
    started with a catalog configured, ``Job.publish``); the job's summary."""
    version = versions.status_fields(context.version)
    context.set_custom_status({"stage": "validating", "windows_done": 0, "windows_total": None, **version})
    validated = yield from call_activity(
        context, job, names.VALIDATE_SOURCE, job, stage="validating the upload", used=used
    )
    scene = validated["scene"]

    batches = plan_batches(job, scene)
    totals = empty_summary()
    status = {
        "stage": "tiling",
        "windows_done": 0,
        "windows_total": sum(len(b) for b in batches),
        "batches_done": 0,
        "batches_total": len(batches),
        **version,
    }
    context.set_custom_status(status)

    def finished(summary: dict) -> None:
        checked(job, summary, used)
        add_summary(totals, summary)
        status.update(windows_done=totals["windows"], batches_done=status["batches_done"] + summary["batches"])
        context.set_custom_status(status)

    # A tile's retries running out fail its batch (or group), and so the job, in this stage.
    rendered = over_windows(context, RENDER, {"job": job}, job["job_id"], scene, batches, finished)
    yield from in_stage(job, "rendering the tiles", rendered)

    status["stage"] = "assembling"
    context.set_custom_status(status)
    mosaic = yield from assemble(context, job, scene, totals["bytes"], status, used)
    catalogued = yield from catalogue(context, job, status, used)
    context.set_custom_status({**status, "stage": "done"})
    totals.pop("errors")
    totals["usage"] = used  # the whole job's, not only its tiles'
    return {
        "job_id": job["job_id"],
        "source": job["blob"],
        "spec": Job.from_dict(job).spec.to_dict(),
        **totals,
        "mosaic_outcome": mosaic["outcome"],
        "mosaic_url": mosaic["mosaic_url"],
        "stac_url": mosaic["stac_url"],
        "quicklook_url": mosaic["quicklook_url"],
        **catalogued,
    }


def catalogue(
    context: df.DurableOrchestrationContext, job: dict, status: dict, used: dict
) -> Generator[Any, Any, dict]:
    """The job's item into its collection, then into the catalog (pgstac), before the completion
    event (announce), so the event carries the item's link; what each did, for the job's summary
    (``collection``, ``published``).

    The collection step runs as the instance's version says (:mod:`orchestrators.versions`: for the
    versions so far, when the payload names a collection); publication only for a payload that
    asks for it (one from before publication, or started with no catalog configured, has no
    ``publish``). A job started by a release whose orchestration announced it right after its
    assembly replays only if it still does."""
    done: dict = {}
    if versions.runs_collection_step(context.version, job):
        status["stage"] = "cataloguing"
        context.set_custom_status(status)
        done["collection"] = yield from call_activity(
            context, job, names.ADD_TO_COLLECTION, {"job": job}, stage="adding the item to its collection", used=used
        )
    if Job.from_dict(job).publish:
        status["stage"] = "publishing"
        context.set_custom_status(status)
        called = yield from call_activity(context, job, names.PUBLISH_ITEM, {"job": job}, stage=PUBLISHING, used=used)
        done["published"] = {k: v for k, v in called.items() if k != "usage"}  # counted in the job's usage
    return done


def render_group(context: df.DurableOrchestrationContext) -> Generator[Any, Any, dict]:
    """A group of consecutive batches (large scenes): their batches as sub-orchestrations."""
    return (yield from run_group(context, RENDER))


def render_batch(context: df.DurableOrchestrationContext) -> Generator[Any, Any, dict]:
    """One batch of windows: fan out one activity per window, fan in a small summary."""
    return (yield from run_batch(context, RENDER))
