"""The catalog's activities: the finished job's item joins its collection
(:mod:`tilecommit.catalog.collections`), once the mosaic and its STAC item are committed; then,
when a pgstac database is configured, the item is published to it once
(:mod:`tilecommit.catalog.pgstac`)."""

from __future__ import annotations

from tilecommit.catalog import collections
from tilecommit.errors import BadInputError
from tilecommit.jobs import Job
from tilecommit.settings import PGSTAC_AUTH_ENTRA

from .context import activity_context
from .tiling import run_activity


def add_to_collection(payload: dict) -> dict:
    """Add the job's stored STAC item to its collection's documents; ``{"collection", ...
    "outcome", "revision", "conflicts", "attempts", "collection_url"}`` or the error.

    The orchestration calls it only for a job whose payload names its collection (a payload from
    before collections names none, and its job ends as it did: orchestrators/tiling.py).
    """
    job = Job.from_dict(payload["job"])
    ctx = activity_context()

    def work() -> dict:
        output = ctx.stores.output
        collection = job.collection
        if collection is None:
            raise BadInputError(f"job {job.job_id}: its payload names no collection to add its item to")
        entry = collections.stored_item_entry(output, job.job_id)
        added = collections.add_item(output, collection, entry, job_id=job.job_id)
        return {**added.to_dict(), "collection_url": output.get_blob_client(added.collection_blob).url}

    return run_activity("add_to_collection", job.job_id, work)


def publish_item(payload: dict) -> dict:
    """``payload``: ``{"job"}``. The job's collection is the job's ``collection`` (chosen when it
    started), else :data:`tilecommit.catalog.pgstac.DEFAULT_COLLECTION`. Returns
    :class:`tilecommit.catalog.pgstac.Publication` as a dict, or the error that fails the job
    (a different item stored under its id); a database down is a retryable fault, raised."""
    # Imported here: psycopg costs every worker about 0.08 CPU-s at start, and only an app with
    # a pgstac database configured calls this activity.
    from tilecommit.catalog import pgstac

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
