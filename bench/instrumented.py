"""The local host run in-process with bench instruments attached (nothing in devhost/ changes).

- a proxy around the host's :class:`devhost.durable.functions.FunctionIndex` times every orchestrator
  replay (by orchestrator name) and every activity (start and end on one clock);
- the engine's ``episodes.run`` (the whole episode on the orchestrator thread: building the
  context JSON, the SDK replay, the store commit, dispatch) and the history store's writes are
  timed by wrapping the bound methods of this host's objects;
- HTTP requests of the Python storage SDKs are counted (:class:`bench.common.RequestCounter`).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .common import BenchStorage, RequestCounter, environment


class TimedIndex:
    """Delegates to a FunctionIndex; records replay seconds and activity spans."""

    def __init__(self, index: Any):
        self._index = index
        self._lock = threading.Lock()
        self.replay_s: dict[str, float] = defaultdict(float)
        self.replays: dict[str, int] = defaultdict(int)
        #: (activity name, start, end) on time.perf_counter's clock.
        self.spans: list[tuple[str, float, float]] = []

    def orchestrator(self, name: str) -> Callable[[str], str]:
        handle = self._index.orchestrator(name)

        def timed(context_json: str) -> str:
            started = time.perf_counter()
            try:
                return handle(context_json)
            finally:
                elapsed = time.perf_counter() - started
                with self._lock:
                    self.replay_s[name] += elapsed
                    self.replays[name] += 1

        return timed

    def invoke_activity(
        self, name: str, input_json: str | None, client_binding: Callable[[], str] | None = None
    ) -> str:
        started = time.perf_counter()
        try:
            return self._index.invoke_activity(name, input_json, client_binding)
        finally:
            ended = time.perf_counter()
            with self._lock:
                self.spans.append((name, started, ended))

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._index, attr)


class MethodTimer:
    """Wraps bound methods of one object; total seconds and calls per method."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()

    def wrap(self, obj: Any, name: str, label: str | None = None) -> None:
        original = getattr(obj, name)
        label = label or name

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                with self._lock:
                    self.seconds[label] += time.perf_counter() - started
                    self.calls[label] += 1

        setattr(obj, name, timed)


@dataclass
class Instruments:
    index: TimedIndex
    timer: MethodTimer
    requests: RequestCounter
    host: Any
    env: dict
    extra: dict = field(default_factory=dict)


def instrument(host: Any) -> tuple[TimedIndex, MethodTimer]:
    index = TimedIndex(host.engine.index)
    host.engine.index = host.engine.episodes.index = index  # activities and episodes call through it
    timer = MethodTimer()
    timer.wrap(host.engine.episodes, "run", "episode")
    for method in ("commit_episode", "write_new_state", "read_state"):
        timer.wrap(host.store, method, f"store.{method}")
    return index, timer


@contextmanager
def local_host(storage: BenchStorage, env: dict, **options: Any) -> Iterator[Instruments]:
    """A started, instrumented LocalHost on ``env``'s containers, tables and task hub."""
    from devhost.durable.host import HostOptions, LocalHost

    storage.ensure(env)
    ports = {storage.blob_port: "blob", storage.table_port: "table"}
    with environment({k: v for k, v in env.items() if k != "BENCH_HUB"}), RequestCounter(ports) as requests:
        host = LocalHost(HostOptions(hub=env["BENCH_HUB"], **options))
        index, timer = instrument(host)
        with host:
            yield Instruments(index, timer, requests, host, env)


def process(
    inst: Instruments, path: Path, *, name: str | None = None, timeout: float = 3600, metadata: dict | None = None
) -> dict:
    """``devhost.session.process_file`` (upload, event, job) with the submit time recorded;
    ``metadata``: the upload's blob metadata (its output profile)."""
    from devhost.session import process_file

    submitted = time.perf_counter()
    summary = process_file(inst.host, path, name=name, timeout=timeout, metadata=metadata)
    finished = time.perf_counter()
    summary["_submitted"] = submitted
    summary["_finished"] = finished
    if summary.get("status") != "completed":
        raise RuntimeError(f"job {summary.get('job_id')} {summary.get('status')}: {summary.get('error')}")
    return summary
