"""What a job used, counted where it happens: each activity's storage requests by service and
kind, the bytes they carried each way, and the activity's seconds.

Every storage client the app makes (:class:`tilecommit.storage.StorageConnection`) reports each
answered request to :func:`count_response`, through the Azure SDK's ``raw_response_hook``, which
runs once per attempt (a retried request is billed again, and counted again). The request is
added to the :class:`Usage` of the activity running in that context (:func:`measuring`, around
each activity in :mod:`tilecommit.observability.observed`); threads the activity starts carry it along when
they come from a :class:`ContextExecutor`. A request outside any activity (the host's own, a
test's) counts nowhere.

The kinds are the ones storage bills by: for blobs, writes (every PUT but a container's: Put
Blob, Put Block, Put Block From URL, Put Block List, metadata), reads (GET of a blob or a
range), lists (GET with ``comp=list``, and creating a container) and the other operations
(HEAD, DELETE, any other GET); for tables, writes (insert, update, delete, a batch) and reads
(a point read or a query page).

Usage values are plain dicts of numbers so the orchestrators can add them up (:func:`add`), which
they do deterministically; nothing here is read back from storage.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, urlsplit

BLOB_KINDS = ("write", "read", "list", "other")
TABLE_KINDS = ("write", "read")
REQUEST_KEYS = tuple(f"blob.{k}" for k in BLOB_KINDS) + tuple(f"table.{k}" for k in TABLE_KINDS)

_CURRENT: contextvars.ContextVar[Usage | None] = contextvars.ContextVar("tilecommit_usage", default=None)


def empty() -> dict:
    """A usage with nothing in it: per function its executions and seconds, requests by kind, bytes."""
    return {"functions": {}, "requests": dict.fromkeys(REQUEST_KEYS, 0), "bytes_sent": 0, "bytes_received": 0}


def add(total: dict, part: dict | None) -> dict:
    """``part`` added into ``total`` (numbers summed at every level); returns ``total``."""
    for key, value in (part or {}).items():
        if isinstance(value, dict):
            add(total.setdefault(key, {}), value)
        else:
            total[key] = total.get(key, 0) + value
    return total


class Usage:
    """One activity execution's counts; safe to add to from several threads."""

    def __init__(self, function: str = "") -> None:
        self.function = function
        self.started = time.perf_counter()
        self._lock = threading.Lock()
        self.requests = dict.fromkeys(REQUEST_KEYS, 0)
        self.bytes_sent = 0
        self.bytes_received = 0

    def count(self, key: str, sent: int, received: int) -> None:
        with self._lock:
            self.requests[key] += 1
            self.bytes_sent += sent
            self.bytes_received += received

    def to_dict(self, seconds: float | None = None) -> dict:
        """This execution's usage; ``seconds`` (default: since it started) as its duration."""
        seconds = time.perf_counter() - self.started if seconds is None else seconds
        with self._lock:
            return {
                "functions": {self.function: {"executions": 1, "seconds": round(seconds, 6)}},
                "requests": {key: n for key, n in self.requests.items() if n},  # histories hold it: keep it small
                "bytes_sent": self.bytes_sent,
                "bytes_received": self.bytes_received,
            }


@contextmanager
def measuring(function: str = "") -> Iterator[Usage]:
    """Count this context's storage requests (and those of threads started from a ContextExecutor),
    as the usage of one execution of activity ``function``."""
    usage = Usage(function)
    token = _CURRENT.set(usage)
    try:
        yield usage
    finally:
        _CURRENT.reset(token)


def so_far() -> dict:
    """What the activity running in this context has used until now (:meth:`Usage.to_dict`, its
    seconds counted from its start); nothing (:func:`empty`) outside any activity."""
    usage = _CURRENT.get()
    if usage is None:
        return empty()
    return usage.to_dict()


def blob_kind(method: str, url: str) -> str:
    """The billing category of a blob request (creating a container is billed with the lists)."""
    method, query = method.upper(), parse_qs(urlsplit(url).query)
    if method == "PUT":
        return "list" if query.get("restype") == ["container"] and "comp" not in query else "write"
    if method == "GET":
        if query.get("comp") == ["list"]:
            return "list"
        return "other" if "comp" in query else "read"
    return "other"


def table_kind(method: str) -> str:
    return "read" if method.upper() == "GET" else "write"


def _length(headers: Any) -> int:
    try:
        return int(headers.get("Content-Length") or 0)
    except (TypeError, ValueError):
        return 0


def response_hook(service: str):
    """The ``raw_response_hook`` of a client of ``service`` (``blob`` or ``table``)."""

    def count_response(response: Any) -> None:
        usage = _CURRENT.get()
        if usage is None:
            return
        request, answer = response.http_request, response.http_response
        kind = blob_kind(request.method, request.url) if service == "blob" else table_kind(request.method)
        body = request.body
        sent = len(body) if isinstance(body, bytes | bytearray) else _length(request.headers)
        received = _length(answer.headers) if request.method.upper() == "GET" else 0
        usage.count(f"{service}.{kind}", sent, received)

    return count_response


class ContextExecutor(ThreadPoolExecutor):
    """A thread pool whose tasks run in the context of the code that submits them, so what they
    do counts toward that activity's usage (a plain pool's threads start with an empty context)."""

    def submit(self, fn, /, *args, **kwargs):
        return super().submit(contextvars.copy_context().run, fn, *args, **kwargs)
