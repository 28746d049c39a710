"""Storage faults cost time, never the job: whole jobs on the local host with the app's storage
traffic (SDK clients and GDAL's /vsiaz/ reads) going through the fault-injecting proxy.

The local host reaches Azurite through the same proxies, but faults are injected only into the
app's containers and manifest table (and never into the local host's listing of the input
container, which plays Event Grid): faults in the host's own store are the host's concern. Each faulty run is compared with a fault-free run of the same
scene: every tile and the mosaic byte for byte (sha256), and nothing written twice.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from pathlib import Path

import pytest

from orchestrators import names
from testkit.storage_proxy import FaultPlan, FaultProxy
from tilecommit.retries import ACTIVITY_RETRY

from .app_jobs import AppEnv, check_outputs, download, make_scene
from .fault_jobs import app_storage, run_job

pytestmark = pytest.mark.slow


def stored_hashes(storage, app_env: AppEnv, job_id: str) -> dict[str, str]:
    """sha256 of every tile (by window) and of the mosaic, as stored."""
    container = storage.blob_service().get_container_client(app_env.tiles)
    hashes = {
        b.name.rsplit("/", 1)[-1]: hashlib.sha256(download(storage, app_env.tiles, b.name)).hexdigest()
        for b in container.list_blobs(name_starts_with=f"tiles/{job_id}/")
    }
    hashes["mosaic"] = hashlib.sha256(download(storage, app_env.output, f"mosaics/{job_id}/mosaic.tif")).hexdigest()
    return hashes


def writes_carried_out(blobs: FaultProxy, job_id: str) -> Counter:
    """How many times storage created each of the job's blobs (a tile's put, the mosaic's block list)."""
    created = Counter()
    for method, path, status in blobs.carried_out:
        if method == "PUT" and status == 201 and job_id in path and "comp=block&" not in path + "&":
            created[path.split("?", 1)[0]] += 1
    return created


@pytest.fixture
def scene(tmp_path) -> Path:
    return make_scene(tmp_path / "scene.tif", 700, 520)  # 3 x 3 windows of 256


@pytest.fixture
def reference(storage, app_env, azurite, monkeypatch, scene) -> dict[str, str]:
    """The fault-free run of the same scene (through the proxy, nothing injected)."""
    summary, *_ = run_job(app_env, azurite, monkeypatch, scene, "reference.tif", FaultPlan(), timer_scale=0.01)
    check_outputs(storage, app_env, summary, scene)
    print(f"\nfault-free run: elapsed {summary['elapsed_s']} s")
    return stored_hashes(storage, app_env, summary["job_id"])


def check_faulty_run(storage, app_env, scene, reference, summary, blobs, tables, attempts, failed, what: str) -> None:
    check_outputs(storage, app_env, summary, scene)
    assert stored_hashes(storage, app_env, summary["job_id"]) == reference
    created = writes_carried_out(blobs, summary["job_id"])
    assert created and set(created.values()) == {1}, f"written more than once: {created}"
    injected = blobs.injected + tables.injected
    print(
        f"\n{what}: injected {dict(injected)} over {len(blobs.requests) + len(tables.requests)} requests; "
        f"elapsed {summary['elapsed_s']} s; activity attempts {dict(attempts)}, failed attempts {dict(failed)}; "
        f"tiles written {summary['written']}, already present {summary['already_present']}"
    )


def test_a_throttled_account_costs_time_not_the_job(storage, app_env, azurite, monkeypatch, scene, reference):
    """20 % of the app's blob and table requests answered 503 ServerBusy (Retry-After: 1), the
    whole job long: the state that made a job fail as "bad input"."""
    plan = FaultPlan(busy=0.2, applies=app_storage(app_env))
    summary, blobs, tables, attempts, failed = run_job(
        app_env, azurite, monkeypatch, scene, "throttled.tif", plan, timer_scale=0.01
    )
    check_faulty_run(storage, app_env, scene, reference, summary, blobs, tables, attempts, failed, "20 % ServerBusy")
    assert blobs.injected["busy"] + tables.injected["busy"] >= 10


def test_a_45_second_outage_in_the_middle_of_a_job_costs_time_not_the_job(
    storage, app_env, azurite, monkeypatch, scene, reference
):
    """Every request of the app fails for 45 s, starting when the first tile has been written;
    the orchestrator's retry timers run at their real length."""
    plan = FaultPlan(applies=app_storage(app_env))
    outage = {}

    def after_first_tile(blobs: FaultProxy) -> None:
        while not any(m == "PUT" and "/tiles/" in p for m, p, _ in list(blobs.carried_out)):
            time.sleep(0.05)
        blobs.start_outage(45)
        outage["started"] = time.monotonic()

    summary, blobs, tables, attempts, failed = run_job(
        app_env, azurite, monkeypatch, scene, "outage.tif", plan, timer_scale=1.0, during=after_first_tile
    )
    check_faulty_run(storage, app_env, scene, reference, summary, blobs, tables, attempts, failed, "45 s outage")
    # The outage hits whichever requests fall inside it: a render_tile attempt reads its manifest
    # row (tables) before it reads the upload (blobs), so it may fail on the table alone.
    assert "started" in outage and blobs.injected["outage"] + tables.injected["outage"] > 0
    assert sum(failed.values()) > 0, "the outage failed no attempt: it did not hit the job"
    assert max(attempts[n] for n in (names.RENDER_TILE, names.ASSEMBLE_MOSAIC)) > 1
    assert all(count <= ACTIVITY_RETRY.max_attempts * 9 for count in attempts.values())


def test_connections_reset_mid_upload_and_lost_answers_cost_time_not_the_job(
    storage, app_env, azurite, monkeypatch, scene, reference
):
    """The first upload of every blob is cut half-way through its body, and 10 % of the other
    requests are reset, half before storage sees them and half after it has carried them out
    (the answer is lost, so the client retries a write that already happened)."""
    plan = FaultPlan(reset=0.1, reset_uploads=True, applies=app_storage(app_env))
    summary, blobs, tables, attempts, failed = run_job(
        app_env, azurite, monkeypatch, scene, "resets.tif", plan, timer_scale=0.01
    )
    check_faulty_run(storage, app_env, scene, reference, summary, blobs, tables, attempts, failed, "resets")
    assert blobs.injected["reset-mid-upload"] >= summary["windows"]
    assert blobs.injected["reset-after"] + tables.injected["reset-after"] > 0


def test_lost_answers_to_the_hosts_own_commits_cost_nothing(storage, app_env, azurite, monkeypatch, scene, reference):
    """Half of the local host's episode commits (its table transactions) are carried out by
    storage and then their connection is reset: the answer is lost, the host tries again, finds
    the episode committed and carries on from what storage holds. Nothing runs or is written
    twice."""
    plan = FaultPlan(reset=0.5, reset_when="after", applies=lambda method, path: method == "POST" and "$batch" in path)
    seen = {}

    def inspect(host) -> None:
        seen["found_committed"] = host.engine.stats.episodes_found_committed

    summary, blobs, tables, attempts, failed = run_job(
        app_env, azurite, monkeypatch, scene, "lost-commits.tif", plan, timer_scale=0.01, inspect=inspect
    )
    check_faulty_run(storage, app_env, scene, reference, summary, blobs, tables, attempts, failed, "lost commits")
    assert tables.injected["reset-after"] > 0 and tables.injected["reset-before"] == 0
    assert seen["found_committed"] > 0
    # Every activity ran once: no episode's decisions were sent twice.
    assert not failed and attempts[names.RENDER_TILE] == summary["windows"]
