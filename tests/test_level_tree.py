"""The mosaic's coarse levels by a reduction tree (tilecommit/raster/assembly/reduction.py,
level_nodes.py, coarse_levels.py), against Azurite: the plan, each node run as its activity runs it, and the
commit that only stitches; the mosaic byte for byte the one the single-instance commit makes."""

from __future__ import annotations

import dataclasses

import pytest

from testkit.scenes import SceneSpec, write_scene
from tilecommit import gates, jobs, profiles
from tilecommit.grid import plan_windows
from tilecommit.manifest import get_manifest_entry, get_manifest_row, repair_manifest_entry
from tilecommit.raster import inspect_source, render_tile, tiff
from tilecommit.raster.assembly import block_copy, coarse_levels, level_nodes
from tilecommit.raster.assembly.committed import verify_outputs
from tilecommit.raster.assembly.pyramid import mosaic_overview_levels
from tilecommit.raster.assembly.reduction import plan_level_tree, tile_level_plan
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec

from .raster_jobs import RequestLog, assemble_mosaic, hooked_stores, job_of, job_stores

SETTINGS = Settings(window_size=256)


@pytest.mark.parametrize(
    ("width", "height", "window", "per_node"),
    [(40960, 40960, 1024, 2), (10000, 7000, 1024, 2), (1100, 800, 256, 1), (2048, 1024, 256, 2), (5000, 333, 512, 1)],
)
def test_a_tree_computes_exactly_the_levels_the_commit_would_in_even_halvings(width, height, window, per_node):
    spec = OutputSpec(window_size=window)
    first, w, h, remaining = tile_level_plan(width, height, spec)
    tree = plan_level_tree(width, height, spec, per_node)
    if tree is None:
        return
    assert tree.first == first and tree.levels == remaining
    assert first + remaining == mosaic_overview_levels(width, height)
    for stage in tree.stages[:-1]:  # every non-final stage halves even sizes only
        assert stage.width % 2**stage.levels == 0 and stage.height % 2**stage.levels == 0
        assert stage.rows * stage.cols > 1 and stage.span == 2**stage.levels
    assert tree.stages[-1].rows == tree.stages[-1].cols == 1


def test_no_tree_where_nothing_runs_in_parallel():
    spec = OutputSpec(window_size=1024)
    assert plan_level_tree(4096, 4096, spec, None) is None  # a payload from before the tree
    assert plan_level_tree(4096, 4096, spec, 2) is None  # one node would take it all
    assert plan_level_tree(1024 * 7 + 2, 4096, spec, 2) is None  # an odd first coarse level


#: The profiles the byte-for-byte comparison runs with: the default (nodata, average), the mask
#: made of the nodata (an internal mask's levels, built with the image's) and nearest resampling.
PROFILES = {"default": {}, "add-mask": {"add_mask": "true"}, "nearest": {"resampling": "nearest"}}


def spec_of(options: dict) -> OutputSpec:
    return OutputSpec.with_choice(256, profiles.choose("default", options, where="tests/test_level_tree.py"))


def render(tmp_path, stores, options: dict):
    """A 1100 x 800 x 3 uint16 scene with nodata in 20 windows of 256, rendered to the profile:
    three stages of nodes of one level (2 x 3, 1 x 2, then the last, odd, level whole)."""
    path = write_scene(str(tmp_path / "scene.tif"), SceneSpec(1100, 800, 3, "uint16", nodata=0))
    spec = spec_of(options)
    scene = inspect_source(path, settings=SETTINGS, spec=spec)
    job = job_of(SETTINGS, spec=spec)
    for window in plan_windows(scene.width, scene.height, spec.window_size):
        render_tile(job, job_stores(stores, SETTINGS), path, window)
    return scene, job


@pytest.fixture(params=list(PROFILES))
def rendered(request, tmp_path, stores):
    return render(tmp_path, stores, PROFILES[request.param])


