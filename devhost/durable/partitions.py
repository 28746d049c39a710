"""Partitions of the task hub and the leases that give each one to one host, as the Durable Azure
Storage provider's table partition manager does (DurableTask.AzureStorage,
``Partitioning/TablePartitionManager.cs``; the default since ``UseTablePartitionManagement``
became true).

- An instance belongs to partition ``FNV-1a(instance id, UTF-8) % partition count``
  (``AzureStorageOrchestrationService.GetControlQueueAsync`` with ``Fnv1aHashHelper``): its
  starts, results and timers go to that partition's control queue, and only the partition's
  owner runs its episodes.
- One table row per partition: ``CurrentOwner``, ``NextOwner``, ``ExpiresAt``, ``IsDraining``.
  Every host reads all rows each loop and writes a row only with the ETag it read (a 412 means
  another host wrote first: read again at once). In each loop a host claims rows that are free,
  expired, or released to it; renews its own; marks a row of a host that is shutting down as
  stolen (``NextOwner`` = itself); and, if it owns fewer than its share (partitions / hosts), marks
  rows of hosts over their share. An owner whose row is marked drains it (finishes the episodes
  in hand, hands on the results it holds) and releases it (``CurrentOwner`` = none), and the next
  owner claims it.
- Timings: the provider loops every ``LeaseAcquireInterval`` (10 s; 1 s while it drains or waits
  for a release), a renewal sets ``ExpiresAt`` to now + ``LeaseInterval`` (30 s), a claim to now +
  1 minute. Here the claim is twice the lease interval, so a shortened lease (tests) keeps the
  proportion. A host that cannot renew for a lease interval stops working on the partition by
  itself, before another host may claim it.

The host learns what it gained and lost through callbacks: ``acquired(partition,
after_crash)`` (``after_crash`` when the row expired under another owner, or was this worker's
before this process started: the previous owner may have died between committing an episode and
sending its messages), then ``taken_up(partition)`` once the partition counts as owned (what was
loaded may run from then on: an episode taken before that would find the partition not its host's
and be put aside), ``drain(partition) -> bool`` (True once nothing of the partition is in
hand, so the row can be released; called again each loop until then), and ``lost(partition)``
when another host holds a row this one thought its own (its lease lapsed while storage was
unreachable): whatever it holds of the partition is dropped, since the new owner, which claimed
an expired row, sends the partition's open work again.

Presence (ours, not the provider's): each host also keeps a row of its own under the partition
key ``workers``, renewed in every loop with the same lease and deleted when it stops, so a host
knows whether it is alone on the task hub (:meth:`PartitionManager.alone`): no other host's row is
live and no partition row names another host. A host alone keeps the activities its slots cannot
take yet in memory instead of sending them through the shared work-item queue (three requests
each, for nobody else to take); ``crowded()`` is called when another host shows up, and the host
then sends what it kept to the queue. The provider needs no such row: every activity goes through
the queue there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceExistsError
from azure.data.tables import TableClient, TableEntity, UpdateMode

logger = logging.getLogger(__name__)

FNV_OFFSET_BASIS, FNV_PRIME = 2166136261, 16777619


def fnv1a(text: str) -> int:
    """FNV-1a, 32 bits, over the UTF-8 bytes (DurableTask.AzureStorage ``Fnv1aHashHelper``)."""
    value = FNV_OFFSET_BASIS
    for byte in text.encode("utf-8"):
        value = ((value ^ byte) * FNV_PRIME) & 0xFFFFFFFF
    return value


def partition_of(instance_id: str, partitions: int) -> int:
    return fnv1a(instance_id) % partitions


def partition_key(partition: int) -> str:
    return f"control-{partition:02d}"


#: The partition key of the hosts' presence rows (one per live host, RowKey = its worker id).
WORKERS_KEY = "workers"


@dataclass(frozen=True)
class LeaseTimings:
    #: The provider's LeaseInterval.
    lease_s: float = 30.0
    #: The provider's LeaseAcquireInterval (its renewals happen in the same loop).
    acquire_s: float = 10.0
    #: The loop's interval while draining or waiting for a row to be released.
    busy_s: float = 1.0


#: The provider's defaults.
PROVIDER_LEASE = LeaseTimings()


def _now() -> datetime:
    return datetime.now(UTC)


class PartitionManager:
    def __init__(
        self,
        table: TableClient,
        partitions: int,
        worker_id: str,
        *,
        acquired: Callable[[int, bool], None],
        drain: Callable[[int], bool],
        lost: Callable[[int], None],
        crowded: Callable[[], None] = lambda: None,
        taken_up: Callable[[int], None] = lambda partition: None,
        timings: LeaseTimings = PROVIDER_LEASE,
    ):
        self.table = table
        self.partitions = partitions
        self.worker_id = worker_id
        self.timings = timings
        self._acquired, self._drain, self._lost, self._crowded = acquired, drain, lost, crowded
        self._taken_up = taken_up
        #: No other host is on the task hub (known after the first loop; until then: not alone).
        self._alone = False
        #: Partitions this process works on, with the monotonic time its lease is good until.
        self._owned: dict[int, float] = {}
        self._draining: set[int] = set()
        #: Partitions claimed whose taking up failed (storage): whether it was after a crash.
        self._taking_up: dict[int, bool] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.claims = self.releases = self.steals = 0

    # ------------------------------------------------------------------ what the host asks

    def owns(self, partition: int) -> bool:
        """This host may run the partition's episodes now (owned, not draining, lease not lapsed)."""
        with self._lock:
            good_until = self._owned.get(partition)
            return good_until is not None and partition not in self._draining and time.monotonic() < good_until

    def partition_for(self, instance_id: str) -> int:
        return partition_of(instance_id, self.partitions)

    def owns_instance(self, instance_id: str) -> bool:
        """This host may run the instance's episodes now (see :meth:`owns`)."""
        return self.owns(self.partition_for(instance_id))

    def alone(self) -> bool:
        """No other host was on the task hub at the last loop (see the module's "Presence")."""
        return self._alone

    def owned(self) -> list[int]:
        with self._lock:
            return sorted(p for p, until in self._owned.items() if time.monotonic() < until)

    # ------------------------------------------------------------------ lifecycle

    def ensure(self) -> None:
        try:
            self.table.create_table()
        except ResourceExistsError:
            pass
        for partition in range(self.partitions):
            try:
                self.table.create_entity({"PartitionKey": "", "RowKey": partition_key(partition)})
            except ResourceExistsError:
                pass

    def start(self) -> None:
        self.ensure()
        self.loop_once()  # claim what is free before the host starts taking work
        self._thread = threading.Thread(target=self._run, name="devhost-partitions", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 600.0) -> None:
        """Drain and release every partition this host owns (the provider's graceful shutdown)."""
        self._stop.set()
        self._alone = False
        if self._thread is not None:
            self._thread.join(timeout=30)
        deadline = time.monotonic() + timeout
        while self.owned() and time.monotonic() < deadline:
            try:
                self.loop_once(shutting_down=True)
            except HttpResponseError as exc:
                if exc.status_code != 412:  # 412: another host wrote the row first; read it again
                    logger.warning("releasing the partitions failed; trying again", exc_info=True)
            except Exception:  # noqa: BLE001 - storage trouble: try again; the lease expires anyway
                logger.warning("releasing the partitions failed; trying again", exc_info=True)
            if self.owned():
                time.sleep(self.timings.busy_s / 4)
        try:
            self.table.delete_entity(WORKERS_KEY, self.worker_id)
        except Exception:  # noqa: BLE001 - it lapses by itself after a lease interval
            logger.warning("could not delete this host's presence row", exc_info=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            interval = self.timings.acquire_s
            try:
                if self.loop_once():
                    interval = self.timings.busy_s
            except HttpResponseError as exc:
                interval = 0.0 if exc.status_code == 412 else self.timings.busy_s
            except Exception:  # noqa: BLE001 - storage down: the loop goes on, leases lapse by themselves
                logger.warning("partition lease loop failed", exc_info=True)
                interval = self.timings.busy_s
            self._stop.wait(interval)

    # ------------------------------------------------------------------ one pass over the table

    def loop_once(self, *, shutting_down: bool = False) -> bool:
        """Read every row, write what changed; True if draining or waiting for a release."""
        entities = list(self.table.query_entities(f"PartitionKey eq '' or PartitionKey eq '{WORKERS_KEY}'"))
        rows = sorted((r for r in entities if r["PartitionKey"] == ""), key=lambda r: r["RowKey"])
        moment = _now()
        if not shutting_down:
            self._present(entities, rows, moment)
        busy = False
        others: dict[str, list[TableEntity]] = {}
        mine = 0
        for row in rows:
            partition = int(row["RowKey"].split("-")[1])
            if partition >= self.partitions:
                continue
            owner, next_owner = row.get("CurrentOwner"), row.get("NextOwner")
            if owner != self.worker_id and partition in self._owned:
                self._forget(partition)  # another host holds it now (our lease lapsed): hands off
            expired = row.get("ExpiresAt") is not None and moment >= row["ExpiresAt"]
            free = (owner is None and next_owner in (None, self.worker_id)) or expired
            if not shutting_down and free:
                after_crash = owner is not None and (owner != self.worker_id or partition not in self._owned)
                self._claim(row, moment)
                self._write(row, partition, after_crash)
                mine += 1
            elif owner == self.worker_id:
                if shutting_down or next_owner is not None:
                    busy = True
                    if self._drained(partition):
                        self._release(row)
                    else:
                        row["IsDraining"] = True
                        self._renew(row, moment)
                else:
                    self._renew(row, moment)
                    mine += 1
                # Ours in the table but not held by this process: a restart under the same name,
                # so the process before it may have died holding work.
                self._write(row, partition, partition not in self._owned)
            elif not shutting_down:
                if next_owner is None and row.get("IsDraining"):
                    row["NextOwner"] = next_owner = self.worker_id  # its owner is shutting down: take it next
                    self._write(row, partition, False)
                    self.steals += 1
                if next_owner == self.worker_id:
                    busy = True
                    mine += 1
                elif (holder := next_owner or owner) is not None:
                    others.setdefault(holder, []).append(row)
        if not shutting_down and others:
            busy = self._balance(others, mine) or busy
        return busy

    def _present(self, entities: list[TableEntity], rows: list[TableEntity], moment: datetime) -> None:
        """Renew this host's presence row and see whether any other host is live."""
        self.table.upsert_entity(
            {
                "PartitionKey": WORKERS_KEY,
                "RowKey": self.worker_id,
                "ExpiresAt": moment + timedelta(seconds=self.timings.lease_s),
            },
            mode=UpdateMode.REPLACE,
        )
        others = {
            e["RowKey"] for e in entities if e["PartitionKey"] == WORKERS_KEY and e.get("ExpiresAt", moment) > moment
        }
        for row in rows:
            if row.get("ExpiresAt") is None or moment < row["ExpiresAt"]:
                others |= {row.get("CurrentOwner"), row.get("NextOwner")}
        others -= {None, self.worker_id}
        was_alone, self._alone = self._alone, not others
        if was_alone and others:
            logger.info("another host is on the task hub (%s)", ", ".join(sorted(others)))
            self._crowded()

    def _balance(self, others: dict[str, list[TableEntity]], mine: int) -> bool:
        """Steal rows from hosts over their share until this one has its share (the provider's
        ``BalanceLeasesAsync``: share = partitions // (other hosts + 1), at most one apart)."""
        share = self.partitions // (len(others) + 1)
        if share < mine:
            return False
        stole = False
        for owned in others.values():
            want = share - mine
            excess = len(owned) - share
            if want < 0:
                break
            if excess <= 0:
                continue
            if want == 0 and excess > 1:
                want = 1
            for row in owned[: min(want, excess)]:
                if row.get("NextOwner") is None:
                    row["NextOwner"] = self.worker_id
                    self._write(row, int(row["RowKey"].split("-")[1]), False)
                    self.steals += 1
                    mine += 1
                    stole = True
        return stole

    # ------------------------------------------------------------------ row changes

    def _claim(self, row: TableEntity, moment: datetime) -> None:
        row.update(
            CurrentOwner=self.worker_id,
            NextOwner=None,
            OwnedSince=moment,
            LastRenewal=moment,
            ExpiresAt=moment + timedelta(seconds=2 * self.timings.lease_s),
            IsDraining=False,
        )

    def _renew(self, row: TableEntity, moment: datetime) -> None:
        row.update(LastRenewal=moment, ExpiresAt=moment + timedelta(seconds=self.timings.lease_s))

    def _release(self, row: TableEntity) -> None:
        row.update(CurrentOwner=None, IsDraining=False)

    def _forget(self, partition: int) -> None:
        with self._lock:
            self._owned.pop(partition, None)
            self._draining.discard(partition)
        logger.warning("lost partition %d to another host (its lease lapsed here)", partition)
        self._lost(partition)

    def _drained(self, partition: int) -> bool:
        with self._lock:
            self._draining.add(partition)
        return partition not in self._owned or self._drain(partition)

    def _write(self, row: TableEntity, partition: int, after_crash: bool) -> None:
        etag = row.metadata["etag"]
        entity = {k: v for k, v in row.items() if v is not None}
        self.table.update_entity(
            entity, mode=UpdateMode.REPLACE, etag=etag, match_condition=MatchConditions.IfNotModified
        )
        owner = row.get("CurrentOwner")
        good_until = time.monotonic() + (row["ExpiresAt"] - _now()).total_seconds() if row.get("ExpiresAt") else 0.0
        newly_owned = owner == self.worker_id and partition not in self._owned
        if newly_owned:
            # The host takes the partition up (loads its instances) before it counts as owned, so
            # nothing of the partition is read or run here until that is done.
            after_crash = self._taking_up.pop(partition, False) or after_crash
            logger.info(
                "acquired partition %d%s", partition, " after its owner stopped answering" if after_crash else ""
            )
            try:
                self._acquired(partition, after_crash)
            except Exception:
                self._taking_up[partition] = after_crash  # taken up at the next renewal
                raise
            self.claims += 1
        with self._lock:
            if owner == self.worker_id:
                self._owned[partition] = good_until
                if not row.get("IsDraining") and row.get("NextOwner") is None:
                    self._draining.discard(partition)
            elif partition in self._owned:
                del self._owned[partition]
                self._draining.discard(partition)
                self.releases += 1
                logger.info("released partition %d", partition)
        if newly_owned:
            self._taken_up(partition)
