"""``python -m devhost``: run the Functions app locally, without the Functions host.

    python -m devhost serve [--catalog]           watch the input container and process uploads;
                                                  --catalog: publish to a local pgstac, serve a STAC API
    python -m devhost process PATH... [--output DIR] [--deliveries N] [--duplicate-activities]
                                                  upload each PATH, process them at once, print
                                                  one JSON summary line per job
    python -m devhost status [JOB_ID]             a job's state and progress, or the recent jobs
    python -m devhost purge [--older-than DAYS]  the retention sweep: finished jobs' tiles, rows
                                                  and history go; their mosaics stay
    python -m devhost verify JOB_ID [--repair]    compare a finished job's tiles with its source;
                                                  --repair rewrites what differs, then the mosaic
    python -m devhost replay-dead-letters         deliver the events Event Grid dead-lettered
                                                  again; each becomes a job or a duplicate
    python -m devhost backfill [--prefix P] [--dry-run] [--max-running N]
                                                  start a job for each blob already stored
                                                  under P, as its upload would; print the counts
    python -m devhost demo                        Azurite + a sample scene + process, end to end

Storage is the ``AzureWebJobsStorage`` setting from the environment, else from
``local.settings.json``; with neither, the embedded Azurite (see ``local_storage``).
Arguments and files are checked before any connection; usage and storage errors are one line
on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn

from tilecommit.settings import CONSUMPTION_INSTANCE_MB, DEAD_LETTER_CONTAINER

from .durable.http_routes import DEFAULT_HTTP_PORT, FUNCTION_KEY_ENV
from .session import UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse exits 2 too; keep the message short
        self.print_usage(sys.stderr)
        raise SystemExit(f"{self.prog}: error: {message}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m devhost", description=__doc__.split("\n\n")[0])
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log at INFO (DEBUG with -vv)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add_command in (
        add_serve,
        add_process,
        add_status,
        add_purge,
        add_verify,
        add_replay_dead_letters,
        add_backfill,
        add_demo,
        add_bindings,
    ):
        add_command(sub)
    return parser


def host_options(p: argparse.ArgumentParser) -> None:
    """The options of every command that runs a host."""
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
    p.add_argument(
        "--worker-id",
        metavar="NAME",
        help="this host's name in the task hub's partition table (default: new for each command; "
        "a host restarted under its old name takes its partitions back without waiting for their leases)",
    )
    p.add_argument(
        "--events-file",
        type=Path,
        metavar="PATH",
        help="append each job's completion event (CloudEvents JSON) to this file, one line each",
    )
    p.add_argument(
        "--events-url",
        metavar="URL",
        help="post each job's completion event to this URL, as Event Grid posts CloudEvents to a webhook",
    )
    p.add_argument(
        "--lease-seconds",
        type=float,
        default=30.0,
        metavar="S",
        help="partition lease: a host that stops answering loses its partitions after S seconds "
        "(default 30, the Durable Azure Storage provider's; leases are renewed every S/3)",
    )


def add_serve(sub: argparse._SubParsersAction) -> None:
    """``serve``: a host that watches the input container until stopped."""
    serve = sub.add_parser("serve", help="watch the input container and process uploads until stopped")
    host_options(serve)
    serve.add_argument(
        "--http-port",
        type=int,
        default=DEFAULT_HTTP_PORT,
        metavar="PORT",
        help=f"serve the app's HTTP routes (the job API) on 127.0.0.1:PORT (default {DEFAULT_HTTP_PORT}, "
        "as func start; 0: any free port; with --hosts, host k gets PORT+k-1); -1: none",
    )
    serve.add_argument(
        "--function-key",
        default=os.environ.get(FUNCTION_KEY_ENV),
        metavar="KEY",
        help=f"the key routes of auth level function require (x-functions-key header or ?code=); default "
        f"${FUNCTION_KEY_ENV}; none: keys are not enforced, as in func start",
    )
    serve.add_argument(
        "--catalog",
        action="store_true",
        help="start a local PostgreSQL with pgstac, publish every finished job's STAC item to it and serve "
        "the STAC API over it on 127.0.0.1 (its URL is printed); without it, a pgstac the settings name "
        "(TILECOMMIT_PGSTAC_HOST, trust) gets the STAC API alone",
    )
    serve.add_argument(
        "--hosts",
        type=int,
        default=1,
        metavar="N",
        help="run N hosts on the task hub, each in a process of its own, sharing its partitions (default 1)",
    )


def add_process(sub: argparse._SubParsersAction) -> None:
    """``process``: upload rasters, process them, print each job's summary."""
    process = sub.add_parser("process", help="upload a raster, process it, print the job summary as JSON")
    process.add_argument("paths", type=Path, nargs="+", metavar="PATH", help="raster files (GeoTIFF)")
    process.add_argument("--name", help="blob name in the input container, for one file (default: its name)")
    process.add_argument(
        "--profile",
        metavar="NAME[,OPTION=VALUE...]",
        help="the output profile, set as the upload's blob metadata (default: the app's, or its path rule): "
        "default (DEFLATE), zstd, lzw, raw, jpeg, webp, lerc, lerc_deflate or lerc_zstd; options level, "
        "predictor, quality, max_z_error, blocksize, resampling, nodata, add_mask, web_optimized, target_srs, "
        "resolution, warp_resampling "
        "(docs/configuration.md, 'Output profiles')",
    )
    process.add_argument(
        "--output",
        type=Path,
        metavar="DIR",
        help="save each completed job's mosaic, STAC item and quicklook here (in DIR/<file stem>/ for several)",
    )
    process.add_argument("--timeout", type=float, default=3600, help="seconds to wait for the job (default 3600)")
    process.add_argument(
        "--progress",
        choices=("auto", "always", "never"),
        default="auto",
        help="progress bar on stderr (default: when stderr is a terminal)",
    )
    host_options(process)


