"""How jobs are started again, cancelled and verified, on the local host against Azurite, with
real GeoTIFFs and the real app: a failed job is never started over a batch of its last run that
still runs; a cancel writes its row before it terminates anything; a scrub is started for a job
only, and its answer carries no key of the Durable extension."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime

import azure.durable_functions as df
import azure.functions as func
import pytest

from client_functions import job_api
from devhost.durable.functions import EventLoopThread
from devhost.session import job_summary, process_file
from devhost.verify import verify_job
from orchestrators import names
from orchestrators.batches import batch_instance_id
from testkit.storage_proxy import FaultPlan, FaultProxy
from tilecommit import retries
from tilecommit.errors import JobNotVerifiable, StorageFaultError
from tilecommit.jobs import CANCELLED_ROW_KEY
from tilecommit.manifest import count_manifest
from tilecommit.storage import StorageConnection

from .app_jobs import check_outputs, local_host, make_scene, upload
from .conftest import counter_total
from .fault_jobs import app_behind_proxy
from .test_retry_contract import blobs_of

pytestmark = pytest.mark.slow

#: The first run's failing window (batch 0) and the window whose write hangs (batch 1).
FAILING, HANGING = "0000_0000.tif", "0001_0002.tif"


def wait_until(predicate, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def run(coroutine):
    return EventLoopThread.shared().run(coroutine)


@pytest.fixture
def no_in_call_retries(monkeypatch):
    """Each storage call fails at once: the attempts are the orchestrator's alone (test_retry_contract.py)."""
    for name in ("BLOB_RETRIES", "TABLE_RETRIES", "GDAL_RETRIES"):
        monkeypatch.setattr(retries, name, 0)


@pytest.mark.parametrize("how", ["upload delivered again", "job API retry"])
def test_a_failed_job_whose_batch_still_runs_is_started_again_once_it_stopped_and_completes_once(
    storage, app_env, azurite, monkeypatch, tmp_path, no_in_call_retries, how
):
    """The first run fails (every write of one tile of batch 0 refused, past the retry policy)
    while batch 1 still runs: the write of one of its tiles hangs in storage. Started again, the
    job must not start its batch 1 while the old one runs: the new start would be dropped as a
    duplicate and the job would wait forever (docs/local-host.md, row 47). The restart stops
    that batch first; once the new run's batch 1 runs, the hanging write is let through. The job
    completes, once, each tile written once, nothing left running."""
    scene = make_scene(tmp_path / "restart.tif", 768, 512)  # 3 x 2 windows: batches of 4 and 2
    tiles_put = blobs_of(app_env, app_env.tiles, "PUT")
    refusing, hanging_released = threading.Event(), threading.Event()
    refusing.set()

    def applies(method: str, path: str) -> bool:
        if not tiles_put(method, path):
            return False
        name = path.split("?")[0]
        if name.endswith(HANGING):
            hanging_released.wait(60)  # a request storage holds until the test lets it through
            return False
        return refusing.is_set() and name.endswith(FAILING)

    with (
        app_behind_proxy(azurite, monkeypatch, FaultPlan(busy=1.0, applies=applies)),
        local_host(app_env) as host,
    ):
        try:
            job_id = process_file(host, scene, timeout=180)["job_id"]  # uploaded through the proxy
            failed = host.engine.status(job_id)
            old_batch = host.engine.status(batch_instance_id(job_id, 1))
            refusing.clear()
            dropped = host.engine.stats.duplicate_starts_dropped
            if how == "job API retry":
                client = df.DurableOrchestrationClient(host.api.client_binding())
                manifest = storage.table_service().get_table_client(app_env.manifest)
                run(job_api.retry_job(client, manifest, job_id))
            else:
                host.deliver_blob_created(scene.name)
            # The new run's batch 1 has been started: it runs (a new execution), or its start was dropped.
            wait_until(
                lambda: (
                    host.engine.stats.duplicate_starts_dropped > dropped
                    or host.engine.status(batch_instance_id(job_id, 1))["execution_id"] != old_batch["execution_id"]
                )
            )
            hanging_released.set()
            state = host.engine.wait_for(job_id, timeout=90)
        finally:
            hanging_released.set()
        family = host.engine.list_instances(prefix=f"{job_id}-")
        decisions = [d["action"] for d in host.decisions if d["blob"] == scene.name]
        stats = host.engine.stats
    assert failed["status"] == "Failed" and "still failed after" in failed["error"], failed
    assert old_batch["status"] == "Running"  # the first run failed while its batch 1 still ran
    assert state["status"] == "Completed", state
    check_outputs(storage, app_env, job_summary(state), scene)
    assert decisions == (["started", "started"] if how == "upload delivered again" else ["started"])
    assert stats.foreign_child_starts_dropped == 0
    assert [s["id"] for s in family if s["status"] in ("Pending", "Running")] == []
    assert counter_total("JobsFinished", job_id=job_id, status="completed") == 1
    assert counter_total("ConditionalWrites", job_id=job_id, gate="tile", outcome="written") == 6


