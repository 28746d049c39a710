"""A backfill: every blob already stored under a prefix of the input container, started as a
job as its upload event would have started it. Pure: the request, its instance id, the state
the orchestration carries from page to page, and its counts.

The orchestration (orchestrators/backfill.py) carries :func:`initial_state`'s dict through
``continue_as_new``; its custom status is the same dict less the running jobs' ids
(:func:`progress`), which is how a re-run with the same arguments reads where a stopped backfill
was (client_functions/backfill.py).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from .errors import InvalidNameError
from .jobs import MAX_BLOB_NAME_CHARS
from .records import Record

#: Blobs listed per page unless the request says: one listing call, one survey and at most one
#: start activity per page, each handling at most this many blobs.
DEFAULT_PAGE_SIZE = 100
#: A page's names travel in the survey's and the start's messages: at most a thousand (List Blobs
#: itself answers up to 5,000).
MAX_PAGE_SIZE = 1000
#: Jobs of one backfill running at once unless the request says.
DEFAULT_MAX_RUNNING = 8
MAX_MAX_RUNNING = 200
#: Seconds between two counts of the running jobs while the backfill waits for room.
DEFAULT_WAIT_S = 5.0
#: A backfill keeps the blob names of this many failed starts (the rest are counted only).
MAX_FAILURES_KEPT = 3
#: Characters of a failed blob's name and reason kept (a name may have 1,024).
MAX_KEPT_CHARS = 100

#: What a backfill counts, per blob listed: a new job, a failed job resumed, a job already
#: there (pending, running, done, or cancelled by its user), a name refused as an upload's would
#: be, a blob the starter ignores (a sidecar, zero bytes), a start that failed (its reason kept).
COUNTS = ("listed", "started", "resumed", "duplicates", "refused", "ignored", "failed")

_CONTAINER = re.compile(r"[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}")
_BACKFILL_ID = re.compile(r"backfill-[0-9a-f]{16}")


def backfill_id(container: str, prefix: str, dry_run: bool) -> str:
    """The backfill's instance id: a pure function of what it lists and whether it starts jobs, so
    that running it again with the same arguments finds it (and a dry run is never the real one)."""
    material = f"{container}\n{prefix}\n{'dry-run' if dry_run else 'start'}".encode()
    return "backfill-" + hashlib.sha256(material).hexdigest()[:16]


def check_backfill_id(value: str) -> str:
    if not isinstance(value, str) or not _BACKFILL_ID.fullmatch(value):
        raise InvalidNameError(f"not a backfill id: {value!r} (expected backfill- and 16 lowercase hex characters)")
    return value


def _bounded(name: str, value: object, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise InvalidNameError(f"{name} {value!r}: expected a number from {low} to {high}")


@dataclass(frozen=True)
class BackfillRequest(Record):
    """What a backfill is asked: the container and prefix it lists, whether it only counts, and
    how it paces itself. Every value comes from outside (an HTTP body, a command line)."""

    container: str
    prefix: str = ""
    dry_run: bool = False
    max_running: int = DEFAULT_MAX_RUNNING
    page_size: int = DEFAULT_PAGE_SIZE
    wait_s: float = DEFAULT_WAIT_S

    def __post_init__(self) -> None:
        if not isinstance(self.container, str) or not _CONTAINER.fullmatch(self.container):
            raise InvalidNameError(f"container {self.container!r}: not a blob container name")
        if not isinstance(self.prefix, str) or len(self.prefix) > MAX_BLOB_NAME_CHARS:
            raise InvalidNameError(f"prefix: expected text of at most {MAX_BLOB_NAME_CHARS} characters")
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F or 0xD800 <= ord(ch) <= 0xDFFF for ch in self.prefix):
            raise InvalidNameError(f"prefix {self.prefix!r} contains control characters or unpaired surrogates")
        if not isinstance(self.dry_run, bool):
            raise InvalidNameError(f"dry_run {self.dry_run!r}: expected true or false")
        _bounded("max_running", self.max_running, 1, MAX_MAX_RUNNING)
        _bounded("page_size", self.page_size, 1, MAX_PAGE_SIZE)
        _bounded("wait_s", self.wait_s, 0.1, 3600)
        if not isinstance(self.max_running, int) or not isinstance(self.page_size, int):
            raise InvalidNameError("max_running and page_size are whole numbers")

    @property
    def instance_id(self) -> str:
        return backfill_id(self.container, self.prefix, self.dry_run)


def initial_state(request: BackfillRequest) -> dict:
    """The orchestration's first input: the request, no page listed yet, nothing counted.

    ``token`` is the listing's continuation token of the page being worked on (None: the first),
    ``after`` the last blob name of that page already handled (a page is handled in parts while
    the backfill waits for room), ``running`` the ids of the jobs it started that were still
    running when it last counted (at most ``max_running`` plus one page)."""
    return {
        **request.to_dict(),
        "token": None,
        "after": None,
        "pages": 0,
        "counts": dict.fromkeys(COUNTS, 0),
        "running": [],
        "failures": [],
        "stage": "listing",
    }


def progress(state: dict) -> dict:
    """The custom status: the state, with how many of its jobs run instead of their ids. The
    extension refuses a custom status over 16 KB of UTF-16; with two names of up to 1,024
    characters (the prefix, the last blob handled), the listing's token and the failures kept,
    the state stays under it, and 200 job ids would not."""
    shown = {key: value for key, value in state.items() if key != "running"}
    return {**shown, "running_count": len(state["running"])}


def resumed_state(checkpoint: dict, request: BackfillRequest) -> dict:
    """The input that resumes a stopped backfill from its last checkpoint (its custom status, with
    the running jobs of its last execution's input), paced as the new request says."""
    return {
        **initial_state(request),
        **{
            key: checkpoint[key]
            for key in ("token", "after", "pages", "counts", "running", "failures")
            if key in checkpoint
        },
        "stage": "listing",
    }


def tally(state: dict, counted: str, blob: str, reason: str = "") -> None:
    """Count one blob's outcome in ``state``; a failed start keeps its blob and reason (a few)."""
    state["counts"][counted] += 1
    if counted == "failed" and len(state["failures"]) < MAX_FAILURES_KEPT:
        state["failures"].append({"blob": blob[:MAX_KEPT_CHARS], "reason": reason[:MAX_KEPT_CHARS]})
