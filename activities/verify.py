"""The scrub's activities: verify (and repair) one window, rebuild the mosaic after a repair."""

from __future__ import annotations

from tilecommit import raster
from tilecommit.grid import Window
from tilecommit.raster import scrub
from tilecommit.spec import spec_of

from .context import activity_context
from .tiling import pinned_upload, reading_own_tiles, run_activity


def verify_window(payload: dict) -> dict:
    """Compare one window's tile and row with the source window at the job's version, and with
    ``repair`` fix them; returns the window's report (never pixel data) or its error."""
    job, window, repair = payload["job"], Window.from_dict(payload["window"]), bool(payload.get("repair"))
    ctx = activity_context()

    def work() -> dict:
        return scrub.check_window(
            pinned_upload(ctx, job),
            window,
            job_id=job["job_id"],
            tiles=ctx.tiles,
            manifest=ctx.manifest,
            settings=ctx.settings,
            spec=spec_of(job),
            repair=repair,
        ).to_dict()

    result = run_activity("verify_window", job, work, window=window.id)
    return {"window": window.id, **result}


def verify_outputs(payload: dict) -> dict:
    """Check the job's mosaic, STAC item and quicklook as an assembly would, writing nothing;
    ``{"differences": [...]}`` (empty when they verify) or the error."""
    job, scene = payload["job"], raster.SceneInfo.from_dict(payload["scene"])
    ctx = activity_context()

    def work() -> dict:
        with reading_own_tiles(job):
            differences = scrub.check_outputs(
                job["job_id"],
                scene,
                **ctx.mosaic_inputs(job),
            )
        return {"differences": differences}

    return run_activity("verify_outputs", job, work)


def rebuild_mosaic(payload: dict) -> dict:
    """Assemble the job's mosaic again from its repaired manifest and replace the mosaic, STAC item
    and quicklook, each with If-Match on the version inspected at the start of this execution."""
    job, scene = payload["job"], raster.SceneInfo.from_dict(payload["scene"])
    ctx = activity_context()

    def work() -> dict:
        with reading_own_tiles(job):
            result = scrub.rebuild_outputs(
                job["job_id"],
                scene,
                **ctx.mosaic_inputs(job),
            )
        return {**result.to_dict(), "mosaic_url": ctx.output.get_blob_client(result.mosaic).url}

    return run_activity("rebuild_mosaic", job, work)
