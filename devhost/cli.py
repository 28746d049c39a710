"""``python -m devhost``: run the Functions app locally, without the Functions host.

    python -m devhost serve                       watch the input container and process uploads
    python -m devhost process PATH [--deliveries N] [--duplicate-activities]
                                                  upload PATH, process it, print the job summary
    python -m devhost status JOB_ID               a job's state and progress
    python -m devhost demo                        Azurite + a sample scene + process, end to end

Storage is the ``AzureWebJobsStorage`` setting from the environment, else from
``local.settings.json``, else Azurite's development storage on its default ports.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EXIT_COMPLETED, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 too; keep the message short
        self.print_usage(sys.stderr)
        raise SystemExit(f"{self.prog}: error: {message}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m devhost", description=__doc__.split("\n\n")[0])
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log at INFO (DEBUG with -vv)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def host_options(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--deliveries",
            type=int,
            default=1,
            metavar="N",
            help="deliver each BlobCreated event N times at once (default 1)",
        )
        p.add_argument(
            "--duplicate-activities",
            action="store_true",
            help="run every activity twice, concurrently (at-least-once, made visible)",
        )
        p.add_argument("--hub", help="task hub name (default: host.json's hubName)")
        p.add_argument("--timer-scale", type=float, default=1.0, help=argparse.SUPPRESS)
        p.add_argument("--crash-before-manifest", type=int, default=0, metavar="N", help=argparse.SUPPRESS)

    serve = sub.add_parser("serve", help="watch the input container and process uploads until stopped")
    host_options(serve)

    process = sub.add_parser("process", help="upload a raster, process it, print the job summary as JSON")
    process.add_argument("path", type=Path, help="a raster file (GeoTIFF)")
    process.add_argument("--name", help="blob name in the input container (default: the file name)")
    process.add_argument("--timeout", type=float, default=3600, help="seconds to wait for the job (default 3600)")
    process.add_argument(
        "--progress",
        choices=("auto", "always", "never"),
        default="auto",
        help="progress bar on stderr (default: when stderr is a terminal)",
    )
    host_options(process)

    status = sub.add_parser("status", help="print a job's state and progress")
    status.add_argument("job_id")
    status.add_argument("--hub", help="task hub name (default: host.json's hubName)")

    demo = sub.add_parser("demo", help="start Azurite, make a sample scene, process it, stop Azurite")
    demo.add_argument("--size", type=int, default=8192, help="sample scene width and height in pixels (default 8192)")
    demo.add_argument("--window-size", type=int, default=512, help="window size for the demo (default 512)")
    demo.add_argument("--output", type=Path, default=Path("demo-output"), help="where to save the outputs")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            return EXIT_USAGE
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("azure").setLevel(logging.WARNING)
    try:
        if args.command == "serve":
            return serve(args)
        if args.command == "process":
            return process(args)
        if args.command == "status":
            return status(args)
        if args.command == "demo":
            from .demo import run_demo

            return run_demo(args)
    except UsageError as exc:
        print(f"python -m devhost {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_USAGE


def _host(args: argparse.Namespace):
    from .host import HostOptions, LocalHost

    if args.deliveries < 1:
        raise UsageError("--deliveries must be at least 1")
    if args.crash_before_manifest:
        from .faults import crash_before_manifest_entry

        crash_before_manifest_entry(args.crash_before_manifest)
    return LocalHost(
        HostOptions(
            deliveries=args.deliveries,
            duplicate_activities=args.duplicate_activities,
            timer_scale=args.timer_scale,
            hub=args.hub,
        )
    )


def serve(args: argparse.Namespace) -> int:
    host = _host(args)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with host:
        print(
            f"devhost: watching container {host.settings.input_container!r} (task hub {host.hub}); Ctrl-C stops",
            file=sys.stderr,
        )
        stop.wait()
    return EXIT_COMPLETED


class ProgressBar:
    """Progress on stderr: a redrawn bar on a terminal, a line per tenth of the job elsewhere."""

    def __init__(self, enabled: bool, stream=sys.stderr):
        self.enabled = enabled
        self.stream = stream
        self.tty = stream.isatty()
        self.last = ""
        self.last_step: tuple = ()

    def update(self, state: dict) -> None:
        if not self.enabled:
            return
        status = state.get("custom_status") or {}
        done, total = status.get("windows_done") or 0, status.get("windows_total")
        stage = status.get("stage", state["status"].lower())
        if total:
            width = 30
            filled = int(width * done / total)
            line = f"{state['id']}: [{'#' * filled}{'.' * (width - filled)}] {done}/{total} windows, {stage}"
        else:
            line = f"{state['id']}: {stage}"
        if self.tty:
            if line != self.last:
                self.stream.write("\r" + line.ljust(len(self.last)))
                self.stream.flush()
                self.last = line
            return
        step = (stage, 10 * done // total if total else 0)
        if step != self.last_step:
            self.stream.write(line + "\n")
            self.stream.flush()
            self.last_step = step

    def close(self) -> None:
        if self.enabled and self.tty and self.last:
            self.stream.write("\n")
            self.stream.flush()


def process_file(host, path: Path, *, name: str | None = None, timeout: float = 3600, progress: bool = False) -> dict:
    """Upload ``path``, let the watcher deliver its event, wait for the job; the summary as a dict."""
    from tilecommit.jobs import job_id_for

    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    started = time.perf_counter()
    blob = host.blobs.get_blob_client(host.settings.input_container, name or path.name)
    with path.open("rb") as data:
        uploaded = blob.upload_blob(data, overwrite=True, max_concurrency=4)
    job_id = job_id_for(blob.url, uploaded["etag"])
    bar = ProgressBar(progress)
    deadline = time.monotonic() + timeout
    # The watcher delivers the event; the starter may also decide to ignore the upload.
    while host.engine.status(job_id) is None:
        ignored = [d for d in host.decisions if d["blob"] == blob.blob_name and d["action"] == "ignored"]
        if ignored:
            return {
                "job_id": None,
                "status": "failed",
                "error": f"upload ignored: {ignored[0]['reason']}",
                "elapsed_s": round(time.perf_counter() - started, 3),
            }
        if time.monotonic() > deadline:
            raise TimeoutError(f"no job started for {blob.blob_name!r} within {timeout} s")
        time.sleep(0.05)
    try:
        state = host.engine.wait_for(job_id, timeout=max(1.0, deadline - time.monotonic()), progress=bar.update)
    finally:
        bar.close()
    return job_summary(state, elapsed=time.perf_counter() - started)


def job_summary(state: dict, *, elapsed: float | None = None) -> dict:
    output = state.get("output") if state["status"] == "Completed" else None
    status = state.get("custom_status") or {}
    summary: dict[str, Any] = {
        "job_id": state["id"],
        "status": "completed" if state["status"] == "Completed" else state["status"].lower(),
        "windows": (output or {}).get("windows", status.get("windows_total")),
        "written": (output or {}).get("written"),
        "already_present": (output or {}).get("already_present"),
        "skipped": (output or {}).get("skipped"),
        "bytes": (output or {}).get("bytes"),
        "mosaic_outcome": (output or {}).get("mosaic_outcome"),
        "mosaic_url": (output or {}).get("mosaic_url"),
        "stac_url": (output or {}).get("stac_url"),
        "quicklook_url": (output or {}).get("quicklook_url"),
    }
    if elapsed is not None:
        summary["elapsed_s"] = round(elapsed, 3)
    if state["status"] != "Completed":
        summary["error"] = state.get("error") or f"job is {state['status']}"
    return summary


def process(args: argparse.Namespace) -> int:
    reader = _job_counter_reader()
    host = _host(args)
    show = args.progress == "always" or (args.progress == "auto" and sys.stderr.isatty())
    with host:
        summary = process_file(host, args.path, name=args.name, timeout=args.timeout, progress=show)
        stats = host.engine.stats
        summary["host"] = {
            "deliveries": args.deliveries,
            "starts": [d["action"] for d in host.decisions],
            "activity_executions": stats.activity_executions,
            "activity_failures": stats.activity_failures,
            "episodes": stats.episodes,
            "replay_s": round(stats.replay_seconds, 3),
        }
    if reader is not None and summary.get("job_id"):
        from tilecommit.monitoring import job_counters

        summary["counters"] = job_counters(reader.get_metrics_data(), summary["job_id"])
    print(json.dumps(summary))
    return EXIT_COMPLETED if summary["status"] == "completed" else EXIT_FAILED


def _job_counter_reader():
    """An in-memory reader of the app's counters, beside any OTEL_*_EXPORTER the environment asks for.

    Installed before the app is loaded (its own call to configure telemetry then leaves it be);
    None when something else configured the process first.
    """
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from tilecommit.monitoring import configure_telemetry

    from .host import apply_settings, load_local_settings

    apply_settings(load_local_settings())  # as the host will: a connection string may come from there
    reader = InMemoryMetricReader()
    return reader if configure_telemetry(metric_readers=[reader]) not in ("none", "already-configured") else None


def status(args: argparse.Namespace) -> int:
    from tilecommit.settings import TASK_HUB
    from tilecommit.storage import StorageConnection

    from .host import apply_settings, load_local_settings, read_host_json
    from .store import HistoryStore

    apply_settings(load_local_settings())
    hub = args.hub or read_host_json().get("extensions", {}).get("durableTask", {}).get("hubName", TASK_HUB)
    connection = StorageConnection.from_env()
    store = HistoryStore(connection.blob_service(), connection.table_service(), hub)
    state = store.read_state(args.job_id)
    if state is None:
        print(json.dumps({"job_id": args.job_id, "status": "not-found"}))
        return EXIT_FAILED
    summary = job_summary(state)
    summary["progress"] = state.get("custom_status")
    summary["runtime_status"] = state["status"]
    print(json.dumps(summary))
    return EXIT_COMPLETED if state["status"] in ("Completed", "Running", "Pending") else EXIT_FAILED
