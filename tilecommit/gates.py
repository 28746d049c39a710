"""The Azure backends of the one conditional write (:mod:`tilecommit.conditional`): a blob's
create-only Put Blob or Put Block List (``If-None-Match: *``) and its ``If-Match`` replacement
(a repair), a table entity's create-only insert and its ``If-Match`` update (the manifest's rows are such
entities: :mod:`tilecommit.manifest`).

The rules (a refusal is an outcome, logged at INFO and counted, never raised; an unknown outcome
resolved from the stored evidence, never by dropping the condition) are :mod:`~tilecommit.conditional`'s;
what is here is how Azure Storage is asked and how its answers read: 409 ``BlobAlreadyExists`` /
``EntityAlreadyExists`` and 412 ``ConditionNotMet`` for a taken key; 412 or 404 for a replaced or
vanished version; the evidence a sha256 in the blob's metadata or a property of the entity.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError
from azure.data.tables import TableClient, TableEntity
from azure.storage.blob import BlobClient, ContainerClient, ContentSettings

from . import conditional, jobs
from .conditional import Outcome, Stored
from .errors import BodyTooLargeError, ConfigurationError, StorageFaultError, retryable_status
from .storage import blob_head
from .storage_answers import (
    STORAGE_ERRORS,
    TRANSPORT_FAULTS,
    call_failed,
    classify,
    error_code,
    storage_fault,
    unless_missing,
)

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


def sha256_hex(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


# --------------------------------------------------------------------------- classification


def is_create_rejection(exc: HttpResponseError) -> bool:
    """True when storage refused a create because the key is taken.

    Classified on status and error code, never on the exception class: with ``overwrite=False``
    the blob SDK raises ``ResourceExistsError`` even for a 412 ``ConditionNotMet``.
    """
    status = getattr(exc, "status_code", None)
    code = error_code(exc)
    if status == 412:
        return True
    if status == 409:
        return code in (None, "BlobAlreadyExists", "EntityAlreadyExists")
    return False


#: A blob replacement's refusals: the version is not the one named (412 ConditionNotMet), or the
#: blob is gone (404 BlobNotFound). A 412 about a lease (LeaseIdMissing...) is not a newer
#: version, nor is a missing container a blob that is gone.
BLOB_SUPERSEDED = frozenset({(404, None), (404, "BlobNotFound"), (412, None), (412, "ConditionNotMet")})
#: An entity update's: a stale ETag (412 UpdateConditionNotSatisfied), or no such entity (404).
ENTITY_SUPERSEDED = frozenset(
    {(404, None), (404, "ResourceNotFound"), (412, None), (412, "UpdateConditionNotSatisfied")}
)


@dataclass
class AzureWrite:
    """One conditional request to Azure Storage (:class:`conditional.Backend`): ``send`` carries
    the condition; ``read`` reads what is stored at the key; ``superseded``, for an If-Match
    replacement, the answers that mean a newer version or none (else it is a create)."""

    key: str
    send: Callable[[], Any]
    read: Callable[[], Stored]
    action: str
    #: The write id ``send`` stores with what it writes (conditional.WRITE_ID_KEY).
    write_id: str | None
    #: For a replacement: the answers (status, error code) that mean superseded.
    superseded: frozenset | None = None

    def refused(self, exc: BaseException) -> bool:
        if not isinstance(exc, HttpResponseError):
            return False
        if self.superseded is not None:
            return (exc.status_code, error_code(exc)) in self.superseded
        return is_create_rejection(exc)

    def unanswered(self, exc: BaseException) -> bool:
        # No answer, or one that does not say whether the write was carried out: a 500
        # OperationTimedOut may come after it was (Common REST API error codes: "the operation
        # may or may not have succeeded"), and the SDKs do not resend every method on a 5xx
        # (azure-core's RetryPolicy never resends a POST, an Insert Entity, after a 500 or 503).
        if isinstance(exc, HttpResponseError):
            return retryable_status(exc.status_code or 0)
        return isinstance(exc, TRANSPORT_FAULTS)

    def stored(self) -> Stored:
        return self.read()

    def status(self, exc: BaseException) -> int | None:
        return getattr(exc, "status_code", None)

    def fault(self, exc: BaseException) -> StorageFaultError:
        return call_failed(self.action, self.key, exc)


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
    held = _blob_evidence(blob, digest_key)()
    return held.digest, held.version


def _blob_evidence(blob: BlobClient, digest_key: str) -> Callable[[], Stored]:
    def read() -> Stored:
        props = blob_head(blob)
        if props is None:
            return conditional.ABSENT
        metadata = props.metadata or {}
        return Stored(True, metadata.get(digest_key), props.etag, metadata.get(conditional.WRITE_ID_KEY))

    return read


@dataclass(frozen=True)
class StoredBlob:
    """One stored version of a blob, as a record of it must describe it: ETag, size, sha256 of its bytes."""

    etag: str
    nbytes: int
    sha256: str


def content_sha256(blob: BlobClient, etag: str | None = None) -> str:
    """The sha256 of the blob's bytes, read in full (pinned to ``etag`` when given: ``If-Match``).

    A version replaced or deleted while it is read (412, 404) is a :class:`StorageFaultError` to
    retry: the next attempt reads whatever is stored then.
    """
    digest = hashlib.sha256()
    for chunk in _content_chunks(blob, etag):
        digest.update(chunk)
    return digest.hexdigest()


def content_bytes(blob: BlobClient, etag: str | None = None, *, length: int | None = None) -> bytes:
    """The blob's bytes (a small one: a companion), or its first ``length`` bytes (a mosaic's
    head), read as :func:`content_sha256` reads them."""
    return b"".join(_content_chunks(blob, etag, length))


def _content_chunks(blob: BlobClient, etag: str | None, length: int | None = None) -> Iterator[bytes]:
    conditions: dict[str, Any] = {"etag": etag, "match_condition": MatchConditions.IfNotModified} if etag else {}
    span: dict[str, Any] = {"offset": 0, "length": length} if length is not None else {}
    try:
        yield from blob.download_blob(max_concurrency=1, **conditions, **span).chunks()
    except STORAGE_ERRORS as exc:
        answer = classify(exc)
        if etag and answer.version_gone:
            raise storage_fault(
                f"{blob.blob_name!r} changed while its bytes were read (was {etag}, storage answered "
                f"{answer.reason}); it is read again",
                answer,
                retryable=True,
            ) from exc
        raise call_failed("reading the bytes of", blob.blob_name, exc) from exc


def stored_blob(blob: BlobClient) -> StoredBlob | None:
    """What storage holds under ``blob``'s key (None: nothing). The sha256 is the one the gates
    store in the blob's metadata; a blob written without one (by another writer) has its bytes
    read, pinned to the ETag of the same HEAD, and hashed."""
    props = blob_head(blob)
    if props is None:
        return None
    digest = (props.metadata or {}).get(SHA256_METADATA_KEY) or content_sha256(blob, props.etag)
    return StoredBlob(etag=props.etag, nbytes=int(props.size), sha256=digest)


@dataclass
class _SinglePut:
    """One body going up through a gate as one Put Blob: its client, sha256 and write id, and
    the service's answer once sent (empty until then, or when the answer was lost)."""

    blob: BlobClient
    body: bytes
    digest: str
    write_id: str
    content_type: str
    metadata: dict[str, str] | None
    answer: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls, container: ContainerClient, name: str, body: bytes, content_type: str, metadata: dict[str, str] | None
    ) -> _SinglePut:
        body = bytes(body)
        digest = sha256_hex(body)
        blob = _single_put_client(container, name, len(body))
        return cls(blob, body, digest, conditional.new_write_id(), content_type, metadata)

    def sender(self, **conditions: Any) -> Callable[[], None]:
        """The request, carrying ``conditions``, with the sha256 and the write id in its metadata."""

        def put() -> None:
            meta = dict(self.metadata or {})
            meta[SHA256_METADATA_KEY] = self.digest
            meta[conditional.WRITE_ID_KEY] = self.write_id
            answer = self.blob.upload_blob(
                self.body,
                length=len(self.body),
                metadata=meta,
                content_settings=ContentSettings(content_type=self.content_type),
                max_concurrency=1,
                **conditions,
            )
            self.answer.update(answer)

        return put


