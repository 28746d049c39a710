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
from collections.abc import Sequence
from pathlib import Path

from .limits import CONSUMPTION_INSTANCE_MB
from .session import UsageError, job_summary, process_file

__all__ = ["main", "process_file", "job_summary", "UsageError"]
EXIT_COMPLETED, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


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
        p.add_argument("--function-timeout", type=float, default=None, help=argparse.SUPPRESS)
        p.add_argument(
            "--instance-memory-mb",
            type=float,
            default=CONSUMPTION_INSTANCE_MB,
            metavar="MB",
            help=f"recycle the process past this resident memory, as the plan recycles an instance "
            f"(default {CONSUMPTION_INSTANCE_MB}, Consumption's; 0: no limit)",
        )
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
            function_timeout=args.function_timeout,
            instance_memory_mb=args.instance_memory_mb or None,
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


def process(args: argparse.Namespace) -> int:
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
    print(json.dumps(summary))
    return EXIT_COMPLETED if summary["status"] == "completed" else EXIT_FAILED


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
