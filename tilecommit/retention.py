"""Deleting a finished job's intermediate data: its manifest rows, its tiles and its mosaic's
staging plans, under its cancellation row.

The mosaic, its STAC item and its quicklook are the job's product and are never deleted here;
the tiles are intermediate (the mosaic holds their pixels), and so are the rows that name them
and the plans of the mosaic's staged attempts (``plans/{job}/``, in the tiles container), and
the intermediates of its coarse levels (``levels/{job}/``, there too, with their rows).

The sweep first writes the job's cancellation row (:mod:`tilecommit.cancellation`, reason
:data:`SWEEP_REASON`, over a user's cancel if there is one): while it is there, a run of the job
started meanwhile renders no window it has no row for, so nothing is written beside what is
being deleted; the job API refuses to retry, and the starter to restart, a job that has it. The
row goes last.

Rows go before tiles. A sweep stopped half-way then leaves tiles without rows, never rows
without tiles: a later run of the job finds no row, renders the window again and meets its old
tile already present with the same bytes. The other order could leave a row naming a deleted
tile, which a later run would trust and skip. Tiles and plans are found by listing their prefix
(a listing is fine for what is being deleted; only assembly must never trust one), so what a
stopped sweep left is found by the next.
"""

from __future__ import annotations

from dataclasses import dataclass

from azure.core import MatchConditions
from azure.data.tables import TableClient, TableTransactionError, UpdateMode
from azure.storage.blob import ContainerClient

from . import cancellation, gates
from .gates import Outcome
from .jobs import CANCELLED_ROW_KEY, LEVEL_ROWS_FILTER, WINDOW_ROWS_FILTER, check_job_id
from .records import Record
from .storage_answers import STORAGE_ERRORS, Meaning, call_failed, classify

#: Entities per entity-group transaction (the Table service's limit).
TRANSACTION_ROWS = 100
#: The reason on the cancellation row the sweep writes while it deletes a job's data.
SWEEP_REASON = "the retention sweep is deleting this job's tiles"


@dataclass(frozen=True)
class PurgedStorage(Record):
    rows: int
    tiles: int
    plans: int
    #: The intermediates of the mosaic's coarse levels (``levels/{job}/``).
    levels: int = 0


def mark_sweeping(manifest: TableClient, job_id: str) -> None:
    """The job's cancellation row, with the sweep's reason: written create-only, or, over a
    user's cancel row, replaced with ``If-Match`` on the version read (the job API's retry, which
    would remove the user's row and start the job, then finds the sweep's and refuses). A row
    that changed meanwhile is read again."""
    while cancellation.mark_cancelled(manifest, job_id, SWEEP_REASON) != Outcome.WRITTEN:
        row = gates.read_entity(manifest, job_id, CANCELLED_ROW_KEY)
        if row is None:
            continue  # removed meanwhile: create it
        if row.get("reason") == SWEEP_REASON:
            return  # a sweep stopped half-way left it
        try:
            manifest.update_entity(
                {**row, "reason": SWEEP_REASON},
                mode=UpdateMode.REPLACE,
                etag=row.metadata["etag"],
                match_condition=MatchConditions.IfNotModified,
            )
            return
        except STORAGE_ERRORS as exc:
            if classify(exc).version_gone:
                continue  # changed or removed meanwhile: look again
            raise call_failed("replacing entity", f"{job_id}/{CANCELLED_ROW_KEY}", exc) from exc


def unmark_sweeping(manifest: TableClient, job_id: str) -> bool:
    """Remove the sweep's row, and only the sweep's (a user's cancel stands); True when none is left."""
    return cancellation.clear_cancelled(manifest, job_id, keep=lambda reason: reason != SWEEP_REASON)


def delete_manifest_rows(manifest: TableClient, job_id: str) -> int:
    """Every window row and coarse-level row of the job's manifest partition (not its cancellation row)."""
    try:
        keys = [
            r["RowKey"]
            for r in manifest.query_entities(
                f"PartitionKey eq @job and (({WINDOW_ROWS_FILTER}) or ({LEVEL_ROWS_FILTER}))",
                parameters={"job": job_id},
                select=["RowKey"],
            )
        ]
        for start in range(0, len(keys), TRANSACTION_ROWS):
            batch = keys[start : start + TRANSACTION_ROWS]
            try:
                manifest.submit_transaction([("delete", {"PartitionKey": job_id, "RowKey": key}) for key in batch])
            except TableTransactionError:  # a row another sweep deleted fails the whole transaction
                for key in batch:
                    manifest.delete_entity(job_id, key)  # answers nothing for a row already gone
    except STORAGE_ERRORS as exc:
        raise call_failed("deleting the manifest rows of", job_id, exc) from exc
    return len(keys)


def _delete_prefix(container: ContainerClient, prefix: str) -> int:
    """Every blob whose name starts with ``prefix``."""
    deleted = 0
    try:
        for blob in container.list_blobs(name_starts_with=prefix):
            try:
                container.delete_blob(blob.name)
                deleted += 1
            except STORAGE_ERRORS as exc:
                if classify(exc).meaning is not Meaning.MISSING:
                    raise
                # else a concurrent sweep, or the lifecycle rule, got there first
    except STORAGE_ERRORS as exc:
        raise call_failed("deleting the blobs under", prefix, exc) from exc
    return deleted


def delete_tiles(tiles: ContainerClient, job_id: str) -> int:
    """Every blob under the job's tile prefix (``tiles/{job_id}/``)."""
    return _delete_prefix(tiles, f"tiles/{check_job_id(job_id)}/")


def delete_levels(tiles: ContainerClient, job_id: str) -> int:
    """Every intermediate of the job's coarse levels (``levels/{job_id}/``, tilecommit.jobs.level_blob_name)."""
    return _delete_prefix(tiles, f"levels/{check_job_id(job_id)}/")


def delete_plans(tiles: ContainerClient, job_id: str) -> int:
    """Every staging plan of the job's mosaic attempts (``plans/{job_id}/``, tilecommit.jobs.share_plan_blob_name)."""
    return _delete_prefix(tiles, f"plans/{check_job_id(job_id)}/")


def purge_job_storage(manifest: TableClient, tiles: ContainerClient, job_id: str) -> PurgedStorage:
    """The job's rows, then its tiles and plans (the order is what makes a stopped sweep harmless).
    The caller holds the job's cancellation row (:func:`mark_sweeping`) meanwhile."""
    rows = delete_manifest_rows(manifest, job_id)
    return PurgedStorage(
        rows=rows,
        tiles=delete_tiles(tiles, job_id),
        plans=delete_plans(tiles, job_id),
        levels=delete_levels(tiles, job_id),
    )


def clear_marker(manifest: TableClient, job_id: str) -> bool:
    """The job's cancellation row, whoever wrote it: the last thing of a swept job (its history is
    gone, and the next delivery of its upload starts a job with nothing cancelled)."""
    return cancellation.clear_cancelled(manifest, job_id)
