"""The progress watch: a job that stops making progress is reported, whatever becomes of stderr.

A job is a top-level instance (one no parent started) that is Pending or Running; its progress
is the last episode committed by it or by any instance below it (its batches and groups, their
children), since an episode is the only way its history or custom status can move. When none
has been committed for the bound (``Engine(stall_report_s=...)``), the host logs an ERROR naming the job
(``job_id`` in the record's fields, as the app's own records carry it) and counts it
(``stats.stalled_jobs_reported``), and again each time the bound passes while it lasts.

The bound's default is the longest a job can legitimately stay quiet: one activity running
alone up to the function timeout, its worker restart's grace, and the margin after which the
host's watchdog sends an unanswered task again
(:func:`devhost.durable.watchdog.quiet_activity_bound`); anything
quieter than that is a job nobody runs. Not the real host's: the Durable extension has no such
report (docs/local-host.md, "Several hosts on one task hub", the watchdog).
"""

from __future__ import annotations

import json
import logging
import time

from .history import PENDING, RUNNING, now, parse_iso
from .instance import EngineStats, HeldInstances
from .partitions import PartitionManager
from .store import HistoryStore
from .watchdog import quiet_activity_bound

logger = logging.getLogger(__name__)


def default_stall_bound(function_timeout: float | None) -> float:
    """Seconds without a committed episode in a job's family after which it is reported."""
    return quiet_activity_bound(function_timeout)


def _family_last_change(job: dict, states: list[dict]) -> str:
    """The latest ``updated`` of ``job`` and every instance below it (by parent links)."""
    below: dict[str, list[dict]] = {}
    for state in states:
        parent = (state.get("parent") or {}).get("id")
        if parent:
            below.setdefault(parent, []).append(state)
    latest, todo = job["updated"], [job["id"]]
    while todo:
        for child in below.get(todo.pop(), []):
            latest = max(latest, child["updated"])
            todo.append(child["id"])
    return latest


class ProgressWatch:
    """Reports the jobs of this host's partitions that make no progress for ``bound`` seconds."""

    def __init__(
        self,
        instances: HeldInstances,
        partitions: PartitionManager,
        store: HistoryStore,
        *,
        stats: EngineStats,
        bound: float,
    ):
        self.instances, self.partitions, self.store, self.stats = instances, partitions, store, stats
        self.bound = bound
        #: Jobs reported as making no progress: id -> time.monotonic() of the last report.
        self._reported: dict[str, float] = {}

    def report_stalled_jobs(self) -> list[str]:
        """One look: the ids of the jobs reported now."""
        bound = self.bound
        moment = now()
        owned = set(self.partitions.owned())
        with self.instances.lock:
            quiet = [
                inst.state()
                for inst in self.instances.all()
                if inst.parent is None
                and inst.status in (PENDING, RUNNING)
                and self.partitions.partition_for(inst.id) in owned
                and (moment - parse_iso(inst.updated)).total_seconds() > bound
            ]
            self._reported = {k: v for k, v in self._reported.items() if k in {q["id"] for q in quiet}}
        if not quiet:
            return []
        # Only when a job itself has been quiet that long: its children may be in any partition,
        # so their states are read from the task hub.
        states = self.store.instances()
        reported = []
        for job in quiet:
            last = _family_last_change(job, states)
            silent = (moment - parse_iso(last)).total_seconds()
            since = self._reported.get(job["id"])
            if silent <= bound or (since is not None and time.monotonic() - since < bound):
                continue
            self._reported[job["id"]] = time.monotonic()
            reported.append(job["id"])
            logger.error(
                "job %s has made no progress for %.0f s (%s, %d episode(s), last change %s, custom status %s): "
                "no episode of it or of its sub-orchestrations was committed within %.0f s",
                job["id"],
                silent,
                job["status"],
                job.get("episodes") or 0,
                last,
                json.dumps(job.get("custom_status")),
                bound,
                extra={"job_id": job["id"]},
            )
        if reported:
            with self.instances.lock:
                self.stats.stalled_jobs_reported += len(reported)
        return reported
