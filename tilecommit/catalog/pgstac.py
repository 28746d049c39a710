"""Publication of a finished job's STAC item to pgstac, once, through the one create-once protocol.

The item published is the job's committed STAC item blob, read back at the version stored (the
blob is never changed): the copy loaded gets the job's collection and absolute asset hrefs (the
blob's are relative to the blob). Each write is create-only, the database's unique key its
condition, and goes through :func:`tilecommit.conditional.create_once`:

- the collection: pgstac's ``create_collection`` (an ``INSERT`` into ``pgstac.collections``,
  whose ``id`` is unique); a unique violation is ``already-present``: someone created it.
- the item: pgstac's ``create_item`` (an ``INSERT`` into ``items_staging``, whose trigger
  ``items_staging_triggerfunc`` makes the collection's partition and inserts into it; each
  partition has a unique index on ``id``), and in the same transaction our write id in the
  row's ``private`` column, which pgstac keeps and never serves. A unique violation is
  ``already-present``: the stored item, read back (``content_hydrate`` of the row, what
  ``pgstac.get_item`` serves), is compared with ours without the run's facts
  (:func:`~tilecommit.raster.assembly.stac.without_run_facts`): another item under the job's id
  is known bad (:class:`~tilecommit.errors.CatalogCheckError`).
- a connection lost during or after the ``COMMIT`` leaves the outcome unknown: it is read back,
  never inserted blindly; our write id stored is ``written``, nothing stored means the same
  create-only insert again.

Then the collection's extent is kept current, whatever the outcome: the item's bbox and time
added to it in one UPDATE of the collection's row (:data:`EXTENT_SQL`), so it is the union of its
items' and never shrinks. pgstac's own ``update_collection_extents`` recomputes every collection
from its partition statistics, whose refresh alters the partitions' constraints: run by 32
publications at once it deadlocked with their inserts (pgstac's trigger checks the partition
under the same locks), so the union is kept here instead, touching the collection's row alone.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

import psycopg
from azure.storage.blob import ContainerClient

from .. import conditional, gates, jobs
from ..conditional import Outcome, Stored
from ..errors import CatalogCheckError, StorageFaultError
from ..raster.assembly.checks import blob_properties
from ..raster.assembly.stac import without_run_facts
from ..records import Record
from ..settings import Settings
from ..storage_answers import storage_fault
from . import naming
from .database import connect, database_fault, retryable
from .published import NOT_CONFIGURED, PUBLISHED

logger = logging.getLogger(__name__)

#: The collection of a job whose payload names none (one started before collections existed).
DEFAULT_COLLECTION = naming.DEFAULT_COLLECTION
GATE_ITEM, GATE_COLLECTION = "pgstac-item", "pgstac-collection"
#: Where the write id of the request that created an item is kept: a key of its row's ``private``.
WRITE_ID_KEY = "tilecommit:write_id"

#: Taken first in each item insert's transaction and held to its end: our inserts into one
#: collection go one at a time. pgstac's trigger widens the partition's constraints under locks
#: it takes in an order of its own, so two inserts at once deadlock or one violates the range the
#: other just set (pgstac's issue 222); serialised, each sees the other's change. Held by the
#: transaction, it is released by the COMMIT, the ROLLBACK, or the connection's end, whichever
#: comes first. It needs no grant: EXECUTE on it is PUBLIC's, as on most built-in functions.
ITEM_LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
ITEM_SQL = "SELECT content_hydrate(i), i.private ->> %s FROM items i WHERE i.id = %s AND i.collection = %s"
#: The collection's extent made the union of what it was and one item's: its bbox corner by corner
#: and its interval end by end (``least``/``greatest`` skip a null: an open end takes the item's).
#: An UPDATE that waited for the row's lock evaluates its SET on the row as the other committed it
#: (READ COMMITTED's re-check of an updated row), so no item's addition is lost.
EXTENT_SQL = """UPDATE collections SET content = jsonb_set(content, '{extent}', jsonb_build_object(
  'spatial', jsonb_build_object('bbox', jsonb_build_array(jsonb_build_array(
    least((content #>> '{extent,spatial,bbox,0,0}')::float8, %(west)s),
    least((content #>> '{extent,spatial,bbox,0,1}')::float8, %(south)s),
    greatest((content #>> '{extent,spatial,bbox,0,2}')::float8, %(east)s),
    greatest((content #>> '{extent,spatial,bbox,0,3}')::float8, %(north)s)))),
  'temporal', jsonb_build_object('interval', jsonb_build_array(jsonb_build_array(
    least((content #>> '{extent,temporal,interval,0,0}')::timestamptz, %(start)s::timestamptz),
    greatest((content #>> '{extent,temporal,interval,0,1}')::timestamptz, %(end)s::timestamptz))))))
WHERE id = %(collection)s"""


@dataclass(frozen=True)
class Publication(Record):
    """Where a job's item is found: ``state`` :data:`PUBLISHED` (``outcome`` says whether this
    call wrote it) or :data:`NOT_CONFIGURED`; ``url`` the catalog link."""

    state: str
    collection: str
    item_id: str
    url: str
    outcome: str | None = None


def catalog_link(settings: Settings, collection: str, item_id: str, item_blob_url: str) -> str:
    """The item's link: the STAC API's item URL, or its blob's when there is no STAC API."""
    if settings.stac_api_url and settings.publishes:
        return f"{settings.stac_api_url}/collections/{collection}/items/{item_id}"
    return item_blob_url


def catalog_item(body: bytes, collection: str, item_url: str) -> dict:
    """The item as pgstac stores it: the blob's, in ``collection``, hrefs absolute."""
    item = json.loads(body)
    item["collection"] = collection
    for asset in item.get("assets", {}).values():
        asset["href"] = urljoin(item_url, asset["href"])
    item["links"] = [link for link in item.get("links", []) if link.get("rel") not in ("self", "parent", "root")]
    return item


def _numbers_as_floats(value: Any) -> Any:
    """PostGIS writes 1.0 as 1: numbers are compared as floats."""
    if isinstance(value, dict):
        return {k: _numbers_as_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers_as_floats(v) for v in value]
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def item_digest(item: dict) -> str:
    """What two copies of one item share: sha256 of the item without the run's facts."""
    return gates.sha256_hex(without_run_facts(json.dumps(_numbers_as_floats(item)).encode()))


def collection_document(collection: str, item: dict) -> dict:
    """A STAC Collection for ``collection``, its extent first that of ``item`` (kept current after)."""
    moment = item["properties"].get("datetime") or item["properties"].get("start_datetime")
    return {
        "type": "Collection",
        "stac_version": item.get("stac_version", "1.1.0"),
        "id": collection,
        "description": f"Mosaics published by tilecommit into the collection {collection}.",
        "license": "other",
        "extent": {
            "spatial": {"bbox": [item.get("bbox") or [-180.0, -90.0, 180.0, 90.0]]},
            "temporal": {"interval": [[moment, moment]]},
        },
        "links": [],
    }


class Session:
    """One connection, opened when first needed and again after it broke."""

    def __init__(self, settings: Settings, credential: Any = None):
        self.settings, self.credential = settings, credential
        self._conn: psycopg.Connection | None = None

    def conn(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self.close()
            self._conn = connect(self.settings, self.credential)
        return self._conn

    def transaction(self, statements: list[tuple[str, Any]]) -> None:
        """Run ``statements`` in one transaction and commit; raises what psycopg raises."""
        conn = self.conn()
        try:
            with conn.cursor() as cur:
                for sql, params in statements:
                    cur.execute(sql, params)
            conn.commit()
        except BaseException:
            self._rollback()
            raise

    def _rollback(self) -> None:
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            try:
                self._conn.rollback()
            except psycopg.Error:
                self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None


class _Gate:
    """What :class:`conditional.Backend` reads of a pgstac create; subclasses send and read."""

    key: str
    write_id: str | None = None
    table: str = ""

    def __init__(self, session: Session):
        self.session = session

    def refused(self, exc: BaseException) -> bool:
        table = getattr(getattr(exc, "diag", None), "table_name", None) or ""
        return isinstance(exc, psycopg.errors.UniqueViolation) and table.startswith(self.table)

    def unanswered(self, exc: BaseException) -> bool:
        # A busy answer (a deadlock, a serialization failure) rolled the transaction back: what is
        # stored is read, finds nothing of ours, and the same insert goes again.
        return retryable(exc)

    def status(self, exc: BaseException) -> int | None:
        return None

    def fault(self, exc: BaseException) -> StorageFaultError:
        return database_fault(f"creating {self.key!r} in pgstac", exc)

    def _read(self, sql: str, params: tuple) -> tuple | None:
        try:
            conn = self.session.conn()
            row = conn.execute(sql, params).fetchone()
            conn.rollback()
            return row
        except psycopg.Error as exc:
            self.session.close()
            raise database_fault(f"reading {self.key!r} from pgstac", exc) from exc


class CollectionGate(_Gate):
    table = "collections"

    def __init__(self, session: Session, document: dict):
        super().__init__(session)
        self.document, self.key = document, f"collections/{document['id']}"

    def send(self) -> None:
        self.session.transaction([("SELECT create_collection(%s)", (json.dumps(self.document),))])

    def stored(self) -> Stored:
        row = self._read("SELECT 1 FROM collections WHERE id = %s", (self.document["id"],))
        return Stored(row is not None)


class ItemGate(_Gate):
    table = "_items_"

    def __init__(self, session: Session, item: dict):
        super().__init__(session)
        self.item, self.key = item, f"collections/{item['collection']}/items/{item['id']}"
        self.write_id = conditional.new_write_id()
        self.held: dict | None = None

    def send(self) -> None:
        mark = json.dumps({WRITE_ID_KEY: self.write_id})
        identity = (self.item["id"], self.item["collection"])
        self.session.transaction(
            [
                (ITEM_LOCK_SQL, (f"tilecommit:pgstac-item:{self.item['collection']}",)),
                ("SELECT create_item(%s)", (json.dumps(self.item),)),
                ("UPDATE items SET private = %s WHERE id = %s AND collection = %s", (mark, *identity)),
            ],
        )

    def stored(self) -> Stored:
        row = self._read(ITEM_SQL, (WRITE_ID_KEY, self.item["id"], self.item["collection"]))
        if row is None:
            return conditional.ABSENT
        self.held = row[0]
        return Stored(True, digest=item_digest(row[0]), write_id=row[1])


def publish_item(
    job_id: str, output: ContainerClient, settings: Settings, *, collection: str, credential: Any = None
) -> Publication:
    """Publish job ``job_id``'s committed STAC item into ``collection`` (see the module)."""
    name = jobs.stac_blob_name(job_id)
    blob = output.get_blob_client(name)
    if not settings.publishes:
        return Publication(NOT_CONFIGURED, collection, job_id, catalog_link(settings, collection, job_id, blob.url))
    props = blob_properties(output, name)
    if props is None:
        raise CatalogCheckError(f"{name} does not exist: job {job_id} has no STAC item to publish")
    item = catalog_item(gates.content_bytes(blob, props.etag), collection, blob.url)
    if item.get("geometry") is None:
        raise CatalogCheckError(
            f"{name} has no geometry ({item['properties'].get('tilecommit:footprint')}): pgstac needs one"
        )
    session = Session(settings, credential)
    try:
        conditional.create_once(
            CollectionGate(session, collection_document(collection, item)),
            digest=None,
            gate=GATE_COLLECTION,
            job_id=job_id,
        )
        gate = ItemGate(session, item)
        ours = item_digest(item)
        outcome = conditional.create_once(gate, digest=ours, gate=GATE_ITEM, job_id=job_id)
        held = gate.held
        if outcome is Outcome.ALREADY_PRESENT and held is None:
            # Refused as present, then not found: deleted meanwhile. The retry publishes it again.
            raise storage_fault(f"{gate.key} was refused as present, then not found in pgstac", retryable=True)
        if outcome is Outcome.ALREADY_PRESENT and held is not None and item_digest(held) != ours:
            raise CatalogCheckError(
                f"pgstac holds an item at {gate.key} that is not job {job_id}'s committed {name}: delete it "
                f"(SELECT pgstac.delete_item('{job_id}', '{collection}')) and publish again by retrying the job"
            )
        _refresh_extent(session, item)
    finally:
        session.close()
    logger.info("job %s: item %s in pgstac collection %s: %s", job_id, job_id, collection, outcome)
    return Publication(
        PUBLISHED, collection, job_id, catalog_link(settings, collection, job_id, blob.url), str(outcome)
    )


def _refresh_extent(session: Session, item: dict) -> None:
    """Add ``item``'s bbox and time to its collection's extent; a busy answer is tried again, as
    the create-only protocol resends a busy insert."""
    props = item["properties"]
    west, south, east, north = item["bbox"][0], item["bbox"][1], item["bbox"][-2], item["bbox"][-1]
    start = props.get("start_datetime") or props.get("datetime")
    params = {
        "collection": item["collection"],
        **{"west": west, "south": south, "east": east, "north": north},
        **{"start": start, "end": props.get("end_datetime") or start},
    }
    for attempt in range(conditional.UNKNOWN_OUTCOME_ATTEMPTS):
        try:
            session.transaction([(EXTENT_SQL, params)])
            return
        except psycopg.Error as exc:
            session.close()
            if not retryable(exc) or attempt == conditional.UNKNOWN_OUTCOME_ATTEMPTS - 1:
                raise database_fault(f"updating the extent of pgstac collection {item['collection']!r}", exc) from exc
            logger.warning("updating the extent of pgstac collection %r: %s; trying again", item["collection"], exc)
            time.sleep(conditional.RESEND_DELAY_S * 2**attempt)


def stored_item(settings: Settings, collection: str, item_id: str, credential: Any = None) -> dict | None:
    """The item pgstac serves as ``item_id`` in ``collection`` (None: none), as ``get_item`` gives it."""
    session = Session(settings, credential)
    try:
        row = session.conn().execute("SELECT get_item(%s, %s)", (item_id, collection)).fetchone()
    except psycopg.Error as exc:
        raise database_fault(f"reading item {item_id!r} from pgstac", exc) from exc
    finally:
        session.close()
    return row[0] if row else None
