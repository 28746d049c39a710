"""The job API's operations over the Durable client: a job's state, a page of jobs, cancel, retry.

function_app.py's HTTP routes and the CLI's ``status`` call these; they know the Durable client
and the manifest table, not bindings. Every refusal is a :class:`JobApiError` with an HTTP
status, a code and a message, which the routes send as JSON.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
from datetime import datetime

import aiohttp
import azure.durable_functions as df
from azure.data.tables import TableClient
from azure.durable_functions.models.DurableOrchestrationStatus import DurableOrchestrationStatus

from orchestrators import names
from tilecommit import cancellation, retention
from tilecommit.catalog.published import publication_of
from tilecommit.errors import InvalidNameError, JobApiError
from tilecommit.jobs import check_job_id

Status = df.OrchestrationRuntimeStatus
#: What a job's state can be: the Durable runtime status, lower case. Only a cancel terminates.
STATES = {
    s.value.lower(): s for s in (Status.Pending, Status.Running, Status.Completed, Status.Failed, Status.Terminated)
}
FINISHED = {Status.Completed, Status.Failed, Status.Terminated}
RETRYABLE = {Status.Failed, Status.Terminated}
DEFAULT_LIMIT, MAX_LIMIT = 50, 500
#: How many instances one list request to the extension asks for (its own default is 100).
INSTANCES_PER_REQUEST = 100
#: The extension's header for the next page of a list (HttpApiHandler); absent or empty on the last.
CONTINUATION_HEADER = "x-ms-continuation-token"
#: The sub-orchestrations of a job, stopped with it on a cancel and before it is started again.
CHILD_ORCHESTRATORS = {names.RENDER_BATCH, names.RENDER_GROUP}
#: How long a restart waits for the sub-orchestrations of the job's last run to stop once told
#: to, and how often it looks. A terminate is carried out at the child's next episode, which
#: runs as soon as its partition's owner reads the message: under a second when hosts are up.
STOP_PATIENCE_S = 20.0
STOP_POLL_S = 0.25


def _job_input(status: DurableOrchestrationStatus) -> dict:
    value = status.input_
    return (json.loads(value) if isinstance(value, str) else value) or {}


def job_view(status: DurableOrchestrationStatus) -> dict:
    """What the API says about one job: its state, progress, upload, profile, outputs, cost, its
    publication to the catalog, error."""
    job = _job_input(status)
    runtime = status.runtime_status
    view = {
        "job_id": status.instance_id,
        "state": runtime.value.lower(),
        "created": status.created_time.isoformat() if status.created_time else None,
        "updated": status.last_updated_time.isoformat() if status.last_updated_time else None,
        "upload": {"blob": job.get("blob"), "url": job.get("url"), "etag": job.get("etag"), "size": job.get("size")},
        "profile": (job.get("spec") or {}).get("profile"),
        "spec": job.get("spec"),
        "progress": status.custom_status,
        "outputs": None,
        "summary": None,
        "cost": None,
        # Where the job's item is found, once it completed (tilecommit/catalog/published.py).
        "published": None,
        "error": None,
    }
    if runtime == Status.Completed and isinstance(status.output, dict):
        summary = status.output
        view["summary"] = summary
        view["outputs"] = {key: summary.get(f"{key}_url") for key in ("mosaic", "stac", "quicklook")}
        view["cost"] = summary.get("cost")
        view["published"] = publication_of(summary)
    elif runtime in (Status.Failed, Status.Terminated):
        view["error"] = {"type": "cancelled" if runtime == Status.Terminated else "failed", "message": status.output}
    return view


def _checked_id(job_id: str) -> str:
    try:
        return check_job_id(job_id)
    except InvalidNameError as exc:
        raise JobApiError(400, "invalid-job-id", str(exc)) from None


async def job_status(client: df.DurableOrchestrationClient, job_id: str) -> DurableOrchestrationStatus:
    """The status (with its input) of the job ``job_id``: an instance of the job orchestration,
    never one of its batches, groups or scrubs. 400 for an id that is not a job's, 404 for none."""
    status = await client.get_status(_checked_id(job_id), show_input=True)
    if not status or status.name != names.TILE_SCENE:
        raise JobApiError(404, "job-not-found", f"no job {job_id}")
    return status


async def get_job(client: df.DurableOrchestrationClient, job_id: str) -> dict:
    return job_view(await job_status(client, job_id))


# ---------------------------------------------------------------------- listing


