"""The plan's instance memory limit, on a real process's resident memory."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from devhost.durable.limits import MemoryWatchdog, resident_mb
from tests.app_jobs import check_outputs, make_scene, serve, serve_until_finished, upload_until_killed


def test_the_watchdog_sees_this_process_pass_its_limit():
    # The reaction is a callback here: the real one (SIGKILL) would end the test run itself.
    fired = threading.Event()
    watchdog = MemoryWatchdog(resident_mb() + 100, interval=0.02, exceeded=fired.set).start()
    try:
        assert not fired.wait(0.3)
        ballast = b"\x01" * (300 * 2**20)  # written, so resident
        assert fired.wait(5)
        assert watchdog.peak_mb > watchdog.limit_mb
        del ballast
    finally:
        watchdog.stop()


@pytest.mark.slow
def test_a_host_over_its_instance_memory_is_recycled_and_the_job_resumes_on_the_next(storage, app_env, tmp_path):
    scene = make_scene(tmp_path / "scene.tif", 1100, 800)  # 20 windows
    log = tmp_path / "serve.log"
    probe = serve(app_env, log)
    baseline = resident_mb(probe.pid)
    os.killpg(probe.pid, signal.SIGTERM)
    probe.wait(timeout=60)

    # A limit the host passes as soon as it does real work: it is killed as the platform would.
    job_id = upload_until_killed(storage, app_env, scene, log, "--instance-memory-mb", str(round(baseline + 20)))
    assert b"over the limit" in log.read_bytes()

    state = serve_until_finished(storage, app_env, log, job_id)  # a fresh instance, default limit
    assert state["status"] == "Completed", state
    check_outputs(storage, app_env, {"status": "completed", "job_id": job_id, "windows": 20}, scene)


@pytest.mark.slow
def test_a_host_whose_function_has_not_ended_after_its_timeout_is_recycled_and_the_job_resumes_on_the_next(
    storage, app_env, tmp_path
):
    """A tile activity stuck for good (tests/stuck_host.py) in ``python -m devhost serve``: past
    the function timeout (2 s here) its task fails and is retried, and 2 s later the process is
    ended as the real host ends the worker running it (SIGKILL), saying so at ERROR; a serve
    started again finishes the job."""
    scene = make_scene(tmp_path / "scene.tif", 1100, 800)  # 20 windows
    log = tmp_path / "serve.log"
    marker = tmp_path / "stuck"
    stuck = ("tests.stuck_host", "0000_0000", str(marker), "--")
    job_id = upload_until_killed(storage, app_env, scene, log, "--function-timeout", "2", module=stuck)
    said = log.read_text()
    assert marker.exists() and "ERROR" in said and "render_tile" in said and "has not ended" in said, said[-3000:]
    assert "recycling this host's process" in said

    state = serve_until_finished(storage, app_env, log, job_id)  # a fresh process, no stuck function
    assert state["status"] == "Completed", state
    check_outputs(storage, app_env, {"status": "completed", "job_id": job_id, "windows": 20}, scene)
