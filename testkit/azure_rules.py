"""The documented rules of Azure Blob and Table storage that Azurite does not enforce, enforced.

Azurite accepts requests Azure refuses. :class:`AzureRules` sees each request before it reaches
Azurite (:mod:`testkit.storage_proxy`), refuses the ones Azure would refuse with Azure's own status
and error code, and follows what storage carried out (the blocks staged on each blob) to judge
the next. Each rule names the REST reference page that states it; the table of docs/faults.md
("What Azure does and Azurite doesn't") lists them with what Azurite 3.37 answers instead.

Pure bookkeeping, no I/O: the proxy calls :meth:`AzureRules.check` before it forwards a request
and :meth:`AzureRules.carried_out` after storage answered it with a success.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field

from . import storage_ops as ops
from .storage_ops import Request

MIB = 2**20

# -- Blob service --------------------------------------------------------------------------------
#: Put Block: "blockid ... Before encoded, the string must be less than or equal to 64 bytes in
#: size. For a given blob, the length of the value specified for the blockid parameter must be the
#: same size for each block." (learn.microsoft.com/rest/api/storageservices/put-block, URI
#: parameters; Put Block From URL says the same.)
MAX_BLOCK_ID_BYTES = 64
#: Put Block, remarks: "A blob can have a maximum of 100,000 uncommitted blocks at any given time.
#: If this maximum is exceeded, the service returns status code 409 (RequestEntityTooLargeBlockCountExceedsLimit)."
MAX_UNCOMMITTED_BLOCKS = 100_000
#: Put Block List, remarks: "The maximum number of blocks that a block blob can include is 50,000."
MAX_COMMITTED_BLOCKS = 50_000
#: Put Block (version 2019-12-12 and later): a block is at most 4,000 MiB. Put Blob: at most 5,000 MiB.
MAX_BLOCK_BYTES = 4000 * MIB
MAX_PUT_BLOB_BYTES = 5000 * MIB
#: Setting and retrieving properties and metadata for Blob service resources: "The total size of
#: all metadata pairs can be up to 8 KiB in size" (names and values, in bytes).
MAX_METADATA_BYTES = 8 * 1024
#: Naming and referencing containers, blobs, and metadata: a blob name is 1 to 1,024 characters,
#: of at most 254 path segments.
MAX_BLOB_NAME_CHARS = 1024
MAX_BLOB_SEGMENTS = 254

# -- Table service -------------------------------------------------------------------------------
#: Understanding the Table service data model: "An entity can have up to 255 properties, including
#: three system properties: PartitionKey, RowKey, and Timestamp"; "The combined size of all data in
#: an entity can't exceed 1 MiB"; a property value "up to 64 KiB in size" (a String holds UTF-16,
#: so 32 K characters); "PartitionKey ... up to 1 KiB in size", the same for RowKey; "Property
#: names ... up to 255 characters"; the key properties may not hold ``/ \\ # ?`` nor control
#: characters U+0000 to U+001F and U+007F to U+009F.
MAX_PROPERTIES = 255
MAX_ENTITY_BYTES = MIB
MAX_PROPERTY_VALUE_BYTES = 64 * 1024
MAX_KEY_BYTES = 1024
MAX_PROPERTY_NAME_CHARS = 255
FORBIDDEN_KEY_CHARACTERS = re.compile(r"[/\\#?\x00-\x1f\x7f-\x9f]")
#: Performing entity group transactions: "A change set can include at most 100 entities", "The
#: transaction can include at most 100 entities, and its total payload may be no more than 4 MiB
#: in size", all entities in one partition, an entity at most once in a transaction.
MAX_BATCH_OPERATIONS = 100
MAX_BATCH_BYTES = 4 * MIB
#: The size of each EDM type's value in the service's accounting of an entity's size (the
#: formula the Azure Storage team gave for the 1 MiB limit: 4 + 2 x the keys' characters, and for
#: each property 8 + 2 x its name's characters + its value's size; a String is 4 + 2 x its
#: characters, a Binary 4 + its bytes).
_EDM_BYTES = {"Edm.Boolean": 1, "Edm.DateTime": 8, "Edm.Double": 8, "Edm.Guid": 16, "Edm.Int32": 4, "Edm.Int64": 8}


@dataclass(frozen=True)
class Refusal:
    """What Azure answers a request that breaks a rule: status, error code, message, and the rule."""

    status: int
    code: str
    message: str
    rule: str


@dataclass
class _BlockState:
    #: Uncommitted block ids (decoded bytes) staged since the blob was last committed or replaced.
    uncommitted: set[bytes] = field(default_factory=set)
    #: The length of the blob's block ids: of its uncommitted blocks, or else of its committed ones.
    id_length: int | None = None
    committed_length: int | None = None


class AzureRules:
    """The rules, and what they need to remember: the blocks staged on each blob."""

    def __init__(self) -> None:
        self._blocks: dict[str, _BlockState] = {}
        self._lock = threading.Lock()
        #: How often each rule refused a request (rule name -> count), for the tests and the docs.
        self.refused: dict[str, int] = {}

    # ------------------------------------------------------------------ the proxy's two calls

    def check(self, request: Request, body: bytes | None) -> Refusal | None:
        """The refusal Azure would answer ``request`` with, or None when Azure would serve it."""
        found = self._blob_rules(request, body) if request.service == "blob" else self._table_rules(request, body)
        if found is not None:
            with self._lock:
                self.refused[found.rule] = self.refused.get(found.rule, 0) + 1
        return found

    def carried_out(self, request: Request, body: bytes | None) -> None:
        """Storage answered ``request`` with a success: remember what it changed."""
        if request.service != "blob" or not request.blob:
            if request.service == "blob" and ops.operation(request) == ops.DELETE_CONTAINER:
                self._forget(prefix=request.container + "/")
            return
        kind = ops.operation(request)
        with self._lock:
            state = self._blocks.setdefault(request.blob, _BlockState())
            if kind in (ops.PUT_BLOCK, ops.PUT_BLOCK_FROM_URL):
                block = _block_id(request)
                if block is not None:
                    state.uncommitted.add(block)
                    state.id_length = len(block)
            elif kind == ops.PUT_BLOCK_LIST:
                listed = _listed_ids(body)
                # Committing discards every uncommitted block the list does not name (Put Block List, remarks).
                state.uncommitted.clear()
                state.committed_length = len(listed[0]) if listed else None
                state.id_length = state.committed_length
            elif kind in (ops.PUT_BLOB, ops.DELETE_BLOB):
                # Put Blob replaces the blob and drops its uncommitted blocks (Put Block, remarks);
                # a deleted blob keeps none.
                self._blocks.pop(request.blob, None)

    def _forget(self, prefix: str) -> None:
        with self._lock:
            for name in [n for n in self._blocks if n.startswith(prefix)]:
                del self._blocks[name]

    # ------------------------------------------------------------------ blobs

    def _blob_rules(self, request: Request, body: bytes | None) -> Refusal | None:
        kind = ops.operation(request)
        if kind not in ops.WRITES or not request.blob:
            return None
        name = request.blob.split("/", 1)[1]
        if len(name) > MAX_BLOB_NAME_CHARS or name.count("/") + 1 > MAX_BLOB_SEGMENTS:
            return Refusal(
                400, "InvalidResourceName", "The specifed resource name contains invalid characters.", "blob-name"
            )
        if kind in (ops.PUT_BLOB, ops.PUT_BLOCK_LIST, ops.SET_BLOB_METADATA):
            size = sum(
                len(k[len("x-ms-meta-") :].encode()) + len(v.encode())
                for k, v in request.headers.items()
                if k.startswith("x-ms-meta-")
            )
            if size > MAX_METADATA_BYTES:
                return Refusal(
                    400,
                    "MetadataTooLarge",
                    "The size of the specified metadata exceeds the maximum size permitted.",
                    "metadata-8kib",
                )
        length = int(request.headers.get("content-length") or 0)
        if kind == ops.PUT_BLOB and length > MAX_PUT_BLOB_BYTES or kind == ops.PUT_BLOCK and length > MAX_BLOCK_BYTES:
            return Refusal(
                413,
                "RequestBodyTooLarge",
                "The request body is too large and exceeds the maximum permissible limit.",
                "body-size",
            )
        if kind in (ops.PUT_BLOCK, ops.PUT_BLOCK_FROM_URL):
            return self._staging_rules(request)
        if kind == ops.PUT_BLOCK_LIST:
            return self._block_list_rules(request, body)
        return None

    def _staging_rules(self, request: Request) -> Refusal | None:
        block = _block_id(request)
        if block is None or len(block) > MAX_BLOCK_ID_BYTES:
            return Refusal(
                400,
                "InvalidQueryParameterValue",
                "Value for one of the query parameters specified in the request URI is invalid.",
                "block-id-form",
            )
        with self._lock:
            state = self._blocks.get(request.blob)
            if state is None:
                return None
            if state.id_length is not None and len(block) != state.id_length:
                return Refusal(
                    400, "InvalidBlobOrBlock", "The specified blob or block content is invalid.", "block-id-length"
                )
            if block not in state.uncommitted and len(state.uncommitted) >= MAX_UNCOMMITTED_BLOCKS:
                return Refusal(
                    409,
                    "BlockCountExceedsLimit",
                    "The uncommitted block count cannot exceed the maximum limit of 100,000 blocks.",
                    "uncommitted-100000",
                )
        return None

    def _block_list_rules(self, request: Request, body: bytes | None) -> Refusal | None:
        listed = _listed_ids(body)
        if len(listed) > MAX_COMMITTED_BLOCKS:
            return Refusal(
                400, "BlockListTooLong", "The block list may not contain more than 50,000 blocks.", "committed-50000"
            )
        if len({len(block) for block in listed}) > 1:
            return Refusal(400, "InvalidBlockList", "The specified block list is invalid.", "block-id-length")
        return None

    # ------------------------------------------------------------------ tables

    def _table_rules(self, request: Request, body: bytes | None) -> Refusal | None:
        kind = ops.operation(request)
        if kind == ops.ENTITY_GROUP_TRANSACTION:
            return self._batch_rules(request, body or b"")
        if kind in (
            ops.INSERT_ENTITY,
            ops.UPDATE_ENTITY,
            ops.MERGE_ENTITY,
            ops.INSERT_OR_REPLACE_ENTITY,
            ops.INSERT_OR_MERGE_ENTITY,
        ):
            return _entity_rules(_entity_of(request.resource, body))
        if kind == ops.DELETE_ENTITY:
            return _key_rules(_keys_of(request.resource))
        return None

    def _batch_rules(self, request: Request, body: bytes) -> Refusal | None:
        if len(body) > MAX_BATCH_BYTES:
            return Refusal(
                413,
                "RequestBodyTooLarge",
                "The request body is too large and exceeds the maximum permissible limit.",
                "batch-4mib",
            )
        entities = list(_batch_entities(body, request.headers.get("content-type", "")))
        if len(entities) > MAX_BATCH_OPERATIONS:
            return Refusal(
                400,
                "InvalidInput",
                "The batch request operation exceeds the maximum 100 changes per change set.",
                "batch-100",
            )
        if len({entity.get("PartitionKey") for entity in entities}) > 1:
            return Refusal(
                400,
                "CommandsInBatchActOnDifferentPartitions",
                "All commands in a batch must operate on same entity group.",
                "batch-one-partition",
            )
        seen = set()
        for entity in entities:
            key = (entity.get("PartitionKey"), entity.get("RowKey"))
            if key in seen:
                return Refusal(
                    400,
                    "InvalidDuplicateRow",
                    "The batch request contains multiple changes with same row key.",
                    "batch-row-once",
                )
            seen.add(key)
            found = _entity_rules(entity)
            if found is not None:
                return found
        return None


# ---------------------------------------------------------------------- parsing


def _block_id(request: Request) -> bytes | None:
    try:
        return base64.b64decode(request.query.get("blockid", ""), validate=True) or None
    except (binascii.Error, ValueError):
        return None


def _listed_ids(body: bytes | None) -> list[bytes]:
    if not body:
        return []
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return []
    ids = []
    for element in root:
        try:
            ids.append(base64.b64decode(element.text or "", validate=True))
        except (binascii.Error, ValueError):
            ids.append((element.text or "").encode())
    return ids


_KEYS = re.compile(r"PartitionKey='(?P<p>(?:[^']|'')*)',\s*RowKey='(?P<r>(?:[^']|'')*)'")


def _keys_of(resource: str) -> dict:
    match = _KEYS.search(resource)
    if not match:
        return {}
    return {"PartitionKey": match["p"].replace("''", "'"), "RowKey": match["r"].replace("''", "'")}


def _entity_of(resource: str, body: bytes | None) -> dict:
    try:
        entity = json.loads(body) if body else {}
    except ValueError:
        entity = {}
    return {**(entity if isinstance(entity, dict) else {}), **_keys_of(resource)}


def _batch_entities(body: bytes, content_type: str) -> Iterator[dict]:
    """The entity (keys and properties) of each operation of a multipart entity group transaction."""
    text = body.decode("utf-8", "replace")
    for part in re.split(r"\r?\n--[^\r\n]+", text):
        request_line = re.search(r"^(POST|PUT|MERGE|PATCH|DELETE) (\S+) HTTP/1\.1", part, re.M)
        if not request_line:
            continue
        payload = part.split("\r\n\r\n")[-1] if "\r\n\r\n" in part else ""
        start = payload.find("{")
        entity_body = payload[start:].encode() if start >= 0 else None
        yield _entity_of(request_line[2].rsplit("/", 1)[-1], entity_body)


def _key_rules(entity: dict) -> Refusal | None:
    for key in ("PartitionKey", "RowKey"):
        value = entity.get(key)
        if not isinstance(value, str):
            continue
        if len(value.encode("utf-16-le")) > MAX_KEY_BYTES:
            # Azure answers a key over its limit as any property value too large (seen on the service).
            return Refusal(400, "PropertyValueTooLarge", f"The {key} value is larger than 1 KiB.", "key-1kib")
        if FORBIDDEN_KEY_CHARACTERS.search(value):
            return Refusal(400, "OutOfRangeInput", "One of the request inputs is out of range.", "key-characters")
    return None


def _entity_rules(entity: dict) -> Refusal | None:
    found = _key_rules(entity)
    if found is not None:
        return found
    keys = ("PartitionKey", "RowKey")
    properties = {
        k: v for k, v in entity.items() if k not in keys and not k.startswith("odata.") and "@odata." not in k
    }
    if len(properties) + len(keys) + 1 > MAX_PROPERTIES:  # + Timestamp
        return Refusal(400, "TooManyProperties", "The entity contains more properties than allowed.", "properties-255")
    size = 4 + sum(2 * len(str(entity.get(key, ""))) for key in keys)
    for name, value in properties.items():
        if len(name) > MAX_PROPERTY_NAME_CHARS:
            return Refusal(
                400, "PropertyNameTooLong", "The property name exceeds the maximum allowed length.", "property-name"
            )
        edm_type = entity.get(f"{name}@odata.type")
        value_bytes = _value_bytes(value, edm_type)
        if value_bytes > MAX_PROPERTY_VALUE_BYTES:
            return Refusal(
                400,
                "PropertyValueTooLarge",
                "The property value exceeds the maximum allowed size (64KB).",
                "property-64kib",
            )
        # A String or Binary value is counted with 4 bytes of length besides its own.
        size += 8 + 2 * len(name) + value_bytes + (4 if isinstance(value, str) and edm_type not in _EDM_BYTES else 0)
    if size > MAX_ENTITY_BYTES:
        return Refusal(
            400, "EntityTooLarge", "The entity is larger than the maximum allowed size (1MB).", "entity-1mib"
        )
    return None


def _value_bytes(value, edm_type: str | None) -> int:
    """A property value's bytes as the service counts them against the 64 KiB and 1 MiB limits."""
    if edm_type == "Edm.Binary" and isinstance(value, str):
        try:
            return len(base64.b64decode(value))
        except (binascii.Error, ValueError):
            return len(value)
    if edm_type in _EDM_BYTES:
        return _EDM_BYTES[edm_type]
    if isinstance(value, str):
        return len(value.encode("utf-16-le"))
    if isinstance(value, bool):
        return 1
    if isinstance(value, int):
        return 4 if -(2**31) <= value < 2**31 else 8
    if isinstance(value, float):
        return 8
    return 0
