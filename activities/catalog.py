"""The catalog's activity: the finished job's item joins its collection
(:mod:`tilecommit.catalog.collections`), once the mosaic and its STAC item are committed."""

from __future__ import annotations

from tilecommit.catalog import collections
from tilecommit.jobs import Job

from .context import activity_context
from .tiling import run_activity


def add_to_collection(payload: dict) -> dict:
    """Add the job's stored STAC item to its collection's documents; ``{"collection", ...
    "outcome", "revision", "conflicts", "attempts", "collection_url"}`` or the error.

    A job whose payload names no collection (started before collections existed) joins the one
    its blob name gives under this instance's settings (the upload's metadata is not read again).
    """
    job = Job.from_dict(payload["job"])
    ctx = activity_context()

    def work() -> dict:
        output = ctx.stores.output
        collection = job.collection or ctx.settings.collection_for(job.blob, None)
        entry = collections.stored_item_entry(output, job.job_id)
        added = collections.add_item(output, collection, entry, job_id=job.job_id)
        return {**added.to_dict(), "collection_url": output.get_blob_client(added.collection_blob).url}

    return run_activity("add_to_collection", job.job_id, work)
