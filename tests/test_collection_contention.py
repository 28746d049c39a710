"""Jobs through the local host end listed in their collection (tilecommit/catalog): one job whose
upload names its collection, and 32 jobs completing at once into one collection, each upload
delivered twice, on the strict storage. The figures of the race (412s and retries beside the
independent-attempt model) are printed by ``python -m bench.collections``."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from activities.catalog import add_to_collection
from devhost.session import process_file
from tilecommit.catalog import collections, documents
from tilecommit.jobs import job_id_for
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec

from .app_jobs import check_outputs, download, local_host, make_scene

pytestmark = pytest.mark.slow

JOBS = 32


def output_container(storage, app_env):
    return storage.blob_service().get_container_client(app_env.output)


def page_entries(output, collection: str) -> dict[str, list[dict]]:
    """Item id -> every entry listing it, over the pages the collection document links to."""
    doc, _ = collections.read_document(output, documents.collection_blob_name(collection))
    assert doc is not None
    linked = [link["href"] for link in doc["links"] if link["rel"] == "tilecommit:index"]
    assert linked == [f"./index/{key}.json" for key in doc[documents.PAGE_RECORDS]]
    found: dict[str, list[dict]] = {}
    for key in doc[documents.PAGE_RECORDS]:
        page, _ = collections.read_document(output, documents.page_blob_name(collection, key))
        assert page is not None and page["mosaicjson"] == "0.0.3"
        for item_id, entry in page[documents.ITEMS].items():
            found.setdefault(item_id, []).append(entry)
    return found


def test_a_job_ends_with_its_item_in_its_collection_and_its_mosaic_in_the_mosaicjson(storage, app_env, tmp_path):
    scene = make_scene(tmp_path / "scene.tif", 1000, 700)  # the demo's kind of scene, 4 x 3 windows
    with local_host(app_env) as host:
        summary = process_file(host, scene, timeout=120, metadata={"tilecommit_collection": "demo-scenes"})
    check_outputs(storage, app_env, summary, scene)
    job_id, added = summary["job_id"], summary["collection"]
    assert added["collection"] == "demo-scenes" and added["outcome"] == "written" and added["revision"] == 1
    assert added["collection_url"].endswith("/collections/demo-scenes/collection.json")
    output = output_container(storage, app_env)
    doc, _ = collections.read_document(output, "collections/demo-scenes/collection.json")
    item = json.loads(download(storage, app_env.output, f"mosaics/{job_id}/item.json"))
    assert doc is not None and doc["type"] == "Collection" and doc["id"] == "demo-scenes"
    assert doc[documents.ITEMS] == 1
    assert doc["extent"]["spatial"]["bbox"] == [item["bbox"]]
    assert doc["extent"]["temporal"]["interval"] == [[item["properties"]["datetime"]] * 2]
    assert "collection" not in item  # the stored item stays as it was: membership is the collection's
    page, _ = collections.read_document(output, added["index_blob"])
    assert page is not None
    mosaic_url = output.get_blob_client(f"mosaics/{job_id}/mosaic.tif").url
    assert page[documents.ITEMS][job_id]["bbox"] == item["bbox"]
    assert page["tiles"] and all(urls == [mosaic_url] for urls in page["tiles"].values())
    assert page["bounds"] == item["bbox"]


def test_an_upload_naming_no_valid_collection_fails_at_once_saying_which_key_and_value(storage, app_env, tmp_path):
    scene = make_scene(tmp_path / "scene.tif", 300, 200)
    with local_host(app_env) as host:
        refused = process_file(host, scene, timeout=120, metadata={"tilecommit_collection": "Field/2026"})
    # Failed while validating: no window was planned, nothing listed anywhere.
    assert refused["status"] == "failed" and refused["windows"] is None, refused
    assert "blob metadata tilecommit_collection='Field/2026' is not a collection id" in str(refused["error"])
    assert "BadInputError" in str(refused["error"])
    assert not list(output_container(storage, app_env).list_blobs(name_starts_with="collections/"))


def test_32_jobs_completing_at_once_each_delivered_twice_list_exactly_their_32_items(storage, app_env, tmp_path):
    """Every job adds its item at about the same moment: the collection document is the one hot
    spot, refused (412) and retried on the newer version; it ends with the 32 items, once each."""
    scenes = [make_scene(tmp_path / f"s{n:02d}.tif", 200 + n, 200) for n in range(JOBS)]  # one window each
    blobs = storage.blob_service().get_container_client(app_env.input)

    with local_host(app_env, deliveries=2) as host:

        def upload(path):
            blob = blobs.get_blob_client(path.name)
            etag = blob.upload_blob(path.read_bytes(), overwrite=True)["etag"]
            return job_id_for(blob.url, etag, OutputSpec.from_settings(Settings.from_env()))

        with ThreadPoolExecutor(8) as pool:
            job_ids = list(pool.map(upload, scenes))
        states = [host.engine.wait_for(job_id, timeout=240) for job_id in job_ids]
        starts = [d["action"] for d in host.decisions]
    assert len(starts) == 2 * JOBS and starts.count("started") >= JOBS
    assert all(s["status"] == "Completed" for s in states), [s.get("error") for s in states]
    added = [s["output"]["collection"] for s in states]
    assert {a["collection"] for a in added} == {Settings().collection}
    output = output_container(storage, app_env)
    listed = page_entries(output, Settings().collection)
    assert sorted(listed) == sorted(job_ids)  # 0 lost
    assert all(len(entries) == 1 for entries in listed.values())  # 0 doubled
    doc, _ = collections.read_document(output, documents.collection_blob_name(Settings().collection))
    assert doc is not None and doc[documents.ITEMS] == JOBS
    bboxes = [e[0]["bbox"] for e in listed.values()]
    union = [min(b[0] for b in bboxes), min(b[1] for b in bboxes), max(b[2] for b in bboxes), max(b[3] for b in bboxes)]
    assert doc["extent"]["spatial"]["bbox"] == [union]
    assert doc[documents.REVISION] >= max(a["revision"] for a in added)

    # The host spreads the jobs' ends over seconds; here their 32 publications, each delivered
    # twice, are released at the same instant into another collection, through the activity itself.
    inputs = [s["input"] if isinstance(s["input"], dict) else json.loads(s["input"]) for s in states]
    payloads = [{"job": {**job, "collection": "race"}} for job in inputs]
    start = threading.Barrier(2 * JOBS)

    def publish(payload: dict) -> dict:
        start.wait()
        return add_to_collection(payload)

    with ThreadPoolExecutor(2 * JOBS) as pool:
        raced = list(pool.map(publish, payloads * 2))
    assert not [r for r in raced if "error" in r], raced
    listed = page_entries(output, "race")
    assert sorted(listed) == sorted(job_ids) and all(len(e) == 1 for e in listed.values())
    race, _ = collections.read_document(output, documents.collection_blob_name("race"))
    assert race is not None and race[documents.ITEMS] == JOBS and race["extent"] == doc["extent"]
    outcomes = sorted(r["outcome"] for r in raced)
    assert outcomes == ["already-present"] * JOBS + ["written"] * JOBS
    assert sum(r["conflicts"] for r in raced) > 0  # they collided, and the condition settled it