@pytest.fixture
def rendered_default(tmp_path, stores):
    return render(tmp_path, stores, {})


def tree_job(job, per_node: int = 1, copied: bool | None = True):
    """The job with a tree of ``per_node`` levels a node; ``copied`` None: a job started before
    the service copied the intermediates (the commit reads them whole and stages their blocks)."""
    return dataclasses.replace(job, coarse_levels_per_node=per_node, coarse_levels_copied=copied)


def run_tree(job, stores, scene) -> list[dict]:
    tree = plan_level_tree(scene.width, scene.height, job.spec, job.coarse_levels_per_node)
    assert tree is not None and len(tree.stages) == 3
    return [
        level_nodes.reduce_node(job, job_stores(stores, SETTINGS), scene, tree, s, r, c)
        for s, stage in enumerate(tree.stages)
        for r, c in stage.nodes
    ]


@pytest.mark.parametrize("copied", [True, None], ids=["copied by the service", "staged by the commit (before)"])
def test_the_tree_mosaic_is_the_single_instance_mosaic_byte_for_byte(rendered, stores, monkeypatch, copied):
    scene, plain = rendered
    single = assemble_mosaic(plain, job_stores(stores, SETTINGS), scene)
    single_bytes = stores["output"].download_blob(single.mosaic).readall()
    for name in (single.mosaic, single.stac, single.quicklook):
        stores["output"].delete_blob(name)

    job = tree_job(plain, copied=copied)
    results = run_tree(job, stores, scene)
    assert [r["outcome"] for r in results] == ["written"] * 9

    def computed_here(*args, **kwargs):
        raise AssertionError("the commit computed coarse levels: it should only stitch the tree's")

    monkeypatch.setattr(block_copy, "build_coarse_levels", computed_here)
    tree = assemble_mosaic(job, job_stores(stores, SETTINGS), scene)
    assert tree.outcome == "written" and tree.overview_levels == single.overview_levels == 3
    assert stores["output"].download_blob(tree.mosaic).readall() == single_bytes
    if copied:  # the service copied the coarse levels too: only the head passed through the commit
        layout = tiff.read_layout(single_bytes)
        first_block = min(min(d.block_offsets) for d in layout.directories) - (4 if layout.block_leaders else 0)
        assert tree.transfer["sent_from_instance"] == first_block
        assert tree.transfer["copied_by_service"] == len(single_bytes) - tree.transfer["sent_from_instance"]
    else:  # only the tree's blocks passed through the commit: no more than the coarse levels' bytes
        assert tree.transfer["copied_by_service"] == single.transfer["copied_by_service"]
    # The same evidence either way: verified as any mosaic is, from the tree again, by a scrub,
    # by an assembly that finds it, and by the other form of the job.
    other = tree_job(plain, copied=None if copied else True)
    for each in (job, other):
        verify_outputs(each, job_stores(stores, SETTINGS), scene)
        assert assemble_mosaic(each, job_stores(stores, SETTINGS), scene).outcome == "already-present"


def test_a_node_run_again_verifies_its_intermediate_and_repairs_one_that_differs(rendered_default, stores):
    scene, job = rendered_default[0], tree_job(rendered_default[1])
    tree = plan_level_tree(scene.width, scene.height, job.spec, 1)
    job_stores_ = job_stores(stores, SETTINGS)
    first = level_nodes.reduce_node(job, job_stores_, scene, tree, 0, 0, 1)
    again = level_nodes.reduce_node(job, job_stores_, scene, tree, 0, 0, 1)
    assert (first["outcome"], again["outcome"]) == ("written", "already-present")

    name = jobs.level_blob_name(job.job_id, 0, 0, 1)
    good = stores["tiles"].download_blob(name).readall()
    stores["tiles"].upload_blob(name, good[:-1] + bytes([good[-1] ^ 0xFF]), overwrite=True)
    repaired = level_nodes.reduce_node(job, job_stores_, scene, tree, 0, 0, 1)
    assert repaired["outcome"] == "written"
    blob = stores["tiles"].get_blob_client(name)
    assert blob.download_blob().readall() == good
    row = get_manifest_entry(stores["manifest"], job.job_id, jobs.level_row_key(0, 0, 1))
    assert row is not None and row.etag == blob.get_blob_properties().etag and row.sha256 == gates.sha256_hex(good)


