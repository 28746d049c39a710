"""Plays Event Grid for the blob trigger: notices new blobs and delivers BlobCreated events.

Deliveries are at least once, like Event Grid's: an event is acknowledged (in a table of the
task hub) only after the trigger ran without error, so a host killed before that delivers it
again when it starts. ``deliveries=N`` sends each event N times at once, to test dedupe.

Several hosts on one task hub share the events as Event Grid spreads them over a function app's
instances: each host delivers the events whose key falls in a partition it owns
(``delivers(key)``), so an upload is normally delivered once, by one host, and by another one if
that host stops. The acknowledgement keeps the starter's decision (``decision(blob name)``), so
any command can tell an upload the starter ignored from one not yet delivered.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.data.tables import TableClient
from azure.storage.blob import ContainerClient

logger = logging.getLogger(__name__)


class BlobEventWatcher:
    """Polls ``container``; ``deliver(blob name)`` is one BlobCreated delivery to the triggers."""

    def __init__(
        self,
        container: ContainerClient,
        acks: TableClient,
        deliver: Callable[[str], object],
        *,
        deliveries: int = 1,
        interval: float = 0.5,
        poison_threshold: int = 5,
        delivers: Callable[[str], bool] = lambda key: True,
        decision: Callable[[str], dict] = lambda blob_name: {},
    ):
        self.delivers = delivers
        self.decision = decision
        self.deliver_event = deliver
        self.deliveries = deliveries
        self.interval = interval
        self.poison_threshold = poison_threshold
        self.acks = acks
        self.container = container
        self.failures: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="devhost-watcher", daemon=True)
        self._pool = ThreadPoolExecutor(max(4, deliveries), thread_name_prefix="event")
        self._acked: set[str] = set()

    @staticmethod
    def event_key(name: str, etag: str) -> str:
        return hashlib.sha256(f"{name}\n{etag}".encode()).hexdigest()

    def start(self) -> None:
        try:
            self.acks.create_table()
        except ResourceExistsError:
            pass
        self._acked = {row["RowKey"] for row in self.acks.query_entities("PartitionKey eq 'ack'", select=["RowKey"])}
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._pool.shutdown(wait=True)

    def poll_once(self) -> int:
        """Deliver every blob not yet acknowledged; returns how many events were delivered."""
        delivered = 0
        for blob in self.container.list_blobs():
            key = self.event_key(blob.name, blob.etag)
            if key in self._acked or not self.delivers(key):
                continue
            if self.failures.get(key, 0) >= self.poison_threshold:
                continue
            self.deliver(blob.name, key)
            delivered += 1
        return delivered

    def deliver(self, blob_name: str, key: str) -> None:
        futures = [self._pool.submit(self.deliver_event, blob_name) for _ in range(self.deliveries)]
        errors = []
        for future in futures:
            try:
                future.result()
            except Exception as exc:  # the trigger failed: Event Grid would deliver again
                errors.append(exc)
        if errors:
            count = self.failures[key] = self.failures.get(key, 0) + 1
            level = logging.ERROR if count >= self.poison_threshold else logging.WARNING
            logger.log(level, "BlobCreated %r failed (%d/%d): %s", blob_name, count, self.poison_threshold, errors[0])
            return
        self.acks.upsert_entity({"PartitionKey": "ack", "RowKey": key, "blob": blob_name, **self.decision(blob_name)})
        self._acked.add(key)

    def acknowledgement(self, blob_name: str, etag: str) -> dict | None:
        """The acknowledged delivery of this version of the blob (with the starter's decision), if any."""
        try:
            return dict(self.acks.get_entity("ack", self.event_key(blob_name, etag)))
        except ResourceNotFoundError:
            return None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:
                logger.exception("watcher poll failed")
            self._stop.wait(self.interval)
