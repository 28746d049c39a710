"""The task hub's queues in Azure Storage, as the Durable Azure Storage provider keeps them: one
control queue per partition (an instance's starts, results and timers) and one work-item queue
(activities, shared by every host).

Names are the local host's own (``devhost-{hub}-control-NN``, ``devhost-{hub}-workitems``), never
the real provider's ``{hub}-control-NN`` / ``{hub}-workitems``. A message is JSON; one larger
than :data:`MAX_MESSAGE_CHARS` goes to a blob of the hub's payload container and the message
keeps its name, as the provider's MessageManager does above 45 KB
(``MaxStorageQueuePayloadSizeInBytes``). A timer is a control message that stays invisible until
it is due (the provider sends timer messages with an initial visibility delay too); the service
allows at most 7 days, so a longer timer is sent again when it shows up early. Messages never
expire (time to live -1): the default of 7 days would drop a message nobody took in time.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.storage.blob import ContainerClient
from azure.storage.queue import QueueServiceClient

from tilecommit.storage import environment_options, pooled_session

#: DTFx's MessageManager sends payloads above 45 KB through blobs (a queue message holds 64 KB).
MAX_MESSAGE_CHARS = 45 * 1024
#: The longest visibility delay the queue service accepts is 7 days; stay below it.
MAX_DELAY_S = 6 * 24 * 3600.0


def queue_service(connection: Any) -> QueueServiceClient:
    """A queue client for the app's storage (:class:`tilecommit.storage.StorageConnection`), with
    the app's pool of connections: every activity slot, dispatcher and reader may send at once."""
    options = {**environment_options(connection.queue_endpoint), "session": pooled_session()}
    if connection.connection_string:
        return QueueServiceClient.from_connection_string(connection.connection_string, **options)
    if not connection.queue_endpoint:
        raise ValueError("the storage setting names no queue endpoint; the local host keeps its task hub queues there")
    return QueueServiceClient(connection.queue_endpoint, credential=connection.credential, **options)


def control_queue_name(hub: str, partition: int) -> str:
    return f"devhost-{hub.lower()}-control-{partition:02d}"


def work_item_queue_name(hub: str) -> str:
    return f"devhost-{hub.lower()}-workitems"


@dataclass
class Received:
    """One message taken from a queue: invisible to others until ``visible_for`` runs out."""

    queue: str
    id: str
    #: Optional in the SDK's QueueMessage, as the queue client's calls that take it accept.
    pop_receipt: str | None
    body: dict
    dequeue_count: int
    #: The blob holding the body when it was too large for the message (deleted with it).
    payload_blob: str | None = None
    #: Set once the message is deleted: a renewal after that has nothing left to keep.
    deleted: bool = False
    #: Serialises the delete and the renewals: a renewal changes the pop receipt, and a delete
    #: sent with the old receipt meanwhile is refused, so the message would show up again.
    guard: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)


class TaskHubQueues:
    def __init__(self, service: QueueServiceClient, payloads: ContainerClient, hub: str, partitions: int):
        self.hub = hub
        self.partitions = partitions
        self.payloads = payloads
        self._control = [service.get_queue_client(control_queue_name(hub, p)) for p in range(partitions)]
        self._work = service.get_queue_client(work_item_queue_name(hub))
        self._by_name = {client.queue_name: client for client in [*self._control, self._work]}
        self.large_messages = 0

    def ensure(self) -> None:
        for client in self._by_name.values():
            try:
                client.create_queue()
            except ResourceExistsError:
                pass

    # ------------------------------------------------------------------ sending

    def _encode(self, body: dict) -> str:
        return self._encode_with_blob(body)[0]

    def _encode_with_blob(self, body: dict) -> tuple[str, str | None]:
        """The message's text, and the blob holding the body when it was too large for one."""
        text = json.dumps(body)
        if len(text) <= MAX_MESSAGE_CHARS:
            return text, None
        name = f"messages/{uuid.uuid4().hex}.json"
        self.payloads.upload_blob(name, text.encode("utf-8"), overwrite=True)
        self.large_messages += 1
        return json.dumps({"payload_blob": name}), name

    def send_control(self, partition: int, body: dict, *, delay: float = 0.0) -> None:
        visibility = int(min(MAX_DELAY_S, max(0.0, delay)) + 0.999) if delay > 0 else None
        self._control[partition].send_message(self._encode(body), visibility_timeout=visibility, time_to_live=-1)

    def send_work_item(self, body: dict) -> None:
        self._work.send_message(self._encode(body), time_to_live=-1)

    def send_work_item_held(self, body: dict, visible_for: float) -> Received:
        """A work item sent invisible for ``visible_for`` seconds and returned as if this host had
        received it at once (its activity already runs here): renewed and deleted as any taken one,
        and visible to every host again if this one dies holding it."""
        text, blob = self._encode_with_blob(body)
        sent = self._work.send_message(text, visibility_timeout=int(visible_for), time_to_live=-1)
        return Received(self._work.queue_name, sent.id, sent.pop_receipt, body, 0, blob)

    # ------------------------------------------------------------------ receiving

    def _receive(self, client, count: int, visible_for: float) -> list[Received]:
        taken = []
        for message in client.receive_messages(
            messages_per_page=count, visibility_timeout=int(visible_for), max_messages=count
        ):
            body = json.loads(message.content)
            received = Received(
                client.queue_name,
                message.id,
                message.pop_receipt,
                body,
                message.dequeue_count,
                body.get("payload_blob"),
            )
            if received.payload_blob:
                try:
                    received.body = json.loads(self.payloads.download_blob(received.payload_blob).readall())
                except ResourceNotFoundError:
                    # Its blob goes once the message was processed and deleted; this is a copy that
                    # showed up again before the delete landed: nothing is left to do with it.
                    self.delete(received)
                    continue
            taken.append(received)
        return taken

    def receive_control(self, partition: int, count: int, visible_for: float) -> list[Received]:
        return self._receive(self._control[partition], count, visible_for)

    def receive_work_items(self, count: int, visible_for: float) -> list[Received]:
        return self._receive(self._work, count, visible_for)

    def delete(self, received: Received) -> None:
        """Delete a processed message; one already gone (or taken again by a newer receive) is fine."""
        with received.guard:
            try:
                self._by_name[received.queue].delete_message(received.id, received.pop_receipt)
            except HttpResponseError as exc:
                if exc.status_code not in (400, 404):  # 404: gone; 400 on Azurite: a stale pop receipt
                    raise
            received.deleted = True
        if received.payload_blob:
            try:
                self.payloads.delete_blob(received.payload_blob)
            except ResourceNotFoundError:
                pass

    def extend(self, received: Received, visible_for: float) -> bool:
        """Keep a message invisible for ``visible_for`` more seconds (a running activity's work item).
        False when it is no longer ours (its visibility ran out and somebody else took it); True
        for one this host has deleted meanwhile (its activity ended while the renewals ran)."""
        with received.guard:
            if received.deleted:
                return True
            try:
                updated = self._by_name[received.queue].update_message(
                    received.id, received.pop_receipt, visibility_timeout=int(visible_for)
                )
            except HttpResponseError as exc:
                if exc.status_code in (400, 404):
                    return False
                raise
            received.pop_receipt = updated.pop_receipt
            return True

    def approximate_counts(self) -> dict[str, int | None]:
        """Messages in each queue, visible or not (the scale controller's signal in Azure)."""
        return {name: client.get_queue_properties().approximate_message_count for name, client in self._by_name.items()}
