"""``python -m devhost serve --hosts N``: N hosts on one task hub, each a process of its own, as
Azure scales a function app out to N instances. They share the hub through its partition table
and queues (:mod:`devhost.durable.partitions`, :mod:`devhost.durable.receivers`); this process
only starts them, passes Ctrl-C / SIGTERM on, and keeps the embedded Azurite (if that is the
storage) running for them.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import uuid
from typing import IO

from .durable.http_routes import FUNCTION_KEY_ENV


def host_command(args: argparse.Namespace, worker_id: str, number: int = 0) -> list[str]:
    """The ``serve`` command line of one of the hosts: this command's options, one host, its own name."""
    command = [sys.executable, "-m", "devhost", *(["-v"] * args.verbose), "serve", "--worker-id", worker_id]
    command += ["--deliveries", str(args.deliveries), "--timer-scale", str(args.timer_scale)]
    command += ["--lease-seconds", str(args.lease_seconds), "--instance-memory-mb", str(args.instance_memory_mb)]
    if args.hub:
        command += ["--hub", args.hub]
    if args.function_timeout is not None:
        command += ["--function-timeout", str(args.function_timeout)]
    if args.duplicate_activities:
        command.append("--duplicate-activities")
    if args.events_file is not None:
        command += ["--events-file", str(args.events_file)]  # each host appends its jobs' events
    if args.events_url is not None:
        command += ["--events-url", args.events_url]
    # Each host answers HTTP on a port of its own, as each instance has its own address behind
    # the platform's front end; the function key reaches them in the environment, never argv.
    command += ["--http-port", str(args.http_port + number if args.http_port > 0 else args.http_port)]
    return command


def serve_hosts(args: argparse.Namespace, storage) -> int:
    """Start ``args.hosts`` host processes, wait until each watches the container, then until stopped.
    The storage is passed on in the environment (``AzureWebJobsStorage``), so each uses the same."""
    base = args.worker_id or f"{os.uname().nodename}-{uuid.uuid4().hex[:6]}"
    hosts = []
    ready = [threading.Event() for _ in range(args.hosts)]
    for number in range(args.hosts):
        process = subprocess.Popen(
            host_command(args, f"{base}-{number + 1}", number),
            stderr=subprocess.PIPE,
            start_new_session=True,
            env={**os.environ, **({FUNCTION_KEY_ENV: args.function_key} if args.function_key else {})},
        )
        hosts.append(process)
        threading.Thread(target=_relay, args=(process.stderr, number + 1, ready[number]), daemon=True).start()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not all(event.is_set() for event in ready) and not stop.is_set():
        if any(process.poll() is not None for process in hosts):
            stop.set()
            break
        stop.wait(0.1)
    if not stop.is_set():
        print(
            f"devhost: watching with {args.hosts} hosts ({base}-1 .. {base}-{args.hosts}) on {storage.source}; "
            "Ctrl-C stops",
            file=sys.stderr,
            flush=True,
        )
    while not stop.is_set() and all(process.poll() is None for process in hosts):
        stop.wait(0.5)
    for process in hosts:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)  # each drains and hands its partitions on
    codes = [process.wait() for process in hosts]
    return max(codes) if any(codes) else 0


def _relay(stderr: IO[bytes], number: int, ready: threading.Event) -> None:
    """Each host's stderr on this one's, its lines marked with the host's number."""
    for line in stderr:
        text = line.decode(errors="replace")
        if text.startswith("devhost: watching"):
            ready.set()
        sys.stderr.write(f"[host {number}] {text}")
        sys.stderr.flush()
