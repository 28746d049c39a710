"""Counters of the write gates, on the OpenTelemetry API.

The app decides where they go (Azure Monitor in production); without an SDK configured they
are no-ops. Attributes are low-cardinality (which gate, which status); job ids go to the logs.
"""

from __future__ import annotations

from opentelemetry import metrics

_meter = metrics.get_meter("tilecommit")

#: Every conditional write the storage engine refused: the mechanism succeeding.
precondition_failed = _meter.create_counter(
    "ConditionalWritePreconditionFailed",
    unit="1",
    description="Conditional writes refused by storage (409 exists / 412 condition not met)",
)

#: A refused create whose stored object has other bytes than ours: encoding is not deterministic.
content_mismatch = _meter.create_counter(
    "ConditionalWriteContentMismatch",
    unit="1",
    description="Create-only writes refused where the stored content differs from ours",
)

#: A transport fault left a write's outcome unknown and stored evidence resolved it.
unknown_outcome_resolved = _meter.create_counter(
    "ConditionalWriteUnknownOutcomeResolved",
    unit="1",
    description="Writes whose response was lost, resolved from the stored sha256",
)
