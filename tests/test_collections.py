"""A job's item joins its collection (tilecommit/catalog): the read-modify-write of the index
page and the collection document against the strict storage, and the pure rules around it."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tilecommit import gates
from tilecommit.catalog import collections, documents, naming
from tilecommit.errors import BadInputError, ConfigurationError, MosaicCheckError, StorageFaultError
from tilecommit.jobs import Job
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec

from .conftest import counter_total
from .test_gates import FAST_SDK_RETRY, LoseResponses, container_client

COLLECTION = "scenes"


def item_entry(n: int, *, west: float = 10.0, day: int = 1, code: str = "EPSG:32632") -> dict:
    """The index entry of a made-up item ``n`` (its id a job id), a 0.1-degree square east of ``west``."""
    job_id = f"{n:016x}"
    bbox = [west + n * 0.1, 45.0, west + n * 0.1 + 0.1, 45.1]
    item = {
        "id": job_id,
        "bbox": bbox,
        "properties": {
            "datetime": f"2026-01-{day:02d}T10:00:00Z",
            "proj:code": code,
            "proj:shape": [1000, 1000],
            "tilecommit:profile": {"name": "default"},
            "tilecommit:overview_levels": 2,
        },
    }
    return documents.entry(
        item, item_blob=f"mosaics/{job_id}/item.json", mosaic_blob=f"mosaics/{job_id}/mosaic.tif", item_sha256="ab" * 32
    )


def stored(output, name: str) -> tuple[dict | None, str | None]:
    return collections.read_document(output, name)


def listed_items(output, collection: str = COLLECTION) -> dict[str, dict]:
    """Every entry of every index page the collection document links to."""
    doc, _ = stored(output, documents.collection_blob_name(collection))
    assert doc is not None
    entries: dict[str, dict] = {}
    for key in doc[documents.PAGE_RECORDS]:
        page, _ = stored(output, documents.page_blob_name(collection, key))
        assert page is not None
        for item_id, entry in page[documents.ITEMS].items():
            assert item_id not in entries, f"{item_id} listed twice"
            entries[item_id] = entry
    return entries


def test_adders_racing_into_one_collection_lose_nothing_and_double_nothing(output):
    """24 items, each added by two threads at once (a job whose activity ran twice): every
    collision is a 412 retried on the newer version; the documents end listing each item once."""
    entries = [item_entry(n, day=1 + n % 20) for n in range(24)]
    adders = [e for e in entries for _ in range(2)]
    start = threading.Barrier(len(adders))

    def add(entry: dict) -> collections.Added:
        start.wait()
        return collections.add_item(output, COLLECTION, entry, job_id=entry["id"])

    with ThreadPoolExecutor(len(adders)) as pool:
        results = list(pool.map(add, adders))
    doc, _ = stored(output, documents.collection_blob_name(COLLECTION))
    assert doc is not None
    listed = listed_items(output)
    assert sorted(listed) == sorted(e["id"] for e in entries)  # 0 lost, 0 doubled
    assert all(listed[e["id"]] == e for e in entries)
    assert doc[documents.ITEMS] == 24
    by_item: dict[str, list[str]] = {}
    for entry, result in zip(adders, results, strict=True):
        by_item.setdefault(entry["id"], []).append(result.outcome)
    assert all(sorted(o) == ["already-present", "written"] for o in by_item.values()), by_item
    assert sum(r.conflicts for r in results) > 0  # the race happened and was settled by the condition
    union = [min(e["bbox"][0] for e in entries), 45.0, max(e["bbox"][2] for e in entries), 45.1]
    assert doc["extent"]["spatial"]["bbox"] == [union]
    assert doc["extent"]["temporal"]["interval"] == [["2026-01-01T10:00:00Z", "2026-01-20T10:00:00Z"]]
    assert doc["summaries"] == {"proj:code": ["EPSG:32632"], "tilecommit:profile": ["default"]}
    # Every write of the collection document is one revision: as many as writes that landed.
    assert doc[documents.REVISION] == max(r.revision for r in results)


def test_an_item_added_again_is_already_present_and_writes_nothing(output):
    entry = item_entry(1)
    first = collections.add_item(output, COLLECTION, entry)
    etags = {name: stored(output, name)[1] for name in (first.collection_blob, first.index_blob)}
    before = counter_total("ConditionalWrites", gate="collection-index", outcome="already-present")
    again = collections.add_item(output, COLLECTION, entry)
    assert (first.outcome, again.outcome) == ("written", "already-present")
    assert again.revision == first.revision == 1 and again.attempts == 0
    assert {name: stored(output, name)[1] for name in etags} == etags
    after = counter_total("ConditionalWrites", gate="collection-index", outcome="already-present")
    assert after == before + 1


def test_a_listed_item_with_another_entry_is_known_bad(output):
    entry = item_entry(2)
    added = collections.add_item(output, COLLECTION, entry)
    etags = {name: stored(output, name)[1] for name in (added.collection_blob, added.index_blob)}
    before = counter_total("ConditionalWriteContentMismatch", gate="collection-index")
    other = {**entry, "item_sha256": "cd" * 32}
    with pytest.raises(MosaicCheckError, match=f"lists item {entry['id']} otherwise"):
        collections.add_item(output, COLLECTION, other)
    assert {name: stored(output, name)[1] for name in etags} == etags  # nothing written
    assert counter_total("ConditionalWriteContentMismatch", gate="collection-index") == before + 1


def test_a_crash_between_the_page_and_the_collection_document_converges_on_the_retry(output):
    """The first attempt listed the item in its page and died before the collection document;
    the retry finds the item listed (already-present) and still brings the document up to it."""
    first, second = item_entry(3, west=20.0), item_entry(4, west=30.0, day=9)
    collections.add_item(output, COLLECTION, first)
    key = documents.page_key(second["id"])
    page_name = documents.page_blob_name(COLLECTION, key)
    url = output.get_blob_client(second["mosaic"]).url
    collections.read_modify_write(  # the page step alone: the crash
        output, page_name, lambda page: documents.page_with(page, COLLECTION, key, second, url)
    )
    doc, _ = stored(output, documents.collection_blob_name(COLLECTION))
    assert doc is not None and doc[documents.ITEMS] == 1  # the collection does not know yet
    retried = collections.add_item(output, COLLECTION, second)
    assert retried.outcome == "already-present" and retried.revision == 2
    doc, _ = stored(output, documents.collection_blob_name(COLLECTION))
    assert doc is not None and doc[documents.ITEMS] == 2
    assert sorted(listed_items(output)) == sorted([first["id"], second["id"]])
    assert doc["extent"]["spatial"]["bbox"] == [[first["bbox"][0], 45.0, second["bbox"][2], 45.1]]
    assert doc["extent"]["temporal"]["interval"] == [["2026-01-01T10:00:00Z", "2026-01-09T10:00:00Z"]]
    # Running it again changes nothing: both steps find what they add.
    again = collections.add_item(output, COLLECTION, second)
    assert (again.outcome, again.revision, again.attempts) == ("already-present", 2, 0)


class LoseEveryOtherPut(LoseResponses):
    """Test double: the answer of the 1st, 3rd, 5th... PUT is lost after it landed (the SDK's
    resend of each gets through)."""

    def __init__(self):
        super().__init__("PUT", times=0)
        self.puts = 0

    def send(self, request):
        if request.http_request.method == "PUT":
            self.puts += 1
            self.left = self.puts % 2
        return super().send(request)


def test_a_write_whose_answer_was_lost_counts_once(storage, output):
    """Test double (a lost answer cannot be caused on purpose): every PUT of two adds lands and its
    answer is lost; the SDK sends it again, storage refuses it (409 on a create, 412 on an
    If-Match of the version it replaced), and the write id stored with the document says it was
    ours. Each add is one page write and one collection write, the revision one per add."""
    lose = LoseEveryOtherPut()
    client = container_client(storage, output, lose, **FAST_SDK_RETRY)
    first = collections.add_item(client, COLLECTION, item_entry(7))  # both documents created
    second = collections.add_item(client, COLLECTION, item_entry(8, west=12.0))  # the document replaced
    assert lose.lost == [201, 201, 201, 201]  # each write's first answer lost, its resend answered
    assert (first.outcome, first.revision, first.conflicts) == ("written", 1, 0)
    assert (second.outcome, second.revision, second.conflicts) == ("written", 2, 0)
    doc, _ = stored(output, documents.collection_blob_name(COLLECTION))
    assert doc is not None and doc[documents.ITEMS] == 2 and doc[documents.REVISION] == 2
    assert sorted(listed_items(output)) == sorted([item_entry(7)["id"], item_entry(8)["id"]])


def test_a_document_that_keeps_changing_under_the_writer_exhausts_its_budget_retryably(output):
    """Another writer lands between every read and write: each write is refused (412), the change
    is made again on the newer version, and past the budget the activity's retry is asked for."""
    name = documents.collection_blob_name("busy")
    gates.commit_blob(output, name, documents.canonical({"n": 0}), content_type="application/json", same_bytes=False)
    refused_before = counter_total("ConditionalWritePreconditionFailed", gate="collection")

    def change_while_another_writes(current: dict | None) -> dict:
        assert current is not None
        _, etag = stored(output, name)
        assert etag is not None
        gates.repair_blob(output, name, documents.canonical({"n": current["n"] + 100}), expect_etag=etag)
        return {"n": current["n"] + 1}

    with pytest.raises(StorageFaultError, match="3 conditional writes refused") as raised:
        collections.read_modify_write(output, name, change_while_another_writes, attempts=3)
    assert raised.value.retryable
    assert stored(output, name)[0] == {"n": 300}  # only the other writer's versions landed
    assert counter_total("ConditionalWritePreconditionFailed", gate="collection") == refused_before + 3


