"""The catalog's activity: the finished job's item joins its collection
(:mod:`tilecommit.catalog.collections`), once the mosaic and its STAC item are committed."""

from __future__ import annotations

from tilecommit.catalog import collections
from tilecommit.errors import BadInputError
from tilecommit.jobs import Job

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
