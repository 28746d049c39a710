"""A backfill of blobs already stored, a third of which have jobs, its host killed once midway.

    .venv/bin/python -m bench.backfill --blobs 300 --kill-after 80

Uploads ``--blobs`` one-window scenes to a private Azurite; a third of them get their jobs first
through the upload path (delivered to the starter): 40 % of those complete, 30 % fail (their
blob is not a raster), 30 % stay pending (queued, run by the backfill's host). Then
``python -m devhost backfill`` runs and is killed (SIGKILL) once it has logged ``--kill-after``
job starts, and is run again with the same arguments. Printed: the backfill's counts, the job
starts the starter logged in both runs (a job id twice: started twice; a start the kill cut off
before its line was written is missing), the new blobs with no job in the task hub, the events
in the backfill's history (its last execution's), the pages, and the wall time of each run. Nothing is
asserted; tests/test_backfill.py asserts the same on 30 blobs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import BenchStorage, environment, say, tiny_scene

ROOT = Path(__file__).resolve().parent.parent
STARTED = re.compile(r"started job ([0-9a-f]{16}) for ")


def prepare(storage: BenchStorage, env: dict, blobs: int, scene: bytes) -> tuple[list[str], dict[str, str]]:
    """Upload the blobs; give a third of them their jobs as their upload events would. The
    blob names and {name: job id} of every blob."""
    from devhost.durable.host import HostOptions, LocalHost, close_durable_client_session
    from tilecommit.jobs import job_id_for
    from tilecommit.settings import SETTING_INPUT_CONTAINER
    from tilecommit.spec import OutputSpec

    names = [f"scenes/b{i:04d}.tif" for i in range(blobs)]
    had = names[::3]
    completed, failed = had[: len(had) * 4 // 10], had[len(had) * 4 // 10 : len(had) * 7 // 10]
    pending = had[len(had) * 7 // 10 :]
    container = storage.connection.blob_service().get_container_client(env[SETTING_INPUT_CONTAINER])
    for name in names:
        container.upload_blob(name, b"not a raster" if name in failed else scene, overwrite=True)
    host = LocalHost(HostOptions(hub=env["BENCH_HUB"], timer_scale=0.01))
    spec = OutputSpec.from_settings(host.settings)
    ids = {
        n: job_id_for(container.get_blob_client(n).url, container.get_blob_client(n).get_blob_properties().etag, spec)
        for n in names
    }
    host.start(watch=False)  # no upload event but those delivered here
    try:
        for name in completed + failed:
            host.deliver_blob_created(name)
        for name in completed + failed:
            host.engine.wait_for(ids[name], timeout=600)
    finally:
        host.stop()
    queued = LocalHost(HostOptions(hub=env["BENCH_HUB"]))
    queued.api.start()  # the Durable HTTP API alone: these jobs are queued and run by the next host
    try:
        for name in pending:
            queued.deliver_blob_created(name)
    finally:
        close_durable_client_session()
        queued.api.stop()
    return names, ids


def backfill(env: dict, log: Path, args: list[str], kill_after: int | None) -> tuple[int, float, str]:
    """One ``python -m devhost backfill``; killed once its log shows ``kill_after`` job starts."""
    command = [sys.executable, "-m", "devhost", "-v", "backfill", "--hub", env["BENCH_HUB"], *args]
    started = time.monotonic()
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=out)
        while kill_after is not None and process.poll() is None:
            if len(STARTED.findall(log.read_text())) >= kill_after:
                process.send_signal(signal.SIGKILL)
                break
            time.sleep(0.05)
        stdout = process.communicate()[0].decode()
    return process.returncode, time.monotonic() - started, stdout


def history_store(storage: BenchStorage, hub: str):
    from devhost.durable.queues import queue_service
    from devhost.durable.store import HistoryStore

    conn = storage.connection
    return HistoryStore(conn.blob_service(), conn.table_service(), hub, queue_service(conn))


def history_events(storage: BenchStorage, hub: str, instance_id: str) -> int:
    return sum(len(episode.events) for episode in history_store(storage, hub).episodes(instance_id))


def task_hub_state(storage: BenchStorage, hub: str, instance_id: str) -> dict | None:
    return history_store(storage, hub).read_state(instance_id)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.backfill", description=__doc__.split("\n\n")[0])
    parser.add_argument("--blobs", type=int, default=300)
    parser.add_argument("--kill-after", type=int, default=80, help="kill the first run after this many job starts")
    parser.add_argument("--page-size", type=int, default=25)
    parser.add_argument("--max-running", type=int, default=8)
    options = parser.parse_args(argv)

    from tilecommit.backfill import backfill_id
    from tilecommit.settings import SETTING_INPUT_CONTAINER

    with tempfile.TemporaryDirectory(prefix="tilecommit-bench-backfill-") as tmp, BenchStorage() as storage:
        env = storage.app_env("backfill", window_size=256, batch_size=4)
        storage.ensure(env)
        scene = tiny_scene(Path(tmp) / "scene.tif", 256).read_bytes()
        with environment(env):
            say(f"uploading {options.blobs} blobs, a third with jobs")
            names, ids = prepare(storage, env, options.blobs, scene)
        had = set(names[::3])
        new_ids = [ids[n] for n in names if n not in had]
        common = ["--worker-id", f"{env['BENCH_HUB']}-backfill", "--lease-seconds", "3", "--timer-scale", "0.01"]
        common += [
            "--page-size",
            str(options.page_size),
            "--max-running",
            str(options.max_running),
            "--wait-seconds",
            "0.5",
        ]
        logs = [Path(tmp) / "first.log", Path(tmp) / "again.log"]
        first = backfill(env, logs[0], common, options.kill_after)
        again = backfill(env, logs[1], common, None)
        view = json.loads(again[2].strip().splitlines()[-1])
        started = STARTED.findall(logs[0].read_text() + logs[1].read_text())
        instance_id = backfill_id(env[SETTING_INPUT_CONTAINER], "", False)
        report = {
            "blobs": len(names),
            "had_jobs": len(had),
            "first_run": {"exit": first[0], "wall_s": round(first[1], 1)},
            "second_run": {"exit": again[0], "wall_s": round(again[1], 1), "action": view.get("action")},
            "state": view["state"],
            "counts": view["counts"],
            "pages": view["pages"],
            "starts_logged": len(started),
            "jobs_started_twice": len(started) - len(set(started)),
            "new_jobs_missing": sum(
                1 for job_id in new_ids if task_hub_state(storage, env["BENCH_HUB"], job_id) is None
            ),
            "history_events": history_events(storage, env["BENCH_HUB"], instance_id),
        }
        print(json.dumps(report, indent=2))
        storage.drop(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
