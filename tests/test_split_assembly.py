"""The mosaic's staging split over activities (tilecommit/raster/assembly/shares.py), step by step against
Azurite 3.37: plan, shares (run twice, concurrently, or superseded), one commit. The whole job
through the Durable SDK is in tests/test_split_jobs.py."""

from __future__ import annotations

import os
import threading

import pytest
from rasterio.io import MemoryFile

from testkit.scenes import SceneSpec, read_scene, write_scene
from tilecommit import conditional, jobs
from tilecommit.errors import FAULT, IncompleteManifestError, StagingPlanChangedError, is_retryable, kind_of
from tilecommit.manifest import count_manifest, get_manifest_row, repair_manifest_entry
from tilecommit.raster import inspect_source
from tilecommit.raster.assembly import attempt, shares
from tilecommit.raster.assembly.copy_plan import CopyRange
from tilecommit.raster.assembly.server_copy import ranges_tag
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec

from .raster_jobs import JOB, RequestLog, assemble, assert_same_pixels, hooked_stores, job_of, job_stores, render_all

#: Bytes a share copies here: the test mosaic (about 3.6 MB of tiles) makes several shares.
SHARE_BYTES = 512 * 1024
SETTINGS = Settings(window_size=256)


@pytest.fixture
def split_scene(tmp_path, stores):
    """A 1100 x 800 x 3 uint16 scene in 20 windows of 256, rendered: its tiles and manifest rows."""
    spec = SceneSpec(1100, 800, 3, "uint16", nodata=0)
    path = write_scene(str(tmp_path / "scene.tif"), spec)
    settings = SETTINGS
    scene = inspect_source(path, settings=settings, spec=OutputSpec.from_settings(settings))
    render_all(path, scene, settings, stores)
    return spec, scene, settings


def plan(scene, settings, stores) -> shares.StagedShares:
    planned = shares.plan_shares(job_of(settings), job_stores(stores, settings), scene, share_bytes=SHARE_BYTES)
    assert isinstance(planned, shares.StagedShares), planned
    return planned


def stage(staged, index: int, stores) -> dict:
    return shares.stage_share(job_of(SETTINGS), job_stores(stores, SETTINGS), staged, index)


def remove_outputs(stores, result) -> None:
    for name in (result.mosaic, result.stac, result.quicklook):
        stores["output"].delete_blob(name)


def without_write_id(metadata: dict) -> dict:
    return {k: v for k, v in metadata.items() if k != conditional.WRITE_ID_KEY}


def block_lists(stores) -> tuple[list[str], list[str]]:
    committed, uncommitted = stores["output"].get_blob_client(jobs.mosaic_blob_name(JOB)).get_block_list("all")
    return [b.id for b in committed], [b.id for b in uncommitted]


