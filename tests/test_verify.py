"""The scrub: ``verify_scene`` through the local host on Azurite, against real GeoTIFFs.

A job is run, then one tile blob is deleted and another replaced (If-Match on its current ETag,
as a hostile writer would) by a valid COG with other pixels. Verify must name exactly those two;
a repair must rewrite both, re-record their rows and rebuild the mosaic, every write of it
conditional (seen on the wire through a recording proxy), and two repairs at once must never
lose an update.
"""

from __future__ import annotations

import json
import os
import threading

import azure.functions as func
import pytest
from azure.core import MatchConditions
from rasterio.io import MemoryFile

from devhost.durable.functions import EventLoopThread
from devhost.session import job_summary, process_file
from devhost.verify import verify_job
from orchestrators import names
from testkit.storage_proxy import RecordingProxy
from tilecommit import gates, jobs
from tilecommit import settings as setting_names
from tilecommit.grid import plan_windows
from tilecommit.manifest import get_manifest_entry, get_manifest_row, record_manifest_entry, repair_manifest_entry

from .app_jobs import WINDOW, AppEnv, check_outputs, download, local_host, make_scene
from .conftest import counter_total
from .fault_jobs import app_storage
from .test_cli import run_cli

JOB_ID = "00000000000000ab"

pytestmark = pytest.mark.slow

#: Outcomes a repair step may report; a second repair racing the first sees the last two or three.
REPAIR_OUTCOMES = {"written", "already-present", "superseded", "unchanged"}


def _job(storage, app_env: AppEnv, tmp_path, host) -> tuple[str, list, object]:
    scene = make_scene(tmp_path / "scene.tif", 600, 520)  # 3 x 3 windows of 256, batches of 4
    summary = process_file(host, scene, timeout=120)
    check_outputs(storage, app_env, summary, scene)
    return summary["job_id"], plan_windows(600, 520, WINDOW), scene


def _damage(storage, app_env: AppEnv, job_id: str, deleted, replaced) -> dict[str, bytes]:
    """Delete one tile; overwrite another, If-Match its ETag, with a valid COG of other pixels.
    Returns the original bytes of both."""
    tiles = storage.blob_service().get_container_client(app_env.tiles)
    originals = {w.id: download(storage, app_env.tiles, jobs.tile_blob_name(job_id, w)) for w in (deleted, replaced)}
    tiles.get_blob_client(jobs.tile_blob_name(job_id, deleted)).delete_blob()
    with MemoryFile(originals[replaced.id]) as memory, memory.open() as src:
        profile, pixels = src.profile, src.read()
    profile.update(driver="COG", blocksize=256)
    profile.pop("blockxsize", None), profile.pop("blockysize", None), profile.pop("tiled", None)
    with MemoryFile() as memory:
        with memory.open(**profile) as dst:
            dst.write(pixels[::-1].copy())  # the bands in reverse order: valid, and wrong
        hostile = memory.read()
    blob = tiles.get_blob_client(jobs.tile_blob_name(job_id, replaced))
    current = blob.get_blob_properties().etag
    blob.upload_blob(hostile, overwrite=True, etag=current, match_condition=MatchConditions.IfNotModified)
    return originals


def _rows_match_tiles(storage, app_env: AppEnv, job_id: str, windows) -> None:
    table = storage.table_service().get_table_client(app_env.manifest)
    tiles = storage.blob_service().get_container_client(app_env.tiles)
    for window in windows:
        entry = get_manifest_entry(table, job_id, window)
        stored = tiles.get_blob_client(entry.uri).download_blob()
        body = stored.readall()
        assert (entry.etag, entry.nbytes, entry.sha256) == (stored.properties.etag, len(body), gates.sha256_hex(body))


def _unconditional_writes(blobs: RecordingProxy, tables: RecordingProxy, applies) -> list:
    """Every write to the app's stores that carried no condition. Put Block (staged, invisible
    until the conditional Put Block List names it) is not a write of a blob; Insert Entity (POST)
    is create-only by itself, refused 409 when the key is taken; the host creating its containers
    (what infra does in Azure) writes no data."""
    found = []
    for method, path, headers in blobs.sent + tables.sent:
        if not applies(method, path) or method in ("GET", "HEAD") or "comp=block&" in path + "&":
            continue
        if "restype=container" in path:
            continue
        if method == "POST" and path.split("?")[0].rstrip("/").count("/") == 2:
            continue  # Insert Entity into the table: /account/table
        if "if-match" not in headers and headers.get("if-none-match") != "*":
            found.append((method, path))
    return found


