"""Start messages (a client's start_new, a parent's sub-orchestration) applied to the host's
memory, as DTFx's TaskOrchestrationDispatcher applies an ExecutionStarted message:

- a start for an id whose execution is live is dropped ("Duplicate start event"); one from a
  parent task other than the one the running instance reports to is remembered, since that task
  never completes and nothing may send the start again (docs/local-host.md, row 47);
- a start sent again for a child that already finished for that same parent task reports the
  child's outcome to the parent instead of running it again;
- any other start for a known id begins a new execution: the earlier one's history goes.
"""

from __future__ import annotations

import logging

from .dispatch import EpisodeQueue
from .history import CONTINUED_AS_NEW, TERMINAL
from .instance import EngineStats, HeldInstances, Instance
from .messaging import Outbound
from .replay import report_to_parent
from .store import HistoryStore
from .work import StartMessage

logger = logging.getLogger(__name__)

#: A refused sub-orchestration start: (child id, parent id, parent execution id, parent's task id).
RefusedStart = tuple[str, str, str, int]


def _continues(current: Instance, message: StartMessage) -> bool:
    """The start of the execution that goes on from ``current``, ended by ``continue_as_new``."""
    return current.status == CONTINUED_AS_NEW and current.execution_id != message.execution_id


class Starts:
    """Applies start messages; remembers the sub-orchestration starts it refused."""

    def __init__(self, instances: HeldInstances, queue: EpisodeQueue, store: HistoryStore, stats: EngineStats):
        self.instances, self.queue, self.store, self.stats = instances, queue, store, stats
        #: Sub-orchestration starts dropped because the id runs for another parent task.
        self._refused: set[RefusedStart] = set()

    def process(self, message: StartMessage) -> tuple[list[Outbound], Instance | None]:
        """Apply one ExecutionStarted message; the messages it leads to, and the new instance if
        it made one (ready for its first episode)."""
        current = self.instances.get(message.instance_id)
        if current is not None and current.status not in TERMINAL and not _continues(current, message):
            self._drop_duplicate(message, current)
            return [], None
        previous = current.state() if current is not None else self.store.read_state(message.instance_id)
        if (
            previous is not None
            and message.parent
            and previous.get("parent") == message.parent
            and previous["status"] in TERMINAL
        ):
            # The child finished (here, or on a host that stopped), and its parent's start of it
            # came again (sent again when the parent's partition changed hands): the parent may
            # never have heard, so tell it now instead of running the child a second time.
            finished = current or Instance.from_state(previous)
            self.instances.put(finished)
            return [report_to_parent(finished)], None
        inst = Instance(
            message.instance_id,
            message.name,
            message.input_json,
            parent=message.parent,
            execution_id=message.execution_id,
            version=message.version,
        )
        if current is not None and _continues(current, message):
            # DTFx carries the custom status over to the execution continue_as_new begins
            # (TaskOrchestrationDispatcher: ``runtimeState.Status = ... carryOverStatus``), until
            # that execution's first episode sets its own.
            inst.custom_status = current.custom_status
        if previous is not None:
            # An earlier execution of this id: the new one's row replaces it, then its history goes.
            self.store.begin_execution(inst.id, inst.state())
        with self.instances.lock:
            self.instances.put(inst)
            self.queue.mark_ready(inst.id)
        return [], inst

    def _drop_duplicate(self, message: StartMessage, current: Instance) -> None:
        """DTFx TaskOrchestrationDispatcher: "Duplicate start event" while an execution is live."""
        if message.parent and current.parent == message.parent:
            return  # already running for this very parent task (recovered); it reports when done
        with self.instances.lock:
            self.stats.duplicate_starts_dropped += 1
        if not message.parent:
            logger.info("dropping a duplicate start event for %s", message.instance_id)
            return
        # A parent starting a child whose id runs for another parent task (a job restarted over
        # its last run's batch): the start is dropped, and the running child reports to its own
        # parent's execution only, so this task never completes (docs/local-host.md, row 47).
        parent = message.parent
        with self.instances.lock:
            self.stats.foreign_child_starts_dropped += 1
            self._refused.add((message.instance_id, parent["id"], parent["execution_id"], int(parent["task_id"])))
        logger.warning(
            "dropping the start of sub-orchestration %s from %s (task %s): it is %s for %s, a duplicate start "
            "event; that task never completes",
            message.instance_id,
            parent["id"],
            parent["task_id"],
            current.status,
            (current.parent or {}).get("id") or "a client",
        )

    def refused(self, start: RefusedStart) -> bool:
        """This host dropped that start: it is never sent again."""
        with self.instances.lock:
            return start in self._refused

    def forget_refused_by(self, finished: set[str]) -> None:
        """Forget the refused starts of parents that have finished (nothing waits for them)."""
        with self.instances.lock:
            self._refused = {r for r in self._refused if r[1] not in finished}
