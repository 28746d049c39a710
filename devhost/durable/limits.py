"""The plan's instance memory limit: a process over it is recycled as an instance would be.

Consumption gives an instance 1.5 GB; Flex Consumption the configured instance memory (512,
2048 or 4096 MB). Past it the platform recycles the instance: the process dies without a
graceful shutdown, and what it was doing is taken up again elsewhere from the task hub (the
work items were never completed). Here the process kills itself with SIGKILL, so the
consequences for a job are the real ones: ``python -m devhost serve`` started again resumes it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_mb(pid: int | str = "self") -> float:
    """Resident set size of a process, from /proc (Linux)."""
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE / 2**20


def recycle() -> None:
    """End this process as the platform recycles an instance: SIGKILL, no graceful shutdown (also
    what :class:`devhost.durable.work.ActivityRunner` does in ``serve`` for a function stuck past its timeout)."""
    logging.shutdown()
    os.kill(os.getpid(), signal.SIGKILL)


class MemoryWatchdog:
    """Samples this process's resident memory; past ``limit_mb`` it calls ``exceeded`` (recycle)."""

    def __init__(self, limit_mb: float, *, interval: float = 0.1, exceeded: Callable[[], None] = recycle):
        self.limit_mb = limit_mb
        self.interval = interval
        self.exceeded = exceeded
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="devhost-memory", daemon=True)

    def start(self) -> MemoryWatchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            rss = resident_mb()
            self.peak_mb = max(self.peak_mb, rss)
            if rss > self.limit_mb:
                logger.error(
                    "instance memory %.0f MB is over the limit of %.0f MB: recycling the instance", rss, self.limit_mb
                )
                self._stop.set()
                self.exceeded()
