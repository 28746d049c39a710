"""The starter: a BlobCreated event -> one job id -> at most one orchestration under that id.

Event Grid delivers at least once (and may announce a zero-byte create before the real
commit), so this is written to be run any number of times for the same upload.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import azure.durable_functions as df
from azure.data.tables import TableClient
from azure.durable_functions.models.DurableOrchestrationStatus import DurableOrchestrationStatus
from azure.storage.blob import BlobClient, ContainerClient

from orchestrators import names
from tilecommit.errors import InvalidNameError, JobApiError
from tilecommit.jobs import Job, check_upload_name
from tilecommit.observability import telemetry
from tilecommit.records import Record
from tilecommit.settings import SIDECAR_SUFFIXES, Settings

from .job_api import restart_job
from .scene_members import scene_members

logger = logging.getLogger(__name__)

#: Statuses under which a job exists and a delivery of its upload must not start it again.
#: A failed job is resumed by a redelivery (its finished windows are kept), through the job
#: API's own restart (:func:`client_functions.job_api.restart_job`). A terminated job was
#: cancelled by its user (the job API is the only thing that terminates one): only the API's
#: retry starts it again, never an event delivered late or twice; nor is a failed job whose
#: cancellation row says its user cancelled it while it failed.
_LIVE_OR_DONE = {
    df.OrchestrationRuntimeStatus.Pending,
    df.OrchestrationRuntimeStatus.Running,
    df.OrchestrationRuntimeStatus.Completed,
    df.OrchestrationRuntimeStatus.ContinuedAsNew,
    df.OrchestrationRuntimeStatus.Suspended,
    df.OrchestrationRuntimeStatus.Terminated,
}


#: Refusals of a failed job's restart that make a delivery a duplicate (the reason it records):
#: its user cancelled it as it failed, or another delivery started it first. Any other refusal
#: (its batches still stopping, its sweep) is raised, so that the event comes again.
_NOT_AGAIN = {"job-cancelled": "cancelled", "started-concurrently": "started concurrently"}


#: The reason of a "started" decision that resumed a failed job (:func:`_restart_failed`).
RESUMED = "failed job resumed"


@dataclass(frozen=True)
class StartDecision(Record):
    action: str  # "started", "duplicate" or "ignored"
    blob: str
    job_id: str | None = None
    reason: str = ""


def _decided(decision: StartDecision, level: int, message: str, *args) -> StartDecision:
    """Log and count the decision; its fields ride along flat (custom dimensions in Application Insights)."""
    fields = decision.to_dict()
    logger.log(
        level,
        message,
        *args,
        extra={
            "job_id": decision.job_id or telemetry.NO_JOB,
            "start_action": decision.action,
            "start_reason": decision.reason,
            "start_blob": decision.blob,
        },
    )
    telemetry.record_start_decision(fields)
    return decision


async def upload_job(
    source: BlobClient, settings: Settings, uploads: ContainerClient | None = None
) -> Job | StartDecision:
    """The job a delivery of ``source`` would start, or the decision to ignore it (a name Azure
    could not have stored, a sidecar, zero bytes); reads the blob's properties (and, for a scene
    document, its members' in ``uploads``, :mod:`.scene_members`), starts nothing, logs nothing.
    The backfill's survey asks it too (client_functions/backfill_pages.py)."""
    name = source.blob_name
    refused = refused_name(name)
    if refused is not None:
        return StartDecision("ignored", name, reason=refused)
    if name.lower().endswith(SIDECAR_SUFFIXES):
        # What the upload is, is decided by its content when the job validates it; a sidecar is
        # never read, with its raster or on its own, so it starts nothing.
        return StartDecision("ignored", name, reason="sidecar file, never read")
    props = await asyncio.to_thread(source.get_blob_properties)
    if props.size == 0:
        # Event Grid can announce a zero-byte create before the real commit; that commit has its
        # own ETag and its own event.
        return StartDecision("ignored", name, reason="zero-byte blob")
    members = await asyncio.to_thread(scene_members, source, props, uploads) if uploads is not None else None
    return Job.for_upload(name, source.url, props.etag, props.size, settings, props.metadata, members)


def refused_name(name: str) -> str | None:
    """Why ``name`` is refused as an upload's (:func:`tilecommit.jobs.check_upload_name`), or None."""
    try:
        check_upload_name(name)
    except InvalidNameError as exc:
        return str(exc)
    return None


