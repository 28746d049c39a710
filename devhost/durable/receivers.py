"""The host's two queue readers: one takes the control messages of the partitions this host owns,
the other takes activity work items while activity slots are free, and keeps the running ones'
messages invisible to the other hosts.

Polling: a reader that found messages reads again at once; one that found none waits
:data:`FIRST_POLL_S`, doubling up to :data:`MAX_POLL_S`. The provider does the same with a
ceiling of 30 s (``MaxQueuePollingInterval``); 1 s here keeps an idle local host answering fast.
A host wakes its own work-item reader when it sends a work item.

Visibility: a control message stays invisible for :data:`CONTROL_VISIBILITY_S` while the owner
holds it, a work item for :data:`WORK_ITEM_VISIBILITY_S`, renewed every third of that while its
activity runs. The provider keeps both 5 minutes; here they equal the default lease interval, so
a host that dies loses its messages to the others within the same time as its partitions
(messages it held longer than that while alive show up again and are dropped as duplicates).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .queues import Received, TaskHubQueues

logger = logging.getLogger(__name__)

FIRST_POLL_S = 0.02
MAX_POLL_S = 1.0
CONTROL_VISIBILITY_S = 30.0
WORK_ITEM_VISIBILITY_S = 30.0
#: Control messages taken per request (the provider takes batches of 32 too).
CONTROL_BATCH = 32


class _Poller:
    def __init__(self, name: str):
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._idle = FIRST_POLL_S

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                found = self.poll()
            except Exception:  # noqa: BLE001 - storage down: wait and read again, nothing is lost
                logger.warning("%s failed; reading again shortly", self._thread.name, exc_info=True)
                found = False
                self._idle = MAX_POLL_S
            if found:
                self._idle = FIRST_POLL_S
                continue
            self._wake.wait(self._idle)
            self._wake.clear()
            self._idle = min(MAX_POLL_S, self._idle * 2)

    def poll(self) -> bool:
        raise NotImplementedError


class ControlReader(_Poller):
    """Reads the control queue of every partition ``receiving(p)`` says this host reads now."""

    def __init__(
        self,
        queues: TaskHubQueues,
        receiving: Callable[[int], bool],
        accept: Callable[[dict, Received], None],
    ):
        super().__init__("devhost-control-reader")
        self.queues, self.receiving, self.accept = queues, receiving, accept

    def poll(self) -> bool:
        found = False
        for partition in range(self.queues.partitions):
            if self._stop.is_set() or not self.receiving(partition):
                continue
            for received in self.queues.receive_control(partition, CONTROL_BATCH, CONTROL_VISIBILITY_S):
                found = True
                self.accept(received.body, received)
        return found


class WorkItemReader(_Poller):
    """Takes work items while ``free()`` activity slots are free and hands each to ``run``;
    ``running()`` lists the work items whose activities run, to keep them invisible."""

    def __init__(
        self,
        queues: TaskHubQueues,
        free: Callable[[], int],
        run: Callable[[dict, Received], None],
        running: Callable[[], list[Received]],
        clock: Callable[[], float],
        prefetch: int = 2,
    ):
        super().__init__("devhost-work-items")
        self.queues, self.free, self.run, self.running, self.clock = queues, free, run, running, clock
        self._renewed = clock()
        self.taking = True
        #: Work items taken beyond the free slots, so a slot that frees starts its next activity
        #: without waiting for a queue round trip (they stay invisible to other hosts meanwhile).
        self.prefetch = prefetch

    def poll(self) -> bool:
        self._renew()
        wanted = self.free() + self.prefetch if self.taking else 0
        if wanted <= 0:
            return False
        taken = self.queues.receive_work_items(min(wanted, 32), WORK_ITEM_VISIBILITY_S)
        for received in taken:
            self.run(received.body, received)
        return bool(taken)

    def _renew(self) -> None:
        if self.clock() - self._renewed < WORK_ITEM_VISIBILITY_S / 3:
            return
        self._renewed = self.clock()
        for received in self.running():
            if not self.queues.extend(received, WORK_ITEM_VISIBILITY_S):
                logger.warning("the work item of a running activity was taken by another host (%s)", received.id)
