"""The project's exception family, and the one contract for what is retried.

Every error says whether repeating the same call may succeed (``retryable``; :func:`is_retryable`
for any exception). Activities raise only retryable faults, which the orchestrator's retry policy
repeats; every other error comes back as a value of one shape (:func:`error_value`) and fails
the job once with its message, worded by its ``kind`` (who is to blame), which the orchestrator
reads instead of exception type names: ``bad_input`` (the upload or its metadata is wrong),
``check`` (an output failed its own checks: a bug, not bad input) or ``fault`` (anything else). :class:`BadInputError` (the input or configuration is wrong) is
never retryable; :class:`StorageFaultError` (transport, throttling, 5xx) is, unless storage
answered a plain 4xx. A rejected conditional write is neither: it is an outcome
(:class:`tilecommit.gates.Outcome`), not an exception.

Two exceptions are not errors but answers that change the assembly's course, and so are not
:class:`TileCommitError`: :class:`CommittedElsewhere` (stop staging, the mosaic exists) and
:class:`CopyFromUrlUnsupported` (the service cannot copy; ``auto`` streams the bytes instead).
"""

#: The kinds of a non-retryable error (``error_value(...)["kind"]``).
BAD_INPUT = "bad_input"
CHECK = "check"
FAULT = "fault"
KINDS = (BAD_INPUT, CHECK, FAULT)


class TileCommitError(Exception):
    """Base class of every error raised on purpose by tilecommit."""

    #: Whether repeating the same call may succeed.
    retryable = False
    #: Who is to blame when it fails a job (one of :data:`KINDS`).
    kind = FAULT


class BadInputError(TileCommitError, ValueError):
    """The input is wrong; never worth a retry."""

    kind = BAD_INPUT


class InvalidNameError(BadInputError):
    """A blob name or URL that cannot be turned into an id or a key."""


class InvalidRasterError(BadInputError):
    """Not a raster, or a corrupt, truncated or empty one."""


class UnsupportedRasterError(BadInputError):
    """A valid raster this pipeline does not handle (dtype, size, georeferencing)."""


class BodyTooLargeError(BadInputError):
    """A body larger than one Put Blob may carry."""


class ConfigurationError(BadInputError):
    """A setting with a value the code cannot use."""


class SourceChangedError(BadInputError):
    """The upload was overwritten or deleted after its job started (the new version has a job of its own)."""


class StorageFaultError(TileCommitError, IOError):
    """A genuine storage fault (transport, throttling, 5xx): retry. ``status``: the HTTP status
    storage answered, when it answered; a plain 4xx will fail the same way again."""

    def __init__(self, message: str, *, status: int | None = None):
        super().__init__(message)
        self.status = status
        self.retryable = retryable_status(status)


class CorruptTileError(StorageFaultError):
    """A tile this job wrote cannot be read back as written (short or undecodable bytes): the
    upload is not to blame; a re-read may succeed, so retry."""


class IncompleteManifestError(TileCommitError):
    """Assembly refused: planned windows are missing from the manifest, or a tile is not what its
    row says (another version, another size, or gone).

    Missing windows are retryable (a window still being written may land later); a mismatched
    tile is not (something rewrote or deleted it: repair, not retry).
    """

    def __init__(self, message: str, *, missing: list[str] | None = None, mismatched: list[str] | None = None):
        super().__init__(message)
        self.missing = list(missing or [])
        self.mismatched = list(mismatched or [])
        self.retryable = not self.mismatched


class MosaicCheckError(TileCommitError):
    """The mosaic built locally failed its own checks (a bug, not bad input): nothing was uploaded."""

    kind = CHECK


class CatalogCheckError(TileCommitError):
    """The catalog holds, under the job's item id, an item that is not the job's committed item
    (or the job has no item to publish): known bad, repaired by an operator, never by a retry."""

    kind = CHECK


class GdalStepError(TileCommitError):
    """GDAL failed in a step of the pipeline; the message names the step, the window and GDAL's own words."""

    def __init__(
        self, message: str, *, step: str = "", window: str | None = None, gdal_messages: list[str] | None = None
    ):
        super().__init__(message)
        self.step = step
        self.window = window
        self.gdal_messages = list(gdal_messages or [])


class IncompatibleTilesError(TileCommitError):
    """The tiles cannot be block-copied (layout differs); the VRT path can still assemble them."""


class StagingPlanChangedError(TileCommitError):
    """The mosaic's staging plan is no longer the version its planning step recorded (replaced
    or deleted): repeating the step reads the same refusal, since the orchestration carries that
    version; delivering the upload again plans anew (the same plan, by its tag)."""


class UnreadableRecordError(TileCommitError):
    """A record (a payload, a result) that travelled as JSON cannot be built back: a field it
    needs is missing or of the wrong type. Reading it again reads the same: never retried."""


class JobCancelledError(TileCommitError):
    """The job was cancelled: its work still queued stops before it reads or writes anything."""


class JobApiError(Exception):
    """A refusal of the job API: the HTTP status, a code and a message, which the routes send as JSON."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def body(self) -> dict:
        return {"error": {"code": self.code, "message": self.message}}


class JobNotVerifiable(LookupError):
    """The job does not exist or is still running: there is nothing finished to verify."""


class CommittedElsewhere(Exception):
    """Raised inside a stream when another attempt committed the blob meanwhile: stop, nothing to do.

    Not an error: the assembly that meets it verifies the mosaic the other attempt committed and
    returns ``already-present`` (``superseded`` in a rebuild); a share that meets it stops."""


class CopyFromUrlUnsupported(Exception):
    """The service does not implement Put Block From URL (501: an emulator older than 3.37).

    ``auto`` assembly then streams the mosaic's bytes through this process (``blocks``); asked
    for ``server`` alone, it is raised out of the assembly (no status: retried, as an unforeseen
    fault is)."""


def retryable_status(status: int | None) -> bool:
    """Whether an HTTP status (None: no answer at all) may go away on a retry."""
    return status is None or status >= 500 or status in (408, 429)


def is_retryable(exc: BaseException) -> bool:
    """Whether repeating the call that raised ``exc`` may succeed.

    The project's errors say so themselves; an SDK error with a status follows the status; any
    other exception (a transport error, a worker that died, an error nobody foresaw) is given the
    retries, which are bounded, rather than failing the job at once for the wrong reason.
    """
    if isinstance(exc, TileCommitError):
        return bool(exc.retryable)
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return retryable_status(status)
    return True


def kind_of(exc: BaseException) -> str:
    """Who is to blame for ``exc`` (one of :data:`KINDS`): any exception not of this family is a fault."""
    return exc.kind if isinstance(exc, TileCommitError) else FAULT


def error_value(exc: BaseException, *, window: str | None = None) -> dict:
    """The one shape in which an activity returns a non-retryable error: kind, type, message, window.

    ``kind`` decides how the job's failure is worded; ``type`` is the exception's name, for
    people and telemetry only.
    """
    return {
        "kind": kind_of(exc),
        "type": type(exc).__name__,
        "message": str(exc),
        "window": window if window is not None else getattr(exc, "window", None),
    }
