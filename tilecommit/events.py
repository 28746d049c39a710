"""Completion events: one CloudEvents 1.0 event when a job completes or fails.

Published to an Event Grid custom topic (``TILECOMMIT_EVENTS_ENDPOINT``, CloudEvents input
schema) by the ``publish_job_event`` activity, with the app's identity (the role: EventGrid Data
Sender on that topic only); locally ``python -m devhost`` plays the topic (``--events-file``,
``--events-url``). No endpoint set: no event, said once in the log.

The event's id is a pure function of the job id, the outcome and the moment the job's
orchestration started (its first episode's clock, the same in every replay). So a publish that
is retried, or an activity that runs twice, sends the same id, and a subscriber that drops
repeated ids sees one event; a job run again after it failed (a new start) is a new event. A
duplicate delivery of an upload starts nothing, so it publishes nothing.

CloudEvents 1.0 attributes used (https://github.com/cloudevents/spec, ``spec.md``): ``id``,
``source`` (the input container's URL), ``type``, ``subject`` (the upload's blob name, so Event
Grid subscriptions can filter by prefix), ``time`` (the job's end), ``datacontenttype``.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

from .catalog.published import publication_of
from .jobs import Job
from .records import Record
from .settings import SETTING_EVENTS_KEY

COMPLETED = "tilecommit.job.completed"
FAILED = "tilecommit.job.failed"
#: The outputs an event names, with their URL and the ETag they had when it was published.
OUTPUTS = ("mosaic", "stac", "quicklook")


def event_id(job_id: str, outcome: str, started_at: str) -> str:
    """The same for every publish of one ending of one run of a job."""
    return hashlib.sha256(f"{job_id}\n{outcome}\n{started_at}".encode()).hexdigest()[:32]


def container_url(upload_url: str, blob_name: str) -> str:
    """The upload's container URL (the events' ``source``), from its blob URL and name."""
    return upload_url[: -len(blob_name) - 1] if upload_url.endswith("/" + blob_name) else upload_url.rsplit("/", 1)[0]


def job_event(
    job: Job,
    *,
    outcome: str,
    started_at: str,
    ended_at: str,
    duration_s: float,
    result: dict | None = None,
    error: dict | None = None,
    outputs: dict | None = None,
    cost: dict | None = None,
) -> dict:
    """The event for a job that ended with ``outcome`` ("completed" or "failed"), as structured
    CloudEvents JSON. ``result``: the orchestration's output (completed); ``error``: ``{"type",
    "message"}`` (failed); ``outputs``: ``{name: {"url", "etag"}}`` for :data:`OUTPUTS`; ``cost``:
    what it used and its estimate (:func:`tilecommit.cost.estimate`)."""
    if outcome not in ("completed", "failed"):
        raise ValueError(f"outcome {outcome!r}: expected completed or failed")
    result = result or {}
    data = {
        "job_id": job.job_id,
        "outcome": outcome,
        "upload": {"blob": job.blob, "url": job.url, "etag": job.etag},
        "spec": job.spec.to_dict(),
        "windows": result.get("windows"),
        "written": result.get("written"),
        "already_present": result.get("already_present"),
        "outputs": outputs or {},
        # Where the item is found: the catalog link (the STAC API's item URL, or its blob's) and
        # whether it is published in pgstac; the event is sent after the publication.
        "catalog": publication_of(result) if outcome == "completed" else None,
        "started": started_at,
        "ended": ended_at,
        "duration_s": round(duration_s, 3),
        "error": error,
        "cost": cost,
    }
    return {
        "specversion": "1.0",
        "id": event_id(job.job_id, outcome, started_at),
        "source": container_url(job.url, job.blob) or "tilecommit",
        "type": COMPLETED if outcome == "completed" else FAILED,
        "subject": job.blob,
        "time": ended_at,
        "datacontenttype": "application/json",
        "data": data,
    }


@dataclass(frozen=True)
class PublishResult(Record):
    """What ``publish_job_event`` did: ``published``, or ``not-configured`` (no topic)."""

    outcome: str
    event_id: str
    type: str
    #: The job's cost estimate the event carries (the orchestration puts it in the job's summary).
    cost: dict | None = None


def publish(endpoint: str, event: dict, credential: Any) -> None:
    """Send one event to the topic at ``endpoint``; raises what the service answered.

    Event Grid stores an event once it answered 200; a publish retried after a lost answer sends
    the same id again (at least once, as every delivery here). ``credential``: the app's identity
    (a token for https://eventgrid.azure.net, role EventGrid Data Sender), or, only for the local
    host's stand-in topic, its key from ``TILECOMMIT_EVENTS_KEY``.
    """
    from azure.core.credentials import AzureKeyCredential
    from azure.core.messaging import CloudEvent
    from azure.eventgrid import EventGridPublisherClient

    key = os.environ.get(SETTING_EVENTS_KEY, "")
    client = EventGridPublisherClient(endpoint, AzureKeyCredential(key) if key else credential)
    with client:
        client.send([CloudEvent.from_dict(event)])
