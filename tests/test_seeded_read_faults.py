"""Seeded read faults in front of the upload: no wrong tile, no fault called bad input.

A fault proxy stands in front of the upload's container only (not the host's own store, not the
tiles or the manifest): of the GETs the app sends for the upload's bytes, a seeded 1 in K is
refused (503 ServerBusy), reset (before or after storage answered), or answered with its body
cut half-way, the kind drawn from the same seed. Jobs
run on the local host through the real SDK orchestration, several at once. Each job either
completes, or fails with a retryable storage fault and completes when its upload is delivered
again; then every tile is decoded and compared with its window of the source, pixel by pixel
(not by sha256 against another run), and the mosaic with the whole source.

``TILECOMMIT_FAULT_RUN_JOBS`` sets the jobs per rate (the suite runs a few; docs/faults.md
gives the figures of a long run, made with both cores busy).
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import rasterio
from rasterio.io import MemoryFile

from devhost.session import job_summary, process_file
from testkit.scenes import SceneSpec, write_scene
from testkit.storage_proxy import FaultPlan
from tilecommit import jobs
from tilecommit.grid import plan_windows
from tilecommit.settings import SETTING_WINDOW_SIZE

from .app_jobs import WINDOW, check_outputs, download, local_host
from .fault_jobs import app_behind_proxy, app_storage

pytestmark = pytest.mark.slow

#: 1 in K of the upload's GETs is broken, for each K.
RATES = (3, 10, 50)
JOBS_PER_RATE = int(os.environ.get("TILECOMMIT_FAULT_RUN_JOBS", "2"))
#: Jobs running at once on the one host.
CONCURRENT_JOBS = 3
#: Error types that say the upload itself is wrong: never the verdict on a storage fault.
BAD_INPUT_TYPES = ("InvalidRasterError", "UnsupportedRasterError", "SourceChangedError", "InvalidNameError")


def upload_gets(app_env):
    """The proxy's selector: GETs of the upload's bytes (the input container's blobs)."""
    app = app_storage(app_env)

    def applies(method: str, path: str) -> bool:
        return method == "GET" and app(method, path) and path.split("/")[2] == app_env.input

    return applies


def scenes(tmp_path: Path, count: int) -> list[Path]:
    """Distinct scenes (other seeds, other sizes), each a few windows of 256 px."""
    sizes = [(700, 520), (512, 768), (900, 300)]
    tmp_path.mkdir(parents=True, exist_ok=True)
    return [
        Path(
            write_scene(
                str(tmp_path / f"scene-{i}.tif"),
                SceneSpec(*sizes[i % len(sizes)], blocksize=WINDOW, seed=100 + i),
            )
        )
        for i in range(count)
    ]


def wrong_tiles(storage, app_env, job_id: str, scene: Path) -> tuple[int, list[str]]:
    """(tiles checked, windows whose decoded pixels differ from the source window)."""
    wrong = []
    with rasterio.open(scene) as src:
        windows = plan_windows(src.width, src.height, WINDOW)
        for window in windows:
            body = download(storage, app_env.tiles, jobs.tile_blob_name(job_id, window))
            want = src.read(window=rasterio.windows.Window(window.col_off, window.row_off, window.width, window.height))
            with MemoryFile(body) as memory, memory.open() as tile:
                if not np.array_equal(tile.read(), want):
                    wrong.append(window.id)
    return len(windows), wrong


def run_at_rate(storage, app_env, azurite, monkeypatch, tmp_path, k: int | None, count: int) -> dict:
    """``count`` jobs with 1 in ``k`` of the upload's GETs broken (None: no fault); the figures."""
    plan = FaultPlan(every=k or 0, applies=upload_gets(app_env), seed=k or 0)
    figures = Counter()
    started = time.perf_counter()
    with app_behind_proxy(azurite, monkeypatch, plan) as (blobs, _), local_host(app_env) as host:
        paths = scenes(tmp_path / f"k{k}", count)
        with ThreadPoolExecutor(CONCURRENT_JOBS) as pool:
            firsts = list(pool.map(lambda p: process_file(host, p, name=f"k{k}/{p.name}", timeout=600), paths))
        for path, first in zip(paths, firsts, strict=True):
            summary = first
            figures["jobs"] += 1
            if first["status"] != "completed":
                error = first.get("error", "")
                assert not any(f"({t})" in error for t in BAD_INPUT_TYPES), f"a storage fault called bad input: {error}"
                assert "retryable" in error or "StorageFault" in error or "Timeout" in error, error
                figures["failed_then_delivered_again"] += 1
                host.deliver_blob_created(f"k{k}/{path.name}")
                summary = job_summary(host.engine.wait_for(first["job_id"], timeout=600))
            check_outputs(storage, app_env, summary, path)
            checked, wrong = wrong_tiles(storage, app_env, summary["job_id"], path)
            figures["tiles_checked"] += checked
            figures["wrong_tiles"] += len(wrong)
            assert wrong == [], f"job {summary['job_id']}: tiles differ from the source: {wrong}"
    figures["upload_gets"] = sum(1 for method, path in blobs.requests if upload_gets(app_env)(method, path))
    figures.update({f"injected_{kind}": n for kind, n in blobs.injected.items()})
    figures["wall_s"] = round(time.perf_counter() - started, 1)
    return dict(figures)


@pytest.mark.parametrize("k", [None, *RATES], ids=lambda k: f"1-in-{k}" if k else "fault-free")
def test_broken_upload_reads_never_make_a_wrong_tile_nor_bad_input(storage, app_env, azurite, monkeypatch, tmp_path, k):
    """(The fault-free run is the baseline the time cost is measured against.)"""
    figures = run_at_rate(storage, app_env, azurite, monkeypatch, tmp_path, k, JOBS_PER_RATE)
    print(f"\n{f'1 in {k}' if k else 'fault-free'}: {figures}")
    assert figures["jobs"] == JOBS_PER_RATE and figures["wrong_tiles"] == 0
    if k is None:
        assert not any(key.startswith("injected_") for key in figures), figures
        return
    injected = sum(v for key, v in figures.items() if key.startswith("injected_"))
    # Exactly 1 in k of the upload's GETs (the seeded offset decides whether a last partial k counts).
    assert figures["upload_gets"] // k <= injected <= figures["upload_gets"] // k + 1, figures


def test_ten_percent_server_busy_on_all_app_storage_completes_pixel_exact(
    storage, app_env, azurite, monkeypatch, tmp_path
):
    """Every blob and table request of the app through a proxy that answers 10 % of them 503
    ServerBusy (Retry-After: 1): a 4096 x 3072 x 3 job of 1024-px windows completes, pixel-exact."""
    monkeypatch.setenv(SETTING_WINDOW_SIZE, "1024")
    scene = Path(write_scene(str(tmp_path / "busy.tif"), SceneSpec(4096, 3072, blocksize=256, seed=5)))
    plan = FaultPlan(busy=0.1, applies=app_storage(app_env), seed=10)
    with app_behind_proxy(azurite, monkeypatch, plan) as (blobs, tables), local_host(app_env) as host:
        summary = process_file(host, scene, timeout=600)
    print(f"\n10 % busy: {summary['status']} in {summary.get('elapsed_s')} s; 503s {blobs.injected} {tables.injected}")
    check_outputs(storage, app_env, summary, scene, window=1024)
    assert blobs.injected["busy"] + tables.injected["busy"] >= 10


#: Moments at which the upload is overwritten during a 60-window job (the long run: 20).
OVERWRITES = int(os.environ.get("TILECOMMIT_OVERWRITE_RUNS", "3"))


def _tiles_of(storage, app_env, job_id: str, scene: Path) -> dict[str, bool]:
    """Window id -> whether the stored tile equals that window of ``scene`` (only tiles that exist)."""
    tiles = storage.blob_service().get_container_client(app_env.tiles)
    found = {}
    with rasterio.open(scene) as src:
        for window in plan_windows(src.width, src.height, WINDOW):
            blob = tiles.get_blob_client(jobs.tile_blob_name(job_id, window))
            if not blob.exists():
                continue
            want = src.read(window=rasterio.windows.Window(window.col_off, window.row_off, window.width, window.height))
            with MemoryFile(blob.download_blob().readall()) as memory, memory.open() as tile:
                found[window.id] = bool(np.array_equal(tile.read(), want))
    return found


def test_an_upload_overwritten_at_random_moments_never_lends_a_pixel_to_the_old_job(
    storage, app_env, azurite, tmp_path
):
    """A 60-window job whose upload is overwritten (other pixels) at a seeded random moment while
    it runs: the old job completes with only its own version's pixels (the overwrite came after
    its last read), or fails once, naming both ETags; the new version's job completes pixel-exact."""
    import random

    from tilecommit.jobs import job_id_for
    from tilecommit.spec import OutputSpec

    old = Path(write_scene(str(tmp_path / "old.tif"), SceneSpec(2560, 1536, blocksize=WINDOW, seed=1)))
    new = Path(write_scene(str(tmp_path / "new.tif"), SceneSpec(2560, 1536, blocksize=WINDOW, seed=2)))
    uploads = storage.blob_service().get_container_client(app_env.input)
    draw = random.Random(21)
    outcomes = Counter()
    with local_host(app_env) as host:
        spec = OutputSpec.from_settings(host.settings)
        # How long the job runs here and now: the moments are drawn across all of it (and a little after).
        baseline = process_file(host, old, name="baseline.tif", timeout=600)
        check_outputs(storage, app_env, baseline, old)
        duration = baseline["elapsed_s"]
        for run in range(OVERWRITES):
            name = f"overwritten-{run}.tif"
            with ThreadPoolExecutor(1) as pool:
                first = pool.submit(process_file, host, old, name=name, timeout=600)
                while not host.decisions or host.decisions[-1]["blob"] != name:  # the old job has started
                    time.sleep(0.02)
                time.sleep(draw.uniform(0.0, 1.1 * duration))
                with new.open("rb") as data:
                    new_etag = uploads.upload_blob(name, data, overwrite=True).get_blob_properties().etag
                summary = first.result()
            new_id = job_id_for(uploads.get_blob_client(name).url, new_etag, spec)
            while host.engine.status(new_id) is None:
                time.sleep(0.05)
            check_outputs(storage, app_env, job_summary(host.engine.wait_for(new_id, timeout=600)), new)
            assert all(_tiles_of(storage, app_env, new_id, new).values())
            old_tiles = _tiles_of(storage, app_env, summary["job_id"], old)
            assert all(old_tiles.values()), f"run {run}: a tile of the old job holds other pixels"
            if summary["status"] == "completed":
                check_outputs(storage, app_env, summary, old)
                outcomes["completed before the overwrite mattered"] += 1
            else:
                error = summary["error"]
                named = set(re.findall(r"ETag (0x[0-9A-Fa-f]+)", error))
                assert "(SourceChangedError)" in error and new_etag.strip('"') in named and len(named) == 2, error
                outcomes["failed naming both versions"] += 1
            outcomes["old tiles checked"] += len(old_tiles)
    print(f"\noverwrites over a {duration:.1f} s job: {dict(outcomes)}")
    assert sum(v for k, v in outcomes.items() if k != "old tiles checked") == OVERWRITES
