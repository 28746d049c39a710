"""The host's timer thread: callbacks run after a delay (backoffs after a storage fault, results
that linger for their siblings, timers of owned partitions held in memory, function timeouts)."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

#: How long a callback that raised waits before it runs again.
RETRY_FAILED_S = 0.5
#: The longest the thread sleeps before it looks again (a new earlier timer wakes it anyway).
IDLE_LOOK_S = 0.5


class Timers:
    """Callbacks due at a monotonic time, run one at a time on a thread of their own."""

    def __init__(self) -> None:
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._changed = threading.Condition(threading.Lock())
        self._stopping = False
        self._thread: threading.Thread | None = None

    def later(self, delay: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the timer thread after ``delay`` seconds."""
        with self._changed:
            heapq.heappush(self._due, (time.monotonic() + delay, next(self._order), callback))
            self._changed.notify_all()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="devhost-timers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _next_due(self) -> Callable[[], None] | None:
        """The first callback that is due, taken off the heap; None after a wait or once stopping."""
        with self._changed:
            if self._stopping:
                return None
            if not self._due:
                self._changed.wait(timeout=IDLE_LOOK_S)
                return None
            due, _, callback = self._due[0]
            wait = due - time.monotonic()
            if wait > 0:
                self._changed.wait(timeout=min(wait, IDLE_LOOK_S))
                return None
            heapq.heappop(self._due)
            return callback

    def _run(self) -> None:
        while not self._stopping:
            callback = self._next_due()
            if callback is None:
                continue
            try:
                callback()
            except Exception:  # noqa: BLE001 - one timer's failure must not end the timer thread
                # Ending the thread would end every later timer with it (retry delays, backoffs)
                # and stall the job: the work is tried again shortly instead.
                logger.warning("timer callback failed; trying it again in %.1f s", RETRY_FAILED_S, exc_info=True)
                self.later(RETRY_FAILED_S, callback)