async def _instances_page(
    client: df.DurableOrchestrationClient, params: dict, token: str | None
) -> tuple[list[DurableOrchestrationStatus], str | None]:
    """One page of the extension's instance query and the token of the next page.

    The SDK's ``get_status_by`` reads one page and drops the continuation token, so a query
    with more than a page of matches would silently lose the rest; this asks the extension's
    own HTTP API (the SDK's ``rpcBaseUrl``, a private attribute of azure-functions-durable 1.7's
    client) for every page.
    """
    url = f"{client._orchestration_bindings.rpc_base_url}instances/"
    headers = {CONTINUATION_HEADER: token} if token else {}
    async with aiohttp.ClientSession() as session, session.get(url, params=params, headers=headers) as response:
        if response.status != 200:
            raise JobApiError(502, "list-failed", f"listing instances answered {response.status}")
        rows = await response.json()
        following = response.headers.get(CONTINUATION_HEADER) or None
    return [DurableOrchestrationStatus.from_json(row) for row in rows], following


async def instances(client: df.DurableOrchestrationClient, **params: str) -> list[DurableOrchestrationStatus]:
    """Every instance the query matches, all pages read."""
    found, token = [], None
    while True:
        page, token = await _instances_page(client, {"top": str(INSTANCES_PER_REQUEST), **params}, token)
        found += page
        if token is None:
            return found


def _encode_cursor(token: str | None, skip: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"token": token, "skip": skip}).encode()).decode()


def _decode_cursor(cursor: str | None) -> tuple[str | None, int]:
    if not cursor:
        return None, 0
    try:
        value = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        return value["token"], int(value["skip"])
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise JobApiError(400, "invalid-cursor", "the cursor is not one this API returned") from None


def _list_params(state: str | None, since: str | None) -> dict:
    params = {}
    if state:
        wanted = [s.strip().lower() for s in state.split(",") if s.strip()]
        unknown = [s for s in wanted if s not in STATES]
        if unknown:
            raise JobApiError(400, "invalid-state", f"state {', '.join(unknown)}: expected any of {', '.join(STATES)}")
        params["runtimeStatus"] = ",".join(STATES[s].value for s in wanted)
    if since:
        try:
            params["createdTimeFrom"] = datetime.fromisoformat(since.replace("Z", "+00:00")).isoformat()
        except ValueError:
            raise JobApiError(400, "invalid-since", f"since {since!r}: expected an ISO 8601 date and time") from None
    return params


async def list_jobs(
    client: df.DurableOrchestrationClient,
    *,
    state: str | None = None,
    since: str | None = None,
    limit: int = DEFAULT_LIMIT,
    cursor: str | None = None,
) -> dict:
    """A page of jobs (never their sub-orchestrations or scrubs), in the task hub's order, and the
    cursor of the next page (None on the last)."""
    if not 1 <= limit <= MAX_LIMIT:
        raise JobApiError(400, "invalid-limit", f"limit {limit}: expected 1..{MAX_LIMIT}")
    params = {"top": str(INSTANCES_PER_REQUEST), **_list_params(state, since)}
    token, skip = _decode_cursor(cursor)
    found: list[dict] = []
    while True:
        page, following = await _instances_page(client, params, token)
        for position in range(skip, len(page)):
            if page[position].name != names.TILE_SCENE:
                continue
            if len(found) == limit:
                return {"jobs": found, "next": _encode_cursor(token, position)}
            found.append(job_view(page[position]))
        if following is None:
            return {"jobs": found, "next": None}
        token, skip = following, 0


# ---------------------------------------------------------------------- cancel and retry


async def _children(client: df.DurableOrchestrationClient, job_id: str) -> list[DurableOrchestrationStatus]:
    return [s for s in await instances(client, instanceIdPrefix=f"{job_id}-") if s.name in CHILD_ORCHESTRATORS]


async def stop_children(
    client: df.DurableOrchestrationClient,
    job_id: str,
    reason: str,
    *,
    patience: float = 0.0,
    last_run: DurableOrchestrationStatus | None = None,
) -> list[str]:
    """Terminate the job's batches and groups that still run, and wait up to ``patience`` seconds
    for them to end; the ids of those still running then.

    Called once the job's own orchestration has ended (or has been told to): nobody waits for
    these children any more. Their parent's execution is over, so what they would report is
    dropped (a message for an earlier execution), and a new run of the job starting a child of
    the same id while it still runs would have its start dropped as a duplicate: that new run
    would wait for it forever (docs/local-host.md, "Conformance", rows 17, 18 and 47). Each is
    terminated once; the list is read again on each look, so a child that a terminated group
    started meanwhile is stopped too. The SDK accepts a terminate of an instance that has just
    finished (410).

    With ``last_run`` (the job's status as the caller found it, finished), the job is read before
    each look, and once it is no longer that run (another restart has begun it again) this
    gives way with 409 ``started-concurrently``: the children running then are the new run's. A
    new run starts its first batch only after an activity (validation), so a look that found the
    job unchanged lists no child of it.
    """
    deadline = time.monotonic() + patience
    told: set[str] = set()
    while True:
        if last_run is not None:
            now = await client.get_status(job_id)
            if (now.runtime_status, now.last_updated_time) != (last_run.runtime_status, last_run.last_updated_time):
                raise JobApiError(409, "started-concurrently", f"job {job_id} was started again concurrently")
        running = [c.instance_id for c in await _children(client, job_id) if c.runtime_status not in FINISHED]
        for instance_id in running:
            if instance_id not in told:
                await client.terminate(instance_id, reason)
                told.add(instance_id)
        if not running or time.monotonic() >= deadline:
            return running
        await asyncio.sleep(STOP_POLL_S)


