"""The project's exception family.

Two branches matter to a caller: :class:`BadInputError` (the input or configuration is wrong;
retrying can never help, so fail the job at once with the message) and :class:`StorageFaultError`
(a genuine fault; retry). A rejected conditional write is neither: it is an outcome
(:class:`tilecommit.gates.Outcome`), not an exception.
"""


class TileCommitError(Exception):
    """Base class of every error raised on purpose by tilecommit."""

    #: Whether repeating the same call may succeed.
    retryable = False


class BadInputError(TileCommitError, ValueError):
    """The input is wrong; never worth a retry."""


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


class StorageFaultError(TileCommitError, IOError):
    """A genuine storage fault (transport, throttling, 5xx): retry."""

    retryable = True


class IncompleteManifestError(TileCommitError):
    """Assembly refused: planned windows are missing from the manifest, or a tile's size is wrong.

    Missing windows are retryable (a window still being written may land later); a tile whose
    stored size differs from its manifest row is not (something rewrote it: repair, not retry).
    """

    def __init__(self, message: str, *, missing: list[str] | None = None, mismatched: list[str] | None = None):
        super().__init__(message)
        self.missing = list(missing or [])
        self.mismatched = list(mismatched or [])
        self.retryable = not self.mismatched


class MosaicCheckError(TileCommitError):
    """The mosaic built locally failed its own checks (a bug, not bad input): nothing was uploaded."""


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
