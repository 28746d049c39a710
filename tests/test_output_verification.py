"""Outputs verified on every path, and a manifest that records what storage holds, against Azurite.

- a repeat assembly over an existing mosaic reads it back and checks it (every method), and one
  replaced by a valid COG with other pixels (by a writer using If-Match, metadata copied) fails
  with the repair instruction, here and on a job delivered again;
- a verification that storage kept from finishing is a retryable fault (the fault is caused for
  real: GDAL's reads go through testkit/storage_proxy.py), and the retry verifies;
- companions (STAC item, quicklook) that are not what the mosaic gives are known bad;
- the footprint: a read storage did not deliver raises, a mask it cannot use gives the null geometry;
- a tile already present with other bytes (encoder drift, another writer): the row records the
  stored version, and the mosaic assembles.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import rasterio
from azure.core import MatchConditions
from rasterio.io import MemoryFile

from activities.tiling import run_activity
from devhost.durable.host import HostOptions, LocalHost
from devhost.session import job_summary, process_file
from testkit.scenes import read_scene
from testkit.storage_proxy import FaultPlan, FaultProxy, RecordingProxy
from tilecommit import gates, jobs, profiles
from tilecommit.errors import MosaicCheckError, is_retryable
from tilecommit.grid import plan_windows
from tilecommit.raster.assembly import checks, stac
from tilecommit.raster.assembly.pyramid import mosaic_overview_levels
from tilecommit.raster.env import gdal_env
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec

from .app_jobs import download as app_download
from .app_jobs import make_scene
from .conftest import counter_total
from .fault_jobs import app_behind_proxy, app_storage
from .raster_jobs import (
    JOB,
    RequestLog,
    assemble,
    assert_same_pixels,
    hooked_stores,
    job_of,
    job_stores,
    manifest_rows,
    render_all,
)

REAL = Path(__file__).resolve().parent / "fixtures" / "real"
REPAIR = f"python -m devhost verify {JOB} --repair"


def proxied_gdal_options(storage, azurite, proxy, **extra) -> dict:
    """GDAL's /vsiaz/ reads through ``proxy``; the SDK clients keep talking to Azurite directly."""
    options = storage.gdal_options()
    connection = options["AZURE_STORAGE_CONNECTION_STRING"]
    options["AZURE_STORAGE_CONNECTION_STRING"] = connection.replace(f":{azurite.blob_port}/", f":{proxy.port}/")
    return {**options, **extra}


def mosaic_gets(proxy, name: str) -> list[str]:
    return [path for method, path in proxy.requests if method == "GET" and path.split("?")[0].endswith("/" + name)]


def other_pixels_cog(body: bytes) -> bytes:
    """A valid COG of the same shape, georeferencing, nodata and pyramid as ``body``, other pixels."""
    with MemoryFile(body) as memory, memory.open() as src:
        data = src.read()
        profile = {
            "driver": "COG",
            "width": src.width,
            "height": src.height,
            "count": src.count,
            "dtype": src.dtypes[0],
            "crs": src.crs,
            "transform": src.transform,
            "nodata": src.nodata,
            "BLOCKSIZE": 256,
            "COMPRESS": "DEFLATE",
            "OVERVIEW_COUNT": len(src.overviews(1)),
        }
    other = np.where(data == 0, 0, np.iinfo(data.dtype).max - data).astype(data.dtype)
    with MemoryFile() as memory:
        with memory.open(**profile) as dst:
            dst.write(other)
        return memory.read()


def stac_item_refused(app_env) -> FaultPlan:
    """A plan by which storage refuses the app's STAC item with a plain 403 (set ``busy`` to 0.0 to stop)."""
    mine = app_storage(app_env)
    return FaultPlan(
        busy=1.0,
        status=403,
        code="AuthorizationPermissionMismatch",
        applies=lambda method, path: (
            method == "PUT" and mine(method, path) and path.split("?")[0].endswith("/item.json")
        ),
    )


