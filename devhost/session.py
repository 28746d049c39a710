"""One upload through a running local host: upload, wait, progress, summary.

Shared by the CLI and ``make demo``; it knows the host only through its public attributes.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import azure.durable_functions as df

from tilecommit.catalog.published import publication_of


class UsageError(Exception):
    pass


class ProgressBoard:
    """Progress on stderr, one line per job: redrawn in place on a terminal, elsewhere a line per
    tenth of a job. Jobs running at once update it from their own threads."""

    def __init__(self, enabled: bool, jobs: int = 1, stream=None):
        self.enabled = enabled
        # The stderr of the call, not of the import: a stream bound as a default is the one
        # sys.stderr was when the module was first imported (in the tests, another test's
        # captured stream, closed since).
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.lines = [""] * jobs
        self.drawn = 0
        self.last_step: dict[int, tuple] = {}
        self.lock = threading.Lock()

    def updater(self, slot: int) -> Callable[[dict], None]:
        return lambda state: self.update(slot, state)

    def update(self, slot: int, state: dict) -> None:
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
        with self.lock:
            if self.tty:
                if line != self.lines[slot]:
                    self.lines[slot] = line
                    self._redraw()
                return
            step = (stage, 10 * done // total if total else 0)
            if step != self.last_step.get(slot):
                self.stream.write(line + "\n")
                self.stream.flush()
                self.last_step[slot] = step

    def _redraw(self, above: str = "", out=None) -> None:
        """Back to the block's first line, clear to the end of the screen, ``above`` on ``out``
        (stdout may be the same terminal), then the block again."""
        if self.drawn:
            self.stream.write(f"\x1b[{self.drawn}F\x1b[J")
        if above:
            self.stream.flush()
            out.write(above)
            out.flush()
        self.stream.write("".join(f"{text}\n" for text in self.lines))
        self.stream.flush()
        self.drawn = len(self.lines)

    def print(self, text: str, out=sys.stdout) -> None:
        """A line on ``out`` that does not tear the block of progress lines."""
        with self.lock:
            if self.enabled and self.tty and self.drawn:
                self._redraw(text + "\n", out)
            else:
                out.write(text + "\n")
                out.flush()

    def close(self) -> None:
        pass  # every line ends with a newline: nothing left to finish


def process_file(
    host,
    path: Path,
    *,
    name: str | None = None,
    timeout: float = 3600,
    progress: bool | Callable[[dict], None] = False,
    metadata: dict[str, str] | None = None,
) -> dict:
    """Upload ``path``, let the watcher deliver its event, wait for the job; the summary as a dict.
    ``progress``: a progress bar on stderr, or a callable that gets the job's state as it changes.
    ``metadata``: the blob's metadata (``tilecommit_profile`` and its options choose the job's
    output profile, tilecommit/profiles.py). The summary's ``upload_cpu_s`` is the process's CPU
    while the file was uploading: with one file, the upload's own (the user's part, on the
    user's machine in Azure; the host has no job yet); with several, the other jobs' work too."""
    from tilecommit.jobs import job_id_for
    from tilecommit.spec import OutputSpec

    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    started = time.perf_counter()
    upload_cpu = time.process_time()
    blob = host.blobs.get_blob_client(host.settings.input_container, name or path.name)
    with path.open("rb") as data:
        # Content-MD5 on every block: the service checks each block against it, and Azurite,
        # given none, computes a CRC64 of every block in JavaScript instead (its Put Block).
        # 434 MiB scene: 0.5 -> 1.0 CPU-s here, 7.1 -> 1.9 CPU-s in Azurite, 8.5 -> 3.0 s wall.
        uploaded = blob.upload_blob(
            data, overwrite=True, max_concurrency=4, validate_content=True, metadata=metadata or None
        )
    upload_cpu = time.process_time() - upload_cpu
    # The starter gives the job the spec of this host's settings and the upload's metadata, and
    # hashes it into the id.
    spec, _ = OutputSpec.started_for(host.settings, blob.blob_name, metadata)
    job_id = job_id_for(blob.url, uploaded["etag"], spec)
    board: ProgressBoard | None = None
    if callable(progress):
        update = progress
    else:
        board = ProgressBoard(progress)
        update = board.updater(0)
    deadline = time.monotonic() + timeout
    # A watcher delivers the event (this host's, or that of the host owning the event's partition);
    # the starter may also decide to ignore the upload.
    next_look = 0.0
    while host.engine.status(job_id) is None:
        acknowledged = time.monotonic() >= next_look  # one read of the acknowledgement a second at most
        if acknowledged:
            next_look = time.monotonic() + 1.0
        reason = _ignored_because(host, blob.blob_name, uploaded["etag"], acknowledged)
        if reason is not None:
            return {
                "job_id": None,
                "status": "failed",
                "error": f"upload ignored: {reason}",
                "elapsed_s": round(time.perf_counter() - started, 3),
            }
        if time.monotonic() > deadline:
            raise TimeoutError(f"no job started for {blob.blob_name!r} within {timeout} s")
        time.sleep(0.1)
    try:
        # A job that makes no progress is reported by the host itself (devhost.durable.progress).
        state = host.engine.wait_for(job_id, timeout=max(1.0, deadline - time.monotonic()), progress=update)
        update(state)  # the last word: done, or failed
    finally:
        if board is not None:
            board.close()
    return {**job_summary(state, elapsed=time.perf_counter() - started), "upload_cpu_s": round(upload_cpu, 3)}


def _ignored_because(host, blob_name: str, etag: str, acknowledged: bool) -> str | None:
    """Why the starter ignored this upload, if it did: in this host, or (``acknowledged``: read the
    acknowledgement) as another host's watcher recorded it."""
    mine = [d for d in host.decisions if d["blob"] == blob_name and d["action"] == "ignored"]
    if mine:
        return mine[0]["reason"]
    ack = host.watcher.acknowledgement(blob_name, etag) if acknowledged else None
    if ack and ack.get("start_action") == "ignored":
        return ack.get("start_reason") or "no reason given"
    return None


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
        "spec": (output or {}).get("spec"),
        "mosaic_outcome": (output or {}).get("mosaic_outcome"),
        "mosaic_url": (output or {}).get("mosaic_url"),
        "stac_url": (output or {}).get("stac_url"),
        "quicklook_url": (output or {}).get("quicklook_url"),
        "collection": (output or {}).get("collection"),
        # Where the item is found: in pgstac, or not configured (tilecommit/catalog/published.py).
        "published": publication_of(output),
    }
    if elapsed is not None:
        summary["elapsed_s"] = round(elapsed, 3)
    if state["status"] != "Completed":
        summary["error"] = state.get("error") or f"job is {state['status']}"
    return summary