def test_verify_names_a_deleted_and_a_replaced_tile_and_a_repair_restores_them_conditionally(
    storage, app_env, azurite, monkeypatch, tmp_path
):
    with local_host(app_env) as host:
        job_id, windows, scene = _job(storage, app_env, tmp_path, host)
        clean = verify_job(host, job_id, repair=False, timeout=120)
        deleted, replaced = windows[1], windows[4]
        originals = _damage(storage, app_env, job_id, deleted, replaced)
        found = verify_job(host, job_id, repair=False, timeout=120)
    assert clean["status"] == "completed" and clean["windows"] == 9 and clean["reports"] == [], clean
    assert {r["window"]: r["differences"] for r in found["reports"]} == {
        deleted.id: ["missing-tile"],
        replaced.id: ["tile-changed", "other-pixels"],
    }, found
    assert found["mosaic"] is None and all(r["tile"] == r["manifest"] == "" for r in found["reports"])

    applies = app_storage(app_env)
    with (
        RecordingProxy(f"http://127.0.0.1:{azurite.blob_port}") as blobs,
        RecordingProxy(f"http://127.0.0.1:{azurite.table_port}") as tables,
    ):
        proxied = azurite.connection_string.replace(f":{azurite.blob_port}/", f":{blobs.port}/").replace(
            f":{azurite.table_port}/", f":{tables.port}/"
        )
        monkeypatch.setenv(setting_names.STORAGE_CONNECTION, proxied)
        with local_host(app_env) as host:
            repaired = verify_job(host, job_id, repair=True, timeout=180)
    monkeypatch.setenv(setting_names.STORAGE_CONNECTION, azurite.connection_string)

    reports = {r["window"]: r for r in repaired["reports"]}
    assert set(reports) == {deleted.id, replaced.id}, repaired
    assert all((r["tile"], r["manifest"]) == ("written", "written") for r in reports.values()), reports
    assert repaired["mosaic"]["outcome"] == "written", repaired
    # The repaired tiles are the bytes the job rendered (encoding is deterministic).
    for window in (deleted, replaced):
        assert download(storage, app_env.tiles, jobs.tile_blob_name(job_id, window)) == originals[window.id]
    _rows_match_tiles(storage, app_env, job_id, windows)
    check_outputs(storage, app_env, {"status": "completed", "windows": 9, "job_id": job_id}, scene)

    assert _unconditional_writes(blobs, tables, applies) == []
    writes = [(m, p, h) for m, p, h in blobs.sent + tables.sent if applies(m, p) and m not in ("GET", "HEAD")]
    if_match = [p for m, p, h in writes if "if-match" in h]
    assert any(f"/{app_env.tiles}/" in p for p in if_match), "the replaced tile was not written If-Match"
    assert any(f"/{app_env.manifest}(" in p for p in if_match), "no row was replaced If-Match"
    for name in ("mosaic.tif", "item.json", "quicklook.png"):
        assert any(p.split("?")[0].endswith(f"/{job_id}/{name}") for p in if_match), name
    assert not [p for m, p, h in writes if m == "DELETE"]

    with local_host(app_env) as host:
        again = verify_job(host, job_id, repair=False, timeout=120)
    assert again["reports"] == [] and again["outputs_differing"] == [], again


