"""``python -m devhost``: the commands' code (their arguments: :mod:`devhost.cli_args`, whose
docstring lists them).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from .cli_args import backfill_values, build_parser, check_usage, profile_metadata
from .session import UsageError, process_file

EXIT_COMPLETED, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: Seconds after which a serve command still stopping writes every thread's stack to stderr.
SLOW_STOP_S = 60


class _NotAboutTheJob(logging.Filter):
    """Drops azure-functions' warning that a function app without HTTP functions has no auth level
    to apply: it is logged on the root logger each time the app's functions are read, and says
    nothing about the user's job."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == "root" and str(record.msg).startswith("Auth level is not applied"))


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
    for handler in logging.getLogger().handlers:
        # The host lowers some loggers to INFO to collect the starter's decisions: not for stderr.
        handler.setLevel(level)
    if not args.verbose:
        logging.getLogger().addFilter(_NotAboutTheJob())
    # SIGTERM ends the command as Ctrl-C does, so an Azurite it started is stopped too.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        if args.command == "demo":
            from .demo import run_demo

            return run_demo(args)
        if args.command == "bindings":  # no storage: indexing only
            from .durable.functions import FunctionIndex

            index = FunctionIndex.load()
            mode = "azure-functions-runtime" if index.worker is not None else "in-process"
            print(json.dumps({"indexed_by": mode, "functions": index.raw_bindings}, indent=2))
            return 0
        check_usage(args)
        from azure.core.exceptions import AzureError

        from .local_storage import StorageUnavailable, storage_for_command

        try:
            with storage_for_command() as storage:
                logging.getLogger(__name__).info("storage: %s at %s", storage.source, storage.blob_endpoint)
                return COMMANDS[args.command](args, storage)
        except StorageUnavailable as exc:
            raise UsageError(str(exc)) from None
        except AzureError as exc:  # e.g. a wrong key: one line, not the SDK's traceback
            raise UsageError(f"storage error: {str(exc).splitlines()[0]}") from None
    except UsageError as exc:
        print(f"python -m devhost {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"python -m devhost {args.command}: interrupted", file=sys.stderr)
        return 130


def _raise_interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _host(args: argparse.Namespace):
    from .durable.http_routes import PortTaken

    try:
        return _local_host(args)
    except PortTaken as exc:
        raise UsageError(str(exc)) from None


def _local_host(args: argparse.Namespace):
    from .durable.host import HostOptions, LocalHost
    from .durable.partitions import LeaseTimings

    return LocalHost(
        HostOptions(
            deliveries=args.deliveries,
            duplicate_activities=args.duplicate_activities,
            timer_scale=args.timer_scale,
            hub=args.hub,
            function_timeout=args.function_timeout,
            instance_memory_mb=args.instance_memory_mb or None,
            # A serve command is a process of its own, as a worker is: a function stuck past its
            # timeout ends it, and the jobs resume when serve starts again (docs/running-locally.md).
            recycle_stuck_worker=args.command == "serve",
            worker_id=args.worker_id,
            lease=LeaseTimings(lease_s=args.lease_seconds, acquire_s=args.lease_seconds / 3),
            events_file=args.events_file,
            events_url=args.events_url,
            http_port=getattr(args, "http_port", -1) if getattr(args, "http_port", -1) >= 0 else None,
            function_key=getattr(args, "function_key", None),
        )
    )


def serve(args: argparse.Namespace, storage) -> int:
    from .catalog import local_catalog

    with local_catalog(args.catalog) as stac_api:
        if stac_api is not None:
            print(f"devhost: the STAC API on {stac_api.url} (search: {stac_api.url}/search)", file=sys.stderr)
        return _serve(args, storage)


def _serve(args: argparse.Namespace, storage) -> int:
    if args.hosts > 1:
        from .hosts import serve_hosts

        return serve_hosts(args, storage)
    host = _host(args)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with host:
        api = ""
        if host.http is not None:
            base = host.http.base_url
            api = f"; the job API on {base}/api/jobs; the web page on {base}/api/ui/"
        print(
            f"devhost: watching container {host.settings.input_container!r} (task hub {host.hub}) "
            f"on {storage.source}, blob endpoint {storage.blob_endpoint}{api}; Ctrl-C stops",
            file=sys.stderr,
        )
        stop.wait()
        # A stop drains what runs and hands the partitions on, which takes seconds; one still
        # going after SLOW_STOP_S writes where every thread waits (from a thread of faulthandler's
        # own, so even a process whose Python threads are all stuck says where).
        faulthandler.dump_traceback_later(SLOW_STOP_S, file=sys.stderr)
    faulthandler.cancel_dump_traceback_later()
    print(f"devhost: host {host.engine.worker_id} stopped: {json.dumps(host.engine.stats.__dict__)}", file=sys.stderr)
    return EXIT_COMPLETED


def process(args: argparse.Namespace, storage) -> int:
    from .session import ProgressBoard, process_summary, save_outputs

    reader = _job_counter_reader()
    host = _host(args)
    show = args.progress == "always" or (args.progress == "auto" and sys.stderr.isatty())
    board = ProgressBoard(show, len(args.paths))
    summaries: list[dict | None] = [None] * len(args.paths)

    def run(slot: int, path: Path) -> None:
        try:
            summary = process_file(
                host,
                path,
                name=args.name,
                timeout=args.timeout,
                progress=board.updater(slot),
                metadata=profile_metadata(args.profile),
            )
        except Exception as exc:  # this upload's line says so; the other uploads go on
            summary = {"job_id": None, "status": "failed", "error": f"{path}: {exc}".splitlines()[0]}
        if args.output is not None and summary["status"] == "completed":
            folder = args.output if len(args.paths) == 1 else args.output / path.stem
            summary["saved"] = save_outputs(host, summary, folder)
        summary = process_summary(host, summary, args.name or path.name, deliveries=args.deliveries)
        if reader is not None and summary.get("job_id"):
            from tilecommit.observability.monitoring import job_counters

            summary["counters"] = job_counters(reader.get_metrics_data(), summary["job_id"])
        summaries[slot] = summary
        board.print(json.dumps(summary))

    with host:
        # Daemon threads, joined in short waits: Ctrl-C reaches this thread and ends the command
        # (stopping the host and an embedded Azurite) without waiting for the jobs.
        workers = [threading.Thread(target=run, args=(slot, path), daemon=True) for slot, path in enumerate(args.paths)]
        for worker in workers:
            worker.start()
        for worker in workers:
            while worker.is_alive():
                worker.join(0.2)
    board.close()
    return EXIT_COMPLETED if all(s and s["status"] == "completed" for s in summaries) else EXIT_FAILED


def replay_dead_letters(args: argparse.Namespace, storage) -> int:
    """Each dead-lettered event delivered to the blob trigger once more (:mod:`devhost.dead_letters`);
    this host's watcher stays off, so every delivery here is one of a dead-lettered event."""
    from azure.core.exceptions import ResourceNotFoundError

    from .dead_letters import replay

    host = _host(args)
    host.start(watch=False)
    try:
        container = host.blobs.get_container_client(args.container)
        if not container.exists():
            raise UsageError(f"no container {args.container!r} (the subscription's dead-letter container)")

        def deliver(blob_name: str) -> dict:
            before = len(host.decisions)
            host.deliver_blob_created(blob_name)
            mine = [d for d in host.decisions[before:] if d["blob"] == blob_name]
            return mine[-1] if mine else {"action": "none", "blob": blob_name, "job_id": None, "reason": "no decision"}

        report = replay(container, host.settings.input_container, deliver).to_dict()
        jobs = sorted({d["job_id"] for d in report["decisions"] if d["action"] == "started"})
        report["jobs"] = {}
        for job_id in [] if args.no_wait else jobs:
            try:
                state = host.engine.wait_for(job_id, timeout=args.timeout)
            except (TimeoutError, ResourceNotFoundError) as exc:
                state = {"status": f"not finished: {exc}"}
            report["jobs"][job_id] = state.get("status")
    finally:
        host.stop()
    print(json.dumps(report))
    finished = all(status == "Completed" for status in report["jobs"].values())
    failed = report["skipped"] or report["counts"].get("failed")
    return EXIT_COMPLETED if finished and not failed else EXIT_FAILED


def _job_counter_reader():
    """An in-memory reader of the app's counters, beside any OTEL_*_EXPORTER the environment asks for.

    Installed before the app is loaded (its own call to configure telemetry then leaves it be);
    None when something else configured the process first.
    """
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from tilecommit.observability.monitoring import configure_telemetry

    from .durable.host import apply_settings, load_local_settings

    apply_settings(load_local_settings())  # as the host will: a connection string may come from there
    reader = InMemoryMetricReader()
    return reader if configure_telemetry(metric_readers=[reader]) not in ("none", "already-configured") else None


def status(args: argparse.Namespace, storage) -> int:
    """``status [JOB_ID]``: what GET /api/jobs/{id} and GET /api/jobs answer (the same functions,
    :mod:`client_functions.job_api`, through the real Durable client), with no host running."""
    from client_functions import job_api
    from tilecommit.errors import JobApiError

    from .durable.functions import EventLoopThread
    from .session import job_client

    with job_client(args.hub) as client:
        run = EventLoopThread.shared().run
        if args.job_id is not None:
            try:
                view = run(job_api.get_job(client, args.job_id))
            except JobApiError as exc:
                print(json.dumps({"job_id": args.job_id, **exc.body()}))
                return EXIT_FAILED
            print(json.dumps(view))
            return EXIT_COMPLETED if view["state"] in ("completed", "running", "pending") else EXIT_FAILED
        views, cursor = [], None
        while True:
            page = run(job_api.list_jobs(client, limit=job_api.MAX_LIMIT, cursor=cursor))
            views += page["jobs"]
            cursor = page["next"]
            if cursor is None:
                break
    return list_jobs(views, args.limit, args.hub)


def list_jobs(views: list[dict], limit: int, hub: str | None) -> int:
    """The most recent jobs (not their sub-orchestrations), newest first, as a table."""
    from datetime import UTC, datetime

    from .session import format_age, job_row

    moment = datetime.now(UTC)
    rows = [job_row(v, moment) for v in sorted(views, key=lambda v: v["created"], reverse=True)[:limit]]
    if not rows:
        print(f"no jobs in task hub {hub}" if hub else "no jobs in this task hub", file=sys.stderr)
        return EXIT_COMPLETED
    table = [("JOB", "STATE", "PROGRESS", "AGE", "UPLOAD")] + [
        (r["job_id"], r["state"], r["progress"], format_age(r["age_s"]), r["upload"] or "-") for r in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(4)]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False)) + "  " + line[4])
    return EXIT_COMPLETED