def add_status(sub: argparse._SubParsersAction) -> None:
    """``status``: a job's state, or the recent jobs."""
    status = sub.add_parser("status", help="print a job's state and progress")
    status.add_argument("job_id", nargs="?", help="a job id (default: list the recent jobs)")
    status.add_argument("--hub", help="task hub name (default: host.json's hubName)")
    status.add_argument("--limit", type=int, default=20, help="how many recent jobs to list (default 20)")


def add_purge(sub: argparse._SubParsersAction) -> None:
    """``purge``: the retention sweep."""
    purge = sub.add_parser(
        "purge",
        help="the retention sweep (the app's daily timer): purge the tiles, manifest rows and history of jobs "
        "finished longer ago than the retention; print what went as JSON",
    )
    purge.add_argument(
        "--older-than",
        type=float,
        metavar="DAYS",
        help="retention in days; 0: every finished job (default: the TILECOMMIT_TILE_RETENTION_DAYS setting, "
        "7, where 0 keeps everything)",
    )
    purge.add_argument("--hub", help="task hub name (default: host.json's hubName)")


def add_verify(sub: argparse._SubParsersAction) -> None:
    """``verify``: a finished job's tiles and mosaic against its source."""
    verify = sub.add_parser(
        "verify",
        help="compare a finished job's tiles with its source window by window, and its mosaic with its tiles; "
        "print the differences",
    )
    verify.add_argument("job_id", help="a finished (completed or failed) job's id")
    verify.add_argument(
        "--repair",
        action="store_true",
        help="rewrite each differing tile and its manifest row, then rebuild the mosaic (each write conditional)",
    )
    verify.add_argument("--timeout", type=float, default=3600, help="seconds to wait (default 3600)")
    host_options(verify)


def add_replay_dead_letters(sub: argparse._SubParsersAction) -> None:
    """``replay-dead-letters``: the dead-lettered events delivered again."""
    replay = sub.add_parser(
        "replay-dead-letters",
        help="deliver the BlobCreated events Event Grid dead-lettered again (each becomes a job or a duplicate), "
        "wait for the jobs, print what happened as JSON",
    )
    replay.add_argument(
        "--container",
        default=DEAD_LETTER_CONTAINER,
        help=f"the subscription's dead-letter container (default {DEAD_LETTER_CONTAINER})",
    )
    replay.add_argument("--no-wait", action="store_true", help="start the jobs and return without waiting for them")
    replay.add_argument("--timeout", type=float, default=3600, help="seconds to wait for the jobs (default 3600)")
    host_options(replay)


def add_backfill(sub: argparse._SubParsersAction) -> None:
    """``backfill``: the blobs already stored, each started as its upload would be."""
    backfill = sub.add_parser(
        "backfill",
        help="start a job for every blob already stored under a prefix of the input container, as its upload "
        "event would (each a new job or a duplicate); print progress, then the counts as JSON. Run again with "
        "the same arguments: a running backfill is reported, a stopped one resumed",
    )
    backfill.add_argument("--container", help="the input container (the default; no other is backfilled)")
    backfill.add_argument("--prefix", default="", help="only blobs whose names start with this (default: all)")
    backfill.add_argument("--dry-run", action="store_true", help="count what would start, start nothing")
    backfill.add_argument(
        "--max-running", type=int, metavar="N", help="at most N of its jobs running at once (default 8)"
    )
    backfill.add_argument("--page-size", type=int, metavar="N", help="blobs listed per page (default 100)")
    backfill.add_argument(
        "--wait-seconds", type=float, metavar="S", help="between two counts of its running jobs (default 5)"
    )
    backfill.add_argument("--timeout", type=float, default=3600, help="seconds to wait for it (default 3600)")
    host_options(backfill)


