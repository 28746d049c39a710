"""The watchdog: the bound on a job nobody runs (ours, not the provider's).

Every round, for the partitions this host owns, the open work of idle instances with no answer
past its bound is sent again (never a sub-orchestration start the child's host dropped as a
duplicate: the real host sends nothing again either), an instance stored Pending with no first
episode that no host holds is started, and jobs that make no progress are reported
(:mod:`devhost.durable.progress`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from .history import PENDING, TERMINAL, now, parse_iso
from .instance import EngineStats, HeldInstances, Instance
from .messaging import Outbound
from .partitions import PartitionManager
from .store import HistoryStore
from .work import TIMEOUT_GRACE_S

if TYPE_CHECKING:
    from .dispatch import EpisodeQueue
    from .messaging import Messaging
    from .progress import ProgressWatch
    from .starts import Starts

logger = logging.getLogger(__name__)

#: The watchdog's round: an unfinished instance of an owned partition that makes no progress is
#: looked at this often.
WATCHDOG_INTERVAL_S = 10.0
#: A stored instance still Pending, with no first episode and not held by its partition's owner,
#: this long after it was created is started from its stored row (its start message was lost).
STALLED_START_S = 30.0
#: An open timer this long past its due time is sent again.
OVERDUE_TIMER_S = 30.0
#: A sub-orchestration with no result for this long has its start sent again; a child that runs
#: drops it, a finished one reports its result again.
QUIET_CHILD_S = 120.0
#: An activity with no result this long past the function timeout (plus the worker restart's
#: grace) is sent again: its outcome cannot come any more.
QUIET_ACTIVITY_MARGIN_S = 60.0
#: The function timeout assumed when the host has none (host.json's: 10 minutes).
DEFAULT_FUNCTION_TIMEOUT_S = 600.0


def quiet_activity_bound(function_timeout: float | None) -> float:
    """Seconds an activity may go without an answer before it is sent again: the longest it can
    legitimately take (the function timeout, then its worker restart's grace) and a margin."""
    return (function_timeout or DEFAULT_FUNCTION_TIMEOUT_S) + TIMEOUT_GRACE_S + QUIET_ACTIVITY_MARGIN_S


class Watchdog:
    """Rounds every ``interval`` seconds on a thread of its own; ``stalled_start_s`` is how long a
    stored Pending instance no host holds waits before it is started from its row."""

    def __init__(
        self,
        instances: HeldInstances,
        queue: EpisodeQueue,
        messaging: Messaging,
        starts: Starts,
        progress: ProgressWatch,
        partitions: PartitionManager,
        store: HistoryStore,
        *,
        stats: EngineStats,
        function_timeout: float | None,
        interval: float = WATCHDOG_INTERVAL_S,
        stalled_start_s: float = STALLED_START_S,
    ):
        self.instances, self.queue, self.messaging, self.starts = instances, queue, messaging, starts
        self.progress, self.partitions, self.store, self.stats = progress, partitions, store, stats
        self.activity_bound = quiet_activity_bound(function_timeout)
        self.interval, self.stalled_start_s = interval, stalled_start_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="devhost-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.run_round()
                self.progress.report_stalled_jobs()
            except Exception:  # noqa: BLE001 - storage trouble: the next round looks again
                logger.warning("watchdog round failed", exc_info=True)

    def _overdue(self, inst: Instance, task_id: int, moment: float) -> bool:
        meta = inst.scheduled[task_id]
        since = moment - inst.dispatched.get(task_id, moment)
        if meta["kind"] == "timer":
            return (now() - parse_iso(meta["fire_at"])).total_seconds() > OVERDUE_TIMER_S
        if meta["kind"] == "suborchestration":
            refused = self.starts.refused((meta["instance_id"], inst.id, inst.execution_id, task_id))
            return since > QUIET_CHILD_S and not refused
        return since > self.activity_bound

    def run_round(self) -> int:
        """No instance left waiting: send again the open work of idle instances of owned partitions
        that has had no answer past its bound, and start instances stored Pending with no first
        episode that no host took up. How many things it sent or started."""
        owned = set(self.partitions.owned())
        outbound: list[Outbound] = []
        what: list[str] = []  # one line per thing sent or started, for the log
        with self.instances.lock:
            self._idle_work(owned, outbound, what)
            known = self.instances.ids()
        self._stalled_starts(owned, known, outbound, what)
        if outbound:
            with self.instances.lock:
                self.stats.watchdog_redispatches += len(outbound)
            logger.warning(
                "watchdog: %d stalled start(s) or unanswered task(s) sent again: %s", len(outbound), "; ".join(what)
            )
        self.messaging.send_all(outbound)
        return len(outbound)

    def _idle_work(self, owned: set[int], outbound: list[Outbound], what: list[str]) -> None:
        """Under the host's lock: held instances never run are made ready, unanswered work is sent again."""
        moment = time.monotonic()
        instances = self.instances.all()
        self.starts.forget_refused_by({i.id for i in instances if i.status in TERMINAL})
        for inst in instances:
            if (
                inst.status in TERMINAL
                or self.queue.holds(inst.id)
                or inst.pending
                or self.partitions.partition_for(inst.id) not in owned
            ):
                continue
            if not inst.history and not self.queue.is_ready(inst.id):
                self.queue.mark_ready(inst.id)
                outbound.append(None)
                what.append(f"{inst.id}: held, never run")
            for task_id in sorted(inst.open):
                if self._overdue(inst, task_id, moment):
                    meta = inst.scheduled[task_id]
                    silent = moment - inst.dispatched.get(task_id, moment)
                    what.append(
                        f"{inst.id}: task {task_id} ({meta['kind']} {meta.get('name', '')}) silent {silent:.0f} s"
                    )
                    outbound += self.messaging.work_for(inst, task_id, meta)
                    inst.dispatched[task_id] = moment

    def _stalled_starts(self, owned: set[int], known: set[str], outbound: list[Outbound], what: list[str]) -> None:
        """Instances stored Pending with no host holding them, past the bound: started from their row."""
        stalled = [
            state
            for state in self.store.instances(PENDING)
            if state["id"] not in known
            and self.partitions.partition_for(state["id"]) in owned
            and (now() - parse_iso(state["created"])).total_seconds() > self.stalled_start_s
        ]
        for state in stalled:
            inst = Instance.from_state(state)
            with self.instances.lock:
                if self.instances.get(inst.id) is None:
                    self.instances.put(inst)
                    self.queue.mark_ready(inst.id)
                    outbound.append(None)
                    what.append(f"{inst.id}: stored Pending, held by no host")