def purge(args: argparse.Namespace, storage) -> int:
    """The timer's sweep, run once now; with no --older-than, the app setting decides (0: nothing)."""
    from client_functions import retention
    from client_functions.context import client_context

    from .durable.functions import EventLoopThread
    from .session import job_client

    with job_client(args.hub) as client:
        ctx = client_context()
        sweep = retention.sweep_as_configured(
            client,
            ctx.manifest,
            ctx.tiles,
            retention_days=ctx.settings.tile_retention_days,
            older_than_days=args.older_than,
        )
        print(json.dumps(EventLoopThread.shared().run(sweep)))
    return EXIT_COMPLETED


def verify(args: argparse.Namespace, storage) -> int:
    """Exit 0: no differences, or all of them repaired by this run or a concurrent one; 1 otherwise."""
    from tilecommit.errors import JobNotVerifiable

    from .verify import verify_job

    host = _host(args)
    host.start(watch=False)  # a scrub reads finished jobs; new uploads are left to serve/process
    try:
        summary = verify_job(host, args.job_id, repair=args.repair, timeout=args.timeout)
    except JobNotVerifiable as exc:
        print(json.dumps({"job_id": args.job_id, "status": "not-verifiable", "error": str(exc)}))
        return EXIT_FAILED
    finally:
        host.stop()
    print(json.dumps(summary))
    if summary["status"] != "completed":
        return EXIT_FAILED
    clean = not summary["windows_differing"] and not summary["outputs_differing"]
    return EXIT_COMPLETED if args.repair or clean else EXIT_FAILED


def backfill(args: argparse.Namespace, storage) -> int:
    """Exit 0: the backfill completed with no failed start; 1: it did not finish, failed, was
    cancelled or a start failed; 2: arguments refused."""
    from tilecommit.errors import JobApiError

    from .backfill import print_result, run_backfill

    values = backfill_values(args)
    host = _host(args)
    host.start(watch=False)  # only the backfill starts jobs here: no upload event is delivered
    try:
        view = run_backfill(host, values, timeout=args.timeout)
    except JobApiError as exc:
        if exc.status == 400:
            raise UsageError(exc.message) from None
        print(json.dumps(exc.body()))
        return EXIT_FAILED
    finally:
        host.stop()
    return EXIT_COMPLETED if print_result(view) else EXIT_FAILED


COMMANDS = {
    "serve": serve,
    "process": process,
    "status": status,
    "purge": purge,
    "verify": verify,
    "replay-dead-letters": replay_dead_letters,
    "backfill": backfill,
}
