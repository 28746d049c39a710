"""The host's orchestration dispatchers (host.json's ``maxConcurrentOrchestratorFunctions``): each
takes the next start or episode of an instance no other dispatcher holds, of a partition this host
owns, and runs it (DTFx's TaskOrchestrationDispatcher on its WorkItemDispatcher).

:class:`EpisodeQueue` is what waits for them: start messages in arrival order, instances ready
for an episode, the instances a dispatcher holds, and those resting after a fault of the host's
own storage. :class:`Dispatcher` is the threads. A fault of the host's storage costs time, never
the instance: the work stays where it was and is taken up again after a growing delay
(:class:`devhost.durable.work.HostBackoff`), as DTFx abandons a work item and takes it up again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .history import TERMINAL
from .instance import EngineStats, HeldInstances, Instance
from .messaging import start_body
from .queues import Received
from .versioning import Versioning
from .work import HostBackoff, StartMessage

if TYPE_CHECKING:
    from .messaging import Messaging
    from .replay import EpisodeRunner
    from .starts import Starts

logger = logging.getLogger(__name__)

#: How long a result waits for the other results its instance still waits for, so that one
#: episode replays for all that land meanwhile (the result awaited last runs at once). Every
#: episode replays the instance's whole history, so a fan-in of n results in n episodes costs
#: n^2 / 2 event replays. Measured on the 10240² job (100 windows in 2 batches of 64, 2 slots,
#: one result about every 0.4 s): 0.05 s gave 78-96 episodes and 3.0-3.9 s of replay, 0.5 s
#: 40-43 episodes and 0.7-0.8 s, and the job used about 6 CPU-s less; 1.0 s 27-30 episodes,
#: no further gain in CPU. In Azure, too, results reach an episode in batches: what the
#: control queue holds when it is read (docs/local-host.md, row 29).
EPISODE_LINGER_S = 0.5

Later = Callable[[float, Callable[[], None]], None]


@dataclass(frozen=True)
class StartDue:
    """A start message to apply; ``here`` is False when the instance's partition is not this
    host's (any more), and the start goes on to its owner."""

    message: StartMessage
    receipt: Received | None
    here: bool


@dataclass(frozen=True)
class EpisodeDue:
    """An episode to run on the results taken from the instance, and the messages they came in."""

    inst: Instance
    events: list[dict]
    receipts: list[Received]


