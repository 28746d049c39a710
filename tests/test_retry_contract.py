"""One retry contract, counted per error kind on whole jobs: an error that is not retryable runs
its activity once and fails the job with its message; a retryable fault follows the retry policy
(``tilecommit.retries.ACTIVITY_RETRY``) and, when it outlasts it, fails the job saying so.

The in-call retries (SDK clients, GDAL) are set to 0 here, so each attempt fails at once and the
attempts counted are the orchestrator's alone; retry timers run at 1/100 of their length.
"""

from __future__ import annotations

import time

import pytest

from devhost.durable.host import HostOptions, LocalHost
from devhost.session import job_summary, process_file
from orchestrators import names
from testkit.storage_proxy import FaultPlan
from tilecommit import retries

from .app_jobs import check_outputs, make_scene
from .fault_jobs import app_behind_proxy, app_storage, run_job

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def no_in_call_retries(monkeypatch):
    for name in ("BLOB_RETRIES", "TABLE_RETRIES", "GDAL_RETRIES"):
        monkeypatch.setattr(retries, name, 0)


def blobs_of(app_env, container: str, *methods: str):
    """The proxy's selector: requests for blobs of one of the app's containers, by method."""
    mine = app_storage(app_env)
    return lambda method, path: (
        mine(method, path)
        and path.split("?")[0].startswith(f"/{azurite_account(path)}/{container}/")
        and method in methods
    )


def azurite_account(path: str) -> str:
    return path.split("/")[1]


def test_a_corrupt_upload_runs_validation_once_and_fails_as_bad_input(app_env, azurite, monkeypatch, tmp_path):
    corrupt = tmp_path / "corrupt.tif"
    corrupt.write_bytes(b"II*\x00" + b"\x00" * 100)
    summary, _, _, attempts, failed = run_job(
        app_env, azurite, monkeypatch, corrupt, "corrupt.tif", FaultPlan(), timer_scale=0.01
    )
    print(f"\ncorrupt upload: attempts {dict(attempts)}, failed attempts {dict(failed)}")
    assert summary["status"] == "failed"
    assert "bad input 'corrupt.tif'" in summary["error"] and "(InvalidRasterError)" in summary["error"]
    # Validation once; then the job's failed event, once (no topic configured here: not published).
    assert attempts == {names.VALIDATE_SOURCE: 1, names.PUBLISH_JOB_EVENT: 1} and not failed


def test_storage_refusing_with_a_plain_4xx_runs_each_tile_once_and_fails_the_job(
    app_env, azurite, monkeypatch, tmp_path
):
    scene = make_scene(tmp_path / "scene.tif", 300, 260)  # 2 x 2 windows
    plan = FaultPlan(
        busy=1.0, status=403, code="AuthorizationPermissionMismatch", applies=blobs_of(app_env, app_env.tiles, "PUT")
    )
    summary, blobs, _, attempts, failed = run_job(
        app_env, azurite, monkeypatch, scene, "forbidden.tif", plan, timer_scale=0.01
    )
    print(f"\n403 on tile writes: injected {dict(blobs.injected)}; attempts {dict(attempts)}, failed {dict(failed)}")
    assert summary["status"] == "failed"
    assert "failed, not retryable" in summary["error"] and "403" in summary["error"]
    assert attempts[names.RENDER_TILE] == summary["windows"] == 4 and not failed
    assert names.ASSEMBLE_MOSAIC not in attempts


