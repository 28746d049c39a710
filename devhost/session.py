"""One upload through a running local host: upload, wait, progress, summary.

Shared by the CLI and ``make demo``; it knows the host only through its public attributes.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any


class UsageError(Exception):
    pass


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