def test_a_mosaic_replaced_while_its_tiles_are_intact_is_found_and_rebuilt(storage, app_env, tmp_path):
    """A hostile writer replaces the mosaic (If-Match, metadata kept) with a valid COG of other
    pixels; every tile is intact. Verify names the mosaic (no window), the repair rebuilds it
    If-Match on the replaced version, and the rebuilt outputs pass the assembly's own checks."""
    from .test_output_verification import other_pixels_cog, replace_as_a_hostile_writer

    output = storage.blob_service().get_container_client(app_env.output)
    with local_host(app_env) as host:
        job_id, _, scene = _job(storage, app_env, tmp_path, host)
        name = jobs.mosaic_blob_name(job_id)
        replace_as_a_hostile_writer(output, name, other_pixels_cog(download(storage, app_env.output, name)))
        found = verify_job(host, job_id, repair=False, timeout=120)
        repaired = verify_job(host, job_id, repair=True, timeout=180)
        again = verify_job(host, job_id, repair=False, timeout=120)
    assert found["reports"] == [] and len(found["outputs_differing"]) == 1, found
    assert name in found["outputs_differing"][0] and "--repair" in found["outputs_differing"][0]
    assert repaired["mosaic"]["outcome"] == "written", repaired
    assert again["reports"] == [] and again["outputs_differing"] == [], again
    check_outputs(storage, app_env, {"status": "completed", "windows": 9, "job_id": job_id}, scene)


