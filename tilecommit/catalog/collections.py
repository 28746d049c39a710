"""A finished job's item joins its collection: the write protocol (docs/catalog.md, "The write
protocol"), over the documents of :mod:`.documents`.

Two documents change, one after the other, each by a conditional read-modify-write
(:func:`read_modify_write`): the item's index page, then the collection document. Each is read
(its bytes and ETag in one GET), changed, and written with ``If-Match`` on the ETag read, or
``If-None-Match: *`` when there was none, through the one conditional write
(:mod:`tilecommit.gates`, :mod:`tilecommit.conditional`); a refusal (412, or 409/412 on a create)
means another writer's version landed in between, so the change is made again on that version.
Neither step is ever sent without its condition, and each is a no-op when the document already
holds what the step adds, so an activity that died between the two (or ran twice) converges
when it runs again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from azure.storage.blob import ContainerClient

from .. import conditional, gates, jobs
from ..conditional import Outcome
from ..errors import MosaicCheckError
from ..observability import telemetry
from ..raster.assembly.stac import without_run_facts
from ..records import Record
from ..retries import DOCUMENT_FIRST_BACKOFF_S, DOCUMENT_MAX_BACKOFF_S, DOCUMENT_WRITE_ATTEMPTS, DOCUMENT_WRITE_BUDGET_S
from ..storage_answers import storage_fault, unless_missing
from . import documents

logger = logging.getLogger(__name__)
CONTENT_TYPE = "application/json"


@dataclass(frozen=True)
class Step:
    """One read-modify-write: whether it wrote, the document as it stands after it (ours, or the
    one read when there was nothing to change), and its refused writes and writes sent."""

    wrote: bool
    document: dict
    conflicts: int
    attempts: int


@dataclass(frozen=True)
class Added(Record):
    """An item added to its collection: ``outcome`` ``written`` (this call listed it) or
    ``already-present``; the collection document's revision that holds it; the refused
    conditional writes (412s, and 409s of a create) and the writes sent, both steps together."""

    collection: str
    collection_blob: str
    index_blob: str
    outcome: str
    revision: int
    conflicts: int
    attempts: int


def read_document(container: ContainerClient, name: str) -> tuple[dict | None, str | None]:
    """The JSON document ``name`` and its ETag, from one GET (None, None: there is none). One that
    is not JSON is known bad: this module wrote every version, whole, in one Put Blob."""
    blob = container.get_blob_client(name)

    def read() -> tuple[bytes, str]:
        download = blob.download_blob(max_concurrency=1)
        return download.readall(), download.properties.etag

    got = unless_missing("reading", name, read)
    if got is None:
        return None, None
    body, etag = got
    try:
        return json.loads(body), etag
    except ValueError as exc:
        raise MosaicCheckError(f"{name} is not a JSON document ({exc}); it was not written by tilecommit") from exc


def read_modify_write(
    container: ContainerClient,
    name: str,
    change: Callable[[dict | None], dict | None],
    *,
    job_id: str = "",
    attempts: int = DOCUMENT_WRITE_ATTEMPTS,
    budget_s: float = DOCUMENT_WRITE_BUDGET_S,
) -> Step:
    """Read ``name``, ``change`` it (None: nothing to change), write it conditionally on the
    version read; on a refusal, sleep a jittered while (tilecommit/retries.py) and do it all again.

    More than ``attempts`` refusals, or ``budget_s`` seconds of them, raise a retryable
    :class:`~tilecommit.errors.StorageFaultError`: the activity is retried later by the
    orchestrator's policy, and starts over from a fresh read.
    """
    gate, started, conflicts = jobs.blob_gate(name), time.monotonic(), 0
    for attempt in range(1, attempts + 1):
        current, etag = read_document(container, name)
        new = change(current)
        if new is None:
            return Step(False, current or {}, conflicts, attempt - 1)
        body = documents.canonical(new)
        if etag is None:
            outcome = gates.commit_blob(
                container, name, body, content_type=CONTENT_TYPE, job_id=job_id, same_bytes=False
            )
        else:
            outcome, _ = gates.repair_blob_versioned(
                container, name, body, expect_etag=etag, content_type=CONTENT_TYPE, job_id=job_id, gate=gate
            )
        if outcome is Outcome.WRITTEN:
            return Step(True, new, conflicts, attempt)
        conflicts += 1
        if time.monotonic() - started > budget_s:
            break
        time.sleep(random.uniform(0, min(DOCUMENT_MAX_BACKOFF_S, DOCUMENT_FIRST_BACKOFF_S * 2 ** (attempt - 1))))
    raise storage_fault(
        f"{name}: {conflicts} conditional writes refused in {time.monotonic() - started:.1f} s, each because "
        "another writer's version landed after it was read; the activity is retried",
        retryable=True,
    )


def stored_item_entry(output: ContainerClient, job_id: str) -> dict:
    """The job's index entry, from its stored STAC item (:func:`.documents.entry`)."""
    item_blob, mosaic_blob = jobs.stac_blob_name(job_id), jobs.mosaic_blob_name(job_id)
    body = unless_missing("reading", item_blob, lambda: gates.content_bytes(output.get_blob_client(item_blob)))
    if body is None:
        raise storage_fault(f"{item_blob} vanished after the mosaic's assembly wrote it; read again", retryable=True)
    comparable = without_run_facts(body)
    return documents.entry(
        json.loads(comparable),
        item_blob=item_blob,
        mosaic_blob=mosaic_blob,
        item_sha256=hashlib.sha256(comparable).hexdigest(),
    )


def add_item(output: ContainerClient, collection: str, entry: dict, *, job_id: str = "") -> Added:
    """List ``entry`` (:func:`.documents.entry`) in collection ``collection``: its page first, then
    the collection document (the module's protocol). Raises :class:`MosaicCheckError` when the
    page lists the item with another entry (known bad: counted as a content mismatch)."""
    key = documents.page_key(entry["id"])
    page_name = documents.page_blob_name(collection, key)
    mosaic_url = output.get_blob_client(entry["mosaic"]).url

    def list_in_page(page: dict | None) -> dict | None:
        try:
            return documents.page_with(page, collection, key, entry, mosaic_url)
        except MosaicCheckError as exc:
            digest = gates.sha256_hex
            held = documents.listed_entry(page, entry["id"])
            conditional.count_mismatch(
                jobs.blob_gate(page_name),
                job_id,
                page_name,
                digest(documents.canonical(entry)),
                digest(documents.canonical(held or {})),
            )
            raise MosaicCheckError(
                f"{page_name} lists item {entry['id']} otherwise than its stored item gives: {exc}. Another "
                "writer listed it, or the item changed after it was listed; nothing was written"
            ) from exc

    page = read_modify_write(output, page_name, list_in_page, job_id=job_id)
    if not page.wrote:
        logger.info("item %s is listed in %s already, with this entry: already-present", entry["id"], page_name)
        telemetry.count_write(jobs.blob_gate(page_name), Outcome.ALREADY_PRESENT, job_id)
    collection_name = documents.collection_blob_name(collection)
    doc = read_modify_write(
        output,
        collection_name,
        lambda current: documents.collection_with(current, collection, entry, key, page.document),
        job_id=job_id,
    )
    return Added(
        collection=collection,
        collection_blob=collection_name,
        index_blob=page_name,
        outcome=str(Outcome.WRITTEN if page.wrote else Outcome.ALREADY_PRESENT),
        revision=int(doc.document[documents.REVISION]),
        conflicts=page.conflicts + doc.conflicts,
        attempts=page.attempts + doc.attempts,
    )
