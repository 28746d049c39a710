"""Helpers for tests that run whole jobs on the local host: each test's own app settings
(containers, tables, task hub), a host to run them, and reading back what a job stored."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import rasterio
from rasterio.io import MemoryFile

from devhost.durable.host import HostOptions, LocalHost
from testkit.scenes import SceneSpec, write_scene
from tilecommit.grid import plan_windows
from tilecommit.jobs import job_id_for
from tilecommit.manifest import count_manifest
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec

ROOT = Path(__file__).resolve().parent.parent

#: Window size of the end-to-end tests: small scenes still make several windows.
WINDOW = 256


@dataclass
class AppEnv:
    hub: str
    input: str
    tiles: str
    output: str
    manifest: str
    env: dict


def local_host(app_env: AppEnv, **options) -> LocalHost:
    options = {"timer_scale": 0.01, "watch_interval": 0.1, **options}
    return LocalHost(HostOptions(hub=app_env.hub, **options))


def download(storage, container: str, name: str) -> bytes:
    return storage.blob_service().get_blob_client(container, name).download_blob().readall()


def make_scene(path: Path, width: int, height: int) -> Path:
    """A deterministic 3-band uint16 scene in 256-pixel blocks (the shared generator)."""
    return Path(write_scene(str(path), SceneSpec(width, height, blocksize=WINDOW)))


def read_pixels(path_or_bytes: Path | bytes) -> np.ndarray:
    if isinstance(path_or_bytes, bytes):
        with MemoryFile(path_or_bytes) as memory, memory.open() as src:
            return src.read()
    with rasterio.open(path_or_bytes) as src:
        return src.read()


def check_outputs(storage, app_env: AppEnv, summary: dict, scene: Path, window: int = WINDOW) -> None:
    assert summary["status"] == "completed", summary
    windows = len(plan_windows(*read_pixels(scene).shape[:0:-1], window))
    assert summary["windows"] == windows
    manifest = count_manifest(storage.table_service().get_table_client(app_env.manifest), summary["job_id"])
    assert manifest.rows == windows
    mosaic = download(storage, app_env.output, f"mosaics/{summary['job_id']}/mosaic.tif")
    np.testing.assert_array_equal(read_pixels(mosaic), read_pixels(scene))
    assert json.loads(download(storage, app_env.output, f"mosaics/{summary['job_id']}/item.json"))["type"] == "Feature"


def serve(app_env: AppEnv, log: Path, *extra: str, module: tuple[str, ...] = ("devhost",)) -> subprocess.Popen:
    """``python -m devhost serve`` in its own process; returns once it watches the container.

    ``module``: what runs instead of ``devhost`` and its arguments (a host that crashes on purpose).
    """
    # faulthandler on: a host that does not stop is sent SIGABRT and writes every thread's stack to the log.
    env = {**os.environ, **app_env.env, "PYTHONFAULTHANDLER": "1"}
    if "--worker-id" not in extra:
        # One name for the test's host across restarts, as a restarted Azure instance keeps its
        # machine name: it takes its partitions back at once instead of waiting for their leases.
        extra = (*extra, "--worker-id", f"{app_env.hub}-serve")
    if "--http-port" not in extra:
        extra = (*extra, "--http-port", "0")  # several hosts at once: none on the default port
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", *module, "serve", "--timer-scale", "0.01", "--hub", app_env.hub, *extra],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while b"devhost: watching" not in log.read_bytes():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"devhost serve did not start:\n{log.read_text()}")
        time.sleep(0.1)
    return process


def upload(storage, app_env: AppEnv, scene: Path) -> str:
    blob = storage.blob_service().get_blob_client(app_env.input, scene.name)
    with scene.open("rb") as data:
        etag = blob.upload_blob(data, overwrite=True)["etag"]
    return job_id_for(blob.url, etag, OutputSpec.from_settings(Settings.from_env()))


def upload_until_killed(
    storage, app_env: AppEnv, scene: Path, log: Path, *extra: str, module: tuple[str, ...] = ("devhost",)
) -> str:
    """Serve with ``extra`` options (``module``: as :func:`serve`), upload ``scene``, and wait for
    that host to die by SIGKILL."""
    host = serve(app_env, log, *extra, module=module)
    try:
        job_id = upload(storage, app_env, scene)
        assert host.wait(timeout=180) == -signal.SIGKILL, log.read_text()
    finally:
        if host.poll() is None:
            os.killpg(host.pid, signal.SIGKILL)
    return job_id


def wait_for_state(storage, app_env: AppEnv, job_id: str, predicate, timeout: float = 180) -> dict:
    from devhost.durable.queues import queue_service
    from devhost.durable.store import HistoryStore

    store = HistoryStore(storage.blob_service(), storage.table_service(), app_env.hub, queue_service(storage))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = store.read_state(job_id)
        try:
            if state is not None and predicate(state):
                return state
        except KeyError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"job {job_id}: condition not reached; last state {state}")


def serve_until_finished(storage, app_env: AppEnv, log: Path, job_id: str) -> dict:
    """Start a fresh host (as after a crash), wait until the job is finished, stop the host."""
    host = serve(app_env, log)
    try:
        return wait_for_state(storage, app_env, job_id, lambda s: s["status"] in ("Completed", "Failed"))
    finally:
        stop_host(host, log)


def stop_host(host: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    """SIGTERM, as the platform stops an instance; a host still running after ``timeout`` seconds is
    a bug: its stacks (faulthandler, on SIGABRT) and the log's tail are the failure's message."""
    os.killpg(host.pid, signal.SIGTERM)
    wait_stopped(host, log, timeout)


def wait_stopped(host: subprocess.Popen, log: Path, timeout: float) -> None:
    """Wait for a host sent SIGTERM to end; still running after ``timeout`` seconds, it is sent
    SIGABRT (its stacks go to its log) and the log's tail is the failure's message."""
    try:
        host.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(host.pid, signal.SIGABRT)
        host.wait(timeout=30)
        raise AssertionError(
            f"the host did not stop {timeout:.0f} s after SIGTERM:\n{log.read_text()[-40000:]}"
        ) from None


def wait_until(predicate, timeout: float = 120) -> None:
    """Return once ``predicate()`` is true; TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.05)
