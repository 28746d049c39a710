"""Retention against the local host: the sweep purges a finished job's tiles, manifest rows and
history and keeps its mosaic, STAC item and quicklook; a running job is untouched; a re-run
renders the tiles again and meets the same mosaic bytes. Also the timer function's binding and
its setting (0 keeps everything)."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta

import azure.durable_functions as df
import pytest
from azure.functions.timer import TimerRequest

from client_functions import job_api, retention
from devhost.durable.functions import EventLoopThread
from devhost.session import job_summary, process_file
from orchestrators import names
from tilecommit import gates
from tilecommit import settings as setting_names
from tilecommit.errors import JobApiError
from tilecommit.manifest import count_manifest
from tilecommit.storage import StorageConnection

from .app_jobs import check_outputs, download, local_host, make_scene, upload
from .conftest import counter_total
from .test_cli import run_cli
from .test_split_jobs import HookedProxy

pytestmark = pytest.mark.slow

PRODUCTS = ("mosaic.tif", "item.json", "quicklook.png")


def products(storage, app_env, job_id: str) -> dict[str, bytes]:
    return {name: download(storage, app_env.output, f"mosaics/{job_id}/{name}") for name in PRODUCTS}


def tile_names(storage, app_env, job_id: str) -> list[str]:
    container = storage.blob_service().get_container_client(app_env.tiles)
    return [b.name for b in container.list_blobs(name_starts_with=f"tiles/{job_id}/")]


def family_running(client, job_id: str) -> list[str]:
    """The job's batches, groups and scrubs that have not finished, as the sweep lists them."""
    family = EventLoopThread.shared().run(job_api.instances(client, instanceIdPrefix=f"{job_id}-"))
    return [i.instance_id for i in family if i.runtime_status not in job_api.FINISHED]


