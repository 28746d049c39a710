"""The Durable client's operations on the task hub: start, terminate, query, purge, status and
wait, as the Azure Storage provider carries them out. The extension's HTTP API
(:mod:`devhost.durable.rpc`) serves them to the app's real client."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from azure.core.exceptions import ResourceNotFoundError

from .functions import FunctionIndex
from .history import (
    CONTINUED_AS_NEW,
    EXECUTION_TERMINATED,
    PENDING,
    RUNNING,
    TERMINAL,
    InstanceAlreadyExists,
    InstanceFinished,
    InstanceNotFound,
    check_instance_id,
    event,
    now,
)
from .instance import HeldInstances, Instance, new_execution_id
from .messaging import event_body, start_body
from .store import HistoryStore
from .versioning import Versioning
from .work import StartMessage

#: How long a terminate waits for the execution that ``continue_as_new`` begins to have started.
CONTINUATION_WAIT_S = 10.0


class TaskHubClient:
    """What the client asks of the task hub: its rows in ``store``, the instances this host holds
    (newer in memory than in their rows), messages through ``send(instance_id, body)``."""

    def __init__(
        self,
        instances: HeldInstances,
        store: HistoryStore,
        index: FunctionIndex,
        send: Callable[[str, dict], None],
        *,
        versioning: Versioning | None = None,
    ):
        self.instances, self.store, self.index, self.send = instances, store, index, send
        self.versioning = versioning or Versioning()

    def start_new(
        self,
        name: str,
        instance_id: str,
        input_value: Any = None,
        *,
        input_json: str | None = None,
        version: str | None = None,
    ) -> str:
        """The client's ``start_new``, in the Azure Storage provider's steps
        (AzureStorageOrchestrationService.CreateTaskOrchestrationAsync): read the instance row;
        refuse if it is Pending/Running; queue the ExecutionStarted message; then write the row,
        create-only for a new id (a conflict from a concurrent starter is ignored). So starters
        that race on a new id all succeed; the host drops the later ExecutionStarted. The instance
        is stamped with ``version``, else the host's default version."""
        check_instance_id(instance_id)
        self.index.orchestrator(name)
        if input_json is None and input_value is not None:
            input_json = json.dumps(input_value)
        existing, etag = self.store.read_state_and_etag(instance_id)
        if existing is not None and existing["status"] in (PENDING, RUNNING, CONTINUED_AS_NEW):
            raise InstanceAlreadyExists(
                f"An Orchestration instance with the status {existing['status']} already exists."
            )
        stamped = self.versioning.stamp(version)
        message = StartMessage(name, instance_id, input_json, None, new_execution_id(), stamped)
        self.send(instance_id, start_body(message))
        row = Instance(instance_id, name, input_json, execution_id=message.execution_id, version=stamped).state()
        self.store.write_new_state(instance_id, row, etag)
        with self.instances.lock:
            finished = self.instances.get(instance_id)
            if finished is not None and finished.status in TERMINAL:
                self.instances.pop(instance_id)  # its status is the new row's now (Pending)
        return instance_id

    def terminate(self, instance_id: str, reason: str) -> None:
        """The client's ``terminate``: an ExecutionTerminated message to the instance's current
        execution (AzureStorageOrchestrationService.ForceTerminateTaskOrchestrationAsync sends it
        to the control queue; the extension's HttpApiHandler answers 404 for an unknown id and 410
        for a finished one before it sends anything). Its activities already queued still run;
        their results reach a finished instance and are dropped."""
        state = self.status(instance_id)
        deadline = time.monotonic() + CONTINUATION_WAIT_S
        while state is not None and state["status"] == CONTINUED_AS_NEW and time.monotonic() < deadline:
            # Between an execution that ended by continue_as_new and the next (a start message
            # away here; no gap in DTFx, which begins the next in the same work item): the
            # terminate is for the next, whose execution id its start brings.
            time.sleep(0.05)
            state = self.status(instance_id)
        if state is None:
            raise InstanceNotFound(f"No instance with ID '{instance_id}' found.")
        if state["status"] in TERMINAL:
            raise InstanceFinished(f"Instance '{instance_id}' is already {state['status']}.")
        item = event(EXECUTION_TERMINATED, now(), Input=json.dumps(reason))
        self.send(instance_id, event_body(instance_id, state["execution_id"], item))

    def list_instances(
        self,
        *,
        created_from: str | None = None,
        created_to: str | None = None,
        statuses: tuple[str, ...] = (),
        prefix: str | None = None,
    ) -> list[dict]:
        """The instances matching the query, oldest first (the Instances table's order is the
        provider's; ours is by creation time, then id, so a page boundary is stable)."""
        try:
            stored = self.store.instances()
        except ResourceNotFoundError:  # no instance has ever run in this task hub
            return []
        with self.instances.lock:  # an instance this host runs is newer in memory than in its row
            held = {inst.id: inst for inst in self.instances.all()}
            states = [held[s["id"]].state() if s["id"] in held else s for s in stored]
        chosen = [
            s
            for s in states
            if (created_from is None or s["created"] >= created_from)
            and (created_to is None or s["created"] <= created_to)
            and (not statuses or s["status"] in statuses)
            and (prefix is None or s["id"].startswith(prefix))
        ]
        return sorted(chosen, key=lambda s: (s["created"], s["id"]))

    def purge(self, instance_id: str) -> int:
        """The client's ``purge_instance_history``: the instance's rows and large-message blobs
        are deleted, whatever its state (AzureTableTrackingStore.PurgeInstanceHistoryAsync does not
        look at it; callers purge finished instances). How many instances were deleted: 0 or 1."""
        if self.status(instance_id) is None:
            return 0
        self.store.purge_history(instance_id)
        self.instances.pop(instance_id)
        return 1

    def status(self, instance_id: str) -> dict | None:
        with self.instances.lock:
            inst = self.instances.get(instance_id)
            if inst is not None:
                return inst.state()
        return self.store.read_state(instance_id)

    def wait_for(
        self, instance_id: str, timeout: float | None = None, progress: Callable[[dict], None] | None = None
    ) -> dict:
        """Block until the instance is finished (on whichever host runs it); returns its state."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.instances.lock:
            while True:
                state = self.status(instance_id)
                if state is not None and state["status"] in TERMINAL:
                    return state
                if progress and state is not None:
                    progress(state)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"instance {instance_id} not finished after {timeout} s")
                self.instances.changed.wait(timeout=0.5 if remaining is None else min(0.5, remaining))
