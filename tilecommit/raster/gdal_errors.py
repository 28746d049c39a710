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

Whether a failure is worth a retry is never read from GDAL's words (a file named "curlew" or
"classlabels" would say "curl" or "ssl"). GDAL reads none of the app's storage itself: every
storage read goes through the app's reader, which records each read storage did not deliver
(:class:`~tilecommit.raster.reading.source.ReadFault`), and :meth:`Source.checked
<tilecommit.raster.reading.source.Source.checked>` around every GDAL call on it raises that
record as a storage fault, whether GDAL failed or not (a :class:`GdalStepError` raised inside it
included). So a :class:`GdalStepError` is a failure on bytes that all arrived, or on local files
and memory: not retryable. GDAL's messages only enrich its text.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from rasterio.errors import RasterioError

from ..errors import GdalStepError, TileCommitError

#: rasterio logs GDAL's messages on these loggers: failures ("GDAL signalled an error: ...") and warnings.
GDAL_LOGGER = "rasterio._env"
GDAL_LOGGERS = (GDAL_LOGGER, "rasterio._err")
#: Messages kept per step (the last ones: those nearest the failure).
MAX_MESSAGES = 5
_MESSAGE = re.compile(r"msg='?(.*?)'?$", re.S)
#: The last messages recorded for each job (by :func:`job_messages`), whatever step they came
#: from. GDAL may report a failure once and stay silent on the next ones (a cached transformer:
#: "further errors will be suppressed on the transform object"), so the text that explains a
#: silent failure can belong to an earlier step, or to an earlier attempt of the same activity.
#: Kept per job, never per process: one job's error must carry only its own GDAL messages.
_recent: OrderedDict[str, deque[str]] = OrderedDict()
#: Jobs whose last messages are kept (the least recently heard of are dropped).
MAX_JOBS_REMEMBERED = 64
_job: ContextVar[str | None] = ContextVar("tilecommit_gdal_job", default=None)
#: thread id -> (its messages, how many recordings are open in it: a step may run inside another).
_buffers: dict[int, tuple[list[str], int]] = {}


class _Recorder(logging.Filter):
    """Copies GDAL's messages into the buffer of the thread's running step; passes on what it did before."""

    def __init__(self, passthrough_level: int, saved_level: int):
        super().__init__()
        self.passthrough_level = passthrough_level
        self.saved_level = saved_level

    def filter(self, record: logging.LogRecord) -> bool:
        buffer = _buffers.get(record.thread or 0, (None, 0))[0]
        if buffer is not None and record.levelno >= logging.INFO:
            text = record.getMessage()
            found = _MESSAGE.search(text) if "GDAL signalled" in text else None
            buffer.append(found.group(1) if found else text)
            _remember(buffer[-1])
        return record.levelno >= self.passthrough_level


_lock = threading.Lock()
_recorders: dict[str, _Recorder] = {}


def _remember(message: str) -> None:
    job = _job.get()  # the thread that called GDAL (a logging filter runs in it)
    if job is None:
        return
    with _lock:
        kept = _recent.pop(job, None) or deque(maxlen=MAX_MESSAGES)
        kept.append(message)
        _recent[job] = kept
        while len(_recent) > MAX_JOBS_REMEMBERED:
            _recent.popitem(last=False)


@contextmanager
def job_messages(job_id: str) -> Iterator[None]:
    """GDAL steps inside the block belong to ``job_id``: a silent failure cites that job's last messages only."""
    token = _job.set(job_id)
    try:
        yield
    finally:
        _job.reset(token)


def _start(thread: int) -> list[str]:
    with _lock:
        if not _recorders:
            for name in GDAL_LOGGERS:
                logger = logging.getLogger(name)
                recorder = _Recorder(logger.getEffectiveLevel(), logger.level)
                logger.addFilter(recorder)
                logger.setLevel(min(logger.getEffectiveLevel(), logging.INFO))
                _recorders[name] = recorder
        buffer, depth = _buffers.get(thread, ([], 0))
        _buffers[thread] = (buffer, depth + 1)
        return buffer


def _stop(thread: int) -> None:
    with _lock:
        if not _recorders:
            return
        buffer, depth = _buffers.pop(thread, ([], 1))
        if depth > 1:
            _buffers[thread] = (buffer, depth - 1)
        if not _buffers:
            for name, recorder in _recorders.items():
                logger = logging.getLogger(name)
                logger.removeFilter(recorder)
                logger.setLevel(recorder.saved_level)
            _recorders.clear()


@contextmanager
def recording() -> Iterator[list[str]]:
    """GDAL's messages sent by this thread while the block runs (shared with an enclosing step)."""
    thread = threading.get_ident()
    buffer = _start(thread)
    start = len(buffer)
    mine: list[str] = []
    try:
        yield mine
    finally:
        mine.extend(buffer[start:])
        _stop(thread)


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
    of the raster ("col=256 row=512 256x256"). The project's own errors pass through unchanged,
    among them the storage fault a read recorded during the step (the module's notes); the
    :class:`GdalStepError` is not retryable.
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
        elif not before and (earlier := list(_recent.get(_job.get() or "", ()))):
            message += f"; GDAL said nothing during this step; its last messages in this job were: {describe(earlier)}"
        raise GdalStepError(message, step=step, window=window, gdal_messages=list(buffer)) from exc
    finally:
        _stop(thread)