def wait(predicate, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_a_sweep_purges_finished_jobs_keeps_their_products_spares_a_running_one(storage, app_env, tmp_path):
    finished_scene = make_scene(tmp_path / "done.tif", 600, 300)  # 3 x 2 windows
    running_scene = make_scene(tmp_path / "busy.tif", 2048, 2048)  # 64 windows
    tables, blobs = storage.table_service(), storage.blob_service()
    manifest, tiles = tables.get_table_client(app_env.manifest), blobs.get_container_client(app_env.tiles)
    with local_host(app_env) as host:
        summary = process_file(host, finished_scene, timeout=120)
        job = summary["job_id"]
        kept = products(storage, app_env, job)
        children = [s["id"] for s in host.engine.list_instances(prefix=f"{job}-")]
        assert children and len(tile_names(storage, app_env, job)) == 6

        busy = upload(storage, app_env, running_scene)
        wait(lambda: count_manifest(manifest, busy).rows >= 4)
        client = df.DurableOrchestrationClient(host.api.client_binding())
        report = EventLoopThread.shared().run(retention.sweep(client, manifest, tiles, older_than=timedelta(0)))
        busy_rows = count_manifest(manifest, busy).rows

        assert report["jobs"] == [job] and report["rows"] == 6 and report["tiles"] == 6, report
        assert report["instances"] == len(children) + 1
        assert tile_names(storage, app_env, job) == [] and count_manifest(manifest, job).rows == 0
        assert all(host.engine.status(i) is None for i in [job, *children])
        assert products(storage, app_env, job) == kept

        assert busy_rows >= 4 and host.engine.status(busy)["status"] in ("Running", "Pending")
        busy_state = host.engine.wait_for(busy, timeout=300)
        assert busy_state["status"] == "Completed" and busy_state["output"]["written"] == 64

        # The upload delivered again: no job under its id any more, so it runs from the start.
        mismatches = counter_total("ConditionalWriteContentMismatch", gate="mosaic")
        host.deliver_blob_created(finished_scene.name)
        again = host.engine.wait_for(job, timeout=120)
    assert again["status"] == "Completed" and again["output"]["written"] == 6  # every tile rendered again
    assert again["output"]["mosaic_outcome"] == str(gates.Outcome.ALREADY_PRESENT)
    assert counter_total("ConditionalWriteContentMismatch", gate="mosaic") == mismatches  # same bytes
    assert products(storage, app_env, job) == kept
    check_outputs(storage, app_env, {"status": "completed", "windows": 6, "job_id": job}, finished_scene)


def test_the_timer_function_keeps_everything_at_zero_and_sweeps_past_the_retention(
    storage, app_env, tmp_path, monkeypatch
):
    scene = make_scene(tmp_path / "scene.tif", 300, 260)
    with local_host(app_env) as host:
        job = process_file(host, scene, timeout=120)["job_id"]
        timer = host.index.timer_functions[names.RETENTION_SWEEP]
        bindings = host.index.raw_bindings[names.RETENTION_SWEEP]
        trigger = next(b for b in bindings if b["type"] == "timerTrigger")
        assert trigger["schedule"] == "0 30 3 * * *"

        def fire() -> None:  # as the worker invokes it: a TimerRequest and the durableClient JSON
            EventLoopThread.shared().run(timer(timer=TimerRequest(past_due=False), client=host.api.client_binding()))

        monkeypatch.setenv("TILECOMMIT_TILE_RETENTION_DAYS", "0")
        fire()
        assert host.engine.status(job)["status"] == "Completed"  # 0: kept forever
        monkeypatch.setenv("TILECOMMIT_TILE_RETENTION_DAYS", "7")
        fire()
        assert host.engine.status(job)["status"] == "Completed"  # finished seconds ago: within the week
        assert len(tile_names(storage, app_env, job)) == 4

    env = {**os.environ, **app_env.env}
    swept = run_cli(env, "purge", "--older-than", "0", "--hub", app_env.hub)
    assert swept.returncode == 0, swept.stderr
    assert json.loads(swept.stdout)["jobs"] == [job]
    assert tile_names(storage, app_env, job) == []
    assert run_cli(env, "purge", "--older-than", "-1").returncode == 2


def test_a_sweep_deletes_the_staging_plans_of_a_mosaic_made_in_shares(storage, app_env, tmp_path, monkeypatch):
    """A mosaic staged in shares leaves its plans under ``plans/{job}/`` in the tiles container
    (TILECOMMIT_ASSEMBLY_SHARE_MB=1 stages the 1100 x 800 scene's 3.6 MB of tiles in shares):
    intermediate data, swept with the tiles."""
    monkeypatch.setenv(setting_names.SETTING_ASSEMBLY_SHARE, "1")
    scene = make_scene(tmp_path / "shares.tif", 1100, 800)
    tables, blobs = storage.table_service(), storage.blob_service()
    manifest, tiles = tables.get_table_client(app_env.manifest), blobs.get_container_client(app_env.tiles)
    with local_host(app_env) as host:
        job = process_file(host, scene, timeout=180)["job_id"]
        plans = [b.name for b in tiles.list_blobs(name_starts_with=f"plans/{job}/")]
        client = df.DurableOrchestrationClient(host.api.client_binding())
        report = EventLoopThread.shared().run(retention.sweep(client, manifest, tiles, older_than=timedelta(0)))
    assert plans, "the mosaic was not staged in shares: nothing is shown"
    assert report["jobs"] == [job] and report["plans"] == len(plans) and report["tiles"] == 20
    # Its coarse levels' reduction tree: two nodes of two levels, then one (1100 x 800 in 256).
    assert report["levels"] == 3 and report["rows"] == 20 + 3
    assert list(tiles.list_blobs(name_starts_with=f"plans/{job}/")) == []
    assert list(tiles.list_blobs(name_starts_with=f"levels/{job}/")) == []
    assert tile_names(storage, app_env, job) == [] and count_manifest(manifest, job).rows == 0


@pytest.mark.parametrize("restart", ["the job API's retry", "a start that looked before the sweep's row"])
def test_a_job_started_again_while_the_sweep_deletes_its_tiles_loses_nothing_it_wrote(
    storage, app_env, azurite, tmp_path, restart
):
    """A cancelled job is swept; as the sweep deletes its first tile (the tiles' requests go
    through a proxy that runs the restart right then, before the sweep hears back), the job is
    started again. The job API's retry is refused (``job-being-swept``: the sweep's cancellation
    row is there), and the sweep finishes. A start that read no row just before the sweep wrote
    it renders nothing while the row is there; the sweep sees the job changed, keeps its history
    and removes the row. Either way no row names a tile that is gone, and the job, delivered or
    retried again, completes with every tile."""
    scene = make_scene(tmp_path / "swept.tif", 1536, 1536)  # 36 windows
    tables = storage.table_service()
    manifest = tables.get_table_client(app_env.manifest)
    outcome: dict = {}
    with local_host(app_env) as host:
        client = df.DurableOrchestrationClient(host.api.client_binding())
        job = upload(storage, app_env, scene)
        wait(lambda: count_manifest(manifest, job).rows >= 4)
        EventLoopThread.shared().run(job_api.cancel_job(client, manifest, job, "to be swept"))
        host.engine.wait_for(job, timeout=120)
        # Swept only once nothing of it runs: a batch the job started just before its cancel, and
        # which the cancel's one look did not see yet, runs on until its windows all refuse.
        wait(lambda: not family_running(client, job))
        wait(lambda: host.engine.activities.free() == host.engine.max_activities)
        cancelled = host.engine.status(job)

        def start_again() -> None:
            try:
                if restart == "the job API's retry":
                    outcome["answer"] = EventLoopThread.shared().run(job_api.retry_job(client, manifest, job))
                else:
                    status = EventLoopThread.shared().run(client.get_status(job, show_input=True))
                    EventLoopThread.shared().run(client.start_new(names.TILE_SCENE, job, status.input_))
                    outcome["answer"] = "started"
            except JobApiError as exc:
                outcome["refused"] = exc.code

        first_tile_deleted = HookedProxy(
            f"http://127.0.0.1:{azurite.blob_port}",
            when=lambda method, path: method == "DELETE" and f"/tiles/{job}/" in path,
            then=start_again,
        )
        with first_tile_deleted:
            proxied = azurite.connection_string.replace(f":{azurite.blob_port}/", f":{first_tile_deleted.port}/")
            tiles = StorageConnection.from_connection_string(proxied).blob_service().get_container_client(app_env.tiles)
            report = EventLoopThread.shared().run(retention.sweep(client, manifest, tiles, older_than=timedelta(0)))
        assert report["kept_running"] == [], (report, outcome)
        if restart == "the job API's retry":
            restarted = None
            assert (report["jobs"], outcome) == ([job], {"refused": "job-being-swept"}), report
            assert host.engine.status(job) is None  # swept: the job is gone
            host.deliver_blob_created(scene.name)  # delivered again: a job from scratch
        else:
            restarted = host.engine.wait_for(job, timeout=120)
            orphans = [
                r["RowKey"]
                for r in manifest.query_entities(f"PartitionKey eq '{job}' and RowKey lt '~'")
                if f"{r['RowKey']}.tif" not in {n.rsplit("/", 1)[-1] for n in tile_names(storage, app_env, job)}
            ]
            assert orphans == [], "a row names a tile the sweep deleted"
            if restarted["status"] != "Completed":
                EventLoopThread.shared().run(job_api.retry_job(client, manifest, job))
        final = host.engine.wait_for(job, timeout=180)
    assert cancelled["status"] == "Terminated"
    if restart == "the job API's retry":
        assert outcome == {"refused": "job-being-swept"}
        assert report["jobs"] == [job] and report["kept_restarted"] == []
    else:
        assert outcome == {"answer": "started"}
        assert report["jobs"] == [] and report["kept_restarted"] == [job]
        assert restarted["status"] in ("Completed", "Failed")
    check_outputs(storage, app_env, job_summary(final), scene)
