"""What storage's answer to a request means, and the one way a storage fault is built.

A read pinned to a version (``If-Match`` with the ETag a record holds, or Put Block From URL's
``x-ms-source-if-match``) ends in one of a few answers, told apart here, once, by the status
(:func:`classify`):

| answer | :class:`Meaning` | retried by its status |
|---|---|---|
| 412 | ``replaced``: another version holds the name | no |
| 404 | ``missing``: nothing holds it (the blob, or its container, is gone) | no |
| 501 | ``unsupported``: the service has no such operation (an emulator) | yes |
| 5xx, 408, 429 | ``busy``: the service could not serve it now | yes |
| any other status (403, 409, 416...) | ``refused``: the same request gets the same answer | no |
| none: a transport fault, an answer cut short | ``no-answer``: its outcome is unknown | yes |

By the status, not by the exception's class: the blob SDK raises ``ResourceNotFoundError`` for a
500 ``CannotVerifyCopySource`` and ``ResourceExistsError`` for a 412 ``ConditionNotMet``
(docs/design.md, "Classify by status, not by class"); the class decides only an exception that
carries no status. A pinned read carries no other precondition (no lease, no
``If-Modified-Since``), so its 412 can only be its ``If-Match``.

What a replaced or missing version means is the caller's to say, since it depends on whose blob
it is: an upload replaced is another job (:class:`~tilecommit.errors.SourceChangedError`); a tile
replaced since its manifest row needs a repair (:class:`~tilecommit.errors.IncompleteManifestError`);
a version of the app's own output replaced or deleted while it was read is read again
(:func:`storage_fault` with ``retryable=True``). Anything else a caller does not foresee is a
storage fault built from its answer: retried unless storage answered a plain 4xx, the contract of
:mod:`tilecommit.errors`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from azure.core.exceptions import (
    HttpResponseError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)

from .errors import StorageFaultError, retryable_status

#: Exceptions that mean a storage request got no answer, so its outcome is unknown: the one
#: classification every storage call of the app uses (azure-core raises ServiceRequestError
#: when the request could not be sent, ServiceResponseError when its answer did not arrive).
TRANSPORT_FAULTS = (ServiceRequestError, ServiceResponseError)
#: Every exception a storage call fails with: an answer storage gave (any status), or none.
STORAGE_ERRORS = (HttpResponseError, *TRANSPORT_FAULTS)


class Meaning(StrEnum):
    """What an answer to a storage request means (the module's table)."""

    REPLACED = "replaced"
    MISSING = "missing"
    UNSUPPORTED = "unsupported"
    BUSY = "busy"
    REFUSED = "refused"
    NO_ANSWER = "no-answer"


@dataclass(frozen=True)
class Answer:
    """One answer to a storage request, classified: its meaning, the status and error code storage
    answered (None when it answered none), and the answer in words, for a message."""

    meaning: Meaning
    status: int | None
    code: str | None
    reason: str

    @property
    def retryable(self) -> bool:
        """Whether the same request may be answered otherwise (:func:`~tilecommit.errors.retryable_status`)."""
        return retryable_status(self.status)

    @property
    def version_gone(self) -> bool:
        """Whether the version the request was pinned to is no longer stored (replaced or deleted)."""
        return self.meaning in (Meaning.REPLACED, Meaning.MISSING)


def error_code(exc: BaseException) -> str | None:
    """The service's error code: from the exception, else the ``x-ms-error-code`` header.

    The Tables SDK leaves ``error_code`` empty on a 409, but the header carries it.
    """
    code = getattr(exc, "error_code", None)
    if code:
        # The blob SDK stores a StorageErrorCode enum: str() of it is "StorageErrorCode.X" on 3.11.
        return str(getattr(code, "value", code))
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or {}
    return headers.get("x-ms-error-code")


def status_of(exc: BaseException) -> int | None:
    """The HTTP status storage answered: the exception's, or that of the exception it was raised from."""
    status = getattr(exc, "status_code", None) or getattr(exc.__cause__, "status_code", None)
    return status if isinstance(status, int) else None


def answered(status: int | None, code: str | None = None, reason: str = "") -> Answer:
    """The answer a status means (the module's table; None: no answer). :func:`classify` reads
    an Azure SDK exception; the other stores' backends (``testkit/providers``), whose
    clients carry the status elsewhere, hand it here."""
    if status is None:
        meaning = Meaning.NO_ANSWER
    elif status == 412:
        meaning = Meaning.REPLACED
    elif status == 404:
        meaning = Meaning.MISSING
    elif status == 501:
        meaning = Meaning.UNSUPPORTED
    else:
        meaning = Meaning.BUSY if retryable_status(status) else Meaning.REFUSED
    return Answer(meaning, status, code, reason or f"status {status}")


def classify(exc: BaseException) -> Answer:
    """What the exception a storage request raised says storage answered (the module's table).

    Any exception that carries no status (a transport fault, an answer shorter than it said, an
    error nobody foresaw) is ``no-answer``: retried, as :func:`~tilecommit.errors.is_retryable`
    gives any such exception the retries; its class decides only for an SDK error built without
    an answer.
    """
    status = status_of(exc)
    if status is None:
        reason = f"{type(exc).__name__}: {exc}".strip()
        if isinstance(exc, ResourceModifiedError):
            return Answer(Meaning.REPLACED, None, None, reason)
        if isinstance(exc, ResourceNotFoundError):
            return Answer(Meaning.MISSING, None, None, reason)
        return answered(None, reason=reason)
    code = error_code(exc)
    reason = f"{status} {getattr(exc, 'reason', None) or type(exc).__name__}" + (f" ({code})" if code else "")
    return answered(status, code, reason)


def storage_fault(
    message: str, answer: Answer | BaseException | None = None, *, retryable: bool | None = None
) -> StorageFaultError:
    """The one way a :class:`~tilecommit.errors.StorageFaultError` is built.

    ``answer``: what storage answered (an exception is classified first). Its status goes with the
    fault and decides whether it is retried: not after a plain 4xx. None: there is no answer to
    blame (a read that came back short, a blob gone that was just seen, no answer after every
    attempt): retried. ``retryable`` overrides the status where the caller knows what the answer
    means for its blob: a version of the app's own output replaced while it was read is read again.
    """
    if isinstance(answer, BaseException):
        answer = classify(answer)
    fault = StorageFaultError(message, status=answer.status if answer is not None else None)
    if retryable is not None:
        fault.retryable = retryable
    return fault


T = TypeVar("T")


def unless_missing(action: str, key: str, read: Callable[[], T]) -> T | None:
    """``read()``, or None when storage answers that nothing holds ``key`` (404); any other failure
    is a storage fault (:func:`call_failed`) for ``action`` (a verb phrase) on ``key``."""
    try:
        return read()
    except STORAGE_ERRORS as exc:
        if classify(exc).meaning is Meaning.MISSING:
            return None
        raise call_failed(action, key, exc) from exc


def call_failed(action: str, key: str, exc: BaseException) -> StorageFaultError:
    """The fault for a storage call that failed in a way its caller does not read: ``action``
    (a verb phrase) on ``key``, worded with the exception and the status storage answered."""
    answer = classify(exc)
    return storage_fault(f"{action} {key!r} failed: {type(exc).__name__} (status {answer.status}): {exc}", answer)