def replace_as_a_hostile_writer(container, name: str, body: bytes) -> None:
    """Overwrite exactly the stored version (If-Match), keeping its metadata: the worst case."""
    blob = container.get_blob_client(name)
    props = blob.get_blob_properties()
    blob.upload_blob(
        body, overwrite=True, etag=props.etag, match_condition=MatchConditions.IfNotModified, metadata=props.metadata
    )


@pytest.mark.parametrize("method", ["server", "blocks", "vrt"])
def test_a_repeat_assembly_verifies_the_existing_mosaic_by_reading_it_back(rendered, stores, storage, azurite, method):
    _, _, scene, settings, _ = rendered
    first = assemble(scene, settings, stores, storage, method=method)
    assert (first.outcome, first.method) == ("written", method)
    name = jobs.mosaic_blob_name(JOB)

    log = RequestLog()
    with RecordingProxy(f"http://127.0.0.1:{azurite.blob_port}") as proxy:
        again = assemble(
            scene,
            settings,
            hooked_stores(storage, stores, log),
            storage,
            method=method,
            gdal_options=proxied_gdal_options(storage, azurite, proxy),
        )
    assert again.outcome == "already-present" and again.nbytes == first.nbytes
    assert "verify" in again.timings
    # The SDK read the mosaic back, every read pinned to the version checked (If-Match): its
    # directories (check_mosaic_file, through the pinned reader), the planned head of a
    # server-side one (and, for its companions, the smallest overview); all of a streamed or VRT
    # one (whose sha256 a server-side plan cannot know: it is hashed from the stored bytes).
    # GDAL's own /vsiaz/ reads nothing: a version it read could not be pinned.
    assert mosaic_gets(proxy, name) == [], proxy.requests
    etag = stores["output"].get_blob_client(name).get_blob_properties().etag
    sdk_reads = [r for r in log.requests if r[0] == "GET" and r[1].endswith("/" + name)]
    assert sdk_reads and all(r[3].get("If-Match") == etag for r in sdk_reads), [r[3] for r in sdk_reads]
    ranges = [r[3].get("x-ms-range") or r[3].get("Range") or "" for r in sdk_reads]
    assert any(found.startswith("bytes=0-") for found in ranges), ranges
    if method == "server":
        read = sum(int(b) - int(a) + 1 for a, b in (found.split("=")[1].split("-") for found in ranges))
        assert read < first.nbytes / 2, (read, first.nbytes, ranges)  # verified without reading it whole


@pytest.mark.parametrize("method", ["server", "blocks", "vrt"])
def test_a_mosaic_replaced_with_other_pixels_fails_every_assembly_with_the_repair_instruction(
    rendered, stores, storage, method
):
    _, _, scene, settings, _ = rendered
    first = assemble(scene, settings, stores, storage, method=method)
    name = jobs.mosaic_blob_name(JOB)
    hostile = other_pixels_cog(stores["output"].download_blob(name).readall())
    # Only the content gives it away: every structural check of a mosaic passes on it.
    with MemoryFile(hostile) as memory:
        checks.check_mosaic_file(memory.name, scene, first.overview_levels, settings=settings)
    replace_as_a_hostile_writer(stores["output"], name, hostile)

    for _ in range(2):  # known bad stays bad: a retry, or a re-run, meets the same mosaic
        with pytest.raises(MosaicCheckError) as caught:
            assemble(scene, settings, stores, storage, method=method)
        message = str(caught.value)
        assert REPAIR in message and "verify_scene" in message, message
        assert f"committed mosaic {name}" in message
        assert not is_retryable(caught.value)
    assert stores["output"].download_blob(name).readall() == hostile  # left in place to be examined


