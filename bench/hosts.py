"""Throughput of several hosts on one task hub: null-activity jobs (the REAL orchestrators,
activities that answer at once, :mod:`bench.null_app`) on 1, 2 and 4 host processes.

    .venv/bin/python -m bench.hosts --hosts 1,2,4 --jobs 8 --windows 200

Each host is a process of its own (``python -m bench.hosts host``): a :class:`devhost.durable.engine.Engine`
with host.json's concurrency (4 activities, 4 orchestrator dispatchers) on one Azurite. This
process starts the jobs as a client (an engine that is never started owns no partition, so its
starts go to the control queues) and waits for them. Printed per host count: windows per second
from the first start to the last completion, each host's CPU seconds (user + system, its own
``getrusage``) and episodes, and Azurite's CPU seconds. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .common import BenchStorage, load1, say

ROOT = Path(__file__).resolve().parent.parent


def _host(hub: str, worker_id: str) -> int:
    """One host: run until SIGTERM, then print its counters and CPU seconds as one JSON line."""
    from devhost.durable.engine import Engine
    from devhost.durable.functions import FunctionIndex
    from devhost.durable.queues import queue_service
    from devhost.durable.store import HistoryStore
    from tilecommit.storage import StorageConnection

    from . import null_app

    connection = StorageConnection.from_env()
    store = HistoryStore(connection.blob_service(), connection.table_service(), hub, queue_service(connection))
    engine = Engine(
        FunctionIndex.from_app(null_app.app), store, max_activities=4, max_orchestrators=4, worker_id=worker_id
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with engine:
        print("ready", flush=True)
        stop.wait()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps({"worker_id": worker_id, "cpu_s": usage.ru_utime + usage.ru_stime, **engine.stats.__dict__}),
        flush=True,
    )
    return 0


def one_run(storage: BenchStorage, hosts: int, jobs: int, windows: int) -> dict:
    from devhost.durable.engine import Engine
    from devhost.durable.functions import FunctionIndex
    from devhost.durable.history import TERMINAL
    from devhost.durable.queues import queue_service
    from devhost.durable.store import HistoryStore
    from orchestrators import names

    from . import null_app

    connection = storage.connection
    hub = f"BenchHosts{hosts}x{time.time_ns() % 10**8}"
    env = {**os.environ, "AzureWebJobsStorage": storage.connection_string}
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.hosts", "host", hub, f"{hub}-{n}"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(hosts)
    ]
    for process in processes:
        assert process.stdout.readline().strip() == "ready"
    store = HistoryStore(connection.blob_service(), connection.table_service(), hub, queue_service(connection))
    _wait_balanced(store, hosts)
    client = Engine(FunctionIndex.from_app(null_app.app), store)  # never started: a client only
    azurite_before = storage.azurite_cpu_s()
    started = time.perf_counter()
    job_ids = []
    for n in range(jobs):
        job = null_app.job_input(f"{n:08x}{time.time_ns() % 16**8:08x}", windows)
        client.start_new(names.TILE_SCENE, job["job_id"], job)
        job_ids.append(job["job_id"])
    while True:
        states = [store.read_state(job_id) for job_id in job_ids]
        if all(s is not None and s["status"] in TERMINAL for s in states):
            break
        time.sleep(0.2)
    wall = time.perf_counter() - started
    azurite_cpu = (storage.azurite_cpu_s() or 0.0) - (azurite_before or 0.0)
    for process in processes:
        process.send_signal(signal.SIGTERM)
    per_host = [json.loads(process.communicate(timeout=300)[0].strip().splitlines()[-1]) for process in processes]
    failed = [s for s in states if s["status"] != "Completed"]
    if failed:
        raise RuntimeError(f"{len(failed)} null job(s) did not complete: {failed[0].get('error')}")
    total_windows = sum(s["output"]["windows"] for s in states)
    return {
        "hosts": hosts,
        "jobs": jobs,
        "windows": total_windows,
        "wall_s": round(wall, 2),
        "windows_per_s": round(total_windows / wall, 1),
        "host_cpu_s": [round(h["cpu_s"], 2) for h in per_host],
        "host_episodes": [h["episodes"] for h in per_host],
        "host_activities": [h["activity_executions"] for h in per_host],
        "azurite_cpu_s": round(azurite_cpu, 2),
        "load1": load1(),
    }


def _wait_balanced(store, hosts: int, timeout: float = 60.0) -> None:
    """Until every host owns its share of the partitions (or ``timeout``): jobs start on a settled hub."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = list(store.partition_table.query_entities("PartitionKey eq ''"))
        owners = {r.get("CurrentOwner") for r in rows if r.get("CurrentOwner") and not r.get("NextOwner")}
        if len(owners) == min(hosts, len(rows)) and all(r.get("CurrentOwner") and not r.get("NextOwner") for r in rows):
            return
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["host"]:
        return _host(argv[1], argv[2])
    parser = argparse.ArgumentParser(prog="python -m bench.hosts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1,2,4", help="host counts to run (default 1,2,4)")
    parser.add_argument("--jobs", type=int, default=8, help="null jobs started at once per run (default 8)")
    parser.add_argument("--windows", type=int, default=200, help="windows per job (default 200)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    results = []
    with BenchStorage() as storage:
        for hosts in (int(h) for h in args.hosts.split(",")):
            say(f"hosts: {hosts} host(s), {args.jobs} jobs of {args.windows} null windows, load {load1():.2f}")
            result = one_run(storage, hosts, args.jobs, args.windows)
            say(json.dumps(result))
            results.append(result)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
