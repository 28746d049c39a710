"""A storage outage costs time, never the job: Azurite really stopped and started again on the
same folder while the local host tiles. The outputs equal a fault-free run's, byte for byte.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time

import pytest

from devhost.azurite import Azurite
from devhost.session import job_summary, process_file
from testkit.strict_storage import StrictStorage
from tests.app_jobs import AppEnv, local_host, make_scene, wait_until
from tilecommit import settings as names
from tilecommit.jobs import job_id_for
from tilecommit.manifest import count_manifest
from tilecommit.spec import OutputSpec
from tilecommit.storage import StorageConnection

pytestmark = pytest.mark.slow
OUTAGE_S = 10.0


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def outputs(connection: StorageConnection, app_env: AppEnv, job_id: str) -> dict[str, str]:
    """sha256 of every tile (by window) and of the mosaic, from the bytes stored."""
    blobs = connection.blob_service()
    tiles = blobs.get_container_client(app_env.tiles)
    found = {
        b.name.rsplit("/", 1)[-1]: sha256(tiles.download_blob(b.name).readall())
        for b in tiles.list_blobs(name_starts_with=f"tiles/{job_id}/")
    }
    mosaic = blobs.get_blob_client(app_env.output, f"mosaics/{job_id}/mosaic.tif").download_blob().readall()
    return {**found, "mosaic": sha256(mosaic)}


@pytest.fixture
def durable_azurite(tmp_path, monkeypatch, app_env):
    """An Azurite of this test's own, on a folder, so that it can be stopped and started again,
    held to Azure's rules as every test's storage is (its proxies stay up through the outage)."""
    emulator = Azurite(in_memory=False, workdir=str(tmp_path / "azurite")).start()
    try:
        with StrictStorage(emulator) as strict:
            monkeypatch.setenv(names.STORAGE_CONNECTION, strict.connection_string)
            yield strict
    finally:
        emulator.stop()


def progress(host, job_id: str) -> dict:
    return (host.engine.status(job_id) or {}).get("custom_status") or {}


#: When the outage begins: after 4 tiles, or as the mosaic's assembly starts.
STAGES = {
    "tiling": lambda status: status.get("windows_done", 0) >= 4,
    "assembly": lambda status: status.get("stage") == "assembling",
}


def stop_inside_a_commit(host, emulator: Azurite, job_prefix: list[str], which: int = 3) -> threading.Event:
    """Stop Azurite from inside the local host's ``which``-th episode commit of the job, just
    before its transaction is sent: the commit meets a stopped storage. The event is set then."""
    stopped = threading.Event()
    commit = host.engine.store.commit_episode
    seen = itertools.count(1)
    lock = threading.Lock()  # dispatchers commit concurrently (the job and its sub-orchestrations)

    def commit_episode(instance_id, episode, state):
        if job_prefix and instance_id.startswith(job_prefix[0]):
            with lock:
                if not stopped.is_set() and next(seen) == which:
                    emulator.outage()
                    stopped.set()
        return commit(instance_id, episode, state)

    host.engine.store.commit_episode = commit_episode
    return stopped


@pytest.mark.parametrize("stage", [*sorted(STAGES), "episode commit"])
def test_azurite_stopped_for_10_s_costs_time_not_the_job(durable_azurite, app_env, tmp_path, stage):
    scene = make_scene(tmp_path / "scene.tif", 1300, 1100)  # 6 x 5 = 30 windows, 8 batches of 4
    reference = tmp_path / "reference.tif"
    reference.write_bytes(scene.read_bytes())
    connection = StorageConnection.from_env()

    # Real retry intervals (5 s, 4 attempts): an activity caught by the outage is retried in time.
    with local_host(app_env, timer_scale=1.0) as host:
        baseline = process_file(host, reference, timeout=300)
        assert baseline["status"] == "completed", baseline
        executions_before = len(host.engine.executions)

        job_prefix: list[str] = []
        in_commit = stop_inside_a_commit(host, durable_azurite, job_prefix) if stage == "episode commit" else None
        blob = host.blobs.get_blob_client(host.settings.input_container, scene.name)
        with scene.open("rb") as data:
            etag = blob.upload_blob(data, overwrite=True)["etag"]
        job_id = job_id_for(blob.url, etag, OutputSpec.from_settings(host.settings))
        job_prefix.append(job_id)
        if in_commit is not None:
            assert in_commit.wait(120), "the job made no third commit"
        else:
            wait_until(lambda: STAGES[stage](progress(host, job_id)))
            durable_azurite.outage()
        during = host.engine.status(job_id)  # the host's own view: no storage call for a job it runs
        stopped = time.monotonic()
        time.sleep(OUTAGE_S)
        durable_azurite.start()
        outage_s = time.monotonic() - stopped
        state = host.engine.wait_for(job_id, timeout=300)
        finished_after_outage_s = time.monotonic() - stopped
        summary = job_summary(state)
        renders = [e for e in list(host.engine.executions)[executions_before:] if e.name == "render_tile"]
        retries = host.engine.stats.episode_retries

    assert outage_s >= OUTAGE_S
    if stage == "episode commit":
        assert retries > 0, "the commit that met the stopped storage was not tried again"
    # The outage began while the job ran (how many of the host's commits met it depends on the
    # machine's speed: on a loaded one every activity may still be waiting on storage).
    assert during["status"] in ("Running", "Pending"), during
    assert summary["status"] == "completed", summary
    manifest = count_manifest(connection.table_service().get_table_client(app_env.manifest), summary["job_id"])
    assert summary["windows"] == manifest.rows == 30
    # Nothing written twice: no window was committed by two executions.
    written = [e.result["window"] for e in renders if e.result and e.result.get("outcome") == "written"]
    assert len(written) == len(set(written))
    assert outputs(connection, app_env, summary["job_id"]) == outputs(connection, app_env, baseline["job_id"])
    print(
        f"outage {outage_s:.1f} s; job finished {finished_after_outage_s:.1f} s after the outage began; "
        f"baseline job {baseline['elapsed_s']} s; {retries} episode retries"
    )
