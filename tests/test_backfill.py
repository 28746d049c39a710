"""The backfill: blobs already stored, started as jobs as their upload events would start them.

Through the local host and Azurite: a container of which a third already has jobs (completed,
failed, pending), backfilled by ``python -m devhost backfill`` killed (SIGKILL) just after it
started a job, then run again with the same arguments; and the HTTP API's dry run, cancel and
resume. The figures of the issue's 300 blobs: ``python -m bench.backfill``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from client_functions import backfill_pages
from devhost.durable.functions import EventLoopThread
from devhost.durable.queues import queue_service
from devhost.durable.store import HistoryStore
from orchestrators.backfill import unhandled, within_room
from tilecommit.backfill import COUNTS, BackfillRequest, backfill_id, check_backfill_id
from tilecommit.errors import InvalidNameError
from tilecommit.jobs import job_id_for
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec

from .app_jobs import ROOT, AppEnv, local_host, make_scene, wait_until

#: Blobs of the crash test: a third of them with jobs already (completed, failed, pending).
BLOBS = 30
PAGE_SIZE = 7
MAX_RUNNING = 4
#: The kill comes just after the backfill's 8th job started (of 20 new ones).
KILL_AFTER_STARTS = 8
#: The history of one execution of the backfill (orchestrators/backfill.py's docstring).
HISTORY_BOUND = 24
KEY = "test-function-key"
STARTED = re.compile(r"started job ([0-9a-f]{16}) for ")
RESUMED = re.compile(r"started failed job ([0-9a-f]{16}) again for ")


def blob_names(count: int) -> list[str]:
    return [f"scenes/b{i:03d}.tif" for i in range(count)]


def upload_all(storage, app_env: AppEnv, names: list[str], content: bytes) -> None:
    container = storage.blob_service().get_container_client(app_env.input)
    for name in names:
        container.upload_blob(name, content, overwrite=True)


def create_containers(storage, app_env: AppEnv) -> None:
    for name in (app_env.input, app_env.tiles, app_env.output):
        storage.blob_service().create_container(name)


def jobs_delivered(app_env: AppEnv, names: list[str], *, run: bool) -> dict[str, str]:
    """Deliver each blob's upload event once; {name: job id}. With ``run``, wait until every job
    has ended; without, the jobs stay pending: no engine runs them until a host does."""
    host = local_host(app_env)
    if run:
        host.start(watch=False)
    else:
        host.ensure_storage()
        host.api.start()  # the Durable HTTP API alone: start_new queues the job, nothing runs it
    try:
        for name in names:
            host.deliver_blob_created(name)
        ids = job_ids(host.connection, app_env, names)
        for job_id in ids.values() if run else ():
            host.engine.wait_for(job_id, timeout=120)
        return ids
    finally:
        if run:
            host.stop()
        else:
            from devhost.durable.host import close_durable_client_session

            close_durable_client_session()
            host.api.stop()


def job_ids(storage, app_env: AppEnv, names: list[str]) -> dict[str, str]:
    """The job id of each blob's upload as it is stored now (its URL, its ETag, the settings' spec)."""
    container = storage.blob_service().get_container_client(app_env.input)
    spec = OutputSpec.from_settings(Settings.from_env())
    found = {}
    for name in names:
        blob = container.get_blob_client(name)
        found[name] = job_id_for(blob.url, blob.get_blob_properties().etag, spec)
    return found


def backfill_command(app_env: AppEnv, *args: str, crash: str | None = None) -> subprocess.CompletedProcess:
    module = ["tests.crash_host", crash, "--"] if crash else ["devhost"]
    command = [
        sys.executable,
        "-m",
        *module,
        "-v",
        "backfill",
        "--hub",
        app_env.hub,
        "--worker-id",
        f"{app_env.hub}-backfill",
        "--lease-seconds",
        "3",
        "--timer-scale",
        "0.01",
        *args,
    ]
    return subprocess.run(
        command, cwd=ROOT, env={**os.environ, **app_env.env}, capture_output=True, text=True, timeout=300
    )


def history_events(storage, app_env: AppEnv, instance_id: str) -> int:
    store = HistoryStore(storage.blob_service(), storage.table_service(), app_env.hub, queue_service(storage))
    return sum(len(episode.events) for episode in store.episodes(instance_id))


@pytest.mark.slow
def test_backfill_killed_and_run_again_starts_each_job_once(storage, app_env, tmp_path):
    create_containers(storage, app_env)
    scene = make_scene(tmp_path / "scene.tif", 256, 256).read_bytes()  # one window
    names = blob_names(BLOBS)
    had_jobs = names[::3]  # 10: 4 completed, 3 failed, 3 pending
    completed, failed, pending = had_jobs[:4], had_jobs[4:7], had_jobs[7:]
    upload_all(storage, app_env, [n for n in names if n not in failed], scene)
    upload_all(storage, app_env, failed, b"not a raster at all")
    upload_all(storage, app_env, ["scenes/b000.tif.aux.xml"], b"<PAMDataset/>")  # a sidecar: ignored
    upload_all(storage, app_env, ["scenes/empty.tif"], b"")  # zero bytes: ignored
    before = jobs_delivered(app_env, completed + failed, run=True)
    before.update(jobs_delivered(app_env, pending, run=False))
    assert len(before) == len(had_jobs)

    args = ("--page-size", str(PAGE_SIZE), "--max-running", str(MAX_RUNNING), "--wait-seconds", "0.2")
    killed = backfill_command(app_env, *args, crash=f"start:{KILL_AFTER_STARTS}")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    again = backfill_command(app_env, *args)
    assert again.returncode == 0, again.stderr[-3000:]
    view = json.loads(again.stdout.strip().splitlines()[-1])
    assert view["action"] == "running"  # the killed host's backfill, found and carried on by this host
    assert view["state"] == "completed"
    new = len(names) - len(had_jobs)
    assert view["counts"] == {
        "listed": len(names) + 2,
        "started": new,
        "resumed": len(failed),  # a failed job is resumed, as its upload event would resume it
        "duplicates": len(completed) + len(pending),
        "refused": 0,
        "ignored": 2,
        "failed": 0,
    }

    # None started twice: the starter's own decisions, in both hosts' logs (a start the kill cut
    # off before its line was written is not there: at most the few starts then in flight).
    logs = killed.stderr + again.stderr
    started = STARTED.findall(logs)
    new_jobs = job_ids(storage, app_env, [n for n in names if n not in had_jobs])
    assert len(started) == len(set(started)) and set(started) <= set(new_jobs.values())
    assert len(started) >= new - MAX_RUNNING
    assert sorted(RESUMED.findall(logs)) == sorted(before[n] for n in failed)
    # None missed: every new blob's job is in the task hub.
    store = HistoryStore(storage.blob_service(), storage.table_service(), app_env.hub, queue_service(storage))
    assert all(store.read_state(job_id) is not None for job_id in new_jobs.values())

    # Bounded history: every page is a new execution, and the last one holds a few events.
    instance_id = backfill_id(app_env.input, "", False)
    assert view["pages"] == -(-(len(names) + 2) // PAGE_SIZE) - 1
    assert history_events(storage, app_env, instance_id) <= HISTORY_BOUND


def call(host, method: str, path: str, body: dict | None = None) -> tuple[int, dict | None]:
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    request = urllib.request.Request(f"{host.http.base_url}{path}", method=method, data=data)
    request.add_header("x-functions-key", KEY)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def wait_for_backfill(host, backfill: str, states: tuple[str, ...], timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        view = call(host, "GET", f"/api/backfill/{backfill}")[1]
        if view["state"] in states or time.monotonic() > deadline:
            return view
        time.sleep(0.1)


@pytest.mark.slow
def test_backfill_api_dry_run_cancel_and_resume(storage, app_env, tmp_path):
    create_containers(storage, app_env)
    names = blob_names(4)
    # 4 windows each: a job runs for a while, and the backfill, one job at a time, waits for it.
    upload_all(storage, app_env, names, make_scene(tmp_path / "scene.tif", 512, 512).read_bytes())
    upload_all(storage, app_env, ["scenes/b000.tif.aux.xml", "other/b9.tif"], b"<PAMDataset/>")
    # The watcher off: no upload event is delivered, only the backfill starts jobs.
    host = local_host(app_env, http_port=0, function_key=KEY).start(watch=False)
    try:
        assert call(host, "POST", "/api/backfill", {"container": "tiles"})[1]["error"]["code"] == "not-input-container"
        assert call(host, "POST", "/api/backfill", {"max_running": 0})[1]["error"]["code"] == "invalid-backfill"
        assert call(host, "POST", "/api/backfill", {"colour": "red"})[0] == 400
        assert call(host, "GET", "/api/backfill/backfill-0000000000000000")[0] == 404

        status, dry = call(host, "POST", "/api/backfill", {"prefix": "scenes/", "dry_run": True})
        assert status == 202 and dry["action"] == "started" and dry["id"] == backfill_id(app_env.input, "scenes/", True)
        dry = wait_for_backfill(host, dry["id"], ("completed", "failed"))
        assert dry["counts"] == {**dict.fromkeys(COUNTS, 0), "listed": 5, "started": 4, "ignored": 1}
        assert host.engine.status(backfill_id(app_env.input, "scenes/", False)) is None
        assert not [d for d in host.decisions if d["action"] == "started"]  # a dry run starts nothing
        again = call(host, "POST", "/api/backfill", {"prefix": "scenes/", "dry_run": True})
        assert again[0] == 200 and again[1]["action"] == "completed" and again[1]["counts"] == dry["counts"]

        # One job at a time, and a long wait for room (3600 s, at the host's timer scale 36 s):
        # the backfill is waiting after its first start when it is cancelled.
        real = {"prefix": "scenes/", "max_running": 1, "page_size": 2, "wait_s": 3600}
        status, view = call(host, "POST", "/api/backfill", real)
        assert status == 202 and view["action"] == "started"
        wait_until(lambda: call(host, "GET", f"/api/backfill/{view['id']}")[1]["stage"] == "waiting for room")
        status, cancelled = call(host, "POST", f"/api/backfill/{view['id']}/cancel")
        assert status == 202 and cancelled["state"] == "cancelling"
        stopped = wait_for_backfill(host, view["id"], ("cancelled",))
        assert stopped["state"] == "cancelled" and stopped["counts"]["started"] == 1
        [first_job] = [d["job_id"] for d in host.decisions if d["action"] == "started"]
        assert stopped["running_jobs"] == [first_job] and stopped["running_count"] == 1
        assert host.engine.wait_for(first_job, timeout=60)["status"] == "Completed"  # a job runs on after a cancel

        status, resumed = call(host, "POST", "/api/backfill", {**real, "wait_s": 0.2})
        assert status == 202 and resumed["action"] == "resumed"
        done = wait_for_backfill(host, view["id"], ("completed", "failed"))
        assert done["state"] == "completed", done
        assert done["counts"] == {**dict.fromkeys(COUNTS, 0), "listed": 5, "started": 4, "ignored": 1}
        started = [d["job_id"] for d in host.decisions if d["action"] == "started"]
        assert len(started) == len(set(started)) == 4 and first_job in started
    finally:
        host.stop()


def test_the_command_refuses_values_out_of_range_before_any_connection():
    for args in (("--max-running", "0"), ("--page-size", "6000"), ("--prefix", "a\x01")):
        refused = subprocess.run(
            [sys.executable, "-m", "devhost", "backfill", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert refused.returncode == 2 and refused.stdout == "", refused.stderr
        assert refused.stderr.startswith("python -m devhost backfill: ") and len(refused.stderr.splitlines()) == 1


def test_a_name_no_upload_may_have_is_refused(storage, app_env):
    """A listed name the starter would refuse is counted refused, and nothing reads it."""
    create_containers(storage, app_env)
    survey = backfill_pages.survey_blobs({"container": app_env.input, "blobs": ["/rooted.tif", "dot."]}, None)
    entries = EventLoopThread.shared().run(survey)
    assert [e["kind"] for e in entries] == ["refused", "refused"]
    assert "may not start with '/'" in entries[0]["reason"]


def test_a_backfill_id_is_a_pure_function_of_what_it_lists_and_whether_it_starts():
    assert backfill_id("in", "a/", False) == backfill_id("in", "a/", False)
    ids = {backfill_id("in", "a/", False), backfill_id("in", "a/", True), backfill_id("in", "b/", False)}
    assert len(ids) == 3 and all(check_backfill_id(i) == i for i in ids)
    assert BackfillRequest("in-x", "a/", max_running=3).instance_id == backfill_id("in-x", "a/", False)
    for bad in ({"container": "In_X"}, {"prefix": "a\x00"}, {"max_running": 0}, {"page_size": 5001}, {"dry_run": 1}):
        with pytest.raises(InvalidNameError):
            BackfillRequest(**{"container": "in-x", **bad})


def test_a_page_is_taken_up_to_the_room_and_resumed_after_its_last_blob_handled():
    survey = [
        {"blob": b, "kind": k}
        for b, k in zip("abcdef", ("new", "ignored", "failed", "exists", "new", "new"), strict=True)
    ]
    assert [e["blob"] for e in within_room(survey, 2)] == ["a", "b", "c", "d"]  # d starts nothing: taken too
    assert [e["blob"] for e in within_room(survey, 0)] == []
    assert [e["blob"] for e in within_room(survey, 9)] == list("abcdef")
    assert unhandled(list("abcdef"), None) == list("abcdef")
    assert unhandled(list("abcdef"), "d") == ["e", "f"]
    assert unhandled(list("abcef"), "d") == ["e", "f"]  # "d" deleted since: by name
