"""The job's publication to the catalog: its committed STAC item into pgstac, once
(:mod:`tilecommit.catalog.pgstac`), when a pgstac database is configured; else it says so at once."""

from __future__ import annotations

from tilecommit.catalog import pgstac
from tilecommit.jobs import Job
from tilecommit.settings import PGSTAC_AUTH_ENTRA

from .context import activity_context
from .tiling import run_activity


def publish_item(payload: dict) -> dict:
    """``payload``: ``{"job"}``. The job's collection is the job's ``collection`` (chosen when it
    started), else :data:`tilecommit.catalog.pgstac.DEFAULT_COLLECTION`. Returns
    :class:`tilecommit.catalog.pgstac.Publication` as a dict, or the error that fails the job
    (a different item stored under its id); a database down is a retryable fault, raised."""
    job = Job.from_dict(payload["job"])
    collection = payload["job"].get("collection") or pgstac.DEFAULT_COLLECTION
    ctx = activity_context()

    def work() -> dict:
        settings = ctx.settings
        entra = settings.publishes and settings.pgstac_auth == PGSTAC_AUTH_ENTRA
        published = pgstac.publish_item(
            job.job_id,
            ctx.stores.output,
            settings,
            collection=collection,
            credential=ctx.connection.credential if entra else None,
        )
        return published.to_dict()

    return run_activity("publish_item", job.job_id, work)