class EpisodeQueue:
    """What waits for a dispatcher, under the host's lock (:class:`HeldInstances`'s): one start or
    episode of an instance at a time, of an owned partition, results lingering for their siblings.

    ``owns(instance_id)`` says whether this host runs the instance's episodes now, ``later(delay,
    callback)`` schedules the instance's return after a linger or a rest."""

    def __init__(self, instances: HeldInstances, *, owns: Callable[[str], bool], linger: float, later: Later):
        self.instances = instances
        self.owns, self.linger, self.later = owns, linger, later
        self._starts: deque[tuple[StartMessage, Received | None]] = deque()
        self._ready: deque[str] = deque()
        #: Instances a dispatcher holds (one episode or start at a time per instance).
        self._busy: set[str] = set()
        #: Instances backing off after a fault of the host's storage: not before this monotonic time.
        self._resting: dict[str, float] = {}

    # ------------------------------------------------------------------ what the other parts add

    def queue_start(self, message: StartMessage, receipt: Received | None) -> None:
        with self.instances.lock:
            self._starts.append((message, receipt))
            self.instances.changed.notify_all()

    def mark_ready(self, instance_id: str) -> None:
        with self.instances.lock:
            if instance_id not in self._ready:
                self._ready.append(instance_id)
            self.instances.changed.notify_all()

    def ready_again(self, instance_id: str) -> None:
        with self.instances.lock:
            self._resting.pop(instance_id, None)
            self.mark_ready(instance_id)

    def rest(self, instance_id: str, delay: float) -> None:
        """Leave the instance alone for ``delay`` seconds (a fault of the host's storage), then run it."""
        with self.instances.lock:
            self._resting[instance_id] = time.monotonic() + delay
        self.later(delay, lambda: self.ready_again(instance_id))

    # ------------------------------------------------------------------ what the other parts ask

    def has_work(self) -> bool:
        with self.instances.lock:
            return bool(self._ready or self._starts)

    def holds(self, instance_id: str) -> bool:
        """A dispatcher holds the instance now."""
        with self.instances.lock:
            return instance_id in self._busy

    def holds_any(self, chosen: Callable[[str], bool]) -> bool:
        with self.instances.lock:
            return any(chosen(i) for i in self._busy)

    def is_ready(self, instance_id: str) -> bool:
        with self.instances.lock:
            return instance_id in self._ready

    def take(self, chosen: Callable[[str], bool]) -> list[tuple[StartMessage, Received | None]]:
        """Remove the starts of the instances whose id is ``chosen`` (returned) and forget that
        they were ready (their partition goes to another host)."""
        with self.instances.lock:
            starts = [s for s in self._starts if chosen(s[0].instance_id)]
            self._starts = deque(s for s in self._starts if not chosen(s[0].instance_id))
            self._ready = deque(i for i in self._ready if not chosen(i))
            self.instances.changed.notify_all()
        return starts

    # ------------------------------------------------------------------ the dispatchers' side

    def next(self) -> StartDue | EpisodeDue | None:
        """The next start or episode of an instance no dispatcher holds, of an owned partition,
        held from now on until :meth:`let_go`; a start for another host's partition is not held."""
        with self.instances.lock:
            if self._starts:
                message, receipt = self._starts.popleft()
                if message.instance_id in self._busy:
                    self._starts.append((message, receipt))  # after the episode that holds the instance
                    return None
                if not self.owns(message.instance_id):
                    return StartDue(message, receipt, here=False)
                self._busy.add(message.instance_id)
                return StartDue(message, receipt, here=True)
            if not self._ready:
                return None
            return self._next_episode(self._ready.popleft())

    def _next_episode(self, instance_id: str) -> EpisodeDue | None:
        inst = self.instances.get(instance_id)
        if inst is None or inst.status in TERMINAL or instance_id in self._busy:
            return None  # a held instance is made ready again when it is released
        if not self.owns(instance_id):
            return None  # the partition is being handed on: the drain takes its results
        if self._resting.get(instance_id, 0.0) > time.monotonic():
            return None  # backing off after a storage fault; ``rest`` makes it ready again
        linger = inst.pending_since + self.linger - time.monotonic()
        if inst.pending and len(inst.open) > len(inst.pending) and linger > 0:
            # More results are due: a moment for them to land, so one episode replays for them all.
            # The result the instance waits for last runs at once (nothing else is open).
            self.later(linger, lambda: self.ready_again(instance_id))
            return None
        events, inst.pending = inst.pending, []
        receipts, inst.receipts = inst.receipts, []
        self._busy.add(instance_id)
        return EpisodeDue(inst, events, receipts)

    def let_go(self, instance_id: str) -> None:
        with self.instances.lock:
            self._busy.discard(instance_id)
            inst = self.instances.get(instance_id)
            # Ready again if results wait in ``pending``, or if it has not run its first episode:
            # a start marks its new instance ready while still holding it, and a dispatcher that
            # looked then passed it by.
            if inst is not None and (inst.pending or not inst.history) and inst.status not in TERMINAL:
                self.mark_ready(instance_id)


