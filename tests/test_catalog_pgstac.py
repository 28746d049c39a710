"""Publication to pgstac against a real PostgreSQL with PostGIS and pgstac (the ``pgstac`` fixture),
of a real job's committed STAC item (made by the job's own steps on a small scene in Azurite).

Each test publishes into a collection of its own. Items of further jobs are the real item under
another job id (its ``id`` changed, written where that job's item is): what publication reads
of an item is its blob, whatever job made it.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from datetime import datetime, timedelta

import psycopg
import pytest

from testkit.postgres_cut import AFTER, BEFORE, HOLD, CommitCutProxy
from testkit.scenes import SceneSpec, write_scene
from testkit.stac_api import StacApi
from tilecommit import jobs
from tilecommit.catalog import pgstac as catalog
from tilecommit.catalog.published import publication_of
from tilecommit.errors import CatalogCheckError, ConfigurationError, StorageFaultError, is_retryable, kind_of
from tilecommit.settings import PGSTAC_AUTH_TRUST, Settings

from .conftest import counter_total
from .raster_jobs import JOB, run_steps


@pytest.fixture(scope="module")
def job_output(storage, tmp_path_factory):
    """An output container holding a real job's committed mosaic and STAC item (job :data:`JOB`)."""
    blobs, tables = storage.blob_service(), storage.table_service()
    names = {kind: f"pgstac{kind}{int(time.time() * 1000) % 10**9}" for kind in ("tiles", "output", "manifest")}
    stores = {
        "tiles": blobs.create_container(names["tiles"]),
        "output": blobs.create_container(names["output"]),
        "manifest": tables.create_table(names["manifest"]),
    }
    path = write_scene(str(tmp_path_factory.mktemp("pgstac") / "scene.tif"), SceneSpec(512, 512, 3, "uint16"))
    run_steps(path, Settings(window_size=256), stores, storage)
    yield stores["output"]
    for kind in ("tiles", "output"):
        stores[kind].delete_container()
    stores["manifest"].delete_table()


def settings_for(pgstac, port: int | None = None, **extra) -> Settings:
    return Settings(
        pgstac_host="127.0.0.1",
        pgstac_port=port or pgstac.port,
        pgstac_user="postgres",
        pgstac_auth=PGSTAC_AUTH_TRUST,
        **extra,
    )


def item_of(output, job_id: str) -> dict:
    return json.loads(output.get_blob_client(jobs.stac_blob_name(job_id)).download_blob().readall())


def shifted(value, dx: float):
    """Coordinates (nested lists of [x, y]) moved east by ``dx``."""
    if isinstance(value[0], list):
        return [shifted(v, dx) for v in value]
    return [value[0] + dx, *value[1:]]


def place_item(output, job_id: str, east: float = 0.0, **properties) -> None:
    """Job ``job_id``'s item: the real one under that id, moved ``east`` (degrees), ``properties`` changed."""
    item = item_of(output, JOB)
    item["id"] = job_id
    item["properties"].update(properties)
    item["geometry"]["coordinates"] = shifted(item["geometry"]["coordinates"], east)
    west, south, east_edge, north = item["bbox"]
    item["bbox"] = [west + east, south, east_edge + east, north]
    blob = output.get_blob_client(jobs.stac_blob_name(job_id))
    blob.upload_blob(json.dumps(item, sort_keys=True, indent=2).encode(), overwrite=True)


def rows(pgstac, collection: str) -> Counter:
    with psycopg.connect(pgstac.dsn()) as conn:
        found = conn.execute("SELECT id FROM pgstac.items WHERE collection = %s", (collection,)).fetchall()
    return Counter(row[0] for row in found)


def collection_of(pgstac, collection: str) -> dict | None:
    with psycopg.connect(pgstac.dsn()) as conn:
        return conn.execute("SELECT pgstac.get_collection(%s)", (collection,)).fetchone()[0]


def publish(output, settings, collection: str, job_id: str = JOB) -> catalog.Publication:
    return catalog.publish_item(job_id, output, settings, collection=collection)