def test_a_verification_storage_kept_from_finishing_is_retried_then_passes(rendered, stores, storage, azurite):
    """The reads of the existing mosaic are answered 503 (the client's own retries off, so the
    first refusal reaches the check): the activity raises a retryable fault, never an
    already-present; its retry, storage answering again, verifies and returns already-present."""
    from .test_read_faults import quick_client

    _, _, scene, settings, _ = rendered
    first = assemble(scene, settings, stores, storage)
    name = jobs.mosaic_blob_name(JOB)
    refusing = {"on": True}
    plan = FaultPlan(
        busy=1.0,
        applies=lambda method, path: refusing["on"] and method == "GET" and path.split("?")[0].endswith("/" + name),
    )
    with FaultProxy(f"http://127.0.0.1:{azurite.blob_port}", plan) as proxy:
        output = quick_client(azurite, proxy).get_container_client(stores["output"].container_name)

        def work() -> dict:
            return assemble(scene, settings, {**stores, "output": output}, storage).to_dict()

        with pytest.raises(Exception) as caught:
            run_activity("assemble_mosaic", JOB, work)
        assert is_retryable(caught.value), caught.value
        assert not isinstance(caught.value, MosaicCheckError)
        assert proxy.injected["busy"] >= 1
        refusing["on"] = False
        result = run_activity("assemble_mosaic", JOB, work)
    print(f"\nfirst attempt: {type(caught.value).__name__}: {str(caught.value)[:200]}")
    assert result["outcome"] == "already-present" and result["nbytes"] == first.nbytes
    assert "verify" in result["timings"]


@pytest.mark.parametrize("method", ["server", "blocks", "vrt"])
def test_a_verification_storage_refuses_fails_once_with_the_refusal_not_retried(
    rendered, stores, storage, azurite, method
):
    """Every read of the existing mosaic refused 403, as Azure refuses an identity without read
    permission: whichever read of the verification meets it first, the assembly fails with a
    storage fault carrying the 403, not retried (a retry would meet the same refusal)."""
    from tilecommit.errors import StorageFaultError

    from .test_read_faults import FORBIDDEN, quick_client

    _, _, scene, settings, _ = rendered
    assemble(scene, settings, stores, storage, method=method)
    name = jobs.mosaic_blob_name(JOB)
    plan = FaultPlan(**FORBIDDEN, applies=lambda verb, path: verb == "GET" and path.split("?")[0].endswith("/" + name))
    with FaultProxy(f"http://127.0.0.1:{azurite.blob_port}", plan) as proxy:
        output = quick_client(azurite, proxy).get_container_client(stores["output"].container_name)
        with pytest.raises(StorageFaultError) as caught:
            assemble(scene, settings, {**stores, "output": output}, storage, method=method)
    assert caught.value.status == 403 and not is_retryable(caught.value), caught.value
    assert proxy.injected["busy"] >= 1


def test_companions_that_are_not_what_the_mosaic_gives_are_known_bad(rendered, stores, storage):
    """A STAC item with a null geometry (what a read fault used to bake in) and a quicklook of
    other pixels, each put in place of the real one: the next assembly says which and how to repair.
    The item's cost is the one part that may differ (each run costs what it costs): the item keeps
    the cost of the run that wrote it, and an item that differs only there is good."""
    _, _, scene, settings, _ = rendered
    assemble(scene, settings, stores, storage, cost=lambda: {"usd": 1.0})
    output = stores["output"]
    item_name, quicklook_name = jobs.stac_blob_name(JOB), jobs.quicklook_blob_name(JOB)
    real_item = output.download_blob(item_name).readall()
    item = json.loads(real_item)
    assert item["properties"]["tilecommit:cost"] == {"usd": 1.0}
    assert assemble(scene, settings, stores, storage, cost=lambda: {"usd": 2.0}).outcome == "already-present"
    assert output.download_blob(item_name).readall() == real_item
    item["geometry"], item["properties"]["tilecommit:footprint"] = None, "none: the footprint could not be computed"
    item.pop("bbox")
    replace_as_a_hostile_writer(output, item_name, json.dumps(item, sort_keys=True, indent=2).encode() + b"\n")
    with pytest.raises(MosaicCheckError, match=rf"{item_name} is not what the committed mosaic gives.*{REPAIR}"):
        assemble(scene, settings, stores, storage)

    replace_as_a_hostile_writer(output, item_name, real_item)
    real_quicklook = output.download_blob(quicklook_name).readall()
    replace_as_a_hostile_writer(output, quicklook_name, real_quicklook[:-1] + bytes([real_quicklook[-1] ^ 1]))
    with pytest.raises(MosaicCheckError, match=rf"{quicklook_name} is not what the committed mosaic gives"):
        assemble(scene, settings, stores, storage)

    replace_as_a_hostile_writer(output, quicklook_name, real_quicklook)
    assert assemble(scene, settings, stores, storage).outcome == "already-present"


