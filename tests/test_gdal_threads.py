"""GDAL never reads an upload on a thread of its own, on any read path: its worker threads are one
pool shared by the process, and a worker calling back into Python for the upload's bytes waits for
the GIL while another Python thread can hold the GIL inside GDAL waiting for that pool (four
web-optimized jobs once stopped so, for good: tilecommit/raster/reading/source.py,
``UPLOAD_READ_THREADS``).

Every test watches the upload plugin's calls (:class:`tests.gdal_threads.GdalThreadReads`) while
the path runs: validation, a plain window, the warped windows (web-optimized, target_srs and
resolution, an alpha band made the mask, a web-optimized alpha band), a whole job with its
assembly (the committed mosaic's checks, quicklook, STAC item and footprint) and its scrub; four
warped renders run at once beside a GIL-holding overview build in a process of their own; and a
GDAL made to read an upload with its threads all the same is refused, with a fault that says so.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import rasterio
from rasterio.windows import Window as RioWindow

from testkit.scenes import SceneSpec, write_scene
from tilecommit.errors import GdalStepError, is_retryable, kind_of
from tilecommit.grid import plan_windows
from tilecommit.raster.env import gdal_env
from tilecommit.raster.reading.gdal_files import gdal_path
from tilecommit.raster.reading.source import UPLOAD_DATASET_OPTIONS, LocalFile
from tilecommit.raster.reading.upload import TIFF, upload_gdal_options
from tilecommit.raster.scrub import check_window
from tilecommit.settings import Settings

from .gdal_threads import WARPED, WINDOW, GdalThreadReads, render_every_window, run_at_once
from .raster_jobs import job_of, job_stores, run_steps
from .test_alpha_band import alpha_scene

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = Settings(window_size=WINDOW)
#: How long the four concurrent renders may take (they take well under a minute on two busy cores).
CONCURRENT_BOUND_S = 240


@pytest.fixture
def gdal_thread_reads(monkeypatch) -> GdalThreadReads:
    return GdalThreadReads().install(monkeypatch.setattr)


@pytest.fixture
def utm(tmp_path) -> str:
    """768 x 640 x 3 uint16, nodata in a corner, DEFLATE in blocks of 256: several blocks a window."""
    return write_scene(str(tmp_path / "utm.tif"), SceneSpec(768, 640, nodata=0, blocksize=256))


def test_validation_and_plain_windows_read_the_upload_on_the_calling_thread_only(utm, gdal_thread_reads):
    assert render_every_window(utm, {}, SETTINGS) == 4
    assert gdal_thread_reads.calls == [], gdal_thread_reads.summary()


@pytest.mark.parametrize("case", WARPED)
def test_a_warped_window_reads_the_upload_on_the_calling_thread_only(tmp_path, utm, gdal_thread_reads, case):
    """The warped VRT opens the upload again by its name: before, that dataset took GDAL_NUM_THREADS=2
    from the environment and GDAL's pool decoded its blocks through the plugin (thousands of calls)."""
    options, on_alpha = WARPED[case]
    upload = alpha_scene(tmp_path / "alpha.tif", compress="deflate") if on_alpha else utm
    assert render_every_window(upload, options, SETTINGS) > 1
    assert gdal_thread_reads.calls == [], gdal_thread_reads.summary()


@pytest.mark.parametrize(
    "profile, on_alpha",
    [("default", False), ("default,web_optimized=true", False), ("default,add_mask=true", True)],
)
def test_a_whole_job_its_assembly_and_its_scrub_read_on_the_calling_threads_only(
    tmp_path, utm, stores, storage, gdal_thread_reads, profile, on_alpha
):
    """Validation, every window, the assembly's reads of the committed mosaic (its checks, the
    quicklook, the STAC item's levels and footprint, every one through the same plugin) and the
    scrub of every window."""
    upload = alpha_scene(tmp_path / "alpha.tif", compress="deflate") if on_alpha else utm
    settings = Settings(window_size=WINDOW, profile=profile)
    spec, scene, result = run_steps(upload, settings, stores, storage)
    assert result.outcome == "written"
    for window in plan_windows(scene.width, scene.height, spec.window_size):
        report = check_window(job_of(settings, spec=spec), job_stores(stores, settings), upload, window)
        assert report.differences == [], report.details
    assert gdal_thread_reads.calls == [], gdal_thread_reads.summary()


def test_four_warped_renders_at_once_beside_a_gil_holding_overview_build_all_finish(tmp_path):
    """Before, this stopped within seconds, for good, at near-zero CPU: GDAL's pool decoding the
    warped VRTs' uploads, a worker in the plugin waiting for the GIL the overview build held while
    it waited for the pool."""
    command = [sys.executable, "-m", "tests.concurrent_warps", str(tmp_path), str(CONCURRENT_BOUND_S)]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=CONCURRENT_BOUND_S + 120)
    assert run.returncode == 0, f"exit {run.returncode}; its stacks and errors:\n{run.stderr[-30000:]}"
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["gdal_thread_call_count"] == 0, report["gdal_thread_calls"]
    renders = {name: result for name, result in report["renders"].items() if name != "coarse levels"}
    assert len(renders) == 4
    for name, result in renders.items():
        assert isinstance(result, int) and result > 1, (name, result)
    assert report["renders"]["coarse levels"] >= 1


def test_an_upload_gdal_reads_with_its_own_threads_is_refused_with_a_fault_that_says_so(utm):
    """What the reader does if a setting ever lets GDAL's pool at an upload: the plugin's calls on
    a thread Python did not start are refused and recorded, and the GDAL call fails with a fault
    that names the defect, not retried (the same settings would meet it again)."""
    upload = LocalFile(utm)
    threads = {**UPLOAD_DATASET_OPTIONS, "NUM_THREADS": 2}  # what the app never opens an upload with
    with (
        gdal_env(SETTINGS, upload_gdal_options(upload.path)),
        pytest.raises(GdalStepError) as caught,
        upload.checked(),
        rasterio.open(gdal_path(upload), driver=TIFF.driver, **threads) as src,
    ):
        src.read(window=RioWindow(0, 0, 768, 640))
    assert not is_retryable(caught.value) and kind_of(caught.value) == "fault"
    assert "on a thread of its own" in str(caught.value) and "not retried" in str(caught.value)
    assert upload.faults and all(fault.kind == "gdal-thread" for fault in upload.faults)
    # The same read on the calling thread only, as the app opens every upload: served, as it is.
    with rasterio.open(utm) as plain:
        expected = plain.read()
    again = LocalFile(utm)
    with (
        gdal_env(SETTINGS, upload_gdal_options(again.path)),
        again.checked(),
        rasterio.open(gdal_path(again), driver=TIFF.driver, **UPLOAD_DATASET_OPTIONS) as src,
    ):
        assert np.array_equal(src.read(), expected)
    assert again.faults == []


def test_run_at_once_fails_with_every_threads_stack_when_a_task_does_not_finish():
    """The bounded wait of the concurrent test: a task still running after the bound names itself
    and where every thread stands."""
    release = threading.Event()
    with pytest.raises(AssertionError) as caught:
        run_at_once({"stuck": lambda: release.wait(30), "quick": lambda: 1}, bound=0.5)
    release.set()
    message = str(caught.value)
    assert "['stuck'] still running" in message and " is stuck\n" in message
    assert 'threading.py", line' in message and "in wait" in message  # where the stuck task waits