def test_a_cancel_whose_row_cannot_be_written_terminates_nothing_and_called_again_cancels(
    storage, app_env, azurite, tmp_path
):
    """Cancel writes the job's cancellation row (what stops its queued tiles) before it
    terminates anything. Storage refusing that insert (403, through the proxy) fails the cancel
    with nothing terminated, so the job runs on as if never cancelled (before, the job was
    terminated first and its tiles went on, and a cancel called again found it finished); the
    same cancel called again writes the row, then terminates the job, and its tiles stop within
    a batch."""
    scene = make_scene(tmp_path / "cancel.tif", 2560, 2560)  # 10 x 10 windows of 256
    manifest = storage.table_service().get_table_client(app_env.manifest)
    batch_size = int(app_env.env["TILECOMMIT_BATCH_SIZE"])
    refuse_inserts = FaultPlan(
        busy=1.0,
        status=403,
        code="AuthorizationPermissionMismatch",
        applies=lambda method, path: method == "POST" and app_env.manifest in path,
    )
    with (
        FaultProxy(f"http://127.0.0.1:{azurite.table_port}", refuse_inserts) as tables,
        local_host(app_env) as host,
    ):
        proxied = azurite.connection_string.replace(f":{azurite.table_port}/", f":{tables.port}/")
        refused_manifest = StorageConnection.from_connection_string(proxied).table_service()
        client = df.DurableOrchestrationClient(host.api.client_binding())
        job_id = upload(storage, app_env, scene)
        wait_until(lambda: count_manifest(manifest, job_id).rows >= 4)
        with pytest.raises(StorageFaultError, match="403"):
            run(job_api.cancel_job(client, refused_manifest.get_table_client(app_env.manifest), job_id, "first try"))
        with pytest.raises(TimeoutError):
            host.engine.wait_for(job_id, timeout=1.0)  # a terminate, had one been sent, ends it within this
        answer = run(job_api.cancel_job(client, manifest, job_id, "second try"))
        at_cancel = count_manifest(manifest, job_id).rows
        state = host.engine.wait_for(job_id, timeout=120)
        wait_until(lambda: host.engine.activities.free() == host.engine.max_activities)
        time.sleep(1.0)
        stopped = count_manifest(manifest, job_id).rows
        marker = manifest.get_entity(job_id, CANCELLED_ROW_KEY)
        terminated = [e for ep in host.store.episodes(job_id) for e in ep.events if e["EventType"] == 3]
    assert tables.injected["busy"] == 1  # the one insert the first cancel sent
    assert answer == {"job_id": job_id, "state": "cancelling", "reason": "second try"}
    assert state["status"] == "Terminated" and state["output"] == "second try"
    assert len(terminated) == 1  # one terminate reached the job: the second cancel's
    # The row, then the terminate.
    assert datetime.fromisoformat(marker["cancelled_at"]) <= datetime.fromisoformat(terminated[0]["Timestamp"])
    assert at_cancel < 100 and stopped - at_cancel <= batch_size, (at_cancel, stopped)


def extension_binding(host, key: str) -> str:
    """The durableClient binding as the Durable extension hands it to the worker in Azure: its
    management URLs carry the extension's system key (``code=``)."""
    binding = json.loads(host.api.client_binding())
    query = f"taskHub={host.hub}&connection=Storage&code={key}"
    base = f"{binding['baseUrl']}instances/INSTANCEID"
    binding["managementUrls"] = {
        "id": "INSTANCEID",
        "statusQueryGetUri": f"{base}?{query}",
        "sendEventPostUri": f"{base}/raiseEvent/{{eventName}}?{query}",
        "terminatePostUri": f"{base}/terminate?reason={{text}}&{query}",
        "rewindPostUri": f"{base}/rewind?reason={{text}}&{query}",
        "purgeHistoryDeleteUri": f"{base}?{query}",
    }
    binding["requiredQueryStringParameters"] = query
    return json.dumps(binding)