def test_a_footprint_storage_did_not_deliver_raises_a_retryable_fault(rendered, stores, storage, azurite):
    """The mosaic is read as the sidecars read it: pinned to its version, every byte counted."""
    from tilecommit.raster.reading.source import PinnedBlob

    from .test_read_faults import quick_client

    _, _, scene, settings, _ = rendered
    assemble(scene, settings, stores, storage)
    name = jobs.mosaic_blob_name(JOB)
    plan = FaultPlan(busy=1.0, applies=lambda method, path: method == "GET" and path.split("?")[0].endswith("/" + name))
    with FaultProxy(f"http://127.0.0.1:{azurite.blob_port}", plan) as proxy:
        blob = quick_client(azurite, proxy).get_blob_client(stores["output"].container_name, name)
        etag = blob.get_blob_properties().etag
        with gdal_env(settings), pytest.raises(Exception) as caught:
            stac.mosaic_footprint(PinnedBlob(blob, etag, upload=False), scene.crs)
        assert is_retryable(caught.value), caught.value
        assert proxy.injected["busy"] >= 1
        plan.busy = 0.0
        with gdal_env(settings):
            found = stac.mosaic_footprint(PinnedBlob(blob, etag, upload=False), scene.crs)
    assert found.geometry is not None and found.note == "valid data"


def test_a_footprint_that_cannot_be_computed_from_good_bytes_keeps_the_null_geometry_and_says_why():
    with gdal_env(Settings()):
        empty = stac.mosaic_footprint(str(REAL / "all-nodata.tif"), "EPSG:4326")
        with rasterio.open(REAL / "alpha.tif") as src:
            unusable = stac.mosaic_footprint(str(REAL / "alpha.tif"), "not a CRS")
            assert src.crs is not None  # the file is fine: only the footprint cannot be made
    assert (empty.geometry, empty.bbox, empty.note) == (None, None, "none: the mosaic has no valid pixel")
    assert unusable.geometry is None and unusable.note.startswith("none: the footprint could not be computed (")


