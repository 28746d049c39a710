"""Which Azure Storage REST operation an HTTP request is, read from its method, path, query and
headers, as the service itself tells them apart (the operation names are the REST reference's).

The strict-storage harness (:mod:`testkit.storage_proxy`) enforces rules and injects faults per
operation, so "every Put Block From URL" or "every Insert Entity" means what the service means by
it, whatever SDK or host sent the request. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

# Blob service operations the app and the local host send.
PUT_BLOB = "Put Blob"
PUT_BLOCK = "Put Block"
PUT_BLOCK_FROM_URL = "Put Block From URL"
PUT_BLOCK_LIST = "Put Block List"
GET_BLOB = "Get Blob"
GET_BLOB_PROPERTIES = "Get Blob Properties"
GET_BLOCK_LIST = "Get Block List"
DELETE_BLOB = "Delete Blob"
SET_BLOB_METADATA = "Set Blob Metadata"
LIST_BLOBS = "List Blobs"
CREATE_CONTAINER = "Create Container"
DELETE_CONTAINER = "Delete Container"
# Table service operations.
INSERT_ENTITY = "Insert Entity"
UPDATE_ENTITY = "Update Entity"
MERGE_ENTITY = "Merge Entity"
INSERT_OR_REPLACE_ENTITY = "Insert Or Replace Entity"
INSERT_OR_MERGE_ENTITY = "Insert Or Merge Entity"
DELETE_ENTITY = "Delete Entity"
QUERY_ENTITIES = "Query Entities"
ENTITY_GROUP_TRANSACTION = "Entity Group Transaction"
CREATE_TABLE = "Create Table"
DELETE_TABLE = "Delete Table"
QUERY_TABLES = "Query Tables"
OTHER = "other"

#: Every kind of write the app makes to its data (the ones the fault runs break, each in turn).
APP_WRITES = (
    PUT_BLOB,
    PUT_BLOCK,
    PUT_BLOCK_FROM_URL,
    PUT_BLOCK_LIST,
    INSERT_ENTITY,
    UPDATE_ENTITY,
    DELETE_ENTITY,
    ENTITY_GROUP_TRANSACTION,
)
#: Operations that change what is stored (an answer lost after one of these was carried out
#: leaves its outcome unknown to the sender).
WRITES = frozenset(
    {
        PUT_BLOB,
        PUT_BLOCK,
        PUT_BLOCK_FROM_URL,
        PUT_BLOCK_LIST,
        DELETE_BLOB,
        SET_BLOB_METADATA,
        CREATE_CONTAINER,
        DELETE_CONTAINER,
        INSERT_ENTITY,
        UPDATE_ENTITY,
        MERGE_ENTITY,
        INSERT_OR_REPLACE_ENTITY,
        INSERT_OR_MERGE_ENTITY,
        DELETE_ENTITY,
        ENTITY_GROUP_TRANSACTION,
        CREATE_TABLE,
        DELETE_TABLE,
    }
)


@dataclass(frozen=True)
class Request:
    """One request as the service reads it: ``resource`` is the path after the account (a
    container and blob, ``table(PartitionKey='p',RowKey='r')``, ``$batch``...), unquoted."""

    service: str  # "blob" or "table"
    method: str
    resource: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names

    @property
    def container(self) -> str:
        return self.resource.split("/", 1)[0]

    @property
    def blob(self) -> str:
        """``container/blob``, the blob a blob request addresses ("" for a container or account)."""
        return self.resource if "/" in self.resource else ""

    @property
    def table(self) -> str:
        """The table a table request addresses (``Tables`` for the table of tables)."""
        return self.resource.split("(", 1)[0]


def parse(service: str, method: str, target: str, headers: dict[str, str]) -> Request:
    """The :class:`Request` of an HTTP request to ``service`` (``target``: the request line's
    path and query, the account first, as the SDKs send it to an emulator or a proxy)."""
    parts = urlsplit(target)
    segments = parts.path.lstrip("/").split("/", 1)
    resource = unquote(segments[1]) if len(segments) > 1 else ""
    query = {key: values[-1] for key, values in parse_qs(parts.query, keep_blank_values=True).items()}
    return Request(service, method.upper(), resource, query, {k.lower(): v for k, v in headers.items()})


def operation(request: Request) -> str:
    """The REST operation ``request`` is (one of this module's names, or :data:`OTHER`)."""
    return _blob_operation(request) if request.service == "blob" else _table_operation(request)


def _blob_operation(request: Request) -> str:
    comp, restype, method = request.query.get("comp"), request.query.get("restype"), request.method
    if restype == "container":
        return {"PUT": CREATE_CONTAINER, "DELETE": DELETE_CONTAINER}.get(
            method, LIST_BLOBS if comp == "list" else OTHER
        )
    if not request.blob:
        return OTHER
    if method == "PUT":
        if comp == "block":
            return PUT_BLOCK_FROM_URL if "x-ms-copy-source" in request.headers else PUT_BLOCK
        if comp == "blocklist":
            return PUT_BLOCK_LIST
        if comp == "metadata":
            return SET_BLOB_METADATA
        return PUT_BLOB if comp is None else OTHER
    if method == "GET":
        return GET_BLOCK_LIST if comp == "blocklist" else (GET_BLOB if comp is None else OTHER)
    if method == "HEAD":
        return GET_BLOB_PROPERTIES if comp is None else OTHER
    if method == "DELETE":
        return DELETE_BLOB
    return OTHER


def _table_operation(request: Request) -> str:
    method, resource = request.method, request.resource
    if resource == "$batch":
        return ENTITY_GROUP_TRANSACTION if method == "POST" else OTHER
    if resource.startswith("Tables"):
        return {"POST": CREATE_TABLE, "DELETE": DELETE_TABLE, "GET": QUERY_TABLES}.get(method, OTHER)
    keyed = "(" in resource and not resource.endswith("()")
    conditional = "if-match" in request.headers
    if method == "POST" and not keyed:
        return INSERT_ENTITY
    if method == "GET":
        return QUERY_ENTITIES
    if not keyed:
        return OTHER
    if method == "PUT":
        return UPDATE_ENTITY if conditional else INSERT_OR_REPLACE_ENTITY
    if method in ("MERGE", "PATCH"):
        return MERGE_ENTITY if conditional else INSERT_OR_MERGE_ENTITY
    if method == "DELETE":
        return DELETE_ENTITY
    return OTHER
