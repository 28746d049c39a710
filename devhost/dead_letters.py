"""Dead-lettered BlobCreated events, delivered again (``python -m devhost replay-dead-letters``).

Event Grid gives up on an event after the subscription's retry policy (30 attempts or 24 hours,
``infra/modules/event-subscription.bicep``), or at once on an answer retries cannot mend (400,
401, 403, 413 from a webhook), and then writes it to the dead-letter container instead of
dropping it. Each dead-letter blob is named ``<SUBSCRIPTION NAME IN UPPER CASE>/<year>/<month>/
<day>/<hour>/<guid>.json`` (UTC, not zero-padded) and holds a JSON array of events in the
subscription's schema (EventGridSchema here), each with the dead-letter fields added
(``deadLetterReason``, ``deliveryAttempts``, ``lastDeliveryOutcome``, ...). Source: Microsoft
Learn, Event Grid, "Set dead-letter location and retry policy" and "Message delivery and retry".

A replay delivers each event to the blob trigger as Event Grid would have, and the starter
decides as for any delivery: the upload's current version becomes a job, or is a duplicate of the
job it already has, or is ignored (a sidecar, a zero-byte create). So a replay cannot start a
second job for an upload version, however often it runs or whoever else delivers the same
event. A dead-letter blob whose events were all delivered gets a create-only marker
``replayed/<its name>`` that holds the decisions; later replays skip it, and nothing is deleted.
A delivery that fails (the upload was deleted since, storage refused) is reported as ``failed``
and its blob gets no marker, so the next replay tries it again.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import unquote

from azure.storage.blob import ContainerClient

from tilecommit import gates

logger = logging.getLogger(__name__)

#: Where a replayed dead-letter blob's marker goes (the marker's name is this + the blob's name).
REPLAYED_PREFIX = "replayed/"
BLOB_CREATED = "Microsoft.Storage.BlobCreated"


@dataclass
class ReplayReport:
    """What a replay did: one decision per event delivered, and what it could not deliver."""

    decisions: list[dict] = field(default_factory=list)
    #: Events not delivered, each with its dead-letter blob and the reason.
    skipped: list[dict] = field(default_factory=list)
    #: Dead-letter blobs already replayed (they have a marker) and left alone.
    already_replayed: int = 0
    blobs_replayed: int = 0

    def counts(self) -> dict[str, int]:
        return dict(Counter(d["action"] for d in self.decisions))

    def to_dict(self) -> dict:
        return {
            "counts": self.counts(),
            "decisions": self.decisions,
            "skipped": self.skipped,
            "blobs_replayed": self.blobs_replayed,
            "already_replayed": self.already_replayed,
        }


def upload_name(event: dict, input_container: str) -> tuple[str | None, str]:
    """The blob name a BlobCreated event of ``input_container`` is about, or None and why not."""
    if event.get("eventType") != BLOB_CREATED:
        return None, f"event type {event.get('eventType')!r} is not {BLOB_CREATED}"
    prefix = f"/blobServices/default/containers/{input_container}/blobs/"
    subject = event.get("subject", "")
    if not subject.startswith(prefix):
        return None, f"subject {subject!r} is not a blob of the input container {input_container!r}"
    # Event Grid's subject carries the name as stored; percent signs in it are the URL's encoding.
    return unquote(subject[len(prefix) :]), ""


def dead_letter_blobs(container: ContainerClient) -> Iterator[tuple[str, bool]]:
    """Every dead-letter blob's name, and whether it was replayed already (has a marker)."""
    names = [b.name for b in container.list_blobs()]
    replayed = {n[len(REPLAYED_PREFIX) :] for n in names if n.startswith(REPLAYED_PREFIX)}
    for name in sorted(n for n in names if not n.startswith(REPLAYED_PREFIX)):
        yield name, name in replayed


def replay(container: ContainerClient, input_container: str, deliver: Callable[[str], dict]) -> ReplayReport:
    """Deliver every event of every dead-letter blob not replayed yet; ``deliver(blob name)`` is one
    BlobCreated delivery to the blob trigger and returns the starter's decision."""
    report = ReplayReport()
    for name, replayed in dead_letter_blobs(container):
        if replayed:
            report.already_replayed += 1
            continue
        try:
            events = json.loads(container.download_blob(name).readall())
        except ValueError as exc:
            report.skipped.append({"dead_letter_blob": name, "reason": f"not a JSON array of events: {exc}"})
            continue
        if isinstance(events, dict):
            events = [events]
        decided = []
        for event in events:
            blob_name, why_not = upload_name(event, input_container)
            if blob_name is None:
                report.skipped.append({"dead_letter_blob": name, "event_id": event.get("id"), "reason": why_not})
                continue
            try:
                decision = deliver(blob_name)
            except Exception as exc:  # noqa: BLE001 - e.g. the upload is gone: reported, tried again next time
                decision = {
                    "action": "failed",
                    "blob": blob_name,
                    "job_id": None,
                    "reason": f"{type(exc).__name__}: {exc}",
                }
            decision.update(event_id=event.get("id"), dead_letter_reason=event.get("deadLetterReason"))
            logger.info("dead-lettered event %s for %r: %s", event.get("id"), blob_name, decision.get("action"))
            decided.append(decision)
        report.decisions += decided
        if any(d["action"] == "failed" for d in decided):
            continue  # no marker: the next replay delivers this blob's events again
        marker = json.dumps({"dead_letter_blob": name, "decisions": decided}, indent=1).encode()
        gates.commit_blob(container, REPLAYED_PREFIX + name, marker, content_type="application/json")
        report.blobs_replayed += 1
    return report