def test_an_already_present_tile_with_other_bytes_is_recorded_as_stored_and_the_mosaic_assembles(
    small_scene, stores, storage, monkeypatch
):
    """Two tiles are in place before the job renders them, encoded at another DEFLATE level (an
    encoder that changed): one through the gate (its sha256 in its metadata), one by a plain
    upload (no metadata: the sha256 is computed from its bytes). Their rows record the stored
    size, sha256 and ETag, the mismatch is counted, and the server-side assembly, which pins each
    copy to its row's ETag and checks each size, builds a mosaic equal to the source."""
    scene_spec, path = small_scene
    settings = Settings(window_size=256)
    output_spec = OutputSpec.from_settings(settings)
    from tilecommit.raster import inspect_source, render_tile

    scene = inspect_source(path, settings=settings, spec=output_spec)
    windows = plan_windows(scene.width, scene.height, settings.window_size)
    drifted, plain = windows[0], windows[4]
    default = profiles.PROFILES[profiles.DEFAULT]
    drift = dataclasses.replace(default, level=1)  # an encoder that drifted
    monkeypatch.setitem(profiles.PROFILES, profiles.DEFAULT, drift)
    for window in (drifted, plain):
        render_tile(job_of(settings), job_stores(stores, settings), path, window)
        stores["manifest"].delete_entity(JOB, window.id)
    plain_name = jobs.tile_blob_name(JOB, plain)
    plain_body = stores["tiles"].download_blob(plain_name).readall()
    stores["tiles"].delete_blob(plain_name)
    stores["tiles"].upload_blob(plain_name, plain_body)  # another writer: no sha256 in the metadata
    monkeypatch.setitem(profiles.PROFILES, profiles.DEFAULT, default)

    mismatches = counter_total("ConditionalWriteContentMismatch", gate="tile")
    results = {r.window: r for r in render_all(path, scene, settings, stores)}
    assert counter_total("ConditionalWriteContentMismatch", gate="tile") - mismatches == 2
    rows = {row["RowKey"]: row for row in manifest_rows(stores["manifest"])}
    for window in (drifted, plain):
        name = jobs.tile_blob_name(JOB, window)
        blob = stores["tiles"].get_blob_client(name)
        props, body = blob.get_blob_properties(), blob.download_blob().readall()
        row = rows[window.id]
        assert results[window.id].outcome == "already-present"
        assert (row["bytes"].value, row["sha256"], row["etag"]) == (len(body), gates.sha256_hex(body), props.etag)
        assert (results[window.id].nbytes, results[window.id].sha256) == (len(body), gates.sha256_hex(body))
    # Ours would have been other bytes (level 6): what the row used to record, and assembly refused.
    ours = stores["tiles"].download_blob(jobs.tile_blob_name(JOB, windows[1])).readall()
    assert rows[windows[1].id]["sha256"] == gates.sha256_hex(ours)
    with MemoryFile(plain_body) as memory, memory.open() as src:
        assert src.profile["compress"].lower() == "deflate"

    result = assemble(scene, settings, stores, storage)
    assert (result.outcome, result.method) == ("written", "server")
    mosaic = stores["output"].download_blob(result.mosaic).readall()
    with MemoryFile(mosaic) as memory, memory.open() as src:
        assert_same_pixels(src.read(), read_scene(scene_spec))
    assert mosaic_overview_levels(scene.width, scene.height) == result.overview_levels


@pytest.mark.slow
def test_a_job_over_a_mosaic_replaced_by_a_hostile_writer_fails_with_the_repair_instruction_when_delivered_again(
    storage, app_env, azurite, monkeypatch, tmp_path
):
    """The first execution commits the mosaic and the quicklook, then storage refuses the STAC
    item with a plain 403: the job fails, not retryable, its mosaic in place. A writer replaces
    the mosaic (If-Match, metadata kept) with a valid COG of other pixels. Delivered again, the
    job fails saying how to repair it; delivered once more, the same: it never completes."""
    scene = make_scene(tmp_path / "hostile.tif", 300, 260)
    plan = stac_item_refused(app_env)
    with (
        app_behind_proxy(azurite, monkeypatch, plan),
        LocalHost(HostOptions(hub=app_env.hub, timer_scale=0.01, watch_interval=0.1)) as host,
    ):
        first = process_file(host, scene, timeout=300)
        job_id = first["job_id"]
        name = jobs.mosaic_blob_name(job_id)
        output = storage.blob_service().get_container_client(app_env.output)
        replace_as_a_hostile_writer(output, name, other_pixels_cog(app_download(storage, app_env.output, name)))
        plan.busy = 0.0
        outcomes = []
        for _ in range(2):
            host.deliver_blob_created(scene.name)
            outcomes.append(job_summary(host.engine.wait_for(job_id, timeout=300)))
        decisions = [d["action"] for d in host.decisions]
        assemblies = [e for e in host.engine.executions if e.name == "assemble_mosaic"]
    print(f"\nfirst: {first.get('error', '')[:160]}\nagain: {outcomes[0].get('error', '')[:400]}")
    assert first["status"] == "failed" and "failed, not retryable" in first["error"] and "403" in first["error"]
    assert decisions == ["started", "started", "started"]
    assert len(assemblies) == 3 and all(e.result and e.result.get("error") for e in assemblies)
    for again in outcomes:
        assert again["status"] == "failed", again
        assert "mosaic check failed" in again["error"] and "(MosaicCheckError)" in again["error"]
        assert f"python -m devhost verify {job_id} --repair" in again["error"] and "verify_scene" in again["error"]
    assert not output.get_blob_client(jobs.stac_blob_name(job_id)).exists()
