"""The storage gates: create-only blob, If-Match repair, create-only entity. One outcome type.

The storage engine refuses the second copy in the same request that performs the first, so a
refused conditional write is the mechanism succeeding: it returns ``Outcome.ALREADY_PRESENT``
(or ``SUPERSEDED`` for a repair), is logged at INFO and counted, and never raises. Only genuine
faults raise (:class:`~tilecommit.errors.StorageFaultError`). A transport fault whose outcome is
unknown is resolved from the evidence written with the object (its sha256), never by dropping
the condition.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.data.tables import EdmType, EntityProperty, TableClient, TableEntity, UpdateMode
from azure.storage.blob import BlobClient, ContainerClient, ContentSettings

from . import jobs, telemetry
from .errors import BodyTooLargeError, ConfigurationError, StorageFaultError
from .grid import Window

logger = logging.getLogger(__name__)

#: Metadata key holding the hex sha256 of the body, written in the same conditional put.
SHA256_METADATA_KEY = "sha256"
#: The largest body one Put Blob accepts (service version 2019-12-12 and later).
MAX_PUT_BLOB_BYTES = 5000 * 1024 * 1024
#: Client options for a container whose blobs are written through the gates (``commit_blob``,
#: ``repair_blob``). The SDK sends a body above ``max_single_put_size`` (64 MiB by default) as
#: staged blocks, and Put Block carries no condition: a duplicate would be refused only at Put
#: Block List, after every byte moved. Built with these options, a client sends every body a gate
#: accepts as the one conditional Put Blob.
SINGLE_PUT_CLIENT_OPTIONS = {"max_single_put_size": MAX_PUT_BLOB_BYTES}
#: Conditional puts tried when a transport fault left the outcome unknown and evidence says absent.
UNKNOWN_OUTCOME_ATTEMPTS = 3

#: Exceptions that mean the request got no answer: its outcome is unknown.
TRANSPORT_FAULTS = _TRANSPORT_FAULTS = (ServiceRequestError, ServiceResponseError)


class Outcome(StrEnum):
    """What a gated write did. A refusal is an outcome, not an error."""

    WRITTEN = "written"
    ALREADY_PRESENT = "already-present"
    SUPERSEDED = "superseded"

    def __str__(self) -> str:  # "written", not "Outcome.WRITTEN", in logs and JSON
        return self.value


def sha256_hex(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


# --------------------------------------------------------------------------- classification


def _error_code(exc: HttpResponseError) -> str | None:
    """The service's error code: from the exception, else the ``x-ms-error-code`` header.

    The Tables SDK leaves ``error_code`` empty on a 409, but the header carries it.
    """
    code = getattr(exc, "error_code", None)
    if code:
        # The blob SDK stores a StorageErrorCode enum: str() of it is "StorageErrorCode.X" on 3.11.
        return str(getattr(code, "value", code))
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or {}
    return headers.get("x-ms-error-code")


def is_create_rejection(exc: HttpResponseError) -> bool:
    """True when storage refused a create because the key is taken.

    Classified on status and error code, never on the exception class: with ``overwrite=False``
    the blob SDK raises ``ResourceExistsError`` even for a 412 ``ConditionNotMet``.
    """
    status = getattr(exc, "status_code", None)
    code = _error_code(exc)
    if status == 412:
        return True
    if status == 409:
        return code in (None, "BlobAlreadyExists", "EntityAlreadyExists")
    return False


def storage_fault(action: str, key: str, exc: Exception) -> StorageFaultError:
    """The :class:`StorageFaultError` for a failed storage call (retryable unless a plain 4xx)."""
    status = getattr(exc, "status_code", None)
    return StorageFaultError(f"{action} {key!r} failed: {type(exc).__name__} (status {status}): {exc}", status=status)


def count_rejection(gate: str, status: int | None, job_id: str, key: str, what: str) -> None:
    """Log a refused conditional write at INFO with the job id and count it (the mechanism working)."""
    logger.info(
        "conditional write refused (%s): gate=%s job_id=%s key=%s status=%s",
        what,
        gate,
        job_id or "-",
        key,
        status,
    )
    telemetry.precondition_failed.add(1, telemetry.job_attributes(job_id, gate=gate, status=str(status)))


def count_mismatch(gate: str, job_id: str, key: str, ours: str, stored: str | None) -> None:
    """Log and count a refused create whose stored content is not ours."""
    logger.warning(
        "refused write holds other content: gate=%s job_id=%s key=%s ours=%s stored=%s "
        "(encoding is not deterministic, or another job wrote this key)",
        gate,
        job_id or "-",
        key,
        ours,
        stored,
    )
    telemetry.content_mismatch.add(1, telemetry.job_attributes(job_id, gate=gate))


# --------------------------------------------------------------------------- blobs


def _single_put_client(container: ContainerClient, name: str, size: int) -> BlobClient:
    """A client for ``name`` that sends a body of ``size`` bytes as one Put Blob, or a refusal.

    Refused before any request: a body larger than one Put Blob, and a body that this container
    client would stage as blocks (see :data:`SINGLE_PUT_CLIENT_OPTIONS`).
    """
    if size > MAX_PUT_BLOB_BYTES:
        raise BodyTooLargeError(
            f"{name!r}: {size} bytes is more than one Put Blob allows ({MAX_PUT_BLOB_BYTES}); "
            "stage large outputs as blocks and commit their list create-only instead"
        )
    blob = container.get_blob_client(name)
    # Private, read only: azure-storage-blob 12.31 keeps the max_single_put_size a client was
    # built with on its configuration object and has no public property for it.
    threshold = blob._config.max_single_put_size
    if size > threshold:
        raise ConfigurationError(
            f"{name!r}: {size} bytes would go up as unconditioned staged blocks with this client "
            f"(max_single_put_size={threshold}); build its container client with gates.SINGLE_PUT_CLIENT_OPTIONS"
        )
    return blob


def stored_blob_sha256(blob: BlobClient, digest_key: str = SHA256_METADATA_KEY) -> tuple[str | None, str | None]:
    """(sha256 from the blob's metadata (``digest_key``), etag), or (None, None) when there is no blob."""
    try:
        props = blob.get_blob_properties()
    except ResourceNotFoundError:
        return None, None
    except HttpResponseError as exc:
        raise storage_fault("reading the properties of", blob.blob_name, exc) from exc
    except _TRANSPORT_FAULTS as exc:
        raise storage_fault("reading the properties of", blob.blob_name, exc) from exc
    return (props.metadata or {}).get(digest_key), props.etag


@dataclass(frozen=True)
class StoredBlob:
    """One stored version of a blob, as a record of it must describe it: ETag, size, sha256 of its bytes."""

    etag: str
    nbytes: int
    sha256: str


def content_sha256(blob: BlobClient, etag: str | None = None) -> str:
    """The sha256 of the blob's bytes, read in full (pinned to ``etag`` when given: ``If-Match``).

    A version replaced while it is read (412) is a :class:`StorageFaultError` to retry: the next
    attempt reads whichever version is stored then.
    """
    digest = hashlib.sha256()
    for chunk in _content_chunks(blob, etag):
        digest.update(chunk)
    return digest.hexdigest()


def content_bytes(blob: BlobClient, etag: str | None = None) -> bytes:
    """The blob's bytes (a small one: a companion), read as :func:`content_sha256` reads them."""
    return b"".join(_content_chunks(blob, etag))


def _content_chunks(blob: BlobClient, etag: str | None) -> Iterator[bytes]:
    conditions = {"etag": etag, "match_condition": MatchConditions.IfNotModified} if etag else {}
    try:
        yield from blob.download_blob(max_concurrency=1, **conditions).chunks()
    except HttpResponseError as exc:
        if exc.status_code == 412:
            raise StorageFaultError(f"{blob.blob_name!r} was replaced while its bytes were read (was {etag})") from exc
        raise storage_fault("reading the bytes of", blob.blob_name, exc) from exc
    except _TRANSPORT_FAULTS as exc:
        raise storage_fault("reading the bytes of", blob.blob_name, exc) from exc


def stored_blob(blob: BlobClient) -> StoredBlob | None:
    """What storage holds under ``blob``'s key (None: nothing). The sha256 is the one the gates
    store in the blob's metadata; a blob written without one (by another writer) has its bytes
    read, pinned to the ETag of the same HEAD, and hashed."""
    try:
        props = blob.get_blob_properties()
    except ResourceNotFoundError:
        return None
    except (HttpResponseError, *_TRANSPORT_FAULTS) as exc:
        raise storage_fault("reading the properties of", blob.blob_name, exc) from exc
    digest = (props.metadata or {}).get(SHA256_METADATA_KEY) or content_sha256(blob, props.etag)
    return StoredBlob(etag=props.etag, nbytes=int(props.size), sha256=digest)


def _put(
    blob: BlobClient,
    body: bytes,
    *,
    digest: str,
    content_type: str,
    metadata: dict[str, str] | None,
    **conditions: Any,
) -> dict[str, Any]:
    meta = dict(metadata or {})
    meta[SHA256_METADATA_KEY] = digest
    return blob.upload_blob(
        body,
        length=len(body),
        metadata=meta,
        content_settings=ContentSettings(content_type=content_type),
        max_concurrency=1,
        **conditions,
    )


def create_once(
    blob: BlobClient,
    put: Callable[[], Any],
    *,
    digest: str,
    job_id: str = "",
    gate: str | None = None,
    digest_key: str = SHA256_METADATA_KEY,
) -> Outcome:
    """Run ``put``, one create-only request for ``blob`` (``If-None-Match: *``), and classify it.

    ``put`` is a single Put Blob, or the Put Block List of blocks already staged: either way the
    condition and the body's sha256 (in the metadata) travel in the request that creates the blob.
    Returns ``WRITTEN`` when this request created the blob; ``ALREADY_PRESENT`` when anything held
    the key (409 BlobAlreadyExists or 412 ConditionNotMet, whatever exception class the SDK raised),
    logged at INFO and counted, the stored sha256 compared with ``digest`` (a difference logged at
    WARNING and counted). A transport fault with an unknown outcome is resolved from the stored
    sha256: ours means written, absent means the same conditional request again, never without
    its condition. Anything else raises :class:`StorageFaultError`. ``gate`` labels the counters:
    by default what the blob's name says it is (:func:`tilecommit.jobs.blob_gate`). ``digest_key``:
    the metadata key holding the evidence (a mosaic the storage service copied stores its plan's digest).
    """
    name = blob.blob_name
    gate = gate or jobs.blob_gate(name)
    outcome = _create_once(blob, put, digest=digest, job_id=job_id, gate=gate, digest_key=digest_key)
    telemetry.count_write(gate, outcome, job_id)
    return outcome


def _create_once(
    blob: BlobClient, put: Callable[[], Any], *, digest: str, job_id: str, gate: str, digest_key: str
) -> Outcome:
    name = blob.blob_name
    for _ in range(UNKNOWN_OUTCOME_ATTEMPTS):
        try:
            put()
            return Outcome.WRITTEN
        except HttpResponseError as exc:
            if not is_create_rejection(exc):
                raise storage_fault("creating blob", name, exc) from exc
            count_rejection(gate, exc.status_code, job_id, name, "already present")
            stored, _ = stored_blob_sha256(blob, digest_key)
            if stored != digest:
                count_mismatch(gate, job_id, name, digest, stored)
            return Outcome.ALREADY_PRESENT
        except _TRANSPORT_FAULTS as exc:
            stored, _ = stored_blob_sha256(blob, digest_key)
            if stored is None:
                logger.warning(
                    "create of %r had no answer (%s) and nothing is stored: sending the same conditional request again",
                    name,
                    exc,
                )
                continue
            telemetry.unknown_outcome_resolved.add(1, telemetry.job_attributes(job_id, gate=gate))
            if stored == digest:
                logger.info("create of %r had no answer (%s); the stored sha256 is ours: written", name, exc)
                return Outcome.WRITTEN
            count_rejection(gate, None, job_id, name, "already present, found after a lost response")
            count_mismatch(gate, job_id, name, digest, stored)
            return Outcome.ALREADY_PRESENT
    raise StorageFaultError(
        f"creating blob {name!r}: no answer after {UNKNOWN_OUTCOME_ATTEMPTS} conditional requests and nothing stored"
    )


def commit_blob(
    container: ContainerClient,
    name: str,
    body: bytes,
    *,
    content_type: str = "image/tiff",
    metadata: dict[str, str] | None = None,
    job_id: str = "",
) -> Outcome:
    """Create ``name`` with ``body`` if nothing holds the key: one Put Blob with ``If-None-Match: *``.

    Outcomes and evidence as :func:`create_once`. The body never goes up as staged blocks, whose
    Put Block requests carry no condition, whatever its size.
    """
    return _commit_blob(container, name, body, content_type=content_type, metadata=metadata, job_id=job_id)[0]


def commit_blob_versioned(
    container: ContainerClient,
    name: str,
    body: bytes,
    *,
    content_type: str = "image/tiff",
    metadata: dict[str, str] | None = None,
    job_id: str = "",
) -> tuple[Outcome, StoredBlob]:
    """:func:`commit_blob`, plus the version that holds the key afterwards (:class:`StoredBlob`).

    When this call wrote, that is our body with the ETag of the Put Blob's answer. Otherwise it
    is the stored version (:func:`stored_blob`), whatever we encoded: a record of the blob (a
    manifest row, which assembly pins to its ETag and checks by size) must describe the bytes
    storage holds, not ours. Where they differ (an encoder that changed between the two writes,
    or another writer) the refusal was already logged and counted as a content mismatch by
    :func:`create_once`; it is not an error by itself.
    """
    outcome, answer, blob, digest = _commit_blob(
        container, name, body, content_type=content_type, metadata=metadata, job_id=job_id
    )
    if outcome is Outcome.WRITTEN and answer.get("etag"):
        return outcome, StoredBlob(etag=answer["etag"], nbytes=len(body), sha256=digest)
    held = stored_blob(blob)
    if held is None:
        raise StorageFaultError(f"{name!r} vanished right after its create was answered ({outcome})")
    if held.sha256 != digest:
        logger.warning(
            "%r holds other bytes than ours (job_id=%s): recording the stored version (%d bytes, sha256 %s, etag %s), "
            "not ours (%d bytes, sha256 %s)",
            name,
            job_id or "-",
            held.nbytes,
            held.sha256,
            held.etag,
            len(body),
            digest,
        )
    return outcome, held


def _commit_blob(
    container: ContainerClient,
    name: str,
    body: bytes,
    *,
    content_type: str,
    metadata: dict[str, str] | None,
    job_id: str,
) -> tuple[Outcome, dict[str, Any], BlobClient, str]:
    body = bytes(body)
    digest = sha256_hex(body)
    blob = _single_put_client(container, name, len(body))
    answer: dict[str, Any] = {}

    def put() -> None:
        # overwrite=False makes the SDK send If-None-Match: *. (Passing etag="*" with
        # MatchConditions.IfMissing raises TypeError in the SDK: docs/design.md, 'Storage semantics'.)
        answer.update(_put(blob, body, digest=digest, content_type=content_type, metadata=metadata, overwrite=False))

    return create_once(blob, put, digest=digest, job_id=job_id), answer, blob, digest


def repair_blob(
    container: ContainerClient,
    name: str,
    body: bytes,
    *,
    expect_etag: str,
    content_type: str = "image/tiff",
    metadata: dict[str, str] | None = None,
    job_id: str = "",
) -> Outcome:
    """Replace exactly the version ``expect_etag`` of ``name`` (``If-Match``), in one Put Blob.

    ``WRITTEN`` when it replaced that version; ``SUPERSEDED`` on 412 or 404 (something newer
    landed, or the blob is gone): the newer state is left untouched.
    """
    return repair_blob_versioned(
        container, name, body, expect_etag=expect_etag, content_type=content_type, metadata=metadata, job_id=job_id
    )[0]


def repair_blob_versioned(
    container: ContainerClient,
    name: str,
    body: bytes,
    *,
    expect_etag: str,
    content_type: str = "image/tiff",
    metadata: dict[str, str] | None = None,
    job_id: str = "",
) -> tuple[Outcome, str | None]:
    """:func:`repair_blob`, plus the ETag of the version it wrote (None unless ``WRITTEN``)."""
    body = bytes(body)
    digest = sha256_hex(body)
    blob = _single_put_client(container, name, len(body))
    answer: dict[str, Any] = {}

    def put() -> None:
        answer.update(
            _put(
                blob,
                body,
                digest=digest,
                content_type=content_type,
                metadata=metadata,
                overwrite=True,
                etag=expect_etag,
                match_condition=MatchConditions.IfNotModified,
            )
        )

    outcome = replace_once(blob, put, expect_etag=expect_etag, digest=digest, job_id=job_id)
    etag = answer.get("etag") if outcome is Outcome.WRITTEN else None
    if outcome is Outcome.WRITTEN and etag is None:  # written, found after a lost response
        _, etag = stored_blob_sha256(blob)
    return outcome, etag


#: The gate every If-Match replacement of a blob is counted under (tile, mosaic or sidecar).
REPAIR_GATE = "blob-repair"


def replace_once(
    blob: BlobClient,
    put: Callable[[], Any],
    *,
    expect_etag: str,
    digest: str,
    job_id: str = "",
    gate: str = REPAIR_GATE,
    digest_key: str = SHA256_METADATA_KEY,
) -> Outcome:
    """Run ``put``, one request replacing exactly the version ``expect_etag`` of ``blob``
    (``If-Match``), and classify it: the counterpart of :func:`create_once` for repairs.

    ``put`` is a single Put Blob or the Put Block List of blocks already staged; either way the
    condition and the evidence (``digest`` under ``digest_key`` in the metadata) travel in the
    request that replaces the blob, so a reader sees the old version or the new one, never a mix.
    ``WRITTEN`` when it replaced that version; ``SUPERSEDED`` on 412 ConditionNotMet or 404
    BlobNotFound (something newer landed, or the blob is gone), logged at INFO and counted: the
    newer state is left untouched. A transport fault with an unknown outcome is resolved from
    what is stored: the old version still there means the same conditional request again; our
    evidence means written; anything else is superseded.
    """
    outcome = _replace_once(
        blob, put, expect_etag=expect_etag, digest=digest, job_id=job_id, gate=gate, digest_key=digest_key
    )
    telemetry.count_write(gate, outcome, job_id)
    return outcome


def _replace_once(
    blob: BlobClient, put: Callable[[], Any], *, expect_etag: str, digest: str, job_id: str, gate: str, digest_key: str
) -> Outcome:
    name = blob.blob_name
    for _ in range(UNKNOWN_OUTCOME_ATTEMPTS):
        try:
            put()
            return Outcome.WRITTEN
        except HttpResponseError as exc:
            # A 412 about a lease (LeaseIdMissing ...) is not a newer version: only ConditionNotMet is.
            # Nor is a missing container a blob that is gone: only BlobNotFound is.
            superseded = (exc.status_code, _error_code(exc)) in (
                (404, None),
                (404, "BlobNotFound"),
                (412, None),
                (412, "ConditionNotMet"),
            )
            if not superseded:
                raise storage_fault("repairing blob", name, exc) from exc
            count_rejection(gate, exc.status_code, job_id, name, "superseded")
            return Outcome.SUPERSEDED
        except _TRANSPORT_FAULTS as exc:
            stored, etag = stored_blob_sha256(blob, digest_key)
            if etag == expect_etag:
                logger.warning(
                    "repair of %r had no answer (%s); the old version is still there: trying again", name, exc
                )
                continue
            telemetry.unknown_outcome_resolved.add(1, telemetry.job_attributes(job_id, gate=gate))
            if stored == digest:
                return Outcome.WRITTEN
            count_rejection(gate, None, job_id, name, "superseded, found after a lost response")
            return Outcome.SUPERSEDED
    raise StorageFaultError(f"repairing blob {name!r}: no answer after {UNKNOWN_OUTCOME_ATTEMPTS} attempts")


# --------------------------------------------------------------------------- table entities


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


def read_entity(table: TableClient, partition_key: str, row_key: str) -> TableEntity | None:
    """One point read: the entity, its ETag in ``.metadata["etag"]``, or None when there is
    none; anything else storage answers (or does not) is a :func:`storage_fault`."""
    try:
        return table.get_entity(partition_key, row_key)
    except ResourceNotFoundError:
        return None
    except (HttpResponseError, *_TRANSPORT_FAULTS) as exc:
        raise storage_fault("reading entity", f"{partition_key}/{row_key}", exc) from exc


def create_entity_once(
    table: TableClient,
    entity: dict,
    *,
    gate: str,
    job_id: str = "",
    evidence_field: str | None = None,
) -> Outcome:
    """Insert ``entity`` only if its key is free (Insert Entity answers 409 when it is taken).

    ``evidence_field`` names a property that identifies the content (a sha256): on a refusal it
    is compared with the stored row, and after a transport fault it tells ours from theirs.
    """
    outcome = _create_entity_once(table, entity, gate=gate, job_id=job_id, evidence_field=evidence_field)
    telemetry.count_write(gate, outcome, job_id)
    return outcome


def _create_entity_once(
    table: TableClient, entity: dict, *, gate: str, job_id: str, evidence_field: str | None
) -> Outcome:
    key = f"{entity['PartitionKey']}/{entity['RowKey']}"
    for _ in range(UNKNOWN_OUTCOME_ATTEMPTS):
        try:
            table.create_entity(entity)
            return Outcome.WRITTEN
        except HttpResponseError as exc:
            if not is_create_rejection(exc):
                raise storage_fault("creating entity", key, exc) from exc
            count_rejection(gate, exc.status_code, job_id, key, "already present")
            if evidence_field:
                stored = read_entity(table, entity["PartitionKey"], entity["RowKey"]) or {}
                if stored.get(evidence_field) != entity[evidence_field]:
                    count_mismatch(gate, job_id, key, entity[evidence_field], stored.get(evidence_field))
            return Outcome.ALREADY_PRESENT
        except _TRANSPORT_FAULTS as exc:
            stored = read_entity(table, entity["PartitionKey"], entity["RowKey"])
            if stored is None:
                logger.warning("insert of %s had no answer (%s) and nothing is stored: trying again", key, exc)
                continue
            telemetry.unknown_outcome_resolved.add(1, telemetry.job_attributes(job_id, gate=gate))
            if evidence_field and stored.get(evidence_field) == entity[evidence_field]:
                return Outcome.WRITTEN
            count_rejection(gate, None, job_id, key, "already present, found after a lost response")
            if evidence_field:
                count_mismatch(gate, job_id, key, entity[evidence_field], stored.get(evidence_field))
            return Outcome.ALREADY_PRESENT
    raise StorageFaultError(f"creating entity {key}: no answer after {UNKNOWN_OUTCOME_ATTEMPTS} attempts")


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
) -> Outcome:
    """Create-only manifest row: PartitionKey job id, RowKey window id; ``etag`` is the tile
    version its commit produced, which assembly pins when the service copies from the tile."""
    entity = _manifest_entity(job_id, window, uri, nbytes, sha256, etag)
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
    return manifest_entry(dict(entity)), entity.metadata["etag"]


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
    entity = _manifest_entity(job_id, window, uri, nbytes, sha256, etag)
    outcome = _repair_entity(table, entity, expect_row_etag, job_id=job_id)
    telemetry.count_write(MANIFEST_REPAIR_GATE, outcome, job_id)
    return outcome