def test_the_collection_document_merge_never_takes_anything_away():
    """Repeating a merge changes nothing; a page record read before another item landed (a lower
    page revision) does not replace the newer one; the extent only grows."""
    a, b = item_entry(5), item_entry(6, west=-5.0, day=3)
    key = "00"
    page1 = documents.page_with(None, COLLECTION, key, a, "http://x/" + a["mosaic"])
    assert page1 is not None
    page2 = documents.page_with(page1, COLLECTION, key, b, "http://x/" + b["mosaic"])
    assert page2 is not None and page2[documents.REVISION] == 2
    doc = documents.collection_with(None, COLLECTION, b, key, page2)
    assert doc is not None and doc[documents.ITEMS] == 2 and doc[documents.REVISION] == 1
    assert documents.collection_with(doc, COLLECTION, b, key, page2) is None  # the same merge: nothing to write
    stale = documents.collection_with(doc, COLLECTION, a, key, page1)  # a's writer read the page before b landed
    assert stale is not None and stale[documents.ITEMS] == 2 and stale[documents.PAGE_RECORDS][key]["revision"] == 2
    assert stale["extent"]["spatial"]["bbox"] == [documents.union(a["bbox"], b["bbox"])]
    assert stale[documents.REVISION] == 2
    assert page2["tiles"] and all(
        url.startswith("http://x/mosaics/") for urls in page2["tiles"].values() for url in urls
    )


