"""End to end through the local host on Azurite: upload -> job -> tiles -> manifest -> mosaic.

The real registered functions run through the real Durable SDK; storage is Azurite; rasters
are real GeoTIFFs. Each test gets its own containers, tables and task hub.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from rasterio.io import MemoryFile

from devhost.session import job_summary, process_file
from orchestrators import names as orchestrator_names
from testkit.metrics import max_overlap, slot_use
from testkit.storage_proxy import RecordingProxy, TrapServer
from tilecommit import settings as names
from tilecommit.jobs import Job, job_id_for
from tilecommit.manifest import count_manifest
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec

from .app_jobs import (
    AppEnv,
    check_outputs,
    download,
    local_host,
    make_scene,
    serve_until_finished,
    upload_until_killed,
)
from .hostile import MARKER, local_vectors, make_secret_raw, make_secret_tif, network_vectors, vrt, write

pytestmark = pytest.mark.slow


def tile_hashes(storage, app_env: AppEnv, job_id: str) -> dict[str, tuple[str, str]]:
    container = storage.blob_service().get_container_client(app_env.tiles)
    return {
        b.name: (b.etag, b.metadata.get("sha256"))
        for b in container.list_blobs(name_starts_with=f"tiles/{job_id}/", include=["metadata"])
    }


def test_upload_becomes_tiles_manifest_and_a_mosaic_equal_to_the_source(storage, app_env, tmp_path):
    scene = make_scene(tmp_path / "scene.tif", 1000, 700)  # 4 x 3 windows of 256
    with local_host(app_env) as host:
        summary = process_file(host, scene, timeout=120)
        failures = host.engine.stats.activity_failures
    check_outputs(storage, app_env, summary, scene)
    assert summary["written"] == 12 and summary["already_present"] == 0
    assert summary["mosaic_outcome"] == "written"
    assert failures == 0


def test_same_upload_delivered_three_times_concurrently_makes_one_job(storage, app_env, tmp_path):
    """As on the Azure Storage provider, starters racing on the new job id may all succeed (the
    host drops the later ExecutionStarted) or see the job and report a duplicate."""
    scene = make_scene(tmp_path / "scene.tif", 600, 600)
    with local_host(app_env, deliveries=3) as host:
        summary = process_file(host, scene, timeout=120)
        starts = [d["action"] for d in host.decisions]
        jobs = {s["id"] for s in host.store.instances() if "-batch-" not in s["id"]}
        dropped = host.engine.stats.duplicate_starts_dropped
        renders = [e for e in host.engine.executions if e.name == "render_tile"]
        job_history = [e for ep in host.store.episodes(summary["job_id"]) for e in ep.events]
    check_outputs(storage, app_env, summary, scene)
    assert len(starts) == 3 and set(starts) <= {"started", "duplicate"} and "started" in starts
    assert dropped == starts.count("started") - 1
    assert jobs == {summary["job_id"]}
    assert [e["EventType"] for e in job_history].count(0) == 1  # one ExecutionStarted: the job ran once
    assert summary["written"] == summary["windows"] == len(renders) and summary["already_present"] == 0


def test_every_activity_twice_yields_one_written_per_tile(storage, app_env, tmp_path):
    scene = make_scene(tmp_path / "scene.tif", 700, 520)
    with local_host(app_env, duplicate_activities=True) as host:
        summary = process_file(host, scene, timeout=120)
        host.engine.activities.drain()  # let the second copies finish before counting
        executions = [e for e in host.engine.executions if e.name == "render_tile"]
        failed = host.engine.stats.activity_failures
    check_outputs(storage, app_env, summary, scene)
    windows = summary["windows"]
    assert len(executions) == 2 * windows and failed == 0
    by_window: dict[str, list[str]] = {}
    for execution in executions:
        by_window.setdefault(execution.result["window"], []).append(execution.result["outcome"])
    assert len(by_window) == windows
    assert all(sorted(outcomes) == ["already-present", "written"] for outcomes in by_window.values()), by_window


def test_processing_the_same_blob_again_writes_nothing_new(storage, app_env, tmp_path):
    scene = make_scene(tmp_path / "scene.tif", 520, 300)
    with local_host(app_env) as host:
        summary = process_file(host, scene, timeout=120)
        before = tile_hashes(storage, app_env, summary["job_id"])
        mosaic_etag = (
            storage.blob_service()
            .get_blob_client(app_env.output, f"mosaics/{summary['job_id']}/mosaic.tif")
            .get_blob_properties()
            .etag
        )
        executions = len(host.engine.executions)
        assert host.deliver_blob_created("scene.tif") == 1
        decision = host.decisions[-1]
    assert decision["action"] == "duplicate" and decision["job_id"] == summary["job_id"]
    assert len(host.engine.executions) == executions  # nothing ran
    assert tile_hashes(storage, app_env, summary["job_id"]) == before
    assert (
        storage.blob_service()
        .get_blob_client(app_env.output, f"mosaics/{summary['job_id']}/mosaic.tif")
        .get_blob_properties()
        .etag
        == mosaic_etag
    )


def test_corrupt_upload_fails_its_job_writes_nothing_and_the_next_upload_works(storage, app_env, tmp_path):
    good = make_scene(tmp_path / "good.tif", 400, 300)
    bad = tmp_path / "bad.tif"
    bad.write_bytes(good.read_bytes()[:2000])  # a truncated TIFF
    with local_host(app_env) as host:
        failed = process_file(host, bad, timeout=120)
        ok = process_file(host, good, timeout=120)
    assert failed["status"] == "failed"
    assert "bad.tif" in failed["error"] and "bad input" in failed["error"]
    assert tile_hashes(storage, app_env, failed["job_id"]) == {}
    table = storage.table_service().get_table_client(app_env.manifest)
    assert count_manifest(table, failed["job_id"]).rows == 0
    check_outputs(storage, app_env, ok, good)


def test_tiling_keeps_every_activity_slot_busy_on_the_extensions_replay_order(storage, app_env, tmp_path):
    """8 batches of 4 windows: every batch is started at once, so the 4 slots stay busy from the
    first tile to the last (a sliding window of batches left them idle at every batch's tail)."""
    scene = make_scene(tmp_path / "scene.tif", 1300, 1100)  # 6 x 5 = 30 windows
    with local_host(app_env) as host:
        summary = process_file(host, scene, timeout=180)
        renders = [e for e in host.engine.executions if e.name == "render_tile"]
        slots = host.engine.max_activities
    check_outputs(storage, app_env, summary, scene)
    assert len(renders) == 30 and max_overlap(renders) == slots == 4
    assert slot_use(renders, slots) > 0.85


def test_a_scene_with_more_batches_than_a_group_runs_through_groups(storage, app_env, tmp_path, monkeypatch):
    monkeypatch.setenv(names.SETTING_BATCH_SIZE, "1")  # 30 batches of one window: two groups
    scene = make_scene(tmp_path / "scene.tif", 1300, 1100)
    with local_host(app_env) as host:
        summary = process_file(host, scene, timeout=180)
        ids = {s["id"] for s in host.store.instances()}
    check_outputs(storage, app_env, summary, scene)
    assert {i for i in ids if "-group-" in i} == {f"{summary['job_id']}-group-0000", f"{summary['job_id']}-group-0001"}
    assert len([i for i in ids if "-batch-" in i]) == 30 and summary["written"] == 30


def tile_shapes(storage, app_env: AppEnv, job_id: str) -> dict[str, tuple[int, int, int]]:
    """Each tile of the job: (width, height, internal overview levels), by window id."""
    container = storage.blob_service().get_container_client(app_env.tiles)
    shapes = {}
    for blob in container.list_blobs(name_starts_with=f"tiles/{job_id}/"):
        with MemoryFile(download(storage, app_env.tiles, blob.name)) as memory, memory.open() as tile:
            shapes[blob.name.rsplit("/", 1)[1].removesuffix(".tif")] = (
                tile.width,
                tile.height,
                len(tile.overviews(1)),
            )
    return shapes


def test_a_job_keeps_the_window_size_it_started_with_and_another_size_is_another_job(storage, app_env, tmp_path):
    """The workers' TILECOMMIT_WINDOW_SIZE says 256 throughout. The upload delivered there is a job
    of 256-px windows; the same upload started with 512 (the payload a starter whose settings said
    512 makes) is another job, with its own id and keys, and renders 512-px windows on the same
    workers; neither reuses a manifest row of the other."""
    scene = make_scene(tmp_path / "scene.tif", 1000, 700)  # 4 x 3 windows of 256, 2 x 2 of 512
    with local_host(app_env) as host:
        at_256 = process_file(host, scene, timeout=120)
        blob = host.blobs.get_blob_client(app_env.input, scene.name)
        props = blob.get_blob_properties()
        job = Job.for_upload(scene.name, blob.url, props.etag, props.size, Settings(window_size=512)).to_dict()
        host.engine.start_new(orchestrator_names.TILE_SCENE, job["job_id"], job)
        state = host.engine.wait_for(job["job_id"], timeout=120)
    at_512 = job_summary(state)
    assert os.environ[names.SETTING_WINDOW_SIZE] == "256"
    assert at_512["job_id"] == job_id_for(blob.url, props.etag, OutputSpec(window_size=512)) != at_256["job_id"]
    assert (at_256["status"], at_512["status"]) == ("completed", "completed"), (at_256, at_512)
    assert at_256["spec"]["window_size"] == 256 and at_512["spec"]["window_size"] == 512
    assert (at_256["written"], at_512["written"]) == (12, 4) and at_512["already_present"] == 0
    # A 512-px window keeps one overview level the mosaic reuses (256 px); a 256-px one none.
    assert tile_shapes(storage, app_env, at_512["job_id"]) == {
        "0000_0000": (512, 512, 1),
        "0000_0001": (488, 512, 1),
        "0001_0000": (512, 188, 1),
        "0001_0001": (488, 188, 1),
    }
    assert set(tile_shapes(storage, app_env, at_256["job_id"]).values()) == {
        (256, 256, 0),
        (232, 256, 0),
        (256, 188, 0),
        (232, 188, 0),
    }
    table = storage.table_service().get_table_client(app_env.manifest)
    assert count_manifest(table, at_256["job_id"]).rows == 12 and count_manifest(table, at_512["job_id"]).rows == 4
    for summary in (at_256, at_512):
        check_outputs(storage, app_env, summary, scene, window=summary["spec"]["window_size"])
        item = json.loads(download(storage, app_env.output, f"mosaics/{summary['job_id']}/item.json"))
        assert item["properties"]["tilecommit:spec"] == summary["spec"]


# ---------------------------------------------------------------------- crash and resume


def killed_before_row(n: int) -> tuple[str, ...]:
    """A ``python -m devhost`` that kills itself before its n-th manifest row (tests/crashing_host.py)."""
    return ("tests.crashing_host", str(n), "--")


def test_killed_between_tile_commit_and_manifest_row_resumes_to_identical_outputs(storage, app_env, tmp_path):
    scene = make_scene(tmp_path / "scene.tif", 1100, 800)  # 5 x 4 = 20 windows
    log = tmp_path / "serve.log"
    job_id = upload_until_killed(storage, app_env, scene, log, module=killed_before_row(6))
    tiles_at_crash = tile_hashes(storage, app_env, job_id)
    table = storage.table_service().get_table_client(app_env.manifest)
    rows_at_crash = count_manifest(table, job_id).rows
    # The kill came at the 6th row; rows 1-5 may still have been in flight on other threads.
    assert 1 <= rows_at_crash <= 5 and len(tiles_at_crash) > rows_at_crash  # a tile without its row

    state = serve_until_finished(storage, app_env, log, job_id)
    assert state["status"] == "Completed", state
    final = tile_hashes(storage, app_env, job_id)
    # Tiles committed before the crash were not rewritten: same ETag, same checksum.
    assert all(final[name] == value for name, value in tiles_at_crash.items())
    assert len(final) == 20 and count_manifest(table, job_id).rows == 20
    summary = {"status": "completed", "job_id": job_id, "windows": 20}
    check_outputs(storage, app_env, summary, scene)


def test_killed_with_some_batches_done_resumes_and_completes(storage, app_env, tmp_path):
    scene = make_scene(tmp_path / "scene.tif", 1300, 1100)  # 6 x 5 = 30 windows, 8 batches of 4
    log = tmp_path / "serve.log"
    # Killed at the 13th manifest row, not when the test sees two batches done: a host that
    # finished the 30 small windows before the test's next look left nothing to resume (seen in
    # CI once activities reused their threads and got faster).
    job_id = upload_until_killed(storage, app_env, scene, log, module=killed_before_row(13))
    table = storage.table_service().get_table_client(app_env.manifest)
    # Rows 1-12 were passed on; up to 3 of them may still have been in flight on the other slots.
    assert 9 <= count_manifest(table, job_id).rows <= 12
    state = serve_until_finished(storage, app_env, log, job_id)
    assert state["status"] == "Completed", state
    check_outputs(storage, app_env, {"status": "completed", "job_id": job_id, "windows": 30}, scene)


def test_zero_byte_and_sidecar_uploads_are_ignored_not_failed(storage, app_env, tmp_path):
    empty = tmp_path / "empty.tif"
    empty.write_bytes(b"")
    sidecar = tmp_path / "scene.tif.aux.xml"
    sidecar.write_text("<PAMDataset><SRS>EPSG:4326</SRS></PAMDataset>")
    with local_host(app_env) as host:
        first = process_file(host, empty, timeout=60)
        second = process_file(host, sidecar, timeout=60)
        instances = host.store.instances()
        acked = host.watcher.failures
    assert first == {
        "job_id": None,
        "status": "failed",
        "error": "upload ignored: zero-byte blob",
        "elapsed_s": first["elapsed_s"],
    }
    assert second["error"] == "upload ignored: sidecar file, never read"
    assert instances == [] and acked == {}  # nothing started, and the deliveries did not fail


def test_what_an_upload_is_comes_from_its_content_not_its_name(storage, app_env, tmp_path):
    """A GeoTIFF named .dat is processed; text named .tif fails its job with what is accepted."""
    scene = make_scene(tmp_path / "scene.tif", 300, 260)
    renamed = tmp_path / "scene.dat"
    renamed.write_bytes(scene.read_bytes())
    notes = tmp_path / "notes.tif"
    notes.write_text("meeting notes, saved with the wrong extension\n")
    with local_host(app_env) as host:
        good = process_file(host, renamed, timeout=120)
        bad = process_file(host, notes, timeout=60)
    check_outputs(storage, app_env, good, scene)
    assert bad["status"] == "failed", bad
    assert "is not a TIFF" in bad["error"] and "accepted: a self-contained GeoTIFF" in bad["error"], bad
    tiles = storage.blob_service().get_container_client(app_env.tiles)
    assert list(tiles.list_blobs(name_starts_with=f"tiles/{bad['job_id']}/")) == []


def test_hostile_and_damaged_uploads_fail_their_job_with_no_request_no_tile_no_leak(
    storage, azurite, app_env, tmp_path, monkeypatch, caplog
):
    """Uploads that name a URL, a file of the instance or another container's blob, and damaged
    TIFFs: every job fails at validation with what is accepted; behind a recording proxy, the
    app never asks for the other blob, the trap hears nothing, no tile or row exists, and no byte
    of the secrets reaches a blob or a log line."""
    caplog.set_level(logging.DEBUG)
    secret_tif, secret_raw = make_secret_tif(tmp_path), make_secret_raw(tmp_path)
    other = storage.blob_service().create_container(f"secret-{app_env.hub.lower()[3:]}")
    with open(secret_tif, "rb") as f:
        other.upload_blob("secret.tif", f)
    intact = make_scene(tmp_path / "intact.tif", 300, 260)
    truncated = tmp_path / "truncated.tif"
    truncated.write_bytes(intact.read_bytes()[: intact.stat().st_size // 2])
    with TrapServer() as trap, RecordingProxy(azurite.blob_endpoint.rsplit("/", 1)[0]) as proxy:
        monkeypatch.setenv(
            names.STORAGE_CONNECTION, azurite.connection_string.replace(f":{azurite.blob_port}/", f":{proxy.port}/")
        )
        uploads = {
            **network_vectors(tmp_path, trap.url),
            **local_vectors(tmp_path, secret_tif, secret_raw),
            "vrt-other-container": write(tmp_path, "other.tif", vrt(f"/vsiaz/{other.container_name}/secret.tif")),
            "truncated-geotiff": str(truncated),
        }
        with local_host(app_env) as host:
            summaries = {
                case: process_file(host, Path(path), name=f"{case}.tif", timeout=120) for case, path in uploads.items()
            }
        asked = proxy.paths()
        heard = list(trap.requests)
    for case, summary in summaries.items():
        assert summary["status"] == "failed", (case, summary)
        assert "accepted" in summary["error"] or "upload the complete file" in summary["error"], (case, summary)
    assert heard == []
    assert not [p for p in asked if other.container_name in p], "the other container's blob was requested"
    service = storage.blob_service()
    for container in (app_env.tiles, app_env.output):
        assert list(service.get_container_client(container).list_blobs()) == [], container
    table = storage.table_service().get_table_client(app_env.manifest)
    assert all(count_manifest(table, s["job_id"]).rows == 0 for s in summaries.values())
    for blob in service.get_container_client(app_env.input).list_blobs():
        assert MARKER not in download(storage, app_env.input, blob.name)
    assert MARKER.decode() not in caplog.text
