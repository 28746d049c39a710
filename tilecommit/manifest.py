"""The manifest: one create-only table row per committed tile (PartitionKey the job id, RowKey
the window id), naming the tile's URL, size, sha256 and the ETag its commit produced. Assembly
trusts these rows, read across every page, never a listing of the tiles.

Rows are written and repaired through the one conditional write (:mod:`tilecommit.conditional`,
Azure's table backend in :mod:`tilecommit.gates`): a row already there is ``already-present``;
a repair replaces exactly the version it inspected (``If-Match``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from azure.core import MatchConditions
from azure.data.tables import EdmType, EntityProperty, TableClient, UpdateMode

from . import conditional, jobs
from .conditional import Outcome, Stored
from .gates import ENTITY_SUPERSEDED, AzureWrite, create_entity_once, read_entity
from .grid import Window
from .storage_answers import STORAGE_ERRORS, call_failed


@dataclass(frozen=True)
class ManifestEntry:
    window: str
    uri: str
    nbytes: int
    sha256: str
    #: The tile's ETag from its commit (None in rows written before ETags were recorded).
    etag: str | None = None


@dataclass(frozen=True)
class ManifestSummary:
    """Every manifest row of one job, read across all pages."""

    job_id: str
    entries: dict[str, ManifestEntry] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return len(self.entries)

    @property
    def total_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())

    @property
    def window_ids(self) -> list[str]:
        return sorted(self.entries)


def _entity_value(value: Any) -> Any:
    return value.value if isinstance(value, EntityProperty) else value


def manifest_entry(entity: dict) -> ManifestEntry:
    """A manifest row as read from the table."""
    return ManifestEntry(
        window=entity["RowKey"],
        uri=entity["uri"],
        nbytes=int(_entity_value(entity["bytes"])),
        sha256=entity["sha256"],
        etag=entity.get("etag") or None,
    )


@dataclass(frozen=True)
class RenderTimes:
    """When the activity that wrote a window's tile began (before its manifest point read) and
    ended (its tile committed), by the worker's clock, in UTC. Recorded in the row, never part of
    its evidence: a repeat that finds the row already present keeps the first attempt's times."""

    started: datetime
    finished: datetime


def _window_id(window: Window | str) -> str:
    return window.id if isinstance(window, Window) else str(window)


def record_manifest_entry(
    table: TableClient,
    *,
    job_id: str,
    window: Window | str,
    uri: str,
    nbytes: int,
    sha256: str,
    etag: str | None = None,
    times: RenderTimes | None = None,
) -> Outcome:
    """Create-only manifest row: PartitionKey job id, RowKey window id; ``etag`` is the tile
    version its commit produced, which assembly pins when the service copies from the tile;
    ``times`` when its activity began and ended rendering (the job's timeline shows them)."""
    entity = _manifest_entity(job_id, window, uri, nbytes, sha256, etag)
    if times is not None:
        entity.update(started=times.started.isoformat(), finished=times.finished.isoformat())
    return create_entity_once(table, entity, gate="manifest", job_id=job_id, evidence_field="sha256")


def get_manifest_entry(table: TableClient, job_id: str, window: Window | str) -> ManifestEntry | None:
    """One point read: the window's manifest row, or None (used to skip work before encoding)."""
    entity = read_entity(table, job_id, _window_id(window))
    return None if entity is None else manifest_entry(entity)


def _manifest_entity(job_id: str, window: Window | str, uri: str, nbytes: int, sha256: str, etag: str | None) -> dict:
    entity = {
        "PartitionKey": job_id,
        "RowKey": _window_id(window),
        "uri": uri,
        "bytes": EntityProperty(int(nbytes), EdmType.INT64),
        "sha256": sha256,
    }
    if etag:
        entity["etag"] = etag
    return entity


