"""Instance state and history kept in Azure Storage, like the Durable Azure Storage provider,
under names of the local host's own: the real provider's ``{hub}History``, ``{hub}Instances``,
``{hub}-largemessages``, ``{hub}-leases``, ``{hub}-control-NN`` and ``{hub}-workitems``
(Azure/durabletask, src/DurableTask.AzureStorage) are never touched, so this host and
``func start`` on the same storage and hub cannot read each other's state.

One table per task hub; one partition per instance:
- RowKey ``state``: name, status, input, output, custom status, parent link, counters;
- RowKey ``ep-000001`` ...: one row per episode: the history events it appended and what it
  scheduled. An episode and the new state are written in one entity-group transaction, so a
  killed host never leaves half an episode behind. Values too large for a table property go
  to a blob (the provider's "large messages"), and the row keeps the blob's name.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.data.tables import TableServiceClient, TableTransactionError, UpdateMode
from azure.storage.blob import BlobServiceClient
from azure.storage.queue import QueueServiceClient

from .queues import TaskHubQueues

#: The provider's default ``partitionCount`` (AzureStorageOrchestrationServiceSettings).
DEFAULT_PARTITION_COUNT = 4

#: Table string properties hold 32K UTF-16 characters; stay well below.
MAX_INLINE_CHARS = 30_000


#: Every table, container and queue name of the local host starts with this.
LOCAL_PREFIX = "DevHost"


def history_table_name(hub: str) -> str:
    return f"{LOCAL_PREFIX}{hub}History"


def events_table_name(hub: str) -> str:
    """Acknowledged BlobCreated events (the watcher's)."""
    return f"{LOCAL_PREFIX}{hub}Events"


def partitions_table_name(hub: str) -> str:
    """Which host owns which partition (the provider's ``{hub}Partitions``)."""
    return f"{LOCAL_PREFIX}{hub}Partitions"


def payload_container_name(hub: str) -> str:
    return f"{LOCAL_PREFIX.lower()}-{hub.lower()}-payloads"


class EpisodeAlreadyCommitted(Exception):
    """The episode's row exists: an earlier attempt was committed although its answer was lost."""


@dataclass
class Episode:
    number: int
    events: list[dict]
    scheduled: dict[str, dict]
    #: Leaf actions the shim invoked for the first time in this episode.
    actions: list[dict]
    #: Leaf positions whose task finished in this episode.
    finished: list[int] = field(default_factory=list)
    execution_id: str | None = None


class HistoryStore:
    """The task hub's storage: history and instance rows, payload blobs, the queues
    (:mod:`devhost.durable.queues`) and the partition table (:mod:`devhost.durable.partitions`)."""

    def __init__(
        self,
        blobs: BlobServiceClient,
        tables: TableServiceClient,
        hub: str,
        queues: QueueServiceClient,
        partitions: int = DEFAULT_PARTITION_COUNT,
    ):
        self.hub = hub
        self.table = tables.get_table_client(history_table_name(hub))
        self.large = blobs.get_container_client(payload_container_name(hub))
        self.large_messages = 0
        self.queues = TaskHubQueues(queues, self.large, hub, partitions)
        self.partition_table = tables.get_table_client(partitions_table_name(hub))

    def ensure(self) -> None:
        try:
            self.table.create_table()
        except ResourceExistsError:
            pass
        try:
            self.large.create_container()
        except ResourceExistsError:
            pass

    # ------------------------------------------------------------------ values

    def _pack(self, instance_id: str, key: str, value: Any, version: str) -> dict:
        """``{key: json}``, or ``{key_blob: name}`` with the JSON in a blob of its own.

        Blob names carry the episode number, so a blob written just before a crash is never
        one the committed rows point at.
        """
        text = json.dumps(value)
        if len(text) <= MAX_INLINE_CHARS:
            return {key: text}
        name = f"{instance_id}/{version}.json"
        self.large.upload_blob(name, text.encode("utf-8"), overwrite=True)
        self.large_messages += 1
        return {f"{key}_blob": name}

    def _unpack(self, entity: dict, key: str) -> Any:
        if f"{key}_blob" in entity:
            return json.loads(self.large.download_blob(entity[f"{key}_blob"]).readall())
        text = entity.get(key)
        return None if text is None else json.loads(text)

    # ------------------------------------------------------------------ instances

    def read_state(self, instance_id: str) -> dict | None:
        return self.read_state_and_etag(instance_id)[0]

    def read_state_and_etag(self, instance_id: str) -> tuple[dict | None, str | None]:
        try:
            entity = self.table.get_entity(instance_id, "state")
        except ResourceNotFoundError:
            return None, None
        return self._unpack(entity, "state"), entity.metadata["etag"]

    def write_new_state(self, instance_id: str, state: dict, etag: str | None) -> bool:
        """The client's instance row for a new execution, as AzureTableTrackingStore.SetNewExecutionAsync
        writes it: insert for a new id, replace-if-unchanged for a finished one; a conflict (a
        concurrent starter, or the host already further) is ignored. True if written."""
        entity = {"PartitionKey": instance_id, "RowKey": "state", "status": state["status"]}
        entity.update(self._pack(instance_id, "state", state, f"state-{state['execution_id']}"))
        try:
            if etag is None:
                self.table.create_entity(entity)
            else:
                self.table.update_entity(
                    entity, mode=UpdateMode.REPLACE, etag=etag, match_condition=MatchConditions.IfNotModified
                )
        except HttpResponseError as exc:
            if exc.status_code in (404, 409, 412):  # 404: the host already cleared the earlier execution
                return False
            raise
        return True

    def commit_episode(self, instance_id: str, episode: Episode, state: dict) -> None:
        """Append one episode and the new state atomically."""
        suffix = f"ep-{episode.number:06d}"
        row = {"PartitionKey": instance_id, "RowKey": suffix}
        row.update(
            self._pack(
                instance_id,
                "episode",
                {
                    "events": episode.events,
                    "scheduled": episode.scheduled,
                    "actions": episode.actions,
                    "finished": episode.finished,
                    "execution_id": episode.execution_id,
                },
                suffix,
            )
        )
        state_row = {"PartitionKey": instance_id, "RowKey": "state", "status": state["status"]}
        state_row.update(self._pack(instance_id, "state", state, f"state-{episode.number:06d}"))
        try:
            self.table.submit_transaction([("create", row), ("upsert", state_row, {"mode": UpdateMode.REPLACE})])
        except TableTransactionError as exc:
            if exc.status_code == 409:  # the batch rolled back: the row was there already
                raise EpisodeAlreadyCommitted(f"{instance_id} episode {episode.number}") from exc
            raise

    def read_episode(self, instance_id: str, number: int) -> Episode:
        row = self.table.get_entity(instance_id, f"ep-{number:06d}")
        return self._episode(row)

    @classmethod
    def _episode_from(cls, number: int, data: dict) -> Episode:
        return Episode(
            number,
            data["events"],
            data["scheduled"],
            data["actions"],
            data.get("finished", []),
            data.get("execution_id"),
        )

    def _episode(self, row: dict) -> Episode:
        return self._episode_from(int(row["RowKey"][3:]), self._unpack(row, "episode"))

    def episodes(self, instance_id: str) -> Iterator[Episode]:
        rows = self.table.query_entities(
            "PartitionKey eq @id and RowKey ge 'ep-' and RowKey lt 'ep.'", parameters={"id": instance_id}
        )
        for row in sorted(rows, key=lambda r: r["RowKey"]):
            yield self._episode(row)

    def purge_history(self, instance_id: str) -> None:
        """Delete an instance: its rows and its large messages."""
        self._delete_rows(instance_id, self._row_keys(instance_id))
        for blob in self.large.list_blobs(name_starts_with=f"{instance_id}/"):
            self.large.delete_blob(blob.name)

    def begin_execution(self, instance_id: str, state: dict) -> None:
        """A finished instance started again: the new execution's row replaces the earlier one's,
        then the earlier execution's episodes and large messages go. The row is never absent, as
        DTFx never deletes an Instances row: it merges the new execution over it
        (AzureTableTrackingStore.UpdateStateAsync, InsertOrMergeEntityAsync) and overwrites the
        old history as the new one grows (AzureStorageOrchestrationService.IsExecutableInstanceAsync
        says so), so a status read meanwhile finds one execution or the other."""
        execution = state["execution_id"]
        row = {"PartitionKey": instance_id, "RowKey": "state", "status": state["status"]}
        row.update(self._pack(instance_id, "state", state, f"state-{execution}"))
        self.table.upsert_entity(row, mode=UpdateMode.REPLACE)
        self._delete_rows(instance_id, [key for key in self._row_keys(instance_id) if key != "state"])
        for blob in self.large.list_blobs(name_starts_with=f"{instance_id}/"):
            if execution not in blob.name:
                self.large.delete_blob(blob.name)

    def _row_keys(self, instance_id: str) -> list[str]:
        rows = self.table.query_entities("PartitionKey eq @id", parameters={"id": instance_id}, select=["RowKey"])
        return [row["RowKey"] for row in rows]

    def _delete_rows(self, instance_id: str, keys: list[str]) -> None:
        for start in range(0, len(keys), 100):  # a transaction holds at most 100 operations
            self.table.submit_transaction(
                [("delete", {"PartitionKey": instance_id, "RowKey": key}) for key in keys[start : start + 100]]
            )

    def instances(self, status: str | None = None) -> list[dict]:
        query = "RowKey eq 'state'" + (" and status eq @status" if status else "")
        rows = self.table.query_entities(query, parameters={"status": status} if status else None)
        return [self._unpack(row, "state") for row in rows]
