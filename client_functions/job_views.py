"""What the web page reads beside a job's state (client_functions/job_api.py): a finished job's
STAC item and quicklook, a collection's document, and the timeline of a job's windows.

Outputs are read from the output container with the app's own identity and handed to the
browser through the app, so no URL the page holds carries a storage key or a SAS. A job's item
and quicklook are written once (create-only), so their blob ETag is a strong validator and they
may be cached for good; a collection document changes with every item added, so it is
revalidated on each read.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import datetime

import azure.durable_functions as df
from azure.data.tables import TableClient
from azure.storage.blob import ContainerClient

from orchestrators import names
from tilecommit import jobs
from tilecommit.catalog.documents import collection_blob_name
from tilecommit.catalog.naming import check_collection_id
from tilecommit.errors import BadInputError, JobApiError
from tilecommit.grid import Window
from tilecommit.manifest import window_timings
from tilecommit.storage_answers import unless_missing

from .job_api import instances, job_status

#: The outputs of a job the page may read, and their content types.
JOB_OUTPUTS = {"item.json": "application/json", "quicklook.png": "image/png"}
IMMUTABLE = "private, max-age=31536000, immutable"
REVALIDATE = "no-cache"


@dataclass(frozen=True)
class BlobAnswer:
    body: bytes
    content_type: str
    etag: str
    cache_control: str


def _read(container: ContainerClient, name: str, missing: str) -> tuple[bytes, str]:
    blob = container.get_blob_client(name)
    downloaded = unless_missing("reading", name, blob.download_blob)
    if downloaded is None:
        raise JobApiError(404, "not-found", missing)
    return downloaded.readall(), f'"{downloaded.properties.etag.strip(chr(34))}"'


async def job_output(
    client: df.DurableOrchestrationClient, outputs: ContainerClient, job_id: str, name: str
) -> BlobAnswer:
    """A completed job's STAC item or quicklook, as stored."""
    if name not in JOB_OUTPUTS:
        raise JobApiError(404, "unknown-output", f"{name!r}: a job's outputs here are {', '.join(JOB_OUTPUTS)}")
    status = await job_status(client, job_id)
    if status.runtime_status != df.OrchestrationRuntimeStatus.Completed:
        raise JobApiError(404, "job-not-completed", f"job {job_id} has no outputs until it completes")
    blob = jobs.stac_blob_name(job_id) if name == "item.json" else jobs.quicklook_blob_name(job_id)
    body, etag = await asyncio.to_thread(_read, outputs, blob, f"job {job_id} has no {name}")
    return BlobAnswer(body, JOB_OUTPUTS[name], etag, IMMUTABLE)


async def collection_document(outputs: ContainerClient, collection_id: str) -> BlobAnswer:
    """The collection's STAC Collection document (docs/catalog.md)."""
    try:
        check_collection_id(collection_id, where="collection")
    except BadInputError as exc:
        raise JobApiError(400, "invalid-collection-id", str(exc)) from None
    name = collection_blob_name(collection_id)
    body, etag = await asyncio.to_thread(_read, outputs, name, f"no collection {collection_id}")
    return BlobAnswer(body, "application/json", etag, REVALIDATE)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _span(start: datetime | None, end: datetime | None) -> float | None:
    return round((end - start).total_seconds(), 3) if start and end else None


async def window_timeline(client: df.DurableOrchestrationClient, manifest: TableClient, job_id: str) -> dict:
    """Per window of the job: when its batch was scheduled (the batch's sub-orchestration was
    created, and schedules all its windows in its first episode), when its activity started
    rendering and when its manifest row was written; the queue wait and run time between them.

    A window rendered by an earlier run of a retried job started before its batch of this run
    was scheduled: its wait is None (it did not wait in this run)."""
    await job_status(client, job_id)
    scheduled: dict[str, tuple[str, datetime | None]] = {}
    for batch in await instances(client, instanceIdPrefix=f"{job_id}-", showInput="true"):
        if batch.name != names.RENDER_BATCH:
            continue
        batch_input = json.loads(batch.input_) if isinstance(batch.input_, str) else batch.input_
        for window in (batch_input or {}).get("windows") or ():
            scheduled[Window.from_dict(window).id] = (batch.instance_id, batch.created_time)
    timings = await asyncio.to_thread(window_timings, manifest, job_id)
    rows = []
    for window in sorted(set(scheduled) | set(timings)):
        batch, queued = scheduled.get(window, (None, None))
        started, finished = timings.get(window, (None, None))
        wait = _span(queued, started)
        rows.append(
            {
                "window": window,
                "batch": batch,
                "scheduled": _iso(queued),
                "started": _iso(started),
                "finished": _iso(finished),
                "queue_s": wait if wait is None or wait >= 0 else None,
                "run_s": _span(started, finished),
            }
        )
    return {"job_id": job_id, "windows": rows}