def test_an_item_is_created_once_with_its_collection_and_served_as_the_blob_says(pgstac, job_output):
    settings = settings_for(pgstac, stac_api_url="http://127.0.0.1:8081")
    published = publish(job_output, settings, "created-once")
    assert (published.state, published.outcome) == (catalog.PUBLISHED, "written")
    assert published.url == f"http://127.0.0.1:8081/collections/created-once/items/{JOB}"
    assert rows(pgstac, "created-once") == Counter({JOB: 1})
    served = catalog.stored_item(settings, "created-once", JOB)
    blob_item = item_of(job_output, JOB)
    assert served["collection"] == "created-once"
    assert served["properties"] == blob_item["properties"]
    assert served["bbox"] == blob_item["bbox"]
    mosaic_url = job_output.get_blob_client(jobs.mosaic_blob_name(JOB)).url
    assert {a["href"] for a in served["assets"].values()} >= {mosaic_url}
    assert catalog.item_digest(served) == catalog.item_digest(
        catalog.catalog_item(
            json.dumps(blob_item).encode(), "created-once", job_output.get_blob_client(jobs.stac_blob_name(JOB)).url
        )
    )
    # The collection was created with it, its extent that of its one item.
    extent = collection_of(pgstac, "created-once")["extent"]
    assert extent["spatial"]["bbox"][0] == pytest.approx(blob_item["bbox"])


def test_an_item_delivered_twice_is_already_present(pgstac, job_output):
    settings = settings_for(pgstac)
    first = publish(job_output, settings, "twice")
    second = publish(job_output, settings, "twice")
    assert (first.outcome, second.outcome) == ("written", "already-present")
    assert second.url == first.url == job_output.get_blob_client(jobs.stac_blob_name(JOB)).url
    assert rows(pgstac, "twice") == Counter({JOB: 1})


def test_a_different_item_stored_under_the_id_is_known_bad(pgstac, job_output):
    settings = settings_for(pgstac)
    other = "0000000000000bad"
    place_item(job_output, other)
    publish(job_output, settings, "known-bad", other)
    place_item(job_output, other, title="another scene")  # the blob now says otherwise
    with pytest.raises(CatalogCheckError, match="is not job 0000000000000bad") as caught:
        publish(job_output, settings, "known-bad", other)
    assert not is_retryable(caught.value) and kind_of(caught.value) == "check"
    assert rows(pgstac, "known-bad") == Counter({other: 1})


def test_without_a_database_configured_nothing_is_published_and_the_link_is_the_blob(job_output):
    published = publish(job_output, Settings(), "unconfigured")
    assert published.state == catalog.NOT_CONFIGURED and published.outcome is None
    assert published.url == job_output.get_blob_client(jobs.stac_blob_name(JOB)).url


@pytest.mark.parametrize("cut", [AFTER, BEFORE])
def test_a_connection_lost_at_the_commit_is_resolved_by_reading_the_item_back(pgstac, job_output, cut):
    collection, job_id = f"cut-{cut}", f"000000000000c{'0a' if cut == AFTER else '0b'}1"
    place_item(job_output, job_id)
    with CommitCutProxy(pgstac.port) as proxy:
        settings = settings_for(pgstac, proxy.port)
        publish(job_output, settings, collection)  # the collection exists: the next COMMIT is the item's
        resolved = counter_total("ConditionalWriteUnknownOutcomeResolved")
        proxy.cut_next_commit(cut)
        published = publish(job_output, settings, collection, job_id)
        assert proxy.cuts == [cut]
    assert published.outcome == "written"
    assert rows(pgstac, collection) == Counter({JOB: 1, job_id: 1})
    # Cut after the COMMIT, the item was there and ours: an unknown outcome resolved; cut before,
    # nothing was there and the same create-only insert went again.
    assert counter_total("ConditionalWriteUnknownOutcomeResolved") - resolved == (1 if cut == AFTER else 0)