#: The gate an If-Match replacement of a manifest row is counted under.
MANIFEST_REPAIR_GATE = "manifest-repair"


def _repair_entity(table: TableClient, entity: dict, expect_row_etag: str, *, job_id: str) -> Outcome:
    key = f"{entity['PartitionKey']}/{entity['RowKey']}"
    gate = MANIFEST_REPAIR_GATE
    for _ in range(UNKNOWN_OUTCOME_ATTEMPTS):
        try:
            table.update_entity(
                entity, mode=UpdateMode.REPLACE, etag=expect_row_etag, match_condition=MatchConditions.IfNotModified
            )
            return Outcome.WRITTEN
        except HttpResponseError as exc:
            if exc.status_code not in (404, 412):
                raise storage_fault("repairing entity", key, exc) from exc
            count_rejection(gate, exc.status_code, job_id, key, "superseded")
            return Outcome.SUPERSEDED
        except _TRANSPORT_FAULTS as exc:
            stored = get_manifest_row(table, entity["PartitionKey"], entity["RowKey"])
            if stored is not None and stored[1] == expect_row_etag:
                logger.warning("repair of %s had no answer (%s); the old row is still there: trying again", key, exc)
                continue
            telemetry.unknown_outcome_resolved.add(1, telemetry.job_attributes(job_id, gate=gate))
            if stored is not None and (stored[0].sha256, stored[0].etag) == (entity["sha256"], entity.get("etag")):
                return Outcome.WRITTEN
            count_rejection(gate, None, job_id, key, "superseded, found after a lost response")
            return Outcome.SUPERSEDED
    raise StorageFaultError(f"repairing entity {key}: no answer after {UNKNOWN_OUTCOME_ATTEMPTS} attempts")


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
    except (HttpResponseError, *_TRANSPORT_FAULTS) as exc:
        raise storage_fault("counting the manifest of", job_id, exc) from exc
    return ManifestSummary(job_id=job_id, entries=entries)


# Re-exported for callers that only need the classification.
__all__ = [
    "Outcome",
    "ManifestEntry",
    "ManifestSummary",
    "commit_blob",
    "commit_blob_versioned",
    "create_once",
    "repair_blob",
    "repair_blob_versioned",
    "replace_once",
    "get_manifest_row",
    "read_entity",
    "repair_manifest_entry",
    "record_manifest_entry",
    "get_manifest_entry",
    "count_manifest",
    "create_entity_once",
    "is_create_rejection",
    "stored_blob_sha256",
    "stored_blob",
    "StoredBlob",
    "content_sha256",
    "sha256_hex",
    "SHA256_METADATA_KEY",
    "MAX_PUT_BLOB_BYTES",
    "SINGLE_PUT_CLIENT_OPTIONS",
]
