"""A job's cancellation marker: the manifest row that stops its queued tiles.

Terminating a Durable instance stops its orchestrator, not the activities it already queued:
the work-item queue still holds them and a host runs them (their results then reach a finished
instance and are dropped). So cancelling a job also writes one create-only row into the job's
manifest partition, and a tile that finds its window not done yet reads that row (a point
read) before it reads the upload: a tile that starts after the cancel reads and writes nothing.
A tile already past its lookup finishes; its tile and row are valid for a later run.

The row stays until a retry of the job removes it, with ``If-Match`` on the version it read, so
a redelivered upload cannot resume a job its user cancelled (the starter restarts neither a
terminated job nor a failed one with this row) and a retry starts with nothing cancelled.

The retention sweep writes the same row, with a reason of its own, while it deletes a job's
data (:mod:`tilecommit.retention`): a retry leaves that one alone and refuses.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from azure.core import MatchConditions
from azure.data.tables import TableClient

from . import gates, jobs
from .gates import Outcome
from .grid import Window
from .manifest import ManifestEntry, get_manifest_entry
from .storage_answers import STORAGE_ERRORS, Meaning, call_failed, classify


def lookup_window(table: TableClient, job_id: str, window: Window) -> tuple[ManifestEntry | None, bool]:
    """The window's manifest row (or None) and whether the job is cancelled.

    Two point reads, the second only when the window has no row (a window already done costs
    nothing to skip, cancelled or not). One query for both row keys would be one request, but
    the Table service runs a filter that ORs row keys as a scan of the whole partition, not as
    point or range reads (Microsoft's Table storage design guide says so of exactly this
    filter): with thousands of windows in it, each tile would pay for the job's size.
    """
    entry = get_manifest_entry(table, job_id, window)
    if entry is not None:
        return entry, False
    return None, is_cancelled(table, job_id)


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
    return gates.read_entity(table, job_id, jobs.CANCELLED_ROW_KEY) is not None


def cancelled_because(table: TableClient, job_id: str) -> str | None:
    """The reason the job's cancellation row gives, or None when it has none."""
    row = gates.read_entity(table, job_id, jobs.CANCELLED_ROW_KEY)
    return None if row is None else str(row.get("reason") or "")


def clear_cancelled(table: TableClient, job_id: str, *, keep: Callable[[str], bool] = lambda reason: False) -> bool:
    """Remove the job's cancellation row, ``If-Match`` on the version read; True when the job has
    none left.

    A row changed between the read and the delete (another retry removed it and a cancel wrote
    it again) is left alone, and False says so: that newer cancel stands. So is a row whose
    reason ``keep`` keeps (the retention sweep's row is removed by the sweep alone).
    """
    row = gates.read_entity(table, job_id, jobs.CANCELLED_ROW_KEY)
    if row is None:
        return True
    if keep(str(row.get("reason") or "")):
        return False
    try:
        table.delete_entity(
            job_id, jobs.CANCELLED_ROW_KEY, etag=row.metadata["etag"], match_condition=MatchConditions.IfNotModified
        )
    except STORAGE_ERRORS as exc:
        answer = classify(exc)
        if answer.meaning is Meaning.REPLACED:
            return False
        if answer.meaning is Meaning.MISSING:
            return True  # a concurrent retry removed it first
        raise call_failed("deleting entity", f"{job_id}/{jobs.CANCELLED_ROW_KEY}", exc) from exc
    return True
