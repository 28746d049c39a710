"""32 whole jobs on the local host at once, every activity run twice, publishing to a real pgstac,
PostgreSQL stopped for 10 s while they run: every job still ends published, each item once, found through the STAC API, its state and link shown by the
job API and ``devhost status``, its completion event carrying the link.

The host's timers run at full scale here (the activity retry policy's real intervals: 5 s, then
10 s...), since what is shown is that the policy outlasts the outage. Each job's item has its own
time (its creation's): 32 inserts at once widening one pgstac partition's time constraint, which
before tilecommit/catalog/database.py read that race as busy failed about 3 jobs of 32 for good.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

import psycopg
import pytest

from testkit.stac_api import StacApi
from tilecommit import settings as names

from .app_jobs import ROOT, download, local_host, make_scene, serve, stop_host, upload, wait_for_state

JOBS = 32
OUTAGE_S = 10.0


@pytest.fixture
def catalog_env(app_env, pgstac, monkeypatch):
    api = StacApi(db_host=pgstac.host, db_port=pgstac.port, database="pgstac", user="postgres").start()
    env = {**pgstac.settings(), names.SETTING_STAC_API_URL: api.url}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    app_env.env.update(env)
    yield app_env, api
    api.close()


def items_in(pgstac, collection: str) -> Counter:
    with psycopg.connect(pgstac.dsn()) as conn:
        found = conn.execute("SELECT id FROM pgstac.items WHERE collection = %s", (collection,)).fetchall()
    return Counter(row[0] for row in found)


@pytest.mark.slow
def test_32_jobs_still_end_published_when_postgresql_stops_for_10_s_while_they_run(
    storage, catalog_env, pgstac, tmp_path
):
    app_env, api = catalog_env
    events = tmp_path / "events.jsonl"
    scenes = [make_scene(tmp_path / f"scene{n}.tif", 256, 256 + 16 * n) for n in range(JOBS)]
    outage: dict[str, float] = {}
    # Every activity runs twice at once (at-least-once, made visible): each publication is delivered twice.
    with local_host(app_env, timer_scale=1.0, events_file=events, duplicate_activities=True):
        pgstac.stop_server()
        outage["stopped"] = time.monotonic()
        restart = threading.Timer(OUTAGE_S, lambda: (pgstac.start_server(), outage.update(started=time.monotonic())))
        restart.start()
        try:
            job_ids = [upload(storage, app_env, scene) for scene in scenes]
            states = [
                wait_for_state(storage, app_env, job_id, lambda s: s["status"] in ("Completed", "Failed"), timeout=180)
                for job_id in job_ids
            ]
        finally:
            restart.join()
    assert [s["status"] for s in states] == ["Completed"] * JOBS, "; ".join(
        json.dumps({k: str(v)[-600:] for k, v in s.items() if k != "input"})
        for s in states
        if s["status"] != "Completed"
    )
    assert outage["started"] - outage["stopped"] >= OUTAGE_S
    summaries = [json.loads(s["output"]) if isinstance(s["output"], str) else s["output"] for s in states]
    for job_id, summary in zip(job_ids, summaries, strict=True):
        assert summary["published"] == {
            "state": "published",
            "collection": "tilecommit",
            "item_id": job_id,
            "url": f"{api.url}/collections/tilecommit/items/{job_id}",
            # Whichever of the two executions Durable took: one wrote it, the other found it.
            "outcome": summary["published"]["outcome"],
        }
        assert summary["published"]["outcome"] in ("written", "already-present")
    assert items_in(pgstac, "tilecommit") == Counter({job_id: 1 for job_id in job_ids})
    # Each is found through the STAC API, by place and time, at the link the job gives.
    for job_id, summary in zip(job_ids, summaries, strict=True):
        item = api.get(summary["published"]["url"].removeprefix(api.url))  # the link serves the item
        found = api.search(bbox=item["bbox"], datetime=item["properties"]["datetime"], limit=100)
        assert job_id in [f["id"] for f in found["features"]]
    # The completion events, sent after the publication, carry the link.
    sent = {e["data"]["job_id"]: e["data"] for e in map(json.loads, events.read_text().splitlines())}
    assert {job_id: sent[job_id]["catalog"]["url"] for job_id in job_ids} == {
        job_id: f"{api.url}/collections/tilecommit/items/{job_id}" for job_id in job_ids
    }
    # devhost status shows the published state and the link (the job API's view).
    shown = subprocess.run(
        [sys.executable, "-m", "devhost", "status", job_ids[0], "--hub", app_env.hub],
        cwd=ROOT,
        env={**os.environ, **app_env.env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert view["published"]["state"] == "published" and view["published"]["url"] == summaries[0]["published"]["url"]


@pytest.mark.slow
def test_devhost_serve_catalog_serves_a_stac_api_that_finds_the_job_by_place_and_time(storage, app_env, tmp_path):
    log = tmp_path / "serve.log"
    host = serve(app_env, log, "--catalog")
    try:
        url = re.search(r"the STAC API on (http://127\.0\.0\.1:\d+)", log.read_text()).group(1)
        job_id = upload(storage, app_env, make_scene(tmp_path / "scene.tif", 256, 256))
        state = wait_for_state(storage, app_env, job_id, lambda s: s["status"] in ("Completed", "Failed"))
        assert state["status"] == "Completed", state.get("error")
        summary = json.loads(state["output"]) if isinstance(state["output"], str) else state["output"]
        assert summary["published"]["url"] == f"{url}/collections/tilecommit/items/{job_id}"
        item = json.loads(download(storage, app_env.output, f"mosaics/{job_id}/item.json"))
        query = {"bbox": item["bbox"], "datetime": item["properties"]["datetime"], "limit": 100}
        request = urllib.request.Request(
            f"{url}/search", data=json.dumps(query).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert [f["id"] for f in json.loads(answer.read())["features"]] == [job_id]
    finally:
        stop_host(host, log)
    # Stopped with the host: nothing answers on its port any more.
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{url}/_mgmt/ping", timeout=5)
