"""The job API over real HTTP on 127.0.0.1, served by the local host: every route, its errors,
function keys, and a cancel and a retry of a running 100-window job."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from client_functions import job_api
from devhost.session import job_summary, process_file
from orchestrators import names
from tilecommit.jobs import CANCELLED_ROW_KEY
from tilecommit.manifest import count_manifest

from .app_jobs import check_outputs, local_host, make_scene, upload

pytestmark = pytest.mark.slow

KEY = "test-function-key"


def call(host, method: str, path: str, *, key: str | None = KEY, header: bool = True) -> tuple[int, dict | None]:
    url = f"{host.http.base_url}{path}"
    if key is not None and not header:
        url += ("&" if "?" in url else "?") + f"code={key}"
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    if key is not None and header:
        request.add_header("x-functions-key", key)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        body = exc.read()
        return exc.code, json.loads(body) if body else None


def test_every_route_its_errors_and_its_keys(storage, app_env, tmp_path, monkeypatch):
    scenes = [make_scene(tmp_path / f"scene{n}.tif", 600, 300) for n in range(2)]
    with local_host(app_env, http_port=0, function_key=KEY) as host:
        summaries = [process_file(host, scene, timeout=120) for scene in scenes]
        job_id = summaries[0]["job_id"]

        assert call(host, "GET", f"/api/jobs/{job_id}", key=None) == (401, None)
        assert call(host, "GET", f"/api/jobs/{job_id}", key="wrong") == (401, None)
        assert call(host, "GET", f"/api/jobs/{job_id}", header=False)[0] == 200  # ?code= works too
        status, view = call(host, "GET", f"/api/jobs/{job_id}")
        assert status == 200 and view["state"] == "completed" and view["error"] is None
        assert view["outputs"]["mosaic"] == summaries[0]["mosaic_url"]
        assert view["progress"]["windows_done"] == view["summary"]["windows"] == 6
        assert view["upload"]["blob"] == "scene0.tif" and view["profile"] == summaries[0]["spec"]["profile"]

        status, missing = call(host, "GET", "/api/jobs/0000000000000000")
        assert status == 404 and missing["error"]["code"] == "job-not-found"
        assert call(host, "GET", "/api/jobs/not-a-job")[1]["error"]["code"] == "invalid-job-id"
        assert call(host, "GET", f"/api/jobs/{job_id}-batch-00000")[0] == 400  # a batch is not a job
        assert call(host, "POST", f"/api/jobs/{job_id}/cancel")[1]["error"]["code"] == "job-finished"
        assert call(host, "POST", f"/api/jobs/{job_id}/retry")[1]["error"]["code"] == "job-not-retryable"
        assert call(host, "POST", "/api/jobs/0000000000000000/cancel")[0] == 404
        assert call(host, "GET", f"/api/jobs/{job_id}/cancel")[0] == 404  # POST only
        assert call(host, "GET", "/api/nothing-here")[0] == 404

        status, page = call(host, "GET", "/api/jobs")
        assert status == 200 and page["next"] is None
        assert sorted(j["job_id"] for j in page["jobs"]) == sorted(s["job_id"] for s in summaries)  # no batches
        first = call(host, "GET", "/api/jobs?limit=1")[1]
        second = call(host, "GET", f"/api/jobs?limit=1&cursor={first['next']}")[1]
        assert [j["job_id"] for j in first["jobs"] + second["jobs"]] == [j["job_id"] for j in page["jobs"]]
        assert (
            second["next"] is None or call(host, "GET", f"/api/jobs?limit=1&cursor={second['next']}")[1]["jobs"] == []
        )
        # One instance per request to the extension: every page is followed, none is lost.
        monkeypatch.setattr(job_api, "INSTANCES_PER_REQUEST", 1)
        assert call(host, "GET", "/api/jobs")[1] == page
        assert call(host, "GET", "/api/jobs?state=failed,running")[1]["jobs"] == []
        assert len(call(host, "GET", "/api/jobs?state=completed")[1]["jobs"]) == 2
        assert call(host, "GET", "/api/jobs?since=2999-01-01T00:00:00Z")[1]["jobs"] == []
        for query, code in (
            ("state=done", "invalid-state"),
            ("since=yesterday", "invalid-since"),
            ("limit=0", "invalid-limit"),
            ("limit=x", "invalid-limit"),
            ("cursor=zz", "invalid-cursor"),
        ):
            status, refused = call(host, "GET", f"/api/jobs?{query}")
            assert (status, refused["error"]["code"]) == (400, code), query


def wait(predicate, timeout: float = 120, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise TimeoutError("condition not reached")


def test_cancel_stops_new_tiles_within_one_batch_and_retry_renders_only_the_rest(storage, app_env, tmp_path):
    scene = make_scene(tmp_path / "big.tif", 2560, 2560)  # 10 x 10 windows of 256
    manifest = storage.table_service().get_table_client(app_env.manifest)
    batch_size = int(app_env.env["TILECOMMIT_BATCH_SIZE"])
    with local_host(app_env, http_port=0, function_key=KEY) as host:
        job_id = upload(storage, app_env, scene)
        wait(lambda: count_manifest(manifest, job_id).rows >= 8)
        status, cancelled = call(host, "POST", f"/api/jobs/{job_id}/cancel?reason=operator%20said%20so")
        assert status == 202 and cancelled["state"] == "cancelling", cancelled
        at_cancel = count_manifest(manifest, job_id).rows
        assert at_cancel < 100, "the job finished before it could be cancelled: nothing is shown"

        wait(lambda: call(host, "GET", f"/api/jobs/{job_id}")[1]["state"] == "terminated")
        wait(lambda: host.engine.activities.free() == host.engine.max_activities)  # nothing left running
        time.sleep(1.0)
        stopped = count_manifest(manifest, job_id).rows
        print(f"cancel: {at_cancel} windows done when it returned, {stopped} when the job stopped")
        assert stopped - at_cancel <= batch_size, (at_cancel, stopped)
        view = call(host, "GET", f"/api/jobs/{job_id}")[1]
        assert view["error"] == {"type": "cancelled", "message": "operator said so"}
        batches = [s for s in host.engine.list_instances(prefix=f"{job_id}-") if s["name"] == names.RENDER_BATCH]
        assert batches and all(s["status"] in ("Terminated", "Completed") for s in batches)
        assert manifest.get_entity(job_id, CANCELLED_ROW_KEY)["reason"] == "operator said so"

        # A late or repeated delivery of the upload does not resume a job its user cancelled.
        host.deliver_blob_created(scene.name)
        assert host.decisions[-1]["action"] == "duplicate"
        assert call(host, "POST", f"/api/jobs/{job_id}/cancel")[1]["error"]["code"] == "job-finished"

        status, retried = call(host, "POST", f"/api/jobs/{job_id}/retry")
        assert (status, retried["state"]) == (202, "pending"), retried
        state = host.engine.wait_for(job_id, timeout=300)
    summary = job_summary(state)
    check_outputs(storage, app_env, summary, scene)
    output = state["output"]
    assert output["skipped"] == stopped  # every window done before the cancel: looked up, not encoded
    assert output["written"] == 100 - stopped and output["already_present"] == stopped
    assert CANCELLED_ROW_KEY not in {r["RowKey"] for r in manifest.query_entities(f"PartitionKey eq '{job_id}'")}
