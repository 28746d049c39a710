"""Starting, finding, reading and cancelling a backfill, over the Durable client: what
``POST /api/backfill``, ``GET /api/backfill/{id}``, ``POST /api/backfill/{id}/cancel`` and
``python -m devhost backfill`` do.

A backfill's instance id is a pure function of its container, prefix and dry run
(:func:`tilecommit.backfill.backfill_id`), so asking again with the same arguments finds it: a
running one is reported, a completed one gives its counts, a failed or cancelled one is resumed
from its checkpoint (its custom status, which every step of it sets). Cancelling terminates the
backfill only: the jobs it has started run on, each a job like any other (the job API cancels
one).
"""

from __future__ import annotations

import asyncio
import json

import azure.durable_functions as df
from azure.durable_functions.models.DurableOrchestrationStatus import DurableOrchestrationStatus
from azure.storage.blob import ContainerClient

from orchestrators import names
from tilecommit.backfill import BackfillRequest, check_backfill_id, initial_state, resumed_state
from tilecommit.errors import InvalidNameError, JobApiError

Status = df.OrchestrationRuntimeStatus
LIVE = {Status.Pending, Status.Running, Status.ContinuedAsNew, Status.Suspended}
#: What a backfill's runtime status reads as, lower case; a cancelled one was terminated, and one
#: between two executions (``continue_as_new``) runs on.
STATES = {Status.Terminated: "cancelled", Status.ContinuedAsNew: "running"}


def request_from(values: dict, input_container: str) -> BackfillRequest:
    """The request a caller's values make (an HTTP body, a command line); 400 for anything off.
    The container defaults to the input container and may be no other."""
    container = values.get("container") or input_container
    if container != input_container:
        raise JobApiError(
            400,
            "not-input-container",
            f"container {container!r}: only the input container {input_container!r} is backfilled",
        )
    known = ("prefix", "dry_run", "max_running", "page_size", "wait_s")
    unknown = sorted(set(values) - {"container", *known})
    if unknown:
        raise JobApiError(400, "invalid-backfill", f"unknown field(s) {', '.join(unknown)}")
    try:
        return BackfillRequest(container, **{k: values[k] for k in known if values.get(k) is not None})
    except (InvalidNameError, TypeError) as exc:
        raise JobApiError(400, "invalid-backfill", str(exc)) from None


def _json(value: object) -> dict:
    return (json.loads(value) if isinstance(value, str) else value) or {}  # type: ignore[return-value]


def checkpoint(status: DurableOrchestrationStatus) -> dict:
    """Where the backfill is: its custom status, or, before its execution has set one (the first
    moment of an execution that ``continue_as_new`` began), that execution's input. The running
    jobs' ids are its execution's input's (those running when it began)."""
    return _json(status.custom_status) or _json(status.input_)


def backfill_view(status: DurableOrchestrationStatus, action: str | None = None) -> dict:
    """What the API says of a backfill: its state, stage, counts, running jobs and failures."""
    runtime = status.runtime_status
    state = checkpoint(status)
    output = status.output if isinstance(status.output, dict) else {}
    running = output.get("running") if output else _json(status.input_).get("running")
    view = {
        "id": status.instance_id,
        "state": STATES.get(runtime, runtime.value.lower()) if runtime else None,
        "container": state.get("container"),
        "prefix": state.get("prefix"),
        "dry_run": state.get("dry_run"),
        "stage": state.get("stage"),
        "pages": state.get("pages"),
        "counts": output.get("counts") or state.get("counts"),
        "running_count": state.get("running_count"),
        "running_jobs": running,
        "failures": state.get("failures"),
        "error": status.output if runtime == Status.Failed else None,
    }
    return {**view, "action": action} if action else view


async def backfill_status(client: df.DurableOrchestrationClient, backfill_id: str) -> DurableOrchestrationStatus:
    try:
        check_backfill_id(backfill_id)
    except InvalidNameError as exc:
        raise JobApiError(400, "invalid-backfill-id", str(exc)) from None
    status = await client.get_status(backfill_id, show_input=True)
    if not status or status.name != names.BACKFILL:
        raise JobApiError(404, "backfill-not-found", f"no backfill {backfill_id}")
    return status


async def start_backfill(
    client: df.DurableOrchestrationClient, request: BackfillRequest, uploads: ContainerClient
) -> dict:
    """Start the backfill of ``request``, or find it: a live one is reported (``running``), a
    completed one too (``completed``), a failed or cancelled one is started again from its
    checkpoint (``resumed``), none is started (``started``)."""
    if not await asyncio.to_thread(uploads.exists):
        raise JobApiError(404, "container-not-found", f"no container {uploads.container_name!r}")
    instance_id = request.instance_id
    for _ in range(2):  # a second look only when another caller started it between ours
        status = await client.get_status(instance_id, show_input=True)
        runtime = status.runtime_status if status else None
        if runtime in LIVE:
            return backfill_view(status, "running")
        if runtime == Status.Completed:
            return backfill_view(status, "completed")
        resuming = runtime in (Status.Failed, Status.Terminated)
        if resuming:
            last = {**checkpoint(status), "running": _json(status.input_).get("running") or []}
            state = resumed_state(last, request)
        else:
            state = initial_state(request)
        try:
            await client.start_new(names.BACKFILL, instance_id, state)
        except Exception as exc:  # the SDK raises a bare Exception carrying the host's message
            if "already exists" not in str(exc):
                raise
            continue
        return backfill_view(
            await client.get_status(instance_id, show_input=True), "resumed" if resuming else "started"
        )
    raise JobApiError(409, "started-concurrently", f"backfill {instance_id} is being started by another caller")


async def get_backfill(client: df.DurableOrchestrationClient, backfill_id: str) -> dict:
    return backfill_view(await backfill_status(client, backfill_id))


async def cancel_backfill(client: df.DurableOrchestrationClient, backfill_id: str, reason: str) -> dict:
    """Terminate a live backfill; the jobs it started go on. Asked again with the same arguments
    it resumes where it stopped."""
    status = await backfill_status(client, backfill_id)
    if status.runtime_status not in LIVE:
        raise JobApiError(409, "backfill-finished", f"backfill {backfill_id} is {backfill_view(status)['state']}")
    await client.terminate(backfill_id, reason)
    return {"id": backfill_id, "state": "cancelling", "reason": reason}
