"""GDAL failures named: which step, which window, and what GDAL said before it failed.

GDAL reports an error to the caller only as a return code; its text goes to an error handler.
When a driver reports a failure and then clears or suppresses its message (a transformer's
"further errors will be suppressed", or the COG driver on some options), rasterio can only raise
``SystemError: Unknown GDAL Error``: useless to whoever uploaded the file. Every GDAL step of
the pipeline therefore runs inside :func:`gdal_step`, which records the messages GDAL sent while
the step ran (rasterio logs each one to the ``rasterio._env`` logger) and turns a GDAL failure
into a :class:`~tilecommit.errors.GdalStepError` whose message names the step, the window and
those messages.

Recording does not change what reaches the application's logs: the records are read by a filter
on that logger, which lets through only what its level let through before.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from rasterio.errors import RasterioError

from ..errors import GdalStepError, TileCommitError

#: rasterio logs every message of GDAL's error handler here ("GDAL signalled an error: ...").
GDAL_LOGGER = "rasterio._env"
#: Messages kept per step (the last ones: those nearest the failure).
MAX_MESSAGES = 5
_MESSAGE = re.compile(r"msg='?(.*?)'?$", re.S)
#: The last messages recorded in this process, whatever step they came from. GDAL may report a
#: failure once and stay silent on the next ones (a cached transformer: "further errors will be
#: suppressed on the transform object"), so the text that explains a silent failure can belong
#: to an earlier step, or to an earlier attempt of the same activity in this worker.
_recent: deque[str] = deque(maxlen=MAX_MESSAGES)


class _Recorder(logging.Filter):
    """Copies GDAL's messages into the buffer of the thread's running step; passes on what it did before."""

    def __init__(self, passthrough_level: int):
        super().__init__()
        self.passthrough_level = passthrough_level
        #: thread id -> (its messages, how many steps are open in it: a step may run inside another).
        self.buffers: dict[int, tuple[list[str], int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        buffer = self.buffers.get(record.thread or 0, (None, 0))[0]
        if buffer is not None and record.levelno >= logging.INFO:
            text = record.getMessage()
            found = _MESSAGE.search(text) if "GDAL signalled" in text else None
            buffer.append(found.group(1) if found else text)
            _recent.append(buffer[-1])
        return record.levelno >= self.passthrough_level


_lock = threading.Lock()
_recorder: _Recorder | None = None
_saved_level = logging.NOTSET


def _start(thread: int) -> list[str]:
    global _recorder, _saved_level
    with _lock:
        logger = logging.getLogger(GDAL_LOGGER)
        if _recorder is None:
            _saved_level = logger.level
            _recorder = _Recorder(logger.getEffectiveLevel())
            logger.addFilter(_recorder)
            logger.setLevel(min(logger.getEffectiveLevel(), logging.INFO))
        buffer, depth = _recorder.buffers.get(thread, ([], 0))
        _recorder.buffers[thread] = (buffer, depth + 1)
        return buffer


def _stop(thread: int) -> None:
    global _recorder
    with _lock:
        if _recorder is None:
            return
        buffer, depth = _recorder.buffers.pop(thread, ([], 1))
        if depth > 1:
            _recorder.buffers[thread] = (buffer, depth - 1)
        if not _recorder.buffers:
            logger = logging.getLogger(GDAL_LOGGER)
            logger.removeFilter(_recorder)
            logger.setLevel(_saved_level)
            _recorder = None


def describe(messages: list[str]) -> str:
    """The last few distinct messages, repeats counted: "A; B (x3)"."""
    runs: list[list] = []
    for message in messages:
        message = message.strip()
        if runs and runs[-1][0] == message:
            runs[-1][1] += 1
        else:
            runs.append([message, 1])
    shown = runs[-MAX_MESSAGES:]
    return "; ".join(m if n == 1 else f"{m} (x{n})" for m, n in shown)


def _is_gdal_failure(exc: BaseException) -> bool:
    # SystemError is how rasterio reports a GDAL failure that came without a message.
    return isinstance(exc, (RasterioError, SystemError)) or type(exc).__module__.startswith("rasterio")


@contextmanager
def gdal_step(step: str, *, window: str | None = None) -> Iterator[None]:
    """Run one GDAL step; a GDAL failure inside it becomes a :class:`GdalStepError` that names it.

    ``step`` says what was being done ("encoding tile 0001_0002 as a COG"), ``window`` which part
    of the raster ("col=256 row=512 256x256"). The project's own errors pass through unchanged.
    """
    thread = threading.get_ident()
    buffer = _start(thread)
    try:
        yield
    except TileCommitError:
        raise
    except Exception as exc:
        if not _is_gdal_failure(exc):
            raise
        said = str(exc)
        if said.startswith("Unknown GDAL Error") or not said.strip():
            said = "GDAL reported the failure without a message"
        before = describe(buffer)
        where = f" (window {window})" if window else ""
        message = f"{step}{where} failed in GDAL: {said}"
        if any(m.strip() != said for m in buffer):
            message += f"; GDAL's messages before the failure: {before}"
        elif not before and _recent:
            message += f"; GDAL said nothing during this step; its last messages in this process were: {describe(list(_recent))}"
        raise GdalStepError(message, step=step, window=window, gdal_messages=list(buffer)) from exc
    finally:
        _stop(thread)