async def cancel_job(client: df.DurableOrchestrationClient, manifest: TableClient, job_id: str, reason: str) -> dict:
    """Mark the job cancelled, so its queued tiles stop, then terminate it and its batches.

    The row first: it is what stops the tiles already queued (terminating stops orchestrators,
    not their activities), and a cancel whose row could not be written has terminated nothing,
    so calling it again does it all (the row is create-only: a second write finds it present).
    Tiles already written stay, each with its manifest row: a retry skips their windows.
    """
    status = await job_status(client, job_id)
    if status.runtime_status in FINISHED:
        raise JobApiError(
            409, "job-finished", f"job {job_id} is {status.runtime_status.value.lower()}: nothing to cancel"
        )
    await asyncio.to_thread(cancellation.mark_cancelled, manifest, job_id, reason)
    await client.terminate(job_id, reason)  # a job that ended meanwhile: 410, accepted by the SDK
    await stop_children(client, job_id, reason)
    return {"job_id": job_id, "state": "cancelling", "reason": reason}


async def restart_job(
    client: df.DurableOrchestrationClient,
    manifest: TableClient,
    status: DurableOrchestrationStatus,
    *,
    by_user: bool,
    patience: float = STOP_PATIENCE_S,
) -> None:
    """Start a failed or cancelled job again under its id, with its own input: windows with a
    manifest row are skipped, only the missing ones are rendered. The one way a job is started
    again: the job API's retry (``by_user``, which also lifts the user's cancel) and a delivery
    of a failed job's upload (which never resumes a job its user cancelled).

    The new run never meets a child of the last one still running: those are terminated and
    awaited first (:func:`stop_children`). Refused with 409 while they still run after
    ``patience`` (``job-stopping``), while the retention sweep deletes the job's data
    (``job-being-swept``: its cancellation row, checked last, just before the start), unless
    ``by_user`` when the job has a user's cancellation row (``job-cancelled``), and when another
    restart got there first (``started-concurrently``).
    """
    job_id = status.instance_id
    reason = f"job {job_id} is started again: its last run's batches are stopped"
    stopping = await stop_children(client, job_id, reason, patience=patience, last_run=status)
    if stopping:
        raise JobApiError(
            409,
            "job-stopping",
            f"job {job_id}: {len(stopping)} batches of its last run are still stopping; try again shortly",
        )
    cancelled = await asyncio.to_thread(cancellation.cancelled_because, manifest, job_id)
    if cancelled == retention.SWEEP_REASON:
        raise JobApiError(409, "job-being-swept", f"job {job_id}: the retention sweep is deleting its tiles")
    if cancelled is not None and not by_user:
        raise JobApiError(409, "job-cancelled", f"job {job_id} was cancelled ({cancelled}): only a retry resumes it")
    if by_user and not await asyncio.to_thread(
        cancellation.clear_cancelled, manifest, job_id, keep=lambda why: why == retention.SWEEP_REASON
    ):
        raise JobApiError(
            409, "cancelled-again", f"job {job_id} was cancelled again, or its sweep began, while it was being retried"
        )
    try:
        await client.start_new(names.TILE_SCENE, job_id, _job_input(status))
    except Exception as exc:  # the SDK raises a bare Exception carrying the host's message
        if "already exists" not in str(exc):
            raise
        raise JobApiError(409, "started-concurrently", f"job {job_id} was started again concurrently") from None


async def retry_job(client: df.DurableOrchestrationClient, manifest: TableClient, job_id: str) -> dict:
    """Start a failed or cancelled job again (:func:`restart_job`)."""
    status = await job_status(client, job_id)
    if status.runtime_status not in RETRYABLE:
        raise JobApiError(
            409,
            "job-not-retryable",
            f"job {job_id} is {status.runtime_status.value.lower()}: only a failed or cancelled job is retried",
        )
    await restart_job(client, manifest, status, by_user=True)
    return {"job_id": job_id, "state": "pending"}