def test_the_commit_refuses_without_every_intermediate(rendered_default, stores):
    from tilecommit.errors import IncompleteManifestError

    scene, job = rendered_default[0], tree_job(rendered_default[1])
    tree = plan_level_tree(scene.width, scene.height, job.spec, 1)
    level_nodes.reduce_node(job, job_stores(stores, SETTINGS), scene, tree, 0, 0, 0)
    with pytest.raises(IncompleteManifestError, match="coarse-level intermediates have no manifest row"):
        assemble_mosaic(job, job_stores(stores, SETTINGS), scene)


def test_retention_purges_the_intermediates_and_their_rows_with_the_tiles(rendered_default, stores):
    from tilecommit import retention
    from tilecommit.raster.assembly.coarse_levels import level_rows

    scene, job = rendered_default[0], tree_job(rendered_default[1])
    run_tree(job, stores, scene)
    assert len(level_rows(stores["manifest"], job.job_id)) == 9
    purged = retention.purge_job_storage(stores["manifest"], stores["tiles"], job.job_id)
    assert (purged.tiles, purged.levels, purged.rows) == (20, 9, 20 + 9)
    assert level_rows(stores["manifest"], job.job_id) == {}
    assert list(stores["tiles"].list_blobs(name_starts_with=f"levels/{job.job_id}/")) == []


def head_reads(log) -> list[str]:
    """The tiles whose head was read: ranged GETs from byte 0 of a tile blob."""
    return [
        path.rsplit("/", 1)[1]
        for method, path, _, headers in log.requests
        if method == "GET"
        and "/tiles/" in path
        and (headers.get("x-ms-range") or headers.get("Range") or "").startswith("bytes=0-")
    ]


def test_the_commit_takes_the_tiles_heads_the_first_stage_read_unless_a_tile_changed(rendered_default, stores, storage):
    scene, job = rendered_default[0], tree_job(rendered_default[1])
    run_tree(job, stores, scene)
    # A repaired tile: the same bytes stored again (a new ETag), its row re-recorded to name it.
    name = jobs.tile_blob_name(job.job_id, plan_windows(scene.width, scene.height, 256)[7])
    blob = stores["tiles"].get_blob_client(name)
    answer = blob.upload_blob(blob.download_blob().readall(), overwrite=True)
    entry, row_etag = get_manifest_row(stores["manifest"], job.job_id, "0001_0002")
    repair_manifest_entry(
        stores["manifest"],
        job_id=job.job_id,
        window="0001_0002",
        uri=entry.uri,
        nbytes=entry.nbytes,
        sha256=entry.sha256,
        etag=answer["etag"],
        expect_row_etag=row_etag,
    )
    log = RequestLog()
    result = assemble_mosaic(job, job_stores(hooked_stores(storage, stores, log), SETTINGS), scene)
    assert result.outcome == "written"
    # The 20 heads came with the first stage's intermediates, but the changed tile's, read anew.
    assert head_reads(log) == ["0001_0002.tif"]
    assert coarse_levels.unpack_heads(coarse_levels.pack_heads({"a": ("e", 3, b"xyz")})) == {"a": ("e", 3, b"xyz")}
    packed = coarse_levels.pack_heads({"a": ("e", 3, b"xyz"), "b": ("f", 4, b"uvw")})
    assert coarse_levels.heads_length(b"II*\0tiff" + packed) == len(packed)
    assert coarse_levels.heads_length(packed[-24:]) == len(packed)  # its last 24 bytes tell
    assert coarse_levels.heads_length(b"II*\0tiff") == 0


