"""How an orchestration fails, named for what happened.

An activity raises only retryable faults, which the retry policy repeats; anything else comes
back as an error value (:func:`tilecommit.errors.error_value`) whose ``kind`` says who is to
blame. The orchestration turns either end into one of these failures, raised once: its class
name is what the failed job's event and telemetry show (``error_type``), its message what the
job's state shows. Only the orchestrations raise them, so they live here, not in the library's
:mod:`tilecommit.errors`.
"""

from __future__ import annotations

from tilecommit import usage
from tilecommit.errors import BAD_INPUT, CHECK
from tilecommit.retries import ACTIVITY_RETRY


class JobFailure(Exception):
    """Base of every failure an orchestration raises on purpose: the job (or scrub) ends with it."""


class BadInputFailure(JobFailure):
    """The upload or its metadata is wrong (an error of kind ``bad_input``): delivering the same
    upload again fails the same way."""


class MosaicFailure(JobFailure):
    """An output failed its own checks (an error of kind ``check``): a bug, not the upload's fault."""


class FaultFailure(JobFailure):
    """An error of kind ``fault`` that no retry mends: storage refused with a plain 4xx (a missing
    role, say), or an exception nobody foresaw."""


class RetriesExhaustedFailure(JobFailure):
    """A retryable fault outlasted the retry policy: storage stayed unavailable or throttled too long."""


def describe_error(error: dict) -> str:
    """An activity's error value (type, message, window) as one line."""
    where = f"window {error['window']}: " if error.get("window") else ""
    return f"{where}{error['message']} ({error['type']})"


def failure_for(job: dict, error: dict) -> JobFailure:
    """The failure of a job whose activity returned ``error``, chosen and worded by its kind. An
    error value without one, from an activity of an older release still in a job's history, is
    a fault."""
    kind = error.get("kind")
    if kind == CHECK:
        return MosaicFailure(f"job {job['job_id']}: mosaic check failed: {describe_error(error)}")
    if kind == BAD_INPUT:
        return BadInputFailure(f"job {job['job_id']}: bad input {job['blob']!r}: {describe_error(error)}")
    return FaultFailure(f"job {job['job_id']}: failed, not retryable: {describe_error(error)}")


def exhausted(job: dict, stage: str, exc: Exception) -> RetriesExhaustedFailure:
    """The failure of a job whose ``stage`` still failed when the retry policy gave up (``exc``:
    the last attempt's failure, or that of the child it failed)."""
    return RetriesExhaustedFailure(
        f"job {job['job_id']}: {stage} still failed after {ACTIVITY_RETRY.max_attempts} attempts over "
        f"{ACTIVITY_RETRY.patience_s():.0f} s of retries: storage stayed unavailable or throttled longer than "
        f"the retry policy waits; deliver the upload again to resume: {exc}"
    )


def checked(job: dict, result: dict, used: dict | None = None) -> dict:
    """A task's result as it lands: its usage added to ``used`` (when given), then its error
    value (an activity's ``error``, or a batch's first of ``errors``) raised as the job's failure."""
    if used is not None:
        usage.add(used, result.get("usage"))
    errors = [result["error"]] if result.get("error") else result.get("errors") or []
    if errors:
        raise failure_for(job, errors[0])
    return result