def process_summary(host, summary: dict, blob_name: str, *, deliveries: int = 1) -> dict:
    """What ``process`` and ``make demo`` print for one job: its summary and what the host did.
    The host's counters are the whole command's (several jobs at once share one host)."""
    stats = host.engine.stats
    summary["host"] = {
        "deliveries": deliveries,
        "starts": [d["action"] for d in host.decisions if d["blob"] == blob_name],
        "activity_executions": stats.activity_executions,
        "activity_failures": stats.activity_failures,
        "activity_timeouts": stats.activity_timeouts,
        "worker_restarts": stats.worker_restarts,
        "episodes": stats.episodes,
        "replay_s": round(stats.replay_seconds, 3),
    }
    return summary


#: What ``--output`` and ``make demo`` save: the job output's URL key, the file name.
SAVED_OUTPUTS = (("mosaic_url", "mosaic.tif"), ("stac_url", "item.json"), ("quicklook_url", "quicklook.png"))


def save_outputs(host, summary: dict, folder: Path) -> dict[str, str]:
    """Download a completed job's mosaic, STAC item and quicklook into ``folder``; their paths by file name."""
    folder.mkdir(parents=True, exist_ok=True)
    container = host.settings.output_container
    saved = {}
    for key, filename in SAVED_OUTPUTS:
        blob_name = summary[key].split(f"/{container}/", 1)[1]
        target = folder / filename
        with target.open("wb") as handle:
            host.blobs.get_blob_client(container, blob_name).download_blob().readinto(handle)
        saved[filename] = str(target)
    return saved


def job_row(view: dict, now: datetime) -> dict:
    """One line of the job list, from the job API's view of a job: id, upload, state, progress, age."""
    status = view.get("progress") or {}
    done, total = status.get("windows_done"), status.get("windows_total")
    return {
        "job_id": view["job_id"],
        "upload": (view.get("upload") or {}).get("blob"),
        "state": view["state"],
        "progress": f"{done or 0}/{total} windows" + (f", {status['stage']}" if status.get("stage") else "")
        if total
        else status.get("stage", "-"),
        "age_s": round((now - datetime.fromisoformat(view["created"])).total_seconds()),
    }


@contextmanager
def job_client(hub: str | None) -> Iterator[df.DurableOrchestrationClient]:
    """A Durable client on the task hub of the app settings, with no host running: an engine
    that is never started answers its HTTP API (status and lists read the hub's storage)."""
    from tilecommit.settings import TASK_HUB
    from tilecommit.storage import StorageConnection

    from .durable.engine import Engine
    from .durable.functions import FunctionIndex
    from .durable.host import apply_settings, close_durable_client_session, load_local_settings, read_host_json
    from .durable.queues import queue_service
    from .durable.rpc import DurableHttpApi
    from .durable.store import HistoryStore
    from .durable.versioning import Versioning

    apply_settings(load_local_settings())
    durable = read_host_json().get("extensions", {}).get("durableTask", {})
    hub = hub or durable.get("hubName", TASK_HUB)
    connection = StorageConnection.from_env()
    store = HistoryStore(connection.blob_service(), connection.table_service(), hub, queue_service(connection))
    # What it starts (a scrub, an event delivered again) is stamped as the host would stamp it.
    engine = Engine(FunctionIndex.load(), store, versioning=Versioning.from_durable_task(durable))
    api = DurableHttpApi(engine, hub).start()
    try:
        yield df.DurableOrchestrationClient(api.client_binding())
    finally:
        close_durable_client_session()
        api.stop()


def format_age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"