@pytest.mark.parametrize("tail_bytes", [None, 512], ids=["one read a node", "heads longer than the first read"])
def test_the_shares_are_planned_from_the_heads_the_first_stage_carries_and_are_the_same_shares(
    rendered_default, stores, storage, monkeypatch, tail_bytes
):
    from tilecommit.raster.assembly.shares import StagedShares, plan_shares

    if tail_bytes is not None:  # as the 16 KiB heads intermediates written before they were cut carry
        monkeypatch.setattr(coarse_levels, "HEADS_TAIL_BYTES", tail_bytes)
    scene, plain = rendered_default
    job = tree_job(plain, copied=None)  # a job from before the service copied the intermediates
    run_tree(job, stores, scene)
    read_one_by_one = plan_shares(plain, job_stores(stores, SETTINGS), scene, share_bytes=64 * 1024)
    log = RequestLog()
    carried = plan_shares(job, job_stores(hooked_stores(storage, stores, log), SETTINGS), scene, share_bytes=64 * 1024)
    assert isinstance(read_one_by_one, StagedShares) and read_one_by_one.shares >= 2
    assert carried == read_one_by_one  # the same ranges of the same tile versions: the same plan
    assert head_reads(log) == []  # the 20 heads came with the first stage's 6 intermediates
    tails = [r for r in log.requests if r[0] == "GET" and "/levels/" in r[1]]
    # One read of each intermediate's end, and a second, exact one where its heads are longer.
    assert len(tails) == (6 if tail_bytes is None else 12), [r[1] for r in tails]


def test_the_first_stage_carries_each_tiles_head_cut_to_its_directories(rendered_default, stores):
    """A carried head is the bytes its directories take, no more: it parses alone, to the layout
    the tile's own 16 KiB head gives."""
    from tilecommit.raster.assembly.block_sources import TILE_HEAD_BYTES

    scene, job = rendered_default[0], tree_job(rendered_default[1])
    run_tree(job, stores, scene)
    tree = plan_level_tree(scene.width, scene.height, job.spec, job.coarse_levels_per_node)
    assert tree is not None
    first = tree.stages[0]
    carried: dict = {}
    for r, c in first.nodes:
        name = jobs.level_blob_name(job.job_id, first.level, r, c)
        carried.update(coarse_levels.unpack_heads(stores["tiles"].download_blob(name).readall()))
    assert len(carried) == len(plan_windows(scene.width, scene.height, 256))
    for window, (etag, size, head) in carried.items():
        blob = stores["tiles"].get_blob_client(get_manifest_entry(stores["manifest"], job.job_id, window).uri)
        whole = tiff.read_layout(blob.download_blob(offset=0, length=TILE_HEAD_BYTES).readall())
        alone = tiff.read_layout(head)  # no reader: a byte past the cut would raise
        assert len(head) == alone.extent == whole.extent < TILE_HEAD_BYTES
        assert [d.tags for d in alone.directories] == [d.tags for d in whole.directories]
        props = blob.get_blob_properties()
        assert (etag, size) == (props.etag, props.size)


def level_reads(log) -> list[str]:
    """The intermediates read (GETs of blobs under levels/), by name."""
    return [r[1].rsplit("/", 1)[1] for r in log.requests if r[0] == "GET" and "/levels/" in r[1]]


