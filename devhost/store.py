"""Instance state and history kept in Azure Storage, like the Durable Azure Storage provider.

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
from dataclasses import dataclass
from typing import Any

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.data.tables import TableServiceClient, UpdateMode
from azure.storage.blob import BlobServiceClient

#: Table string properties hold 32K UTF-16 characters; stay well below.
MAX_INLINE_CHARS = 30_000


def _hub_table_name(hub: str) -> str:
    return f"{hub}History"


def _hub_container_name(hub: str) -> str:
    return f"{hub.lower()}-largemessages"


@dataclass
class Episode:
    number: int
    events: list[dict]
    scheduled: dict[str, dict]
    actions: list[dict]


class HistoryStore:
    def __init__(self, blobs: BlobServiceClient, tables: TableServiceClient, hub: str):
        self.hub = hub
        self.table = tables.get_table_client(_hub_table_name(hub))
        self.large = blobs.get_container_client(_hub_container_name(hub))
        self.large_messages = 0

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
        try:
            entity = self.table.get_entity(instance_id, "state")
        except ResourceNotFoundError:
            return None
        return self._unpack(entity, "state")

    def write_state(self, instance_id: str, state: dict) -> None:
        entity = {"PartitionKey": instance_id, "RowKey": "state", "status": state["status"]}
        entity.update(self._pack(instance_id, "state", state, f"state-{state.get('episodes', 0):06d}"))
        self.table.upsert_entity(entity, mode=UpdateMode.REPLACE)

    def commit_episode(self, instance_id: str, episode: Episode, state: dict) -> None:
        """Append one episode and the new state atomically."""
        suffix = f"ep-{episode.number:06d}"
        row = {"PartitionKey": instance_id, "RowKey": suffix}
        row.update(
            self._pack(
                instance_id,
                "episode",
                {"events": episode.events, "scheduled": episode.scheduled, "actions": episode.actions},
                suffix,
            )
        )
        state_row = {"PartitionKey": instance_id, "RowKey": "state", "status": state["status"]}
        state_row.update(self._pack(instance_id, "state", state, f"state-{episode.number:06d}"))
        self.table.submit_transaction([("create", row), ("upsert", state_row, {"mode": UpdateMode.REPLACE})])

    def episodes(self, instance_id: str) -> Iterator[Episode]:
        rows = self.table.query_entities(
            "PartitionKey eq @id and RowKey ge 'ep-' and RowKey lt 'ep.'", parameters={"id": instance_id}
        )
        for row in sorted(rows, key=lambda r: r["RowKey"]):
            data = self._unpack(row, "episode")
            yield Episode(int(row["RowKey"][3:]), data["events"], data["scheduled"], data["actions"])

    def purge(self, instance_id: str) -> None:
        """Delete an instance's history (a finished instance started again is overwritten)."""
        rows = list(self.table.query_entities("PartitionKey eq @id", parameters={"id": instance_id}, select=["RowKey"]))
        for start in range(0, len(rows), 100):
            batch = [
                ("delete", {"PartitionKey": instance_id, "RowKey": r["RowKey"]}) for r in rows[start : start + 100]
            ]
            self.table.submit_transaction(batch)
        for blob in self.large.list_blobs(name_starts_with=f"{instance_id}/"):
            self.large.delete_blob(blob.name)

    def instances(self, status: str | None = None) -> list[dict]:
        query = "RowKey eq 'state'" + (" and status eq @status" if status else "")
        rows = self.table.query_entities(query, parameters={"status": status} if status else None)
        return [self._unpack(row, "state") for row in rows]