def test_a_retryable_fault_follows_the_policy_then_fails_the_job_saying_storage_stayed_unavailable(
    app_env, azurite, monkeypatch, tmp_path
):
    scene = make_scene(tmp_path / "scene.tif", 300, 260)
    # Every read of the upload's bytes (GDAL's ranged GETs) refused; the starter's and the
    # activity's HEADs answered, so the job starts and validation fails in its read.
    plan = FaultPlan(busy=1.0, applies=blobs_of(app_env, app_env.input, "GET"))
    summary, blobs, _, attempts, failed = run_job(
        app_env, azurite, monkeypatch, scene, "busy.tif", plan, timer_scale=0.01
    )
    print(f"\n503 on the upload: injected {dict(blobs.injected)}; attempts {dict(attempts)}, failed {dict(failed)}")
    policy = retries.ACTIVITY_RETRY
    assert failed == {names.VALIDATE_SOURCE: policy.max_attempts}
    assert attempts == {names.VALIDATE_SOURCE: policy.max_attempts, names.PUBLISH_JOB_EVENT: 1}
    assert summary["status"] == "failed"
    assert f"still failed after {policy.max_attempts} attempts" in summary["error"]
    assert "storage stayed unavailable or throttled" in summary["error"] and "bad input" not in summary["error"]


def test_a_failed_job_delivered_again_completes_and_a_completed_one_stays_untouched(
    storage, app_env, azurite, monkeypatch, tmp_path
):
    """The first execution exhausts its retries on one tile (its writes refused 503), leaving
    the other tiles, their manifest rows and its sub-orchestrations behind; the upload delivered
    again re-runs the job, which completes without rewriting any of them. Delivered once more,
    the completed job is left alone."""
    scene = make_scene(tmp_path / "rerun.tif", 300, 260)  # windows 0000_0000 .. 0001_0001
    tiles = blobs_of(app_env, app_env.tiles, "PUT")
    plan = FaultPlan(busy=1.0, applies=lambda method, path: tiles(method, path) and "0001_0001.tif" in path)
    # The host is built inside: its connection, like the app's, goes through the proxies.
    with (
        app_behind_proxy(azurite, monkeypatch, plan) as (blobs, _),
        LocalHost(HostOptions(hub=app_env.hub, timer_scale=0.01, watch_interval=0.1)) as host,
    ):
        first = process_file(host, scene, timeout=300)
        left_behind = tile_etags(storage, app_env, first["job_id"])
        plan.busy = 0.0
        host.deliver_blob_created(scene.name)
        rerun = job_summary(host.engine.wait_for(first["job_id"], timeout=300))
        done = {**tile_etags(storage, app_env, first["job_id"]), "mosaic": mosaic_etag(storage, app_env, rerun)}
        executions = len(host.engine.executions)
        host.deliver_blob_created(scene.name)
        time.sleep(2)  # anything a start would schedule runs at once here (timers at 1/100)
        again = host.engine.status(first["job_id"])
        after = {**tile_etags(storage, app_env, first["job_id"]), "mosaic": mosaic_etag(storage, app_env, rerun)}
        decisions = [d["action"] for d in host.decisions]
        executions_after = len(host.engine.executions)
    print(
        f"\nfirst: {first['status']} ({first.get('error', '')[:120]}); rerun: {rerun['status']}, {rerun['written']} "
        f"written, {rerun['already_present']} already present; injected {dict(blobs.injected)}; starts {decisions}"
    )
    assert first["status"] == "failed" and "still failed after" in first["error"]
    assert sorted(left_behind) == ["0000_0000.tif", "0000_0001.tif", "0001_0000.tif"]
    check_outputs(storage, app_env, rerun, scene)
    assert rerun["written"] == 1 and rerun["already_present"] == 3
    assert {k: v for k, v in done.items() if k in left_behind} == left_behind, "a tile was rewritten"
    assert decisions == ["started", "started", "duplicate"]
    assert again["status"] == "Completed" and after == done and executions_after == executions


def tile_etags(storage, app_env, job_id: str) -> dict[str, str]:
    container = storage.blob_service().get_container_client(app_env.tiles)
    return {b.name.rsplit("/", 1)[-1]: b.etag for b in container.list_blobs(name_starts_with=f"tiles/{job_id}/")}


def mosaic_etag(storage, app_env, summary: dict) -> str:
    blob = storage.blob_service().get_blob_client(app_env.output, f"mosaics/{summary['job_id']}/mosaic.tif")
    return blob.get_blob_properties().etag