def test_shares_run_twice_and_at_once_commit_the_one_activity_mosaic_byte_for_byte(split_scene, stores, storage):
    """The one-activity mosaic first; then the same tiles planned in shares, one share staged twice
    at the same time and again afterwards, committed: the same bytes and metadata. Every range
    request carries the source If-Match of its tile's manifest row; one Put Block List."""
    spec, scene, settings = split_scene
    single = assemble(scene, settings, stores, storage, method="server")
    mosaic = stores["output"].get_blob_client(single.mosaic)
    single_bytes = mosaic.download_blob().readall()
    single_metadata = mosaic.get_blob_properties().metadata
    remove_outputs(stores, single)

    log = RequestLog()
    hooked = hooked_stores(storage, stores, log)
    staged = plan(scene, settings, hooked)
    assert staged.shares >= 3 and staged.ranges == single.transfer["copy_ranges"]
    barrier = threading.Barrier(2)
    twice: list[dict] = []

    def stage_one_share() -> None:
        barrier.wait()
        twice.append(stage(staged, 1, hooked))

    threads = [threading.Thread(target=stage_one_share) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    results = [stage(staged, index, hooked) for index in range(staged.shares)]
    assert len(twice) == 2 and twice[0]["ranges"] == twice[1]["ranges"] == results[1]["ranges"] > 0
    assert sum(r["staged"] for r in results) == staged.ranges and not any(r["stopped"] for r in results)

    result = assemble(scene, settings, hooked, storage, shares=staged)
    assert (result.outcome, result.method, result.transfer["shares"]) == ("written", "server", staged.shares)
    assert mosaic.download_blob().readall() == single_bytes
    # The same metadata, but for each commit's own write id.
    assert without_write_id(mosaic.get_blob_properties().metadata) == without_write_id(single_metadata)

    # Requests as sent: every Put Block From URL pinned to its tile's recorded ETag.
    name = jobs.mosaic_blob_name(JOB)
    rows = {r.uri: r.etag for r in count_manifest(stores["manifest"], JOB).entries.values()}
    copies = [r for r in log.put_blocks(name) if "x-ms-copy-source" in {k.lower() for k in r[3]}]
    assert len(copies) == staged.ranges + results[1]["ranges"] * 2
    for _, _, _, headers in copies:
        headers = {k.lower(): v for k, v in headers.items()}
        tile = headers["x-ms-copy-source"].split("?", 1)[0].split(f"/{stores['tiles'].container_name}/", 1)[1]
        assert headers["x-ms-source-if-match"] == rows[tile]
    assert len(log.put_block_lists(name)) == 1

    # The committed list: the plan's range ids (its tag, 0..N-1), then this commit's own local ids.
    committed, uncommitted = block_lists(stores)
    ranges = [b for b in committed if b.startswith(staged.tag)]
    assert ranges == [attempt.block_id(staged.tag, i) for i in range(staged.ranges)]
    assert uncommitted == []
    with MemoryFile(single_bytes) as memory, memory.open() as src:
        assert_same_pixels(src.read(), read_scene(spec))


def test_attempts_over_the_same_tiles_restage_the_same_ids_and_other_versions_never_reach_the_commit(
    split_scene, stores, storage
):
    """Two attempts over the same tiles plan the same tag and stage the same ids in place (the
    blob's uncommitted blocks do not grow: Azure keeps at most 100,000). A tile repaired since
    (a new version of it) makes another plan with another tag; blocks staged under the first
    tag, even overwritten with other bytes as a hostile writer might, never reach its commit."""
    spec, scene, settings = split_scene
    first = plan(scene, settings, stores)
    for index in range(first.shares):
        stage(first, index, stores)
    staged_once = block_lists(stores)[1]
    again = plan(scene, settings, stores)
    assert (again.tag, again.name, again.etag) == (first.tag, first.name, first.etag)
    for index in range(again.shares):
        stage(again, index, stores)
    assert sorted(block_lists(stores)[1]) == sorted(staged_once) and len(staged_once) == first.ranges

    # A tile repaired: the same bytes under a new version, its row naming the new one.
    window = "0000_0000"
    row, row_etag = get_manifest_row(stores["manifest"], JOB, window)
    tile = stores["tiles"].get_blob_client(row.uri)
    tile.upload_blob(tile.download_blob().readall(), overwrite=True)
    new_etag = tile.get_blob_properties().etag
    repaired = repair_manifest_entry(
        stores["manifest"],
        job_id=JOB,
        window=window,
        uri=row.uri,
        nbytes=row.nbytes,
        sha256=row.sha256,
        etag=new_etag,
        expect_row_etag=row_etag,
    )
    assert str(repaired) == "written"
    blob = stores["output"].get_blob_client(jobs.mosaic_blob_name(JOB))
    for index in range(first.ranges):
        blob.stage_block(attempt.block_id(first.tag, index), os.urandom(4096))

    current = plan(scene, settings, stores)
    assert current.tag != first.tag and current.name != first.name
    for index in range(current.shares):
        stage(current, index, stores)
    result = assemble(scene, settings, stores, storage, shares=current)
    assert result.outcome == "written"
    committed, uncommitted = block_lists(stores)
    assert not [b for b in committed if b.startswith(first.tag)]
    assert uncommitted == []
    body = blob.download_blob().readall()
    with MemoryFile(body) as memory, memory.open() as src:
        assert_same_pixels(src.read(), read_scene(spec))


def test_a_tile_replaced_after_planning_fails_its_share_naming_the_window_and_nothing_is_committed(
    split_scene, stores, storage
):
    _, scene, settings = split_scene
    staged = plan(scene, settings, stores)
    plan_body = stores["tiles"].download_blob(staged.name).readall()
    ranges = shares.SharePlan.from_json(plan_body)
    changed = ranges.ranges[ranges.shares[-1][0]].source  # a window of the last share
    tile = stores["tiles"].get_blob_client(ranges.uris[changed])
    tile.upload_blob(tile.download_blob().readall(), overwrite=True)  # same bytes, new ETag

    for index in range(staged.shares - 1):
        assert stage(staged, index, stores)["staged"] > 0
    with pytest.raises(IncompleteManifestError) as failure:
        stage(staged, staged.shares - 1, stores)
    assert f"window {changed}" in str(failure.value) and failure.value.mismatched == [changed]
    assert not stores["output"].get_blob_client(jobs.mosaic_blob_name(JOB)).exists()


def test_the_commit_refuses_a_plan_made_from_tile_versions_the_manifest_no_longer_names(split_scene, stores, storage):
    """A row re-recorded after planning (as a repair does, If-Match on the row): the commit names
    its window and commits nothing."""
    _, scene, settings = split_scene
    staged = plan(scene, settings, stores)
    for index in range(staged.shares):
        stage(staged, index, stores)
    window = "0002_0003"
    entity = stores["manifest"].get_entity(JOB, window)
    tile = stores["tiles"].get_blob_client(entity["uri"])
    entity["etag"] = tile.upload_blob(tile.download_blob().readall(), overwrite=True)["etag"]
    stores["manifest"].update_entity(entity)

    with pytest.raises(IncompleteManifestError) as failure:
        assemble(scene, settings, stores, storage, shares=staged)
    assert window in str(failure.value) and failure.value.mismatched == [window]
    assert not stores["output"].get_blob_client(jobs.mosaic_blob_name(JOB)).exists()


def test_a_share_stops_when_the_mosaic_is_committed_meanwhile(split_scene, stores, storage):
    _, scene, settings = split_scene
    staged = plan(scene, settings, stores)
    first = assemble(scene, settings, stores, storage, method="server")
    result = stage(staged, 0, stores)
    assert result["stopped"] and result["staged"] == 0
    # The commit step then verifies the mosaic there, as any already-present.
    assert assemble(scene, settings, stores, storage, shares=staged).outcome == "already-present"
    assert first.outcome == "written"


def test_the_range_tag_is_a_pure_function_of_the_ranges_and_their_versions():
    ranges = [CopyRange("0000_0000", 100, 250), CopyRange("0000_0001", 0, 4096)]
    versions = {"0000_0000": "0x8D1", "0000_0001": "0x8D2"}
    tag = ranges_tag(JOB, ranges, versions)
    assert tag == ranges_tag(JOB, list(ranges), dict(versions)) and len(tag) == attempt.TAG_LENGTH
    assert tag != ranges_tag(JOB, ranges, {**versions, "0000_0001": "0x8D3"})
    assert tag != ranges_tag(JOB, ranges[:1], versions)
    assert tag != ranges_tag("fedcba9876543210", ranges, versions)
    assert jobs.share_plan_blob_name(JOB, tag) == f"plans/{JOB}/{tag}.json"


@pytest.mark.parametrize("change", ["replaced", "deleted"])
def test_a_staging_plan_changed_after_planning_fails_the_share_for_good_saying_deliver_again(
    split_scene, stores, storage, change
):
    """The orchestration carries the plan's version: a plan replaced or deleted since (by hand,
    or a sweep) refuses every repeat of the step alike, so no retry is spent on it."""
    _, scene, settings = split_scene
    staged = plan(scene, settings, stores)
    blob = stores["tiles"].get_blob_client(staged.name)
    if change == "replaced":
        blob.upload_blob(blob.download_blob().readall(), overwrite=True)  # same bytes, new ETag
    else:
        blob.delete_blob()
    with pytest.raises(StagingPlanChangedError, match="deliver the upload again") as failure:
        stage(staged, 0, stores)
    assert not is_retryable(failure.value) and kind_of(failure.value) == FAULT
    assert not stores["output"].get_blob_client(jobs.mosaic_blob_name(JOB)).exists()
