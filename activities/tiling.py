"""The job's activities: validate the source, render one window, assemble the mosaic."""

from __future__ import annotations

import logging

from azure.core.exceptions import ResourceNotFoundError

from tilecommit import raster
from tilecommit.errors import BadInputError, MosaicCheckError
from tilecommit.grid import Window
from tilecommit.storage import vsiaz_path

from .context import ActivityContext, activity_context

logger = logging.getLogger(__name__)


def _source_changed(ctx: ActivityContext, job: dict) -> str | None:
    """Why the job's source can no longer be read as the version it was started for, or None.

    The job id names one version (URL + ETag) of the upload; GDAL cannot pin an ETag, so each
    reader checks it first. An overwritten upload has a job of its own.
    """
    try:
        props = ctx.input.get_blob_client(job["blob"]).get_blob_properties()
    except ResourceNotFoundError:
        return f"the upload {job['blob']!r} was deleted"
    if props.etag.strip('"') != job["etag"].strip('"'):
        return f"the upload {job['blob']!r} was overwritten (ETag {props.etag}, job started for {job['etag']})"
    return None


def validate_source(job: dict) -> dict:
    """Inspect the upload; ``{"ok": True, "scene": ...}`` or ``{"ok": False, "error": ...}``."""
    ctx = activity_context()
    changed = _source_changed(ctx, job)
    if changed:
        return {"ok": False, "error": changed, "error_type": "SourceChanged"}
    try:
        scene = raster.inspect_source(
            vsiaz_path(ctx.settings.input_container, job["blob"]),
            settings=ctx.settings,
            gdal_options=ctx.connection.gdal_options(),
        )
    except BadInputError as exc:
        logger.warning("job %s: refusing %r: %s", job["job_id"], job["blob"], exc)
        return {"ok": False, "error": str(exc), "error_type": type(exc).__name__}
    return {"ok": True, "scene": scene.to_dict()}


def render_tile(payload: dict) -> dict:
    """Render, commit and record one window; returns its outcome (never pixel data)."""
    job, window = payload["job"], Window.from_dict(payload["window"])
    ctx = activity_context()
    changed = _source_changed(ctx, job)
    if changed:
        return {"window": window.id, "error": changed, "error_type": "SourceChanged"}
    try:
        result = raster.render_tile(
            vsiaz_path(ctx.settings.input_container, job["blob"]),
            window,
            job_id=job["job_id"],
            tiles=ctx.tiles,
            manifest=ctx.manifest,
            settings=ctx.settings,
            gdal_options=ctx.connection.gdal_options(),
        )
    except BadInputError as exc:
        return {"window": window.id, "error": str(exc), "error_type": type(exc).__name__}
    return result.to_dict()


def assemble_mosaic(payload: dict) -> dict:
    """Assemble the job's mosaic from its manifest; returns the outputs' URLs.

    Activities run at least once, so another execution may be assembling the same mosaic, or
    may have died half-way. Neither is waited for: each execution assembles, the first commit
    wins and the others return ``already-present`` (see :mod:`tilecommit.raster.attempt`).
    """
    job, scene = payload["job"], raster.SceneInfo.from_dict(payload["scene"])
    ctx = activity_context()
    try:
        result = raster.assemble_mosaic(
            job["job_id"],
            scene,
            tiles=ctx.tiles,
            output=ctx.output,
            manifest=ctx.manifest,
            settings=ctx.settings,
            gdal_options=ctx.connection.gdal_options(),
            source_name=job["blob"],
        )
    except MosaicCheckError as exc:
        # A mosaic that fails its own checks is a bug that repeating cannot fix; and once
        # committed, a retry would only find it present. Fail the job loudly instead.
        logger.error("job %s: mosaic check failed: %s", job["job_id"], exc)
        return {"error": f"mosaic check failed: {exc}", "error_type": type(exc).__name__}
    summary = result.to_dict()

    def url(name: str) -> str:
        return ctx.output.get_blob_client(name).url

    summary.update(
        mosaic_url=url(result.mosaic),
        stac_url=url(result.stac),
        quicklook_url=url(result.quicklook),
    )
    return summary
