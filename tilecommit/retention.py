"""Deleting a finished job's intermediate data: its manifest rows, then its tiles.

The mosaic, its STAC item and its quicklook are the job's product and are never deleted here;
the tiles are intermediate (the mosaic holds their pixels) and so are the rows that name them.

Rows go first. A sweep stopped half-way then leaves tiles without rows, never rows without
tiles: a later run of the job finds no row, renders the window again and meets its old tile
already present with the same bytes. The other order could leave a row naming a deleted tile,
which a later run would trust and skip. The tiles are found by listing their prefix (a
listing is fine for what is being deleted; only assembly must never trust one), so a tile
left by a stopped sweep is found by the next.
"""

from __future__ import annotations

from dataclasses import dataclass

from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.data.tables import TableClient, TableTransactionError
from azure.storage.blob import ContainerClient

from . import storage
from .jobs import check_job_id
from .records import Record

#: Entities per entity-group transaction (the Table service's limit).
TRANSACTION_ROWS = 100


@dataclass(frozen=True)
class PurgedStorage(Record):
    rows: int
    tiles: int


def delete_manifest_rows(manifest: TableClient, job_id: str) -> int:
    """Every row of the job's manifest partition (its windows and any cancellation row)."""
    try:
        keys = [
            r["RowKey"]
            for r in manifest.query_entities("PartitionKey eq @job", parameters={"job": job_id}, select=["RowKey"])
        ]
        for start in range(0, len(keys), TRANSACTION_ROWS):
            batch = keys[start : start + TRANSACTION_ROWS]
            try:
                manifest.submit_transaction([("delete", {"PartitionKey": job_id, "RowKey": key}) for key in batch])
            except TableTransactionError:  # a row another sweep deleted fails the whole transaction
                for key in batch:
                    manifest.delete_entity(job_id, key)  # answers nothing for a row already gone
    except (HttpResponseError, *storage.TRANSPORT_FAULTS) as exc:
        raise storage.storage_fault("deleting the manifest rows of", job_id, exc) from exc
    return len(keys)


def delete_tiles(tiles: ContainerClient, job_id: str) -> int:
    """Every blob under the job's tile prefix (``tiles/{job_id}/``)."""
    deleted = 0
    try:
        for blob in tiles.list_blobs(name_starts_with=f"tiles/{check_job_id(job_id)}/"):
            try:
                tiles.delete_blob(blob.name)
                deleted += 1
            except ResourceNotFoundError:
                pass  # a concurrent sweep, or the lifecycle rule, got there first
    except (HttpResponseError, *storage.TRANSPORT_FAULTS) as exc:
        raise storage.storage_fault("deleting the tiles of", job_id, exc) from exc
    return deleted


def purge_job_storage(manifest: TableClient, tiles: ContainerClient, job_id: str) -> PurgedStorage:
    """The job's rows, then its tiles (the order is what makes a stopped sweep harmless)."""
    rows = delete_manifest_rows(manifest, job_id)
    return PurgedStorage(rows=rows, tiles=delete_tiles(tiles, job_id))