def test_a_scrub_is_started_for_a_job_only_and_its_answer_holds_no_key_of_the_extension(storage, app_env, tmp_path):
    """POST /api/jobs/{id}/verify and ``devhost verify`` refuse an id that is not a job's (a batch
    of a real job among them) as an unknown job: 404. A scrub started answers its id and a status
    URL of the job API, never the extension's management URLs, which in Azure carry its system
    key; the status URL tells the scrub's state and report."""
    scene = make_scene(tmp_path / "verify.tif", 600, 300)
    with local_host(app_env) as host:
        job_id = process_file(host, scene, timeout=120)["job_id"]
        batch = batch_instance_id(job_id, 0)
        assert host.engine.status(batch)["name"] == names.RENDER_BATCH
        route = host.index.http_functions[names.VERIFY_ROUTE]
        status_route = host.index.http_functions[names.VERIFY_STATUS_ROUTE]
        binding = extension_binding(host, key="the-extensions-system-key")

        def post(job: str) -> func.HttpResponse:
            request = func.HttpRequest(
                method="POST",
                url=f"https://app.example/api/jobs/{job}/verify?code=the-callers-key",
                body=b"",
                route_params={"job_id": job},
                params={"code": "the-callers-key"},
            )
            return run(route(req=request, client=binding))

        def get(url: str) -> dict:
            job, _, verify_id = url.split("/api/jobs/", 1)[1].partition("/verify/")
            request = func.HttpRequest(
                method="GET", url=url, body=b"", route_params={"job_id": job, "verify_id": verify_id}
            )
            response = run(status_route(req=request, client=binding))
            return {"status": response.status_code, **json.loads(response.get_body())}

        refused = [post(batch), post(f"{job_id}-verify-00000000"), post("not-a-job")]
        started = post(job_id)
        body = json.loads(started.get_body())
        wait_until(lambda: get(body["status_url"])["state"] == "completed")
        scrub = get(body["status_url"])
        with pytest.raises(JobNotVerifiable):
            verify_job(host, batch, repair=False, timeout=60)  # what `python -m devhost verify` runs
        stray = get(body["status_url"].replace(job_id, "0" * 16))
    assert [r.status_code for r in refused] == [404, 404, 404]
    assert [json.loads(r.get_body())["error"]["code"] for r in refused] == ["job-not-verifiable"] * 3
    assert started.status_code == 202
    assert body == {
        "id": body["id"],
        "job_id": job_id,
        "repair": False,
        "status_url": f"https://app.example/api/jobs/{job_id}/verify/{body['id']}",
    }
    text = started.get_body().decode()
    assert "the-extensions-system-key" not in text and "the-callers-key" not in text
    assert scrub["status"] == 200 and scrub["id"] == body["id"] and scrub["report"]["reports"] == []
    assert stray["status"] == 404 and stray["error"]["code"] == "verify-not-found"
    assert not [s for s in host.engine.list_instances(prefix=f"{batch}-verify-")]  # no scrub of a batch began


def test_a_failed_job_whose_user_cancelled_it_is_not_resumed_by_its_upload_but_by_a_retry(storage, app_env, tmp_path):
    """A cancel that meets its job failing writes its row, and its terminate finds the job failed
    (the SDK accepts the 410): the job ends Failed with a cancellation row. A delivery of its
    upload does not resume it, as it would not resume a terminated job; the job API's retry does,
    and lifts the row."""
    corrupt = tmp_path / "corrupt.tif"
    corrupt.write_bytes(b"II*\x00" + b"\x00" * 100)
    manifest = storage.table_service().get_table_client(app_env.manifest)
    with local_host(app_env) as host:
        failed = process_file(host, corrupt, timeout=120)
        job_id = failed["job_id"]
        client = df.DurableOrchestrationClient(host.api.client_binding())
        run(client.terminate(job_id, "cancelled as it failed"))  # what the cancel's terminate meets: 410
        manifest.create_entity(
            {"PartitionKey": job_id, "RowKey": CANCELLED_ROW_KEY, "reason": "cancelled as it failed"}
        )
        host.deliver_blob_created(corrupt.name)
        decision = host.decisions[-1]
        still = host.engine.status(job_id)
        retried = run(job_api.retry_job(client, manifest, job_id))
        rows = {r["RowKey"] for r in manifest.query_entities(f"PartitionKey eq '{job_id}'")}
        again = host.engine.wait_for(job_id, timeout=120)
    assert failed["status"] == "failed" and still["status"] == "Failed"
    assert (decision["action"], decision["reason"]) == ("duplicate", "cancelled")
    assert retried == {"job_id": job_id, "state": "pending"} and CANCELLED_ROW_KEY not in rows
    assert again["status"] == "Failed" and again["execution_id"] != still["execution_id"]  # run again (and bad again)