async def start_job(
    source: BlobClient,
    client: df.DurableOrchestrationClient,
    settings: Settings,
    manifest: TableClient,
    uploads: ContainerClient | None = None,
) -> StartDecision:
    """Start the job for this upload unless it already exists; never fails on a duplicate.

    ``uploads``: the upload's container, where a scene document's members are looked up
    (:mod:`.scene_members`); without it no upload is read as one.

    Raises :class:`JobApiError` (409 ``job-stopping`` or ``job-being-swept``) when a failed job
    cannot be started again yet, so the event is delivered again (see :func:`_restart_failed`)."""
    name = source.blob_name
    job = await upload_job(source, settings, uploads)
    if isinstance(job, StartDecision):
        refused = refused_name(name) is not None
        return _decided(job, logging.WARNING if refused else logging.INFO, "ignoring upload %r: %s", name, job.reason)
    job_id = job.job_id
    status = await client.get_status(job_id, show_input=True)
    if status.runtime_status in _LIVE_OR_DONE:
        return _decided(
            StartDecision("duplicate", name, job_id, reason=status.runtime_status.value),
            logging.INFO,
            "duplicate delivery for %r: job %s is %s",
            name,
            job_id,
            status.runtime_status.value,
        )
    if status.runtime_status == df.OrchestrationRuntimeStatus.Failed:
        return await _restart_failed(status, client, manifest, name, job)

    try:
        await client.start_new(names.TILE_SCENE, job_id, job.to_dict())
    except Exception as exc:  # the SDK raises a bare Exception carrying the host's message
        if "already exists" in str(exc):
            # Another starter won the race between our status check and our start.
            return _decided(
                StartDecision("duplicate", name, job_id, reason="started concurrently"),
                logging.INFO,
                "duplicate delivery for %r: job %s was started concurrently",
                name,
                job_id,
            )
        raise
    return _decided(
        StartDecision("started", name, job_id),
        logging.INFO,
        "started job %s for %r (etag %s, %d bytes)",
        job_id,
        name,
        job.etag,
        job.size,
    )


async def _restart_failed(
    status: DurableOrchestrationStatus,
    client: df.DurableOrchestrationClient,
    manifest: TableClient,
    name: str,
    job: Job,
) -> StartDecision:
    """A delivery of a failed job's upload: resume it with the job API's own restart, which first
    stops the batches of its last run that still run.

    While they have not stopped (or the retention sweep is deleting the job's data) this raises,
    and the invocation fails so that its event is delivered again later. In Azure the blob
    trigger's Event Grid webhook has already answered 202 once it queued the event in the host's
    blob-trigger queue (azure-sdk-for-net, Microsoft.Azure.WebJobs.Extensions.Storage.Blobs,
    ``BlobsExtensionConfigProvider.ProcessEventsAsync``); the function runs from that queue
    (``SharedBlobQueueListenerFactory``), and a failed invocation leaves its message to be
    dequeued again, up to host.json's ``poisonBlobThreshold`` attempts, then moved to the
    ``webjobs-blobtrigger-poison`` queue (Event Grid does not retry a delivery it saw accepted).
    The local host's watcher delivers an event whose trigger raised again at its next poll, up to
    the same threshold (``devhost.durable.watcher.BlobEventWatcher.deliver``). Either way a few
    attempts come within seconds, which is why the restart itself waits for the batches to stop
    (``restart_job``'s patience); a job left failed after the last attempt stays visible (the
    failed-jobs alert) and is resumed by the job API's retry.
    """
    job_id = status.instance_id
    try:
        await restart_job(client, manifest, status, by_user=False)
    except JobApiError as exc:
        if exc.code in _NOT_AGAIN:
            return _decided(
                StartDecision("duplicate", name, job_id, reason=_NOT_AGAIN[exc.code]),
                logging.INFO,
                "duplicate delivery for %r: failed job %s %s",
                name,
                job_id,
                _NOT_AGAIN[exc.code],
            )
        logger.warning(
            "failed job %s for %r not started again yet (%s): %s; the event is delivered again",
            job_id,
            name,
            exc.code,
            exc.message,
            extra={"job_id": job_id},
        )
        raise
    return _decided(
        StartDecision("started", name, job_id, reason=RESUMED),
        logging.INFO,
        "started failed job %s again for %r (etag %s, %d bytes)",
        job_id,
        name,
        job.etag,
        job.size,
    )
