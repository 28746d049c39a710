"""Assembly attempts without a claim, against Azurite: what a dead attempt left is harmless and
goes away, two live attempts make one mosaic, a late one stops early. Nothing here waits."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import tempfile
import threading
import time

import pytest
from rasterio.io import MemoryFile

from testkit.scenes import read_scene
from tilecommit import gates, jobs
from tilecommit.raster.assembly import attempt, commit, staging, strategy

from .conftest import counter_total
from .raster_jobs import JOB, RequestLog, assemble, assert_same_pixels, hooked_stores

#: Small blocks, so the test mosaic is streamed as a dozen or more of them.
BLOCK = 64 * 1024


def committed_pixels(stores, name: str):
    body = stores["output"].download_blob(name).readall()
    with MemoryFile(body) as memory, memory.open() as src:
        return src.read()


def block_ids(blob, kind: str) -> list[str]:
    committed, uncommitted = blob.get_block_list("all")
    return [b.id for b in (committed if kind == "committed" else uncommitted)]


def test_block_ids_keep_the_length_of_the_untagged_ids_and_differ_between_attempts():
    first, second = attempt.new_attempt_tag(), attempt.new_attempt_tag()
    # 8 characters, as every earlier version's ids: a dead attempt of an earlier version cannot
    # lock this one out with ids of another length (Put Block's 400 InvalidBlobOrBlock).
    assert len(attempt.block_id(first, 0)) == len("00000000") == attempt.BLOCK_ID_LENGTH
    assert {len(attempt.block_id(first, i)) for i in (0, 63, 64, 4095, attempt.MAX_BLOCKS - 1)} == {8}
    assert attempt.block_id(first, 0) == f"{first}AAA" and attempt.block_id(first, 65) == f"{first}ABB"
    assert attempt.block_id(first, attempt.MAX_BLOCKS - 1).endswith("___") and attempt.MAX_BLOCKS > 100_000
    ids = {attempt.block_id(first, i) for i in range(attempt.MAX_BLOCKS)}
    assert len(ids) == attempt.MAX_BLOCKS and all(i.isascii() for i in ids)
    with pytest.raises(ValueError):
        attempt.block_id(first, attempt.MAX_BLOCKS)
    # One collision in 64**5 per pair: 20 tags in a row all equal would be a broken generator.
    assert len({attempt.new_attempt_tag() for _ in range(20)} | {first, second}) > 1
    assert attempt.content_tag("a", "b") == attempt.content_tag("a", "b") != attempt.content_tag("a", "c")
    # Every tag names a plan blob, counted under its gate.
    for tag in ("AAAAA", "-_-_-", "zZ09_", first):
        assert jobs.blob_gate(jobs.share_plan_blob_name(JOB, tag)) == "plan"


def test_blocks_a_dead_attempt_staged_never_reach_the_committed_mosaic(rendered, stores, storage, monkeypatch):
    """A dead attempt's blocks, under the ids of the untagged scheme and under another tag, hold
    other bytes; the next attempt commits a pixel-exact mosaic of its own blocks only, and its
    commit discards every block it did not list."""
    spec, _, scene, settings, _ = rendered
    monkeypatch.setattr(staging, "STREAM_BLOCK_BYTES", BLOCK)
    blob = stores["output"].get_blob_client(jobs.mosaic_blob_name(JOB))
    dead = [f"{i:08d}" for i in range(6)] + [f"zzzz{i:04x}" for i in range(6)]
    for block in dead:
        blob.stage_block(block, os.urandom(BLOCK))
    assert sorted(block_ids(blob, "uncommitted")) == sorted(dead)

    result = assemble(scene, settings, stores, storage, method="blocks")
    assert (result.outcome, result.method) == ("written", "blocks")
    committed = block_ids(blob, "committed")
    assert len(committed) > 2 and not set(committed) & set(dead)
    assert len({b[: attempt.TAG_LENGTH] for b in committed}) == 1  # one attempt's tag
    assert block_ids(blob, "uncommitted") == []
    assert_same_pixels(committed_pixels(stores, result.mosaic), read_scene(spec))


def test_a_file_commit_after_a_dead_attempt_stages_ids_of_the_same_length(storage, stores, tmp_path):
    """The VRT path commits a file. The SDK's upload_blob stages a body above its single-put size
    under 32-character ids of its own, and Azure (the strict storage here) refuses a block whose
    id length differs from the blob's uncommitted ones' for a week: one dead attempt of another
    path would have locked it out. It now stages under the 8-character ids every path uses."""
    name = jobs.mosaic_blob_name(JOB)
    output = storage.blob_service(max_single_put_size=4096, max_block_size=4096).get_container_client(
        stores["output"].container_name
    )
    output.get_blob_client(name).stage_block(attempt.block_id(attempt.new_attempt_tag(), 0), b"dead" * 1024)
    path = tmp_path / "mosaic.tif"
    body = os.urandom(3 * BLOCK + 100)
    path.write_bytes(body)

    outcome = staging.commit_file(
        output, name, str(path), sha256=hashlib.sha256(body).hexdigest(), content_type="image/tiff", job_id=JOB
    )

    assert str(outcome) == "written"
    blob = stores["output"].get_blob_client(name)
    assert blob.download_blob().readall() == body
    assert {len(b) for b in block_ids(blob, "committed")} == {attempt.BLOCK_ID_LENGTH}
    assert block_ids(blob, "uncommitted") == []


def test_a_dead_attempts_temporary_directory_is_removed_and_a_live_ones_kept(rendered, stores, storage):
    _, _, scene, settings, _ = rendered
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid now names no process (the kernel does not reuse it at once)
    dead = tempfile.mkdtemp(prefix=f"tilecommit-{JOB}-{gone.pid}-")
    with open(os.path.join(dead, "level2.tif"), "wb") as leftover:
        leftover.write(b"\0" * 4096)
    live = tempfile.mkdtemp(prefix=f"tilecommit-{JOB}-{os.getpid()}-")  # as a concurrent attempt's
    try:
        assert assemble(scene, settings, stores, storage, method="blocks").outcome == "written"
        assert not os.path.exists(dead)
        assert os.path.isdir(live)
    finally:
        os.rmdir(live)


def test_two_assemblies_started_together_commit_one_mosaic_and_neither_waits(rendered, stores, storage, monkeypatch):
    spec, _, scene, settings, _ = rendered
    monkeypatch.setattr(staging, "STREAM_BLOCK_BYTES", BLOCK)
    started = time.perf_counter()
    solo = assemble(scene, settings, stores, storage, method="blocks")
    solo_s = time.perf_counter() - started
    assert solo.outcome == "written"
    for name in (solo.mosaic, solo.stac, solo.quicklook):
        stores["output"].delete_blob(name)

    log = RequestLog()
    hooked = hooked_stores(storage, stores, log)
    refused = counter_total("ConditionalWritePreconditionFailed", gate="mosaic")
    barrier = threading.Barrier(2)
    results: dict[int, tuple] = {}

    def run(n: int) -> None:
        barrier.wait()
        began = time.perf_counter()
        try:
            results[n] = (
                "ok",
                assemble(scene, settings, hooked, storage, method="blocks"),
                time.perf_counter() - began,
            )
        except Exception as exc:  # noqa: BLE001 - reported below
            results[n] = ("raised", exc, time.perf_counter() - began)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert all(r[0] == "ok" for r in results.values()), results
    outcomes = sorted(r[1].outcome for r in results.values())
    print(
        f"\none assembly alone {solo_s:.2f} s; two started together: "
        + ", ".join(f"{r[1].outcome} ({r[1].method}) {r[2]:.2f} s" for r in results.values())
    )
    assert outcomes == ["already-present", "written"]
    name = jobs.mosaic_blob_name(JOB)
    blob = stores["output"].get_blob_client(name)
    # Committed once: one attempt's blocks; the other's commit, if it got that far, was refused
    # and counted (with the refused creates of the companions, which both attempts write), never raised.
    commits = log.put_block_lists(name)
    assert 1 <= len(commits) <= 2
    assert counter_total("ConditionalWritePreconditionFailed", gate="mosaic") - refused >= len(commits) - 1
    assert len({b[:4] for b in block_ids(blob, "committed")}) == 1
    assert_same_pixels(committed_pixels(stores, name), read_scene(spec))
    written = next(r[1] for r in results.values() if r[1].outcome == "written")
    assert blob.get_blob_properties().metadata[gates.SHA256_METADATA_KEY] == written.sha256 == solo.sha256
    # Neither waited for the other: no claim, nothing to wait on ("seconds, not minutes").
    assert max(r[2] for r in results.values()) < 60


def test_an_attempt_stops_streaming_when_another_commits_the_mosaic(rendered, stores, storage, monkeypatch):
    """The other attempt's commit is made from this test while this attempt streams (at its
    third Put Block); this attempt sees the blob at its next check, stages nothing more, commits
    nothing and returns already-present."""
    spec, _, scene, settings, _ = rendered
    monkeypatch.setattr(staging, "STREAM_BLOCK_BYTES", BLOCK)
    monkeypatch.setattr(staging, "COMMITTED_ELSEWHERE_CHECK_S", 0.0)
    name = jobs.mosaic_blob_name(JOB)
    first = assemble(scene, settings, stores, storage, method="blocks")
    body = stores["output"].download_blob(name).readall()
    for leftover in (first.mosaic, first.stac, first.quicklook):
        stores["output"].delete_blob(leftover)
    total_blocks = -(-len(body) // BLOCK)
    assert total_blocks > 6

    log = RequestLog()
    other = threading.Event()

    def commit_by_the_other_attempt(request) -> None:
        log(request)
        if len(log.put_blocks(name)) == 3 and not other.is_set():
            other.set()
            # The other attempt commits as attempts do: its own staged blocks, one create-only list.
            # (Not one Put Blob: Azurite refuses a Put Blob with If-None-Match: * while the name
            # has uncommitted blocks, with 409 BlobAlreadyExists, although no blob exists.)
            sink = staging.StagedBlockSink(stores["output"].get_blob_client(name))
            sink.write(body)
            assert (
                staging.commit_staged_blob(
                    stores["output"],
                    name,
                    sink.close(),
                    sha256=first.sha256,
                    content_type=commit.COG_CONTENT_TYPE,
                    job_id=JOB,
                    metadata={
                        strategy.OVERVIEW_LEVELS_METADATA_KEY: str(first.overview_levels),
                        strategy.METHOD_METADATA_KEY: "blocks",
                    },
                )
                is gates.Outcome.WRITTEN
            )

    hooked = hooked_stores(storage, stores, commit_by_the_other_attempt)
    result = assemble(scene, settings, hooked, storage, method="blocks")
    assert other.is_set()
    assert result.outcome == "already-present" and result.sha256 == first.sha256
    staged = log.put_blocks(name)
    assert len(staged) <= 3 + staging.STAGE_IN_FLIGHT < total_blocks
    assert log.put_block_lists(name) == []
    tags = {base64.b64decode(r[2]["blockid"]).decode()[:4] for r in staged}
    assert len(tags) == 1
    # The companions are written from the committed mosaic, as after any already-present.
    assert sorted(b.name for b in stores["output"].list_blobs()) == sorted([first.mosaic, first.stac, first.quicklook])
    assert_same_pixels(committed_pixels(stores, name), read_scene(spec))
