"""The scrub's activities: verify (and repair) one window, rebuild the mosaic after a repair."""

from __future__ import annotations

from tilecommit import raster
from tilecommit.grid import Window
from tilecommit.jobs import Job
from tilecommit.raster import scrub

from .context import activity_context
from .tiling import pinned_upload, reading_own_tiles, run_activity


def verify_window(payload: dict) -> dict:
    """Compare one window's tile and row with the source window at the job's version, and with
    ``repair`` fix them; returns the window's report (never pixel data) or its error."""
    job, window, repair = (
        Job.from_dict(payload["job"]),
        Window.from_dict(payload["window"]),
        bool(payload.get("repair")),
    )
    ctx = activity_context()

    def work() -> dict:
        return scrub.check_window(job, ctx.stores, pinned_upload(ctx, job), window, repair=repair).to_dict()

    result = run_activity("verify_window", job.job_id, work, window=window.id)
    return {"window": window.id, **result}


def verify_outputs(payload: dict) -> dict:
    """Check the job's mosaic, STAC item and quicklook as an assembly would, writing nothing;
    ``{"differences": [...]}`` (empty when they verify) or the error."""
    job, scene = Job.from_dict(payload["job"]), raster.SceneInfo.from_dict(payload["scene"])
    ctx = activity_context()

    def work() -> dict:
        with reading_own_tiles(job.job_id):
            differences = scrub.check_outputs(job, ctx.stores, scene)
        return {"differences": differences}

    return run_activity("verify_outputs", job.job_id, work)


def rebuild_mosaic(payload: dict) -> dict:
    """Assemble the job's mosaic again from its repaired manifest and replace the mosaic, STAC item
    and quicklook, each with If-Match on the version inspected at the start of this execution."""
    job, scene = Job.from_dict(payload["job"]), raster.SceneInfo.from_dict(payload["scene"])
    ctx = activity_context()

    def work() -> dict:
        with reading_own_tiles(job.job_id):
            result = scrub.rebuild_outputs(job, ctx.stores, scene)
        return {**result.to_dict(), "mosaic_url": ctx.stores.output.get_blob_client(result.mosaic).url}

    return run_activity("rebuild_mosaic", job.job_id, work)