class Dispatcher:
    """``count`` threads taking work from the :class:`EpisodeQueue`: starts applied by ``starts``,
    episodes run by ``episodes``, what they send and consume through ``messaging``."""

    def __init__(
        self,
        queue: EpisodeQueue,
        *,
        count: int,
        starts: Starts,
        episodes: EpisodeRunner,
        messaging: Messaging,
        backoff: HostBackoff,
        stats: EngineStats,
        versioning: Versioning | None = None,
    ):
        self.queue, self.instances, self.count = queue, queue.instances, count
        self.versioning = versioning or Versioning()
        self.starts, self.episodes, self.messaging = starts, episodes, messaging
        self.backoff, self.stats = backoff, stats
        self._stopping = False
        self._threads: list[threading.Thread] = []
        #: Instances this host has refused to run for their version (logged once each).
        self._rejected: set[str] = set()

    def start(self) -> None:
        for n in range(self.count):
            thread = threading.Thread(target=self._loop, name=f"devhost-orchestrator-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop the threads once they are done with what they hold."""
        with self.instances.lock:
            self._stopping = True
            self.instances.changed.notify_all()
        for thread in self._threads:
            thread.join(timeout=10)

    def _loop(self) -> None:
        while True:
            with self.instances.lock:
                while not self.queue.has_work() and not self._stopping:
                    self.instances.changed.wait()
                if self._stopping:
                    return
            work = self.queue.next()
            if isinstance(work, StartDue) and not work.here:
                self.messaging.forward(start_body(work.message), work.receipt)  # to the partition's owner
            elif isinstance(work, StartDue):
                try:
                    self._run_start(work.message, work.receipt)
                finally:
                    self.queue.let_go(work.message.instance_id)
            elif isinstance(work, EpisodeDue):
                try:
                    self._run_episode(work.inst, work.events, work.receipts)
                finally:
                    self.queue.let_go(work.inst.id)

    def _run_start(self, message: StartMessage, receipt: Received | None) -> None:
        try:
            outbound, made = self.starts.process(message)
            self.backoff.succeeded(message.instance_id)
        except Exception:
            delay = self.backoff.failed(message.instance_id)
            logger.warning(
                "start of %s failed in the host; trying again in %.1f s", message.instance_id, delay, exc_info=True
            )
            self.queue.later(delay, lambda: self.queue.queue_start(message, receipt))
            return
        self.messaging.send_all(outbound)
        if made is not None and receipt is not None:
            with self.instances.lock:
                made.receipts.append(receipt)  # deleted once the first episode is committed
        else:
            self.messaging.delete(receipt)

    def _run_episode(self, inst: Instance, events: list[dict], receipts: list[Received]) -> None:
        if self.versioning.rejects(inst.version):
            self._reject(inst, events, receipts)
            return
        try:
            outbound = self.episodes.run(inst, events)
            self.backoff.succeeded(inst.id)
        except Exception:  # the host's own storage failed: the work item stays, as in DTFx
            delay = self.backoff.failed(inst.id)
            logger.warning("episode of %s failed in the host; trying again in %.1f s", inst.id, delay, exc_info=True)
            with self.instances.lock:
                self.stats.episode_retries += 1
                self._put_back(inst, events, receipts, delay)
            return
        # As the provider: the episode is committed, then what it scheduled is sent, then the
        # messages it consumed are deleted (a crash in between sends or delivers them again).
        self.messaging.send_all(outbound)
        for receipt in receipts:
            self.messaging.delete(receipt)

    def _reject(self, inst: Instance, events: list[dict], receipts: list[Received]) -> None:
        """An instance of a version this host may not run (versionFailureStrategy Reject): DTFx
        abandons the work item, and its messages come back later; nothing of the instance
        changes. Here its results go back to it, unconsumed, and it is tried again after a
        growing delay (up to 5 s), so a host with the same partition never runs it; a host that
        may run it does once it owns the partition (docs/local-host.md, row 50)."""
        delay = self.backoff.failed(f"version:{inst.id}")
        with self.instances.lock:
            first = inst.id not in self._rejected
            self._rejected.add(inst.id)
            self.stats.version_rejections += 1
            self._put_back(inst, events, receipts, delay)
        if first:
            logger.warning(
                "instance %s is orchestration version %r, which this host (defaultVersion %r, %s) may not run: "
                "left for a host that may",
                inst.id,
                inst.version,
                self.versioning.default_version,
                self.versioning.match_strategy,
            )

    def _put_back(self, inst: Instance, events: list[dict], receipts: list[Received], delay: float) -> None:
        """The episode's results and messages back to the instance, which rests ``delay`` seconds
        (under the host's lock)."""
        inst.pending = events + inst.pending
        inst.receipts = receipts + inst.receipts
        self.queue.rest(inst.id, delay)