def test_the_shares_copy_the_intermediates_and_the_commit_reads_only_the_last_node(rendered_default, stores, storage):
    from tilecommit.raster.assembly.shares import StagedShares, plan_shares, read_share_plan, stage_share

    scene, plain = rendered_default
    single = assemble_mosaic(plain, job_stores(stores, SETTINGS), scene)
    single_bytes = stores["output"].download_blob(single.mosaic).readall()
    for name in (single.mosaic, single.stac, single.quicklook):
        stores["output"].delete_blob(name)
    job = tree_job(plain)
    run_tree(job, stores, scene)
    log = RequestLog()
    hooked = job_stores(hooked_stores(storage, stores, log), SETTINGS)
    staged = plan_shares(job, hooked, scene, share_bytes=64 * 1024)
    assert isinstance(staged, StagedShares) and staged.shares >= 2
    # The last node carries every head: of the 8 nodes below it and of the 20 tiles.
    assert head_reads(log) == [] and level_reads(log) == ["L02_0000_0000.tif"]
    plan = read_share_plan(stores["tiles"], staged)
    rows = coarse_levels.level_rows(stores["manifest"], job.job_id)
    copied = {r.source for r in plan.ranges if jobs.is_level_row_key(r.source)}
    assert copied == set(rows)  # every intermediate's blocks are ranges, pinned to its row
    assert all(plan.versions[k] == rows[k].etag and plan.uris[k] == rows[k].uri for k in copied)
    for index in range(staged.shares):
        stage_share(job, job_stores(stores, SETTINGS), staged, index)
    log.requests.clear()
    result = assemble_mosaic(job, hooked, scene, shares=staged)
    assert result.outcome == "written" and result.transfer["shares"] == staged.shares
    assert stores["output"].download_blob(result.mosaic).readall() == single_bytes
    assert head_reads(log) == [] and level_reads(log) == ["L02_0000_0000.tif"]


def test_a_node_repaired_after_the_node_above_read_it_is_read_at_its_new_version(rendered_default, stores, storage):
    """The last node carries a head of the version it read; a node rewritten since (the same bytes
    stored again: a new ETag, its row re-recorded) is read anew, pinned to its row, and the
    service copies its blocks from that version."""
    scene, job = rendered_default[0], tree_job(rendered_default[1])
    run_tree(job, stores, scene)
    key, name = jobs.level_row_key(0, 0, 1), jobs.level_blob_name(job.job_id, 0, 0, 1)
    blob = stores["tiles"].get_blob_client(name)
    answer = blob.upload_blob(blob.download_blob().readall(), overwrite=True)
    entry, row_etag = get_manifest_row(stores["manifest"], job.job_id, key)
    fields = dict(uri=entry.uri, nbytes=entry.nbytes, sha256=entry.sha256)
    repair_manifest_entry(
        stores["manifest"], job_id=job.job_id, window=key, **fields, etag=answer["etag"], expect_row_etag=row_etag
    )
    log = RequestLog()
    result = assemble_mosaic(job, job_stores(hooked_stores(storage, stores, log), SETTINGS), scene)
    assert result.outcome == "written"
    assert sorted(level_reads(log)) == ["L00_0000_0001.tif", "L02_0000_0000.tif"]
    verify_outputs(job, job_stores(stores, SETTINGS), scene)


def test_an_intermediate_changed_after_its_row_is_refused_by_the_service_and_named(rendered_default, stores):
    from tilecommit.errors import IncompleteManifestError

    scene, job = rendered_default[0], tree_job(rendered_default[1])
    run_tree(job, stores, scene)
    name = jobs.level_blob_name(job.job_id, 1, 0, 1)
    blob = stores["tiles"].get_blob_client(name)
    blob.upload_blob(blob.download_blob().readall(), overwrite=True)  # the same bytes, another version
    with pytest.raises(IncompleteManifestError, match="Run the job again") as raised:
        assemble_mosaic(job, job_stores(stores, SETTINGS), scene)
    assert raised.value.mismatched == [jobs.level_row_key(1, 0, 1)]
    assert not list(stores["output"].list_blobs(name_starts_with=jobs.mosaic_blob_name(job.job_id)))
    # The job run again: the node finds other bytes' version, repairs its row; the one above it
    # carries the new version; the commit then succeeds.
    results = run_tree(job, stores, scene)
    assert sorted({r["outcome"] for r in results}) == ["already-present", "written"]
    assert assemble_mosaic(job, job_stores(stores, SETTINGS), scene).outcome == "written"


