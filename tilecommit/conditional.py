"""One conditional write, written once, for every store the idea applies to.

The storage service evaluates the condition in the request that performs the write, so the
second copy is refused by the same request that would have made it:

- **create once**: the request carries "only if the key is free" (Azure Blob and S3
  ``If-None-Match: *``, Cloud Storage ``ifGenerationMatch=0``, an Azure Table insert, DynamoDB
  ``attribute_not_exists``). The service's refusal means the key is taken: ``ALREADY_PRESENT``,
  logged at INFO and counted, never raised; the stored evidence (a sha256 written in the same
  request) is compared with ours, and a difference is logged at WARNING and counted.
- **replace once** (a repair): the request carries "only if the version is the one inspected"
  (``If-Match``, ``ifGenerationMatch=<generation>``, a condition on the item). The refusal means
  something newer landed, or the object is gone: ``SUPERSEDED``, left untouched.

A request without an answer (a transport fault) has an unknown outcome. It is resolved from what
is stored, never by sending the write without its condition: nothing stored (or the old version
still there) means the same conditional request again; our evidence means ``WRITTEN``; anything
else is the refusal's outcome. Only a genuine fault raises (:class:`StorageFaultError`).

A refusal is not always another writer's doing. The storage SDKs retry a request whose answer was
lost or was a 500 (``OperationTimedOut`` may come after the write was carried out), and the retry
of a write that landed is refused by the write itself: the caller sees a 409 or a 412 for its own
write, never the unknown outcome. So each request stores a write id of its own beside what it
writes (:data:`WRITE_ID_KEY`, in the same request), and a refusal is checked against it: our id
stored means ``WRITTEN``, whichever layer retried. The write id also tells our write from another
writer's identical one, which the content's digest cannot.

What differs between stores is only how a request is sent, how its refusal and a lost answer
look, and where the evidence is read: a :class:`Backend`. The Azure ones are in
:mod:`tilecommit.gates`; S3, Cloud Storage and DynamoDB, which only the tests use, in
:mod:`testkit.providers`.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from .errors import StorageFaultError
from .observability import telemetry
from .storage_answers import storage_fault

logger = logging.getLogger(__name__)

#: Conditional requests sent while a lost answer leaves the outcome unknown and the evidence
#: says nothing was written.
UNKNOWN_OUTCOME_ATTEMPTS = 3
#: Seconds before the first resend of a request whose outcome was unknown and found not carried
#: out; doubled before each next one (1 s, then 2 s: within one storage call's budget, retries.py).
RESEND_DELAY_S = 1.0
#: Where a conditional write stores its write id: a blob's metadata key, an entity's property.
WRITE_ID_KEY = "write_id"


def new_write_id() -> str:
    """A fresh id for one conditional request (distinct, not secret)."""
    return secrets.token_hex(8)


class Outcome(StrEnum):
    """What a conditional write did. A refusal is an outcome, not an error."""

    WRITTEN = "written"
    ALREADY_PRESENT = "already-present"
    SUPERSEDED = "superseded"

    def __str__(self) -> str:  # "written", not "Outcome.WRITTEN", in logs and JSON
        return self.value


@dataclass(frozen=True)
class Stored:
    """What the store holds at the key: nothing (``present`` False), or a version (``version``:
    its ETag, generation...) and the evidence written with it (``digest``, None when there is none;
    ``write_id``, the id of the request that wrote it, None when the store keeps none)."""

    present: bool
    digest: str | None = None
    version: str | None = None
    write_id: str | None = None


ABSENT = Stored(False)


class Backend(Protocol):
    """One conditional request to one store, and how to read its answers."""

    #: What the write is to (a blob name, a table key), for logs and errors.
    key: str
    #: The write id :meth:`send` stores with what it writes (:data:`WRITE_ID_KEY`), or None when
    #: this store's writes keep none (then a digest is the only evidence).
    write_id: str | None

    def send(self) -> None:
        """Send the request, its condition in it. Raises what the store's client raises."""

    def refused(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the store refusing the condition (the key taken; for a replace,
        the version not the one named, or the object gone), and nothing else."""

    def unanswered(self, exc: BaseException) -> bool:
        """Whether ``exc`` means the request got no answer: its outcome is unknown."""

    def stored(self) -> Stored:
        """What the store holds at the key now (one read; a fault raises StorageFaultError)."""

    def status(self, exc: BaseException) -> int | None:
        """The status a refusal came with, for the counter."""

    def fault(self, exc: BaseException) -> StorageFaultError:
        """The error to raise for anything else the store answered."""


def count_refusal(gate: str, status: int | None, job_id: str, key: str, what: str) -> None:
    """Log a refused conditional write at INFO with the job id and count it (the mechanism working)."""
    logger.info(
        "conditional write refused (%s): gate=%s job_id=%s key=%s status=%s", what, gate, job_id or "-", key, status
    )
    telemetry.precondition_failed.add(1, telemetry.job_attributes(job_id, gate=gate, status=str(status)))


def count_mismatch(gate: str, job_id: str, key: str, ours: str | None, stored: str | None) -> None:
    """Log and count a refused create whose stored content is not ours."""
    logger.warning(
        "refused write holds other content: gate=%s job_id=%s key=%s ours=%s stored=%s "
        "(encoding is not deterministic, or another job wrote this key)",
        gate,
        job_id or "-",
        key,
        ours,
        stored,
    )
    telemetry.content_mismatch.add(1, telemetry.job_attributes(job_id, gate=gate))


def create_once(backend: Backend, *, digest: str | None, gate: str, job_id: str = "") -> Outcome:
    """Send ``backend``'s create-only request and classify it (the module's rules). ``digest``:
    the evidence our request writes (None: the store keeps none; then, without a write id, a
    stored object found after a lost answer cannot be told from another writer's and is
    ``ALREADY_PRESENT``)."""
    key = backend.key

    def refused(exc: BaseException) -> Outcome:
        held = _evidence(backend) if digest is not None or backend.write_id is not None else None
        if held is not None and _ours(backend, held):
            return _found_ours(gate, job_id, key, exc)
        count_refusal(gate, backend.status(exc), job_id, key, "already present")
        if held is not None and digest is not None and held.digest != digest:
            count_mismatch(gate, job_id, key, digest, held.digest)
        return Outcome.ALREADY_PRESENT

    def lost(held: Stored, exc: BaseException) -> Outcome | None:
        if not held.present:
            logger.warning(
                "create of %r had no answer (%s) and nothing is stored: sending the same conditional request again",
                key,
                exc,
            )
            return None
        if _ours(backend, held, digest):
            return _found_ours(gate, job_id, key, exc)
        telemetry.unknown_outcome_resolved.add(1, telemetry.job_attributes(job_id, gate=gate))
        count_refusal(gate, None, job_id, key, "already present, found after a lost response")
        if digest is not None and held.digest != digest:
            count_mismatch(gate, job_id, key, digest, held.digest)
        return Outcome.ALREADY_PRESENT

    return _conditional(backend, refused, lost, gate=gate, job_id=job_id, what="creating")


def replace_once(backend: Backend, *, expect_version: str, digest: str, gate: str, job_id: str = "") -> Outcome:
    """Send ``backend``'s request replacing exactly the version ``expect_version`` and classify
    it: ``WRITTEN``, or ``SUPERSEDED`` (the module's rules)."""
    key = backend.key

    def refused(exc: BaseException) -> Outcome:
        if backend.write_id is not None and _ours(backend, _evidence(backend)):
            return _found_ours(gate, job_id, key, exc)
        count_refusal(gate, backend.status(exc), job_id, key, "superseded")
        return Outcome.SUPERSEDED

    def lost(held: Stored, exc: BaseException) -> Outcome | None:
        if held.present and held.version == expect_version:
            logger.warning("replace of %r had no answer (%s); the old version is still there: trying again", key, exc)
            return None
        if _ours(backend, held, digest):
            return _found_ours(gate, job_id, key, exc)
        telemetry.unknown_outcome_resolved.add(1, telemetry.job_attributes(job_id, gate=gate))
        count_refusal(gate, None, job_id, key, "superseded, found after a lost response")
        return Outcome.SUPERSEDED

    return _conditional(backend, refused, lost, gate=gate, job_id=job_id, what="replacing")


def _evidence(backend: Backend) -> Stored:
    """What the store holds (:meth:`Backend.stored`), read again after a storage fault: the
    outcome of a write that may have landed hangs on this read, and a fault here would report a
    landed write as a fault (and its next attempt would find it done, never counting it written)."""
    for attempt in range(UNKNOWN_OUTCOME_ATTEMPTS):
        try:
            return backend.stored()
        except StorageFaultError as exc:
            if not exc.retryable or attempt == UNKNOWN_OUTCOME_ATTEMPTS - 1:
                raise
            logger.warning("reading what is stored at %r failed (%s): reading it again", backend.key, exc)
            time.sleep(RESEND_DELAY_S * 2**attempt)
    raise AssertionError("unreachable")


def _ours(backend: Backend, held: Stored, digest: str | None = None) -> bool:
    """Whether what is stored was written by ``backend``'s own request: its write id, or, for a
    store that keeps none, ``digest`` (given only after a lost answer: a refusal with no write id
    to compare is another writer's)."""
    if not held.present:
        return False
    if backend.write_id is not None:
        return held.write_id == backend.write_id
    return digest is not None and held.digest == digest


def _found_ours(gate: str, job_id: str, key: str, exc: BaseException) -> Outcome:
    """Our own write is what is stored, though the answer we got (a lost one, or a retry's
    refusal) did not say so: ``WRITTEN``, counted as an unknown outcome resolved."""
    logger.info("write of %r: the answer was %s, and what is stored is our own write: written", key, exc)
    telemetry.unknown_outcome_resolved.add(1, telemetry.job_attributes(job_id, gate=gate))
    return Outcome.WRITTEN


def _conditional(
    backend: Backend,
    refused: Callable[[BaseException], Outcome],
    lost: Callable[[Stored, BaseException], Outcome | None],
    *,
    gate: str,
    job_id: str,
    what: str,
) -> Outcome:
    """The one loop: the request; its refusal (``refused``); a lost answer resolved from what is
    stored (``lost``: an outcome, or None for the same conditional request again); a fault."""
    last: BaseException | None = None
    for attempt in range(UNKNOWN_OUTCOME_ATTEMPTS):
        if attempt:
            # Nothing was written: the store was busy or the request was lost. Give it a moment
            # before the same conditional request goes again.
            time.sleep(RESEND_DELAY_S * 2 ** (attempt - 1))
        try:
            backend.send()
            outcome = Outcome.WRITTEN
        except Exception as exc:  # noqa: BLE001 - classified here; anything unknown re-raised as a fault
            if backend.refused(exc):
                outcome = refused(exc)
            elif not backend.unanswered(exc):
                raise backend.fault(exc) from exc
            else:
                decided = lost(_evidence(backend), exc)
                if decided is None:
                    last = exc
                    continue
                outcome = decided
        telemetry.count_write(gate, outcome, job_id)
        return outcome
    raise storage_fault(
        f"{what} {backend.key!r}: {UNKNOWN_OUTCOME_ATTEMPTS} conditional requests had no answer or a busy one "
        f"and nothing changed (last: {type(last).__name__}: {last})"
    )