def add_demo(sub: argparse._SubParsersAction) -> None:
    """``demo``: Azurite, a sample scene, process, end to end."""
    demo = sub.add_parser("demo", help="start Azurite, make a sample scene, process it, stop Azurite")
    demo.add_argument("--size", type=int, default=8192, help="sample scene width and height in pixels (default 8192)")
    demo.add_argument("--window-size", type=int, default=512, help="window size for the demo (default 512)")
    demo.add_argument("--output", type=Path, default=Path("demo-output"), help="where to save the outputs")


def add_bindings(sub: argparse._SubParsersAction) -> None:
    """``bindings``: each function's raw bindings as the worker reports them to the host."""
    sub.add_parser(
        "bindings",
        help="print each function's raw bindings as JSON, as indexing reports them to the host "
        "(through azure-functions-runtime with TILECOMMIT_DEVHOST_WORKER=runtime)",
    )


def check_usage(args: argparse.Namespace) -> None:
    """Everything about the arguments and files that can be wrong, before any connection."""
    if getattr(args, "deliveries", 1) < 1:
        raise UsageError("--deliveries must be at least 1")
    if getattr(args, "hosts", 1) < 1:
        raise UsageError("--hosts must be at least 1")
    events_url = getattr(args, "events_url", None)
    if events_url is not None and not events_url.startswith(("http://", "https://")):
        raise UsageError(f"--events-url {events_url}: expected an http:// or https:// URL")
    events_file = getattr(args, "events_file", None)
    if events_file is not None and events_file.is_dir():
        raise UsageError(f"--events-file {events_file}: a folder, not a file")
    if getattr(args, "lease_seconds", 30.0) < 3:
        raise UsageError("--lease-seconds must be at least 3")
    if args.command == "purge" and args.older_than is not None and args.older_than < 0:
        raise UsageError(f"--older-than {args.older_than}: expected days >= 0 (0: every finished job)")
    if args.command == "status" and args.limit < 1:
        raise UsageError("--limit must be at least 1")
    if args.command == "backfill":
        check_backfill_usage(args)
    if args.command != "process":
        return
    for path in args.paths:
        if not path.exists():
            raise UsageError(f"{path}: no such file")
        if not path.is_file():
            raise UsageError(f"{path}: not a file")
    if args.name and len(args.paths) > 1:
        raise UsageError("--name names one upload: give one file with it")
    names = [args.name or path.name for path in args.paths]
    if len(set(names)) < len(names):
        raise UsageError("two files have the same name; they would be the same upload")
    if args.output is not None and args.output.exists() and not args.output.is_dir():
        raise UsageError(f"--output {args.output}: not a folder")
    stems = [path.stem for path in args.paths]
    if args.output is not None and len(set(stems)) < len(stems):
        raise UsageError("--output saves by file stem: two files share one")


def backfill_values(args: argparse.Namespace) -> dict:
    """The backfill's request as ``POST /api/backfill`` takes it; None: the default."""
    return {
        "container": args.container,
        "prefix": args.prefix,
        "dry_run": args.dry_run,
        "max_running": args.max_running,
        "page_size": args.page_size,
        "wait_s": args.wait_seconds,
    }


def check_backfill_usage(args: argparse.Namespace) -> None:
    """The backfill's values, checked as the API checks them (the container, once the settings
    are read, against the input container)."""
    from tilecommit.backfill import BackfillRequest
    from tilecommit.errors import InvalidNameError
    from tilecommit.settings import INPUT_CONTAINER

    values = {k: v for k, v in backfill_values(args).items() if v is not None}
    try:
        BackfillRequest(**{"container": INPUT_CONTAINER, **values})
    except InvalidNameError as exc:
        raise UsageError(str(exc)) from None


def profile_metadata(text: str | None) -> dict[str, str] | None:
    """``--profile zstd,level=19`` as the blob metadata the starter reads (tilecommit/profiles.py)."""
    if not text:
        return None
    from tilecommit import profiles
    from tilecommit.errors import BadInputError

    try:
        name, options = profiles.split(text, where="--profile")
    except BadInputError as exc:
        raise UsageError(str(exc)) from None
    return {profiles.METADATA_PROFILE: name, **{profiles.METADATA_PREFIX + k: v for k, v in options.items()}}
