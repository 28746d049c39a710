"""The job's activities: validate the source, render one window, compute a node of the mosaic's
coarse levels (:mod:`tilecommit.raster.assembly.level_nodes`), assemble the mosaic (in one
activity, or planned, staged in shares and committed: :mod:`tilecommit.raster.assembly.shares`), and
publish the job's completion event (:mod:`tilecommit.events`) once it ended.

Each reads its input's job as a :class:`tilecommit.jobs.Job` (the orchestrations carry it as a
dict) and what decides its outputs (the window grid, the block size, the profile) from the job's
output spec, never from the app settings (see :mod:`tilecommit.spec`); the settings give it the
containers, the table and GDAL's limits (:class:`tilecommit.stores.JobStores`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tilecommit import cost, events, jobs, raster
from tilecommit.errors import (
    BadInputError,
    CorruptTileError,
    IncompatibleTilesError,
    InvalidRasterError,
    error_value,
    is_retryable,
)
from tilecommit.grid import Window
from tilecommit.jobs import Job
from tilecommit.observability.observed import job_id_of
from tilecommit.raster.assembly import level_nodes, reduction
from tilecommit.raster.assembly import shares as split
from tilecommit.raster.gdal_errors import job_messages
from tilecommit.storage import readable_blob_name

from .context import ActivityContext, activity_context

logger = logging.getLogger(__name__)


def pinned_upload(ctx: ActivityContext, job: Job) -> raster.PinnedBlob:
    """The job's upload at the job's version: every read of it carries ``If-Match`` with the job's ETag.

    The job id names one version (URL + ETag) of the upload; the service refuses to serve any
    other (:class:`~tilecommit.errors.SourceChangedError`, naming both ETags). An overwritten
    upload has a job of its own. A scene document's members are pinned likewise, each to its own
    ETag in the job (:func:`tilecommit.raster.reading.scene_document.pin_members`).
    """
    upload = raster.PinnedBlob(ctx.input.get_blob_client(readable_blob_name(job.blob)), job.etag)
    if job.members is not None:  # a scene document: each member at the version the job was started with
        raster.pin_members(upload, job.members, lambda name: ctx.input.get_blob_client(readable_blob_name(name)))
    return upload


@contextmanager
def reading_own_tiles(job_id: str) -> Iterator[None]:
    """Work that reads the job's tiles back: they are its own output, checked when written, so
    one that cannot be decoded is storage's fault (a short or damaged read), never the upload's."""
    try:
        yield
    except InvalidRasterError as exc:
        raise CorruptTileError(f"job {job_id}: a tile cannot be read back as written: {exc}") from exc


def run_activity(name: str, job_id: str, work: Callable[[], dict], *, window: str | None = None) -> dict:
    """``work()``'s result, or its non-retryable error as ``{"error": error_value(...)}``.

    The one contract of every activity: a retryable fault is raised (the orchestrator's retry
    policy repeats the activity); anything else comes back as a value and fails the job once,
    with its message, without burning a retry.
    """
    try:
        with job_messages(job_id):
            return work()
    except Exception as exc:
        return _classified(exc, name, job_id, window)


def _classified(exc: Exception, name: str, job_id: str, window: str | None) -> dict:
    """Raise ``exc`` again if it is retryable, else its error value (see :func:`run_activity`)."""
    where = f" {window}" if window else ""
    if is_retryable(exc):
        logger.warning("job %s: %s%s: retryable fault: %s", job_id, name, where, exc)
        raise exc
    logger.warning("job %s: %s%s failed for good: %s", job_id, name, where, exc)
    return {"error": error_value(exc, window=window)}


def held_to_contract(name: str, function: Callable[[Any], dict]) -> Callable[[Any], dict]:
    """The activity ``function`` held to :func:`run_activity`'s contract as a whole, the decoding
    of its input included: an input it cannot read (a bug, or the payload of a release that named
    its fields otherwise, still in a running job's history) fails the job once with what was
    wrong, instead of being retried as a storage fault and reported as one.

    The registration in function_app.py applies it to every activity; what ``function`` already
    turned into an error value passes through unchanged."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> dict:
        try:
            return function(*args, **kwargs)
        except Exception as exc:
            payload = args[0] if args else next(iter(kwargs.values()), None)
            return _classified(exc, name, job_id_of(payload) or "(unknown)", None)

    return run


def validate_source(job: dict) -> dict:
    """Inspect the upload of the job ``job`` (its payload: the binding names the input so);
    ``{"scene": ...}`` or ``{"error": {"kind", "type", "message", "window"}}``."""
    return _validate(Job.from_dict(job), activity_context())


def _validate(job: Job, ctx: ActivityContext) -> dict:
    def work() -> dict:
        if job.profile_error:  # the upload's metadata names a profile this build cannot make
            raise BadInputError(job.profile_error)
        if job.collection_error:  # the upload's metadata names no valid collection
            raise BadInputError(job.collection_error)
        upload = pinned_upload(ctx, job)
        scene = raster.inspect_source(upload, settings=ctx.settings, spec=job.spec)
        # The assembly's temporary disk, from the scene's numbers (the reading room cannot count the mosaic's levels).
        raster.check_temporary_disk(upload.name, scene, job.spec)
        return {"scene": scene.to_dict()}

    return run_activity("validate_source", job.job_id, work)


def render_tile(payload: dict) -> dict:
    """Render, commit and record one window; returns its outcome (never pixel data) or its error."""
    job, window = Job.from_dict(payload["job"]), Window.from_dict(payload["window"])
    ctx = activity_context()

    def work() -> dict:
        return raster.render_tile(job, ctx.stores, pinned_upload(ctx, job), window).to_dict()

    result = run_activity("render_tile", job.job_id, work, window=window.id)
    return {"window": window.id, **result}


def assemble_mosaic(payload: dict) -> dict:
    """Assemble the job's mosaic from its manifest; returns the outputs' URLs or the error.

    Activities run at least once, so another execution may be assembling the same mosaic, or
    may have died half-way. Neither is waited for: each execution assembles, the first commit
    wins and the others return ``already-present`` (see :mod:`tilecommit.raster.assembly.attempt`).
    A mosaic that fails its own checks (a bug that repeating cannot fix) comes back as an error.
    ``payload["shares"]`` (a split staging's commit): the ranges were staged by
    :func:`stage_mosaic_share`; only the head and the coarse levels are staged here.
    ``payload["usage"]`` and ``["tile_bytes"]``: what the job used before (added up by the
    orchestration) and its tiles' bytes, for the cost the STAC item records.
    """
    job, scene = Job.from_dict(payload["job"]), raster.SceneInfo.from_dict(payload["scene"])
    shares = split.StagedShares.from_dict(payload["shares"]) if payload.get("shares") else None
    ctx = activity_context()

    def work() -> dict:
        with reading_own_tiles(job.job_id):
            result = raster.assemble_mosaic(
                job,
                ctx.stores,
                scene,
                shares=shares,
                cost=lambda: cost.estimate_so_far(
                    payload.get("usage"),
                    instance_memory_mb=ctx.settings.instance_memory_mb,
                    tile_bytes=payload.get("tile_bytes", 0),
                ),
            )
        summary = result.to_dict()

        def url(name: str) -> str:
            return ctx.stores.output.get_blob_client(name).url

        summary.update(
            mosaic_url=url(result.mosaic),
            stac_url=url(result.stac),
            quicklook_url=url(result.quicklook),
        )
        return summary

    return run_activity("assemble_mosaic", job.job_id, work)


def plan_mosaic_shares(payload: dict) -> dict:
    """Plan the split staging of the mosaic: ``{"shares": StagedShares}``, or ``{"single": why}``
    when one activity assembles it."""
    job, scene = Job.from_dict(payload["job"]), raster.SceneInfo.from_dict(payload["scene"])
    ctx = activity_context()

    def work() -> dict:
        with reading_own_tiles(job.job_id):
            planned = split.plan_shares(job, ctx.stores, scene, share_bytes=payload["share_bytes"])
        return {"single": planned} if isinstance(planned, str) else {"shares": planned.to_dict()}

    return run_activity("plan_mosaic_shares", job.job_id, work)


def stage_mosaic_share(payload: dict) -> dict:
    """Stage share ``payload["share"]`` of the planned ranges. Safe to run any number of times,
    at once or one after the other: every execution stages the same ids with the same bytes."""
    job, staged, index = (
        Job.from_dict(payload["job"]),
        split.StagedShares.from_dict(payload["shares"]),
        payload["share"],
    )
    ctx = activity_context()

    def work() -> dict:
        return split.stage_share(job, ctx.stores, staged, index)

    return run_activity("stage_mosaic_share", job.job_id, work)


def reduce_level_node(payload: dict) -> dict:
    """Node (``row``, ``col``) of stage ``stage`` of the job's coarse-level reduction tree
    (:mod:`tilecommit.raster.assembly.level_nodes`): its intermediate written once, or found
    and verified; ``{"incompatible": why}`` when the tiles cannot be block-copied (the commit
    then falls back as it does for such tiles). Safe to run any number of times, at once too."""
    job, scene = Job.from_dict(payload["job"]), raster.SceneInfo.from_dict(payload["scene"])
    stage, row, col = payload["stage"], payload["row"], payload["col"]
    ctx = activity_context()

    def work() -> dict:
        tree = reduction.plan_level_tree(scene.width, scene.height, job.spec, job.coarse_levels_per_node)
        if tree is None or not 0 <= stage < len(tree.stages) or (row, col) not in tree.stages[stage].nodes:
            raise BadInputError(f"job {job.job_id} has no level node {stage} ({row}, {col})")
        try:
            with reading_own_tiles(job.job_id):
                return level_nodes.reduce_node(job, ctx.stores, scene, tree, stage, row, col)
        except IncompatibleTilesError as exc:
            return {"stage": stage, "row": row, "col": col, "incompatible": str(exc)}

    return run_activity("reduce_level_node", job.job_id, work)


OUTPUT_NAMES = {"mosaic": jobs.mosaic_blob_name, "stac": jobs.stac_blob_name, "quicklook": jobs.quicklook_blob_name}


def publish_job_event(payload: dict) -> dict:
    """``payload``: ``{"job", "outcome", "started_at", "ended_at", "duration_s", "result", "error"}``
    (made by the orchestration). A completed job's event names its outputs with the ETags storage
    holds for them now; returns :class:`tilecommit.events.PublishResult` as a dict."""
    job = Job.from_dict(payload["job"])
    ctx = activity_context()

    def work() -> dict:
        publishing = bool(ctx.settings.events_endpoint)
        outputs = {}
        if payload["outcome"] == "completed" and publishing:  # read only for an event that goes out
            for name, blob_name in OUTPUT_NAMES.items():
                blob = ctx.stores.output.get_blob_client(blob_name(job.job_id))
                outputs[name] = {"url": blob.url, "etag": blob.get_blob_properties().etag.strip('"')}
        tile_bytes = (payload.get("result") or {}).get("bytes") or 0
        used = cost.estimate(
            payload.get("usage"), instance_memory_mb=ctx.settings.instance_memory_mb, tile_bytes=tile_bytes
        )
        event = events.job_event(
            job,
            outcome=payload["outcome"],
            started_at=payload["started_at"],
            ended_at=payload["ended_at"],
            duration_s=payload["duration_s"],
            result=payload.get("result"),
            error=payload.get("error"),
            outputs=outputs,
            cost=used,
        )
        if not publishing:
            logger.info(
                "job %s: %s, no events endpoint set: event %s not published", job.job_id, event["type"], event["id"]
            )
            return events.PublishResult("not-configured", event["id"], event["type"], used).to_dict()
        events.publish(ctx.settings.events_endpoint, event, ctx.connection.credential)
        logger.info("job %s: published %s (event %s)", job.job_id, event["type"], event["id"])
        return events.PublishResult("published", event["id"], event["type"], used).to_dict()

    return run_activity("publish_job_event", job.job_id, work)
