"""What the app records, on the OpenTelemetry API: counters, histograms, spans and structured logs.

Where it goes is decided once per process (:mod:`tilecommit.observability.monitoring`): Application Insights in
Azure, an OTLP or console exporter when the standard ``OTEL_*_EXPORTER`` variables ask for one, an
in-memory reader in tests; with nothing configured every call here is a no-op.

Every data point, span and log record carries the job id (``job_id``), so an operator can answer
"for which jobs?" from any of them. Job ids are one per upload version: a job's points become a
few rows a minute in ``customMetrics``, not a cardinality problem at this app's rates.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging

from opentelemetry import metrics, trace

_meter = metrics.get_meter("tilecommit")
tracer = trace.get_tracer("tilecommit")
logger = logging.getLogger("tilecommit.jobs")

#: ``job_id`` of records that belong to no job (an upload the starter ignored).
NO_JOB = "none"
#: The job whose activity runs in this context (set by :func:`tilecommit.observability.observed.observed_activity`).
current_job: contextvars.ContextVar[str | None] = contextvars.ContextVar("tilecommit_job_id", default=None)


class JobIdFilter(logging.Filter):
    """Gives a log record the ``job_id`` of the activity that logged it, unless it names one itself.

    Installed on the exporting handlers, so a record logged anywhere inside an activity (the gates,
    the raster code) reaches Application Insights with the job id among its custom dimensions.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "job_id", None) is None:
            job_id = current_job.get()
            if job_id is not None:
                record.job_id = job_id
        return True


#: Every conditional write the storage engine refused: the mechanism succeeding.
precondition_failed = _meter.create_counter(
    "ConditionalWritePreconditionFailed",
    unit="1",
    description="Conditional writes refused by storage (409 exists / 412 condition not met), by gate",
)

#: Every gated write, by gate and outcome (written / already-present / superseded).
conditional_writes = _meter.create_counter(
    "ConditionalWrites",
    unit="1",
    description="Gated writes by gate and outcome",
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
    description="Writes whose answer was lost or hidden by a retry, resolved from the stored write id or sha256",
)

#: Tile activity executions by what they did with their window. ``already-present`` includes
#: ``skipped`` (the manifest already named the window, nothing was read or encoded).
tiles_written = _meter.create_counter("TilesWritten", unit="1", description="Windows this execution wrote")
tiles_already_present = _meter.create_counter(
    "TilesAlreadyPresent", unit="1", description="Windows found already written (includes skipped)"
)
tiles_skipped = _meter.create_counter(
    "TilesSkipped", unit="1", description="Windows skipped before encoding: the manifest named them"
)
tile_bytes = _meter.create_counter("TileBytes", unit="By", description="Bytes of tiles this execution wrote")

verify_differences = _meter.create_counter(
    "VerifyDifferences", unit="1", description="Differences a scrub found between a tile and its source window"
)
activity_duration = _meter.create_histogram(
    "ActivityDuration", unit="s", description="Wall time of one activity execution"
)
start_decisions = _meter.create_counter(
    "StartDecisions", unit="1", description="The starter's decisions: started / duplicate / ignored"
)
#: The counter's name in Application Insights' customMetrics (the failed-jobs alert reads it).
JOBS_FINISHED = "JobsFinished"
jobs_finished = _meter.create_counter(
    JOBS_FINISHED, unit="1", description="Jobs that completed or failed, failures by error type"
)
job_duration = _meter.create_histogram(
    "JobDuration", unit="s", description="Orchestration time from the job's start to its end"
)


def job_attributes(job_id: str | None, **more: str) -> dict[str, str]:
    return {"job_id": job_id or NO_JOB, **more}


def count_write(gate: str, outcome: str, job_id: str) -> None:
    conditional_writes.add(1, job_attributes(job_id, gate=gate, outcome=str(outcome)))


def count_difference(job_id: str, kind: str) -> None:
    """Count one difference a scrub found (``kind``: missing-row, missing-tile, tile-changed, other-pixels)."""
    verify_differences.add(1, job_attributes(job_id, kind=kind))


def count_tile(job_id: str, result: dict) -> None:
    """Count one tile execution from its result (``outcome``, ``skipped``, ``nbytes``)."""
    attributes = job_attributes(job_id)
    if result.get("error"):
        return
    if result["outcome"] == "written":
        tiles_written.add(1, attributes)
        tile_bytes.add(int(result["nbytes"]), attributes)
        return
    tiles_already_present.add(1, attributes)
    if result.get("skipped"):
        tiles_skipped.add(1, attributes)


def record_start_decision(decision: dict) -> None:
    start_decisions.add(
        1,
        job_attributes(decision.get("job_id"), action=decision["action"], reason=decision.get("reason") or ""),
    )


def record_job_finished(job_id: str, *, status: str, seconds: float, error_type: str = "", error: str = "") -> None:
    """Count, time and log a job's end (``status`` completed / failed) with its error type."""
    attributes = job_attributes(job_id, status=status, error_type=error_type)
    jobs_finished.add(1, attributes)
    job_duration.record(seconds, attributes)
    level = logging.INFO if status == "completed" else logging.ERROR
    logger.log(
        level,
        "job %s %s after %.1f s%s",
        job_id,
        status,
        seconds,
        f": {error_type}: {error}" if error_type else "",
        extra={"job_id": job_id, "job_status": status, "error_type": error_type, "job_seconds": round(seconds, 3)},
    )


def job_span_context(job_id: str) -> trace.SpanContext:
    """The job's place in a trace: a trace id and a parent span id that follow from the job id.

    A job runs as many invocations on many instances over minutes, so no span of ours lasts as
    long as it; every activity span is the child of this (remote, never exported) context
    instead, and all of one job's spans share a trace id: Application Insights' ``operation_Id``.
    """
    digest = hashlib.sha256(f"tilecommit-job:{job_id}".encode()).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    return trace.SpanContext(
        trace_id=trace_id,
        span_id=span_id,
        is_remote=True,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
    )