def get_manifest_row(table: TableClient, job_id: str, window: Window | str) -> tuple[ManifestEntry, str] | None:
    """The window's manifest row and the row's own ETag (what a repair's If-Match names), or None."""
    entity = read_entity(table, job_id, _window_id(window))
    if entity is None:
        return None
    return manifest_entry(dict(entity)), str(entity.metadata["etag"])  # the service sends every entity's ETag


def repair_manifest_entry(
    table: TableClient,
    *,
    job_id: str,
    window: Window | str,
    uri: str,
    nbytes: int,
    sha256: str,
    etag: str | None,
    expect_row_etag: str,
) -> Outcome:
    """Replace exactly the version ``expect_row_etag`` of the window's row (Update Entity with
    ``If-Match``), so that it names the tile as stored now (``etag``: the tile blob's ETag).

    ``WRITTEN`` when it replaced that version; ``SUPERSEDED`` on 412 or 404 (a newer row, or
    none): left untouched, counted and logged like a refused create. A transport fault is
    resolved from the stored row: the old version means the same request again, our sha256 and
    tile ETag mean written, anything else superseded.
    """
    write_id = conditional.new_write_id()
    entity = {**_manifest_entity(job_id, window, uri, nbytes, sha256, etag), conditional.WRITE_ID_KEY: write_id}
    key = f"{job_id}/{entity['RowKey']}"

    def send() -> None:
        table.update_entity(
            entity, mode=UpdateMode.REPLACE, etag=expect_row_etag, match_condition=MatchConditions.IfNotModified
        )

    def read() -> Stored:
        # The evidence of a row is what it names: the tile's sha256 and ETag.
        stored = read_entity(table, job_id, entity["RowKey"])
        if stored is None:
            return conditional.ABSENT
        row = manifest_entry(dict(stored))
        evidence = _row_evidence(row.sha256, row.etag)
        return Stored(True, evidence, stored.metadata["etag"], stored.get(conditional.WRITE_ID_KEY))

    write = AzureWrite(key, send, read, "repairing entity", write_id, ENTITY_SUPERSEDED)
    return conditional.replace_once(
        write,
        expect_version=expect_row_etag,
        digest=_row_evidence(sha256, etag),
        gate=MANIFEST_REPAIR_GATE,
        job_id=job_id,
    )


#: The gate an If-Match replacement of a manifest row is counted under.
MANIFEST_REPAIR_GATE = "manifest-repair"


def _row_evidence(sha256: str, etag: str | None) -> str:
    return f"{sha256}|{etag or ''}"


def count_manifest(table: TableClient, job_id: str) -> ManifestSummary:
    """All manifest rows of ``job_id``, every page read. Assembly trusts this, never a listing."""
    entries: dict[str, ManifestEntry] = {}
    try:
        pages: Iterable[dict] = table.query_entities(
            f"PartitionKey eq @job and {jobs.WINDOW_ROWS_FILTER}",
            parameters={"job": job_id},
            select=["RowKey", "uri", "bytes", "sha256", "etag"],
        )
        for entity in pages:
            entry = manifest_entry(entity)
            entries[entry.window] = entry
    except STORAGE_ERRORS as exc:
        raise call_failed("counting the manifest of", job_id, exc) from exc
    return ManifestSummary(job_id=job_id, entries=entries)


def _parsed_time(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


def window_timings(table: TableClient, job_id: str) -> dict[str, tuple[datetime | None, datetime | None]]:
    """Window id -> when its tile's activity started and finished rendering (:class:`RenderTimes`),
    for every window row of ``job_id``; (None, None) for a row written without them."""
    try:
        pages: Iterable[dict] = table.query_entities(
            f"PartitionKey eq @job and {jobs.WINDOW_ROWS_FILTER}",
            parameters={"job": job_id},
            select=["RowKey", "started", "finished"],
        )
        return {e["RowKey"]: (_parsed_time(e.get("started")), _parsed_time(e.get("finished"))) for e in pages}
    except STORAGE_ERRORS as exc:
        raise call_failed("reading the window times of", job_id, exc) from exc
