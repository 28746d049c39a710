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

from client_functions import retention
from devhost.durable.functions import EventLoopThread
from devhost.session import process_file
from orchestrators import names
from tilecommit import gates
from tilecommit.manifest import count_manifest

from .app_jobs import check_outputs, download, local_host, make_scene, upload
from .conftest import counter_total
from .test_cli import run_cli

pytestmark = pytest.mark.slow

PRODUCTS = ("mosaic.tif", "item.json", "quicklook.png")


def products(storage, app_env, job_id: str) -> dict[str, bytes]:
    return {name: download(storage, app_env.output, f"mosaics/{job_id}/{name}") for name in PRODUCTS}


def tile_names(storage, app_env, job_id: str) -> list[str]:
    container = storage.blob_service().get_container_client(app_env.tiles)
    return [b.name for b in container.list_blobs(name_starts_with=f"tiles/{job_id}/")]


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
