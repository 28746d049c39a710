"""The backfill's activities (orchestrators/backfill.py): list a page of the input container,
survey its blobs, start them through the starter, count the jobs still running.

Three of them take a Durable client binding (function_app.py): an orchestrator may not start
orchestrations itself (it does no I/O), and a job must be started exactly as an upload event
starts it, by :func:`client_functions.starter.start_job` with a Durable client, so that each
blob is a new job or a duplicate by the very decision the starter makes. The Functions host
resolves a function's input bindings whatever its trigger, and azure-functions-durable's
``durable_client_input`` wraps any function, an activity included, turning the binding's JSON
into a ``DurableOrchestrationClient`` (``DFApp._add_rich_client``, azure-functions-durable 1.7).

Every name the listing returns is untrusted, as an upload's is: it goes through the starter's
own checks (:func:`client_functions.starter.upload_job`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import azure.durable_functions as df
from azure.core.exceptions import ResourceNotFoundError
from azure.storage.blob import ContainerClient

from tilecommit.errors import ConfigurationError, JobApiError

from . import starter
from .context import client_context

#: Blobs surveyed or started at once (each a HEAD and a status request or two).
CONCURRENT_BLOBS = 8
#: The runtime statuses under which a job of the backfill still counts as running.
RUNNING = {
    df.OrchestrationRuntimeStatus.Pending,
    df.OrchestrationRuntimeStatus.Running,
    df.OrchestrationRuntimeStatus.ContinuedAsNew,
}
#: A blob deleted between the listing and the survey or the start.
GONE = "no longer stored"


def uploads(container: str) -> ContainerClient:
    """The input container; a backfill of any other is refused (an upload event only ever comes
    from the input container, and the others hold the app's own outputs)."""
    ctx = client_context()
    if container != ctx.settings.input_container:
        raise ConfigurationError(f"container {container!r} is not the input container {ctx.settings.input_container!r}")
    return ctx.uploads


def list_page(payload: dict) -> dict:
    """One page of the blob names under the prefix, from the continuation token (None: the first),
    and the token of the next page (None after the last). A storage fault raises (retried)."""
    pages = uploads(payload["container"]).list_blobs(
        name_starts_with=payload["prefix"] or None, results_per_page=payload["page_size"]
    )
    paged: Any = pages.by_page(continuation_token=payload["token"])
    names = [blob.name for blob in next(paged, [])]
    return {"blobs": names, "next": paged.continuation_token or None}


async def _each(items: list, work: Callable[[Any], Awaitable[dict]]) -> list[dict]:
    """``work`` for every item, ``CONCURRENT_BLOBS`` at once, results in the items' order."""
    gate = asyncio.Semaphore(CONCURRENT_BLOBS)

    async def one(item: Any) -> dict:
        async with gate:
            return await work(item)

    return list(await asyncio.gather(*(one(item) for item in items)))


def _seen(status: Any) -> list | None:
    """What a status says of a job, to tell later whether it changed: None when there is no job."""
    if status is None or status.runtime_status is None:
        return None
    updated = status.last_updated_time.isoformat() if status.last_updated_time else None
    return [status.runtime_status.value, updated]


async def survey_blobs(payload: dict, client: df.DurableOrchestrationClient) -> list[dict]:
    """For each blob: what its upload event would find (the starter's :func:`upload_job`, then the
    job's status), starting nothing: ``kind`` refused, ignored, new, failed or exists.

    The orchestration keeps this answer in its history before any start, so a start repeated
    after a crash tells the jobs it began itself from those that were there before."""
    container, settings = uploads(payload["container"]), client_context().settings

    async def survey(name: str) -> dict:
        entry = {"blob": name, "kind": "ignored", "job_id": None, "seen": None, "reason": ""}
        try:
            job = await starter.upload_job(container.get_blob_client(name), settings, container)
        except ResourceNotFoundError:
            return {**entry, "reason": GONE}
        if isinstance(job, starter.StartDecision):
            refused = starter.refused_name(name) is not None
            return {**entry, "kind": "refused" if refused else "ignored", "reason": job.reason}
        seen = _seen(await client.get_status(job.job_id))
        kind = "new" if seen is None else "failed" if seen[0] == "Failed" else "exists"
        return {**entry, "kind": kind, "job_id": job.job_id, "seen": seen, "reason": seen[0] if seen else ""}

    return await _each(payload["blobs"], survey)


def _counted(decision: starter.StartDecision) -> str:
    if decision.action == "started":
        return "resumed" if decision.reason == starter.RESUMED else "started"
    return "duplicates" if decision.action == "duplicate" else "ignored"


async def start_blobs(payload: dict, client: df.DurableOrchestrationClient) -> list[dict]:
    """Start each surveyed blob as its upload event would (:func:`starter.start_job`); what each
    counts as. A blob the survey found new (or failed) whose job has changed since is not started
    again: this page's earlier attempt started it (the activity runs again after a crash), or an
    upload event did meanwhile; either way it is counted as this backfill's start, once. A start
    the starter refuses for now (a failed job still stopping) counts as failed, with its reason."""
    ctx = client_context()
    container = uploads(payload["container"])

    async def start(entry: dict) -> dict:
        outcome = {
            "blob": entry["blob"],
            "job_id": entry["job_id"],
            "counted": entry["kind"],
            "reason": entry["reason"],
        }
        if entry["kind"] in ("refused", "ignored"):
            return outcome
        if entry["kind"] in ("new", "failed") and _seen(await client.get_status(entry["job_id"])) != entry["seen"]:
            again = "started" if entry["kind"] == "new" else "resumed"
            return {**outcome, "counted": again, "reason": "started by an earlier attempt of this page"}
        try:
            decision = await starter.start_job(
                container.get_blob_client(entry["blob"]), client, ctx.settings, ctx.manifest, container
            )
        except ResourceNotFoundError:
            return {**outcome, "counted": "ignored", "reason": GONE}
        except JobApiError as exc:
            return {**outcome, "counted": "failed", "reason": f"{exc.code}: {exc.message}"}
        return {**outcome, "job_id": decision.job_id, "counted": _counted(decision), "reason": decision.reason}

    return await _each(payload["entries"], start)


async def count_running(payload: dict, client: df.DurableOrchestrationClient) -> list[str]:
    """The ids among ``job_ids`` whose jobs are still pending or running."""

    async def status(job_id: str) -> dict:
        found = await client.get_status(job_id)
        return {"job_id": job_id, "running": found is not None and found.runtime_status in RUNNING}

    return [s["job_id"] for s in await _each(payload["job_ids"], status) if s["running"]]