def create_once(
    blob: BlobClient,
    put: Callable[[], Any],
    *,
    digest: str | None,
    write_id: str,
    job_id: str = "",
    gate: str | None = None,
    digest_key: str = SHA256_METADATA_KEY,
) -> Outcome:
    """Run ``put``, one create-only request for ``blob`` (``If-None-Match: *``), and classify it.

    ``put`` is a single Put Blob, or the Put Block List of blocks already staged: either way the
    condition, the body's sha256 and ``write_id`` (in the metadata) travel in the request that
    creates the blob.
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
    write = AzureWrite(name, put, _blob_evidence(blob, digest_key), "creating blob", write_id)
    return conditional.create_once(write, digest=digest, gate=gate or jobs.blob_gate(name), job_id=job_id)


def commit_blob(
    container: ContainerClient,
    name: str,
    body: bytes,
    *,
    content_type: str = "image/tiff",
    metadata: dict[str, str] | None = None,
    job_id: str = "",
    same_bytes: bool = True,
) -> Outcome:
    """Create ``name`` with ``body`` if nothing holds the key: one Put Blob with ``If-None-Match: *``.

    Outcomes and evidence as :func:`create_once`. The body never goes up as staged blocks, whose
    Put Block requests carry no condition, whatever its size. ``same_bytes`` False: the blob is a
    document several writers change (a collection's), so one another writer created first holds
    other bytes by right and is not compared with ours (no content mismatch counted).
    """
    return _commit_blob(
        container, name, body, content_type=content_type, metadata=metadata, job_id=job_id, same_bytes=same_bytes
    )[0]


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
    outcome, one = _commit_blob(container, name, body, content_type=content_type, metadata=metadata, job_id=job_id)
    digest = one.digest
    if outcome is Outcome.WRITTEN and one.answer.get("etag"):
        return outcome, StoredBlob(etag=one.answer["etag"], nbytes=len(one.body), sha256=digest)
    held = stored_blob(one.blob)
    if held is None:
        raise storage_fault(f"{name!r} vanished right after its create was answered ({outcome})")
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
    same_bytes: bool = True,
) -> tuple[Outcome, _SinglePut]:
    one = _SinglePut.of(container, name, body, content_type, metadata)
    # overwrite=False makes the SDK send If-None-Match: *. (Passing etag="*" with
    # MatchConditions.IfMissing raises TypeError in the SDK: docs/design.md, 'Storage semantics'.)
    put = one.sender(overwrite=False)
    digest = one.digest if same_bytes else None
    return create_once(one.blob, put, digest=digest, write_id=one.write_id, job_id=job_id), one


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
    gate: str | None = None,
) -> tuple[Outcome, str | None]:
    """:func:`repair_blob`, plus the ETag of the version it wrote (None unless ``WRITTEN``).
    ``gate`` labels the counters (by default :data:`REPAIR_GATE`)."""
    one = _SinglePut.of(container, name, body, content_type, metadata)
    put = one.sender(overwrite=True, etag=expect_etag, match_condition=MatchConditions.IfNotModified)
    outcome = replace_once(
        one.blob,
        put,
        expect_etag=expect_etag,
        digest=one.digest,
        write_id=one.write_id,
        job_id=job_id,
        gate=gate or REPAIR_GATE,
    )
    etag = one.answer.get("etag") if outcome is Outcome.WRITTEN else None
    if outcome is Outcome.WRITTEN and etag is None:  # written, found after a lost response
        _, etag = stored_blob_sha256(one.blob)
    return outcome, etag


#: The gate every If-Match replacement of a blob is counted under (tile, mosaic or sidecar).
REPAIR_GATE = "blob-repair"


def replace_once(
    blob: BlobClient,
    put: Callable[[], Any],
    *,
    expect_etag: str,
    digest: str,
    write_id: str,
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
    write = AzureWrite(
        blob.blob_name, put, _blob_evidence(blob, digest_key), "repairing blob", write_id, BLOB_SUPERSEDED
    )
    return conditional.replace_once(write, expect_version=expect_etag, digest=digest, gate=gate, job_id=job_id)


# --------------------------------------------------------------------------- table entities


def read_entity(table: TableClient, partition_key: str, row_key: str) -> TableEntity | None:
    """One point read: the entity, its ETag in ``.metadata["etag"]``, or None when there is
    none; anything else storage answers (or does not) is a storage fault (:func:`.storage_answers.unless_missing`)."""
    return unless_missing(
        "reading entity", f"{partition_key}/{row_key}", lambda: table.get_entity(partition_key, row_key)
    )


def stored_entity(table: TableClient, partition_key: str, row_key: str, evidence_field: str | None) -> Stored:
    """What the table holds at the key, as a conditional write's evidence: the row's ETag, the
    property ``evidence_field`` (a sha256) and the write id of the request that wrote it."""
    stored = read_entity(table, partition_key, row_key)
    if stored is None:
        return conditional.ABSENT
    evidence = stored.get(evidence_field) if evidence_field else None
    return Stored(True, evidence, stored.metadata.get("etag"), stored.get(conditional.WRITE_ID_KEY))


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
    partition, row = entity["PartitionKey"], entity["RowKey"]
    write_id = conditional.new_write_id()
    entity = {**entity, conditional.WRITE_ID_KEY: write_id}

    def read() -> Stored:
        return stored_entity(table, partition, row, evidence_field)

    write = AzureWrite(f"{partition}/{row}", lambda: table.create_entity(entity), read, "creating entity", write_id)
    digest = entity[evidence_field] if evidence_field else None
    return conditional.create_once(write, digest=digest, gate=gate, job_id=job_id)


# Re-exported for callers that only need the classification.
__all__ = [
    "Outcome",
    "commit_blob",
    "commit_blob_versioned",
    "create_once",
    "repair_blob",
    "repair_blob_versioned",
    "replace_once",
    "read_entity",
    "create_entity_once",
    "is_create_rejection",
    "error_code",
    "stored_blob_sha256",
    "stored_blob",
    "StoredBlob",
    "content_sha256",
    "sha256_hex",
    "SHA256_METADATA_KEY",
    "MAX_PUT_BLOB_BYTES",
    "SINGLE_PUT_CLIENT_OPTIONS",
]