def test_a_database_down_is_a_retryable_fault_and_costs_nothing_once_it_is_back(pgstac, job_output):
    settings = settings_for(pgstac)
    pgstac.stop_server()
    try:
        with pytest.raises(StorageFaultError) as caught:
            publish(job_output, settings, "outage")
        assert is_retryable(caught.value)
    finally:
        pgstac.start_server()
    assert publish(job_output, settings, "outage").outcome == "written"
    assert rows(pgstac, "outage") == Counter({JOB: 1})


def deliver_until_not_busy(output, settings, collection: str, job_id: str, outcomes, errors, redelivered) -> None:
    """One job's publication as Durable makes it: a retryable failure (a busy answer, the same
    insert busy three times over) fails the activity and Durable runs it again, here at once, at
    most three times, each recorded in ``redelivered``; anything else lands in ``errors``."""
    for _ in range(3):
        try:
            outcomes[publish(output, settings, collection, job_id).outcome] += 1
            return
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            if not is_retryable(exc):
                errors.append(exc)
                return
            redelivered.append(f"{job_id}: {exc}")
    errors.append(AssertionError(f"{job_id}: three deliveries failed"))


def lock_waits(pgstac) -> Counter:
    """What the database's sessions wait for, by kind of lock (``advisory``, ``relation``, ...)."""
    with psycopg.connect(pgstac.dsn()) as conn:
        sql = "SELECT wait_event FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        return Counter(row[0] for row in conn.execute(sql).fetchall())