def test_an_entry_is_the_stored_items_own_facts():
    """From the item alone: a 3D bbox loses its heights; the zooms from its pixel size (0.1 degree
    over 1000 pixels: zoom 14, where a pixel is 0.000086 degree) and its overview levels."""
    item = {
        "id": "0123456789abcdef",
        "bbox": [10.0, 45.0, 0.0, 10.1, 45.1, 200.0],
        "properties": {"datetime": None, "start_datetime": "2026-02-01T00:00:00Z", "proj:shape": [1000, 1000]},
    }
    made = documents.entry(item, item_blob="i", mosaic_blob="m", item_sha256="s")
    assert made["bbox"] == [10.0, 45.0, 10.1, 45.1]
    assert made["datetime"] == "2026-02-01T00:00:00Z"
    assert (made["maxzoom"], made["minzoom"]) == (14, 14)
    assert made["proj:code"] is None and made["tilecommit:profile"] is None


def test_quadkeys_are_web_mercator_tiles():
    """Known tiles at zoom 8 (Munich's and Greenwich's, which straddles the meridian)."""
    assert documents.quadkeys([11.0, 47.0, 11.5, 47.4]) == ["12022113", "12022131", "12023002", "12023020"]
    assert documents.quadkeys([-0.1, 51.4, 0.1, 51.6]) == ["03131313", "12020202"]
    assert documents.quadkeys(None) == []