def test_the_commit_refuses_intermediates_framed_otherwise_than_the_tiles(rendered_default, stores):
    from tilecommit.errors import MosaicCheckError

    scene, job = rendered_default[0], tree_job(rendered_default[1])
    run_tree(job, stores, scene)
    tree = plan_level_tree(scene.width, scene.height, job.spec, 1)
    assert tree is not None
    intermediates = None

    def unframed(*args):
        nonlocal intermediates
        intermediates = coarse_levels.read_carried_intermediates(*args)
        key = jobs.level_row_key(0, 0, 0)
        layout = intermediates.layouts[key]
        intermediates.layouts[key] = dataclasses.replace(layout, ghost=b"")
        return intermediates

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(block_copy, "read_carried_intermediates", unframed)
        with pytest.raises(MosaicCheckError, match="frames its blocks otherwise than the tiles"):
            assemble_mosaic(job, job_stores(stores, SETTINGS), scene)


@pytest.mark.parametrize("copied", [True, None], ids=["copied by the service", "staged by the commit (before)"])
def test_a_tile_repaired_with_other_contents_after_the_tree_ran_is_refused_until_the_tree_runs_again(
    rendered_default, stores, copied
):
    """The intermediates carry the contents of the tiles they were computed from: a tile whose row
    names other bytes since (a repair) would leave the old pixels in the coarse levels under a
    mosaic named by the new ones, so the commit refuses, naming the window, until the job runs the
    tree again, whose nodes then find other bytes to make and repair their intermediates."""
    from tilecommit.errors import IncompleteManifestError

    scene, job = rendered_default[0], tree_job(rendered_default[1], copied=copied)
    run_tree(job, stores, scene)
    windows = plan_windows(scene.width, scene.height, 256)
    donor, repaired = windows[6], windows[7]  # two interior windows of 256 x 256: the same layout
    body = stores["tiles"].download_blob(jobs.tile_blob_name(job.job_id, donor)).readall()
    blob = stores["tiles"].get_blob_client(jobs.tile_blob_name(job.job_id, repaired))
    answer = blob.upload_blob(body, overwrite=True)
    entry, row_etag = get_manifest_row(stores["manifest"], job.job_id, repaired.id)
    repair_manifest_entry(
        stores["manifest"],
        job_id=job.job_id,
        window=repaired.id,
        uri=entry.uri,
        nbytes=len(body),
        sha256=gates.sha256_hex(body),
        etag=answer["etag"],
        expect_row_etag=row_etag,
    )
    with pytest.raises(IncompleteManifestError, match="computed from other contents") as raised:
        assemble_mosaic(job, job_stores(stores, SETTINGS), scene)
    assert raised.value.mismatched == [repaired.id]
    assert not list(stores["output"].list_blobs(name_starts_with=jobs.mosaic_blob_name(job.job_id)))

    results = run_tree(job, stores, scene)
    # The node over the repaired tile and every node above it make other bytes: repaired.
    assert [(r["stage"], r["row"], r["col"]) for r in results if r["outcome"] == "written"] == [
        (0, 0, 1),
        (1, 0, 0),
        (2, 0, 0),
    ]
    result = assemble_mosaic(job, job_stores(stores, SETTINGS), scene)
    assert result.outcome == "written"
    # The same mosaic as the single-instance commit over the same tiles now.
    tree_bytes = stores["output"].download_blob(result.mosaic).readall()
    for name in (result.mosaic, result.stac, result.quicklook):
        stores["output"].delete_blob(name)
    single = assemble_mosaic(tree_job(rendered_default[1], per_node=0), job_stores(stores, SETTINGS), scene)
    assert stores["output"].download_blob(single.mosaic).readall() == tree_bytes