def test_32_publications_at_once_each_delivered_twice_make_32_items(pgstac, job_output):
    settings = settings_for(pgstac)
    ids = [f"{n:016x}" for n in range(0x3200, 0x3220)]
    base = datetime.fromisoformat(item_of(job_output, JOB)["properties"]["datetime"].replace("Z", "+00:00"))
    moments = [(base + timedelta(days=40 * n)).isoformat().replace("+00:00", "Z") for n in range(len(ids))]
    for n, job_id in enumerate(ids):
        # Each its own place and month: pgstac's partition constraints are widened by each insert.
        place_item(job_output, job_id, east=0.01 * n, datetime=moments[n])
    outcomes: Counter = Counter()
    errors: list[BaseException] = []
    start = threading.Barrier(2 * len(ids))

    redelivered: list[str] = []

    def deliver(job_id: str) -> None:
        start.wait()
        deliver_until_not_busy(job_output, settings, "thirty-two", job_id, outcomes, errors, redelivered)

    threads = [threading.Thread(target=deliver, args=(job_id,)) for job_id in ids * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert redelivered == []  # our inserts into a collection go one at a time: none is busy
    assert outcomes == Counter({"written": 32, "already-present": 32})
    assert rows(pgstac, "thirty-two") == Counter({job_id: 1 for job_id in ids})
    # The collection's extent is the union of the 32 items' (each moved 0.01 degrees east of the last).
    west, south, east, north = item_of(job_output, ids[0])["bbox"]
    extent = collection_of(pgstac, "thirty-two")["extent"]
    assert extent["spatial"]["bbox"][0] == pytest.approx([west, south, east + 0.01 * 31, north])
    interval = [datetime.fromisoformat(t) for t in extent["temporal"]["interval"][0]]
    assert interval == [
        datetime.fromisoformat(moments[0].replace("Z", "+00:00")),
        datetime.fromisoformat(moments[-1].replace("Z", "+00:00")),
    ]
    # Each is found through the STAC API's search, by place and time.
    with StacApi(db_host=pgstac.host, db_port=pgstac.port, database="pgstac", user="postgres") as api:
        everything = f"{moments[0]}/{moments[-1]}"
        found = api.search(
            collections=["thirty-two"], bbox=extent["spatial"]["bbox"][0], datetime=everything, limit=100
        )
        assert sorted(f["id"] for f in found["features"]) == ids
        west_of_all = api.search(collections=["thirty-two"], bbox=[west - 1, south, west - 0.5, north], limit=100)
        assert west_of_all["features"] == []  # the search does filter by place
        for n in (0, 31):  # the first and the last alone, by a point inside each and no other
            point = east + 0.01 * n - 0.001
            alone = api.search(
                collections=["thirty-two"], bbox=[point - 0.0005, south, point, north], datetime=moments[n], limit=100
            )
            assert [f["id"] for f in alone["features"]] == [ids[n]]  # its place and its time: it alone


def test_inserts_into_a_collection_wait_for_each_other_before_they_touch_pgstac(pgstac, job_output):
    """Our inserts into one collection never overlap, which is what keeps pgstac's race away: one
    publication's transaction is held open at its ``COMMIT`` (the proxy), after its insert, while
    six more start. They wait for our lock, not inside pgstac's trigger for its tables' locks,
    and once the first commits each lands the first time."""
    settings, collection = settings_for(pgstac), "held-back"
    ids = [f"{n:016x}" for n in range(0x4800, 0x4808)]
    base = datetime.fromisoformat(item_of(job_output, JOB)["properties"]["datetime"].replace("Z", "+00:00"))
    for n, job_id in enumerate(ids):  # each widens the partition's time range
        place_item(job_output, job_id, east=0.01 * n, datetime=(base + timedelta(days=40 * n)).isoformat())
    publish(job_output, settings, collection, ids[0])  # the collection and its partition exist
    outcomes: Counter = Counter()
    errors: list[BaseException] = []
    redelivered: list[str] = []

    def deliver(job_id: str, through: Settings) -> threading.Thread:
        args = (job_output, through, collection, job_id, outcomes, errors, redelivered)
        thread = threading.Thread(target=deliver_until_not_busy, args=args)
        thread.start()
        return thread

    with CommitCutProxy(pgstac.port) as proxy:
        proxy.cut_next_commit(HOLD)
        threads = [deliver(ids[1], settings_for(pgstac, proxy.port))]
        assert proxy.held.wait(60)  # the first insert is done, its COMMIT held
        threads += [deliver(job_id, settings) for job_id in ids[2:]]
        deadline = time.monotonic() + 60
        while sum(lock_waits(pgstac).values()) < len(ids) - 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        waits = lock_waits(pgstac)
        proxy.release()
        for thread in threads:
            thread.join()
    # Unserialised, the six waited inside pgstac's trigger for the partition ("relation").
    assert waits == Counter({"advisory": len(ids) - 2})
    assert errors == []
    assert redelivered == []
    assert outcomes == Counter({"written": len(ids) - 1})
    assert rows(pgstac, collection) == Counter({job_id: 1 for job_id in ids})


def test_a_job_publishes_when_the_instance_that_started_it_had_a_catalog():
    url = "http://127.0.0.1:10000/acct/raster-uploads/scene.tif"
    with_catalog = Settings(pgstac_host="db.example", pgstac_user="tilecommit-data")
    assert jobs.Job.for_upload("scene.tif", url, '"0x1"', 1, with_catalog).to_dict()["publish"] is True
    # Without one the payload is as it always was: no step is added to the job's history.
    assert "publish" not in jobs.Job.for_upload("scene.tif", url, '"0x1"', 1, Settings()).to_dict()


def test_a_job_that_published_nothing_shows_its_item_blob_as_its_link():
    assert publication_of({"stac_url": "http://blob/item.json"}) == {
        "state": "not-configured",
        "url": "http://blob/item.json",
        "outcome": None,
    }
    recorded = {"state": "published", "url": "http://api/collections/c/items/i"}
    assert publication_of({"stac_url": "x", "published": recorded}) == recorded
    assert publication_of(None) is None  # not completed: nothing to show yet


def test_settings_refuse_a_catalog_they_cannot_sign_in_to():
    with pytest.raises(ConfigurationError, match="TILECOMMIT_PGSTAC_USER"):
        Settings(pgstac_host="db.example")
    with pytest.raises(ConfigurationError, match="TILECOMMIT_PGSTAC_AUTH"):
        Settings(pgstac_host="db.example", pgstac_user="u", pgstac_auth="password")
    read = Settings.from_env({"TILECOMMIT_PGSTAC_HOST": "db.example", "TILECOMMIT_PGSTAC_USER": "u"})
    assert (read.pgstac_port, read.pgstac_database, read.pgstac_auth) == (5432, "pgstac", "entra")