@pytest.mark.parametrize("value", ["", "A", "a/b", "a.b", "-a", "a" * 65, "a b", "a:b"])
def test_collection_ids_outside_the_rule_are_refused_naming_key_and_value(value):
    with pytest.raises(BadInputError, match="blob metadata tilecommit_collection=.* is not a collection id"):
        naming.resolve({"tilecommit_collection": value}, "x.tif", rules=[], default="d")
    with pytest.raises(ConfigurationError, match="TILECOMMIT_COLLECTION="):
        Settings(collection=value)


def test_the_collection_is_chosen_by_metadata_then_the_longest_prefix_then_the_default():
    settings = Settings(collection="all", collection_rules="dem/=elevation; dem/alps/=alps ;previews/=quick")
    assert settings.collection_for("dem/alps/a.tif", None) == "alps"
    assert settings.collection_for("dem/b.tif", {}) == "elevation"
    assert settings.collection_for("other.tif", None) == "all"
    assert settings.collection_for("dem/b.tif", {"Tilecommit_Collection": "mine"}) == "mine"
    with pytest.raises(
        ConfigurationError, match="TILECOMMIT_COLLECTION_RULES rule 'dem/'='Bad' is not a collection id"
    ):
        Settings(collection_rules="dem/=Bad")
    assert Settings().collection == naming.DEFAULT_COLLECTION


def test_the_job_carries_its_collection_and_a_payload_from_before_reads_back_without_one():
    settings = Settings(collection_rules="dem/=elevation")
    job = Job.for_upload(
        "dem/a.tif", "http://127.0.0.1/a/in/dem/a.tif", '"0x1"', 10, settings, {"tilecommit_level": "9"}
    )
    assert job.collection == "elevation" and job.collection_error is None
    assert job.spec.profile_options == (("level", 9),)  # the collection key is no profile option
    same = Job.for_upload(
        "dem/a.tif", "http://127.0.0.1/a/in/dem/a.tif", '"0x1"', 10, Settings(), {"tilecommit_level": "9"}
    )
    assert same.job_id == job.job_id  # the collection is not part of the job id
    bad = Job.for_upload("a.tif", "http://127.0.0.1/a/in/a.tif", '"0x1"', 10, settings, {"tilecommit_collection": "A"})
    assert bad.collection_error is not None and "'A'" in bad.collection_error
    assert bad.profile_error is None and bad.spec == OutputSpec.from_settings(settings)  # not a profile key
    old = {k: v for k, v in job.to_dict().items() if k not in ("collection", "collection_error")}
    assert Job.from_dict(old).collection is None
    assert Job.from_dict(old).to_dict() == old  # written as it was
    assert Job.from_dict(job.to_dict()) == job
    assert OutputSpec.from_dict(job.to_dict()["spec"]) == job.spec
