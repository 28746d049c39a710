"""A job's cancellation marker: the manifest row that stops its queued tiles.

Terminating a Durable instance stops its orchestrator, not the activities it already queued:
the work-item queue still holds them and a host runs them (their results then reach a finished
instance and are dropped). So cancelling a job also writes one create-only row into the job's
manifest partition, and each tile's first lookup, the one that finds a finished window, reads
that row in the same request: a tile that starts after the cancel reads and writes nothing.
A tile already past its lookup finishes; its tile and row are valid for a later run.

The row stays until a retry of the job removes it, with ``If-Match`` on the version it read, so
a redelivered upload cannot resume a job its user cancelled (the starter does not restart a
terminated job) and a retry starts with nothing cancelled.
"""

from __future__ import annotations

from datetime import UTC, datetime

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableClient

from . import gates, jobs
from .gates import ManifestEntry, Outcome
from .grid import Window


def lookup_window(table: TableClient, job_id: str, window: Window) -> tuple[ManifestEntry | None, bool]:
    """The window's manifest row (or None) and whether the job is cancelled, in one request.

    A query for two row keys of one partition instead of the point read of one: the same single
    request, so a tile pays nothing for being cancellable.
    """
    key = f"{job_id}/{window.id}"
    try:
        rows = list(
            table.query_entities(
                "PartitionKey eq @job and (RowKey eq @window or RowKey eq @cancelled )",  # the SDK ends a name at a space
                parameters={"job": job_id, "window": window.id, "cancelled": jobs.CANCELLED_ROW_KEY},
            )
        )
    except (HttpResponseError, *gates.TRANSPORT_FAULTS) as exc:
        raise gates.storage_fault("looking up", key, exc) from exc
    entry = next((gates.manifest_entry(dict(r)) for r in rows if r["RowKey"] == window.id), None)
    return entry, any(r["RowKey"] == jobs.CANCELLED_ROW_KEY for r in rows)


def mark_cancelled(table: TableClient, job_id: str, reason: str) -> Outcome:
    """Write the job's cancellation row, create-only (a second cancel finds it: already present)."""
    entity = {
        "PartitionKey": job_id,
        "RowKey": jobs.CANCELLED_ROW_KEY,
        "reason": reason,
        "cancelled_at": datetime.now(UTC).isoformat(),
    }
    return gates.create_entity_once(table, entity, gate="cancel", job_id=job_id)


def is_cancelled(table: TableClient, job_id: str) -> bool:
    try:
        table.get_entity(job_id, jobs.CANCELLED_ROW_KEY)
    except ResourceNotFoundError:
        return False
    except (HttpResponseError, *gates.TRANSPORT_FAULTS) as exc:
        raise gates.storage_fault("reading entity", f"{job_id}/{jobs.CANCELLED_ROW_KEY}", exc) from exc
    return True


def clear_cancelled(table: TableClient, job_id: str) -> bool:
    """Remove the job's cancellation row, ``If-Match`` on the version read; True when the job has
    none left.

    A row changed between the read and the delete (another retry removed it and a cancel wrote
    it again) is left alone, and False says so: that newer cancel stands.
    """
    key = f"{job_id}/{jobs.CANCELLED_ROW_KEY}"
    try:
        row = table.get_entity(job_id, jobs.CANCELLED_ROW_KEY)
    except ResourceNotFoundError:
        return True
    except (HttpResponseError, *gates.TRANSPORT_FAULTS) as exc:
        raise gates.storage_fault("reading entity", key, exc) from exc
    try:
        table.delete_entity(
            job_id, jobs.CANCELLED_ROW_KEY, etag=row.metadata["etag"], match_condition=MatchConditions.IfNotModified
        )
    except ResourceModifiedError:
        return False
    except ResourceNotFoundError:
        return True  # a concurrent retry removed it first
    except (HttpResponseError, *gates.TRANSPORT_FAULTS) as exc:
        raise gates.storage_fault("deleting entity", key, exc) from exc
    return True