def test_two_repairs_at_once_each_write_once_or_find_it_done_and_lose_nothing(storage, app_env, tmp_path):
    with local_host(app_env) as host:
        job_id, windows, scene = _job(storage, app_env, tmp_path, host)
        deleted, replaced = windows[0], windows[8]
        originals = _damage(storage, app_env, job_id, deleted, replaced)
        results: list[dict] = [{}, {}]

        def repair(slot: int) -> None:
            results[slot] = verify_job(host, job_id, repair=True, timeout=180)

        threads = [threading.Thread(target=repair, args=(slot,)) for slot in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(240)
        final = verify_job(host, job_id, repair=False, timeout=120)
    assert all(r["status"] == "completed" for r in results), results
    for window in (deleted, replaced):
        steps = [r2 for r in results for r2 in r["reports"] if r2["window"] == window.id]
        tiles = [s["tile"] for s in steps]
        rows = [s["manifest"] for s in steps]
        assert set(tiles) | set(rows) <= REPAIR_OUTCOMES, steps
        assert tiles.count("written") == 1 and rows.count("written") <= 1, steps
        assert download(storage, app_env.tiles, jobs.tile_blob_name(job_id, window)) == originals[window.id]
    assert all(r["windows"] == 9 for r in results)
    mosaics = [r["mosaic"]["outcome"] for r in results if r["mosaic"]]
    assert mosaics and set(mosaics) <= {"written", "superseded"}, results
    assert final["reports"] == [], final
    _rows_match_tiles(storage, app_env, job_id, windows)
    check_outputs(storage, app_env, {"status": "completed", "windows": 9, "job_id": job_id}, scene)


def test_the_http_route_starts_the_same_orchestration_and_refuses_an_unknown_job(storage, app_env, tmp_path):
    written_before = counter_total("ConditionalWrites", gate=gates.REPAIR_GATE, outcome="written")
    with local_host(app_env) as host:
        job_id, windows, _ = _job(storage, app_env, tmp_path, host)
        route = host.index.http_functions[names.VERIFY_ROUTE]

        def post(job: str, query: str) -> func.HttpResponse:
            request = func.HttpRequest(
                method="POST",
                url=f"http://localhost/api/jobs/{job}/verify?{query}",
                body=b"",
                route_params={"job_id": job},
                params=dict(p.split("=") for p in query.split("&") if p),
            )
            # As the worker invokes it: the request, and the durableClient binding's JSON.
            return EventLoopThread.shared().run(route(req=request, client=host.api.client_binding()))

        started = post(job_id, "repair=true")
        assert started.status_code == 202
        body = json.loads(started.get_body())
        assert body["job_id"] == job_id and body["repair"] is True
        state = host.engine.wait_for(body["id"], timeout=120)
        unknown = post("0000000000000000", "")
    assert state["name"] == names.VERIFY_SCENE and state["status"] == "Completed", state
    assert state["output"]["reports"] == [] and state["output"]["mosaic"] is None  # a clean job: nothing written
    assert counter_total("ConditionalWrites", gate=gates.REPAIR_GATE, outcome="written") == written_before
    assert unknown.status_code == 404 and "no job" in json.loads(unknown.get_body())["error"]["message"]


def test_the_cli_verifies_a_completed_job_and_refuses_an_unknown_one(storage, app_env, tmp_path):
    env = {**os.environ, **app_env.env}
    scene = make_scene(tmp_path / "cli.tif", 300, 260)
    done = run_cli(env, "process", str(scene), "--hub", app_env.hub)
    assert done.returncode == 0, done.stderr
    job_id = json.loads(done.stdout)["job_id"]
    clean = run_cli(env, "verify", job_id, "--hub", app_env.hub)
    assert clean.returncode == 0, clean.stderr
    assert json.loads(clean.stdout)["reports"] == [] and json.loads(clean.stdout)["windows"] == 4
    tiles = storage.blob_service().get_container_client(app_env.tiles)
    tiles.get_blob_client(jobs.tile_blob_name(job_id, plan_windows(300, 260, WINDOW)[3])).delete_blob()
    found = run_cli(env, "verify", job_id, "--hub", app_env.hub)
    assert found.returncode == 1 and json.loads(found.stdout)["reports"][0]["differences"] == ["missing-tile"]
    repaired = run_cli(env, "verify", job_id, "--repair", "--hub", app_env.hub)
    assert repaired.returncode == 0, repaired.stderr
    assert json.loads(repaired.stdout)["reports"][0]["tile"] == "written"
    unknown = run_cli(env, "verify", "0000000000000000", "--hub", app_env.hub)
    assert unknown.returncode == 1 and json.loads(unknown.stdout)["status"] == "not-verifiable"


def test_a_row_repair_on_a_stale_row_etag_is_superseded_and_leaves_the_newer_row(table):
    record_manifest_entry(table, job_id=JOB_ID, window="0000_0000", uri="t.tif", nbytes=1, sha256="a", etag="e1")
    _, first = get_manifest_row(table, JOB_ID, "0000_0000")
    fields = dict(job_id=JOB_ID, window="0000_0000", uri="t.tif")
    assert repair_manifest_entry(table, **fields, nbytes=2, sha256="b", etag="e2", expect_row_etag=first) == "written"
    stale = repair_manifest_entry(table, **fields, nbytes=3, sha256="c", etag="e3", expect_row_etag=first)
    assert stale is gates.Outcome.SUPERSEDED
    entry, _ = get_manifest_row(table, JOB_ID, "0000_0000")
    assert (entry.nbytes, entry.sha256, entry.etag) == (2, "b", "e2")
    gone = repair_manifest_entry(
        table, **{**fields, "window": "0000_0001"}, nbytes=1, sha256="a", etag="e", expect_row_etag=first
    )
    assert gone is gates.Outcome.SUPERSEDED  # no row: a repair never creates one under If-Match


def test_a_job_failed_on_a_mosaic_known_bad_is_repaired_as_its_message_says_then_completes(
    storage, app_env, azurite, monkeypatch, tmp_path
):
    """The operator's path end to end. The job commits its mosaic, then storage refuses its STAC
    item (403): it fails. A hostile writer replaces the mosaic. Delivered again, the job fails
    with "mosaic check failed" and the repair command. That command (a scrub of the failed job)
    finds the mosaic, rebuilds it; delivered once more, the job completes, pixel-exact."""
    from .fault_jobs import app_behind_proxy
    from .test_output_verification import other_pixels_cog, replace_as_a_hostile_writer, stac_item_refused

    scene = make_scene(tmp_path / "operator.tif", 600, 520)
    plan = stac_item_refused(app_env)
    output = storage.blob_service().get_container_client(app_env.output)
    with app_behind_proxy(azurite, monkeypatch, plan), local_host(app_env) as host:
        first = process_file(host, scene, timeout=120)
        job_id = first["job_id"]
        name = jobs.mosaic_blob_name(job_id)
        replace_as_a_hostile_writer(output, name, other_pixels_cog(download(storage, app_env.output, name)))
        plan.busy = 0.0
        host.deliver_blob_created(scene.name)
        refused = job_summary(host.engine.wait_for(job_id, timeout=120))
        repaired = verify_job(host, job_id, repair=True, timeout=180)
        host.deliver_blob_created(scene.name)
        done = job_summary(host.engine.wait_for(job_id, timeout=120))
    assert first["status"] == "failed" and "403" in first["error"], first
    assert refused["status"] == "failed" and f"python -m devhost verify {job_id} --repair" in refused["error"], refused
    assert repaired["reports"] == [] and repaired["outputs_differing"], repaired
    assert repaired["mosaic"]["outcome"] == "written", repaired
    check_outputs(storage, app_env, done, scene)


def _level_rows(storage, app_env: AppEnv, job_id: str) -> dict[str, str]:
    """The job's intermediates' manifest rows: their ETags by row key."""
    table = storage.table_service().get_table_client(app_env.manifest)
    rows = table.query_entities("PartitionKey eq @job", parameters={"job": job_id})
    return {row["RowKey"]: row.metadata["etag"] for row in rows if jobs.is_level_row_key(row["RowKey"])}


def test_a_tile_repaired_with_other_bytes_has_its_coarse_levels_repaired_by_the_same_scrub(
    storage, app_env, monkeypatch, tmp_path
):
    """A job whose mosaic's coarse levels a reduction tree computed (5 windows: two nodes, then
    one), its tiles encoded by a release whose encoder made other bytes of the same pixels
    (DEFLATE level 1 here); then one tile is lost. Today's repair encodes it again: the same
    pixels, other bytes, so the nodes over it were computed from other contents than its row now
    names. A scrub of version 3.0 repairs the tile and then refuses to rebuild, naming the window;
    one of version 4.0 runs the tree first, whose two nodes over that tile make theirs again (the
    third finds its own verified), and rebuilds a mosaic pixel-exact against the source. A scrub
    after it finds nothing."""
    from devhost.durable.host import JOB_HOST_OVERRIDE
    from orchestrators import versions
    from tilecommit.raster.tiling import encode

    scene = make_scene(tmp_path / "tree.tif", 5 * WINDOW, WINDOW)
    windows = plan_windows(5 * WINDOW, WINDOW, WINDOW)
    today = encode.cog_creation_options

    def an_earlier_encoder(*args, **kwargs) -> dict:
        return {**today(*args, **kwargs), "LEVEL": 1}

    with local_host(app_env) as host:
        monkeypatch.setattr(encode, "cog_creation_options", an_earlier_encoder)
        summary = process_file(host, scene, timeout=120)
        monkeypatch.setattr(encode, "cog_creation_options", today)
    check_outputs(storage, app_env, summary, scene)
    job_id, lost = summary["job_id"], windows[0]
    before = _level_rows(storage, app_env, job_id)
    assert len(before) == 3, before
    tiles = storage.blob_service().get_container_client(app_env.tiles)
    tiles.delete_blob(jobs.tile_blob_name(job_id, lost))

    monkeypatch.setenv(f"{JOB_HOST_OVERRIDE}extensions__durableTask__defaultVersion", "3.0")
    with local_host(app_env) as host:
        old = verify_job(host, job_id, repair=True, timeout=180)
    monkeypatch.delenv(f"{JOB_HOST_OVERRIDE}extensions__durableTask__defaultVersion")
    assert old["status"] == "failed" and "computed from other contents" in old["error"], old
    assert lost.id in old["error"], old
    assert _level_rows(storage, app_env, job_id) == before

    with local_host(app_env) as host:
        repaired = verify_job(host, job_id, repair=True, timeout=180)
        again = verify_job(host, job_id, repair=False, timeout=120)
        state = host.store.read_state(repaired["verify_id"])
    assert state["version"] == versions.CURRENT == "4.0", state
    # The tile itself was repaired by the 3.0 scrub; the mosaic still named its old version.
    assert repaired["status"] == "completed" and repaired["reports"] == [], repaired
    assert repaired["outputs_differing"] and repaired["mosaic"]["outcome"] == "written", repaired
    after = _level_rows(storage, app_env, job_id)
    changed = sorted(key for key in before if after[key] != before[key])
    assert changed == ["~L00_0000_0000", "~L02_0000_0000"], (before, after)
    assert repaired["levels_written"] == [{"stage": 0, "row": 0, "col": 0}, {"stage": 1, "row": 0, "col": 0}]
    check_outputs(storage, app_env, {"status": "completed", "windows": 5, "job_id": job_id}, scene)
    assert again["reports"] == [] and again["outputs_differing"] == [], again
