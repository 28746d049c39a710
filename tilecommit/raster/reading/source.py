"""The upload as GDAL reads it: one version of one blob, every byte fetched at that version and counted.

GDAL's own ``/vsiaz/`` reader cannot pin a version, and when storage fails part-way through a
read it does not always say so: during an outage a window read could come back all zeros with
no error reaching rasterio, and that tile was then committed create-only, for good. So GDAL
never talks to storage for an upload. It reads through the app's own GDAL file system
(:mod:`.gdal_files`: a plugin whose calls come to Python), and every read it makes lands here:

- each ranged GET carries ``If-Match`` with the job's ETag, so the service itself refuses bytes
  of any other version (412: "the upload changed", never mixed into a tile of the old one);
- each answer must hold every byte asked for (up to the end of the blob); a short, cut, refused
  or failed read is a fault, **recorded here, by the reader**, whatever GDAL does with it next;
- after every GDAL call on the source, :meth:`Source.checked` raises the first fault recorded
  during that call, whether GDAL failed or returned pixels. Only a failure with no recorded
  fault is the file's own: every byte arrived and did not decode.

No log is parsed to tell a storage fault from a corrupt file, so one job's messages can never
decide another job's fate. A local file (tests, benchmarks, the CLI) goes through the same
plugin with the same counting (:class:`LocalFile`), so there is one read path.

The plugin interface is rasterio's (``rasterio.abc.FileContainer``), served by
:mod:`.gdal_files`: GDAL stats and opens the path, makes small sequential reads for the header
and directories, then reads block by block. Two facts of that bridge shape the code: a read that
fails reaches GDAL as a short read, so ``read`` records the fault and returns short, never raises;
and nothing tells GDAL's caller that a read came back short, so the check after the call
(:meth:`Source.checked`) is what makes a failed read fail.
"""

from __future__ import annotations

import io
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import rasterio
from azure.core import MatchConditions
from rasterio.abc import FileContainer

from ...errors import GdalStepError, InvalidRasterError, SourceChangedError, UnsupportedRasterError
from ...storage_answers import STORAGE_ERRORS, Answer, Meaning, classify, status_of, storage_fault
from . import jpeg2000
from .gdal_files import gdal_path
from .netcdf import open_copy
from .upload import HEADER_BYTES, SCENE_DOCUMENT, TIFF, UploadFormat, check_upload_content

#: Small reads (GDAL walking the header and directories) are served from chunks of this size,
#: so a TIFF's header costs a request or two instead of one per field.
READ_AHEAD = 64 * 1024
#: Bytes of fetched spans kept per source: a window's blocks, prefetched, and the directories.
MAX_CACHED_BYTES = 64 * 1024 * 1024
#: Prefetched ranges closer than this are fetched as one GET (the gap is discarded):
#: a window's blocks in a row of blocks are neighbours in a COG, the next row is far away.
MERGE_GAP = 64 * 1024
#: GDAL threads that decode the upload's blocks: one, the caller's. GDAL's worker threads are one
#: pool shared by the whole process (gcore/gdal_thread_pool.cpp, GDALGetGlobalThreadPool); a
#: worker reading the upload calls back into Python and waits for the GIL, while another Python
#: thread can hold the GIL inside GDAL waiting for that pool (rasterio 1.4's ``build_overviews``
#: holds it around GDALBuildOverviews, whose multi-threaded computation waits for the pool): the
#: process deadlocks. Seen in gdb with four web-optimized jobs: a pool worker in the plugin's seek
#: (rasterio's ``pyopener_seek`` then) waiting for the GIL, a warped read and the assembly's coarse
#: levels waiting for the pool.
#:
#: In GDAL 3.10 the one reader of the upload that uses the pool is GTiff's multi-threaded decoding
#: (frmts/gtiff/gtiffdataset_read.cpp, MultiThreadedRead: each job seeks and reads its block
#: through the file handle, ThreadDecompressionFunc), enabled for a dataset by its NUM_THREADS
#: open option, or, when that option is absent, by the GDAL_NUM_THREADS configuration option read
#: as the dataset is opened (GTiffDataset::InitCompressionThreads). So every dataset GDAL opens
#: on the upload is given NUM_THREADS=1 (:data:`UPLOAD_DATASET_OPTIONS`): rasterio's open here,
#: and the warped VRT's own open of its source by name (tilecommit/raster/reading/warp.py), which
#: would otherwise take the environment's GDAL_NUM_THREADS. The warper's threads (GWKThreadsCreate
#: in alg/gdalwarpkernel.cpp: its NUM_THREADS option, else GDAL_NUM_THREADS) only resample a chunk
#: the calling thread has already read ("all IO is done before and after", alg/gdalwarper.h,
#: GDALWarpKernel; GDALWarpOperation::WarpRegionToBuffer reads the source), and overview building
#: (gcore/overview.cpp, GDALRegenerateOverviewsMultiBand, GDAL_NUM_THREADS) and the tile encoder's
#: compression threads (the COG driver's NUM_THREADS) touch only local files and memory: they keep
#: their threads. A read that reaches the plugin from a GDAL thread all the same is refused
#: (:meth:`Source.refused_on_gdal_thread`).
UPLOAD_READ_THREADS = 1
#: The GTiff open options of every dataset GDAL opens on a TIFF upload (here, and in a warped VRT);
#: each accepted format has its own (:attr:`~.upload.UploadFormat.open_options`).
UPLOAD_DATASET_OPTIONS = dict(TIFF.open_options)
#: The largest single GET; larger spans are fetched in parts.
MAX_GET = 32 * 1024 * 1024


#: The kind of a read refused here, before any request: asked for by a thread of GDAL's own.
GDAL_THREAD = "gdal-thread"


def merged_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``(offset, size)`` ranges as the GETs that fetch them: sorted, empty ones left out, and
    neighbours less than :data:`MERGE_GAP` apart merged into one of at most :data:`MAX_GET` bytes."""
    spans: list[list[int]] = []
    for offset, size in sorted(r for r in ranges if r[1] > 0):
        if spans and offset <= spans[-1][1] + MERGE_GAP and offset + size - spans[-1][0] <= MAX_GET:
            spans[-1][1] = max(spans[-1][1], offset + size)
        else:
            spans.append([offset, offset + size])
    return [(start, end - start) for start, end in spans]


@dataclass(frozen=True)
class ReadFault:
    """A read storage did not answer in full: which bytes, and what storage answered."""

    name: str
    offset: int
    length: int
    #: Storage's answer, classified (None: no request was sent, see ``note``).
    answer: Answer | None
    #: Why a read with no answer was refused.
    note: str = ""

    @property
    def kind(self) -> str:
        """The answer's :class:`~tilecommit.storage_answers.Meaning` ("replaced", "missing",
        "refused"...), or :data:`GDAL_THREAD`."""
        return self.answer.meaning if self.answer is not None else GDAL_THREAD

    @property
    def status(self) -> int | None:
        """The HTTP status storage answered, when it answered (None: no answer, or a short one)."""
        return self.answer.status if self.answer is not None else None

    @property
    def reason(self) -> str:
        return self.answer.reason if self.answer is not None else self.note


class Source(FileContainer):
    """One file for GDAL, served from :meth:`fetch`; every failed fetch kept in :attr:`faults`.

    Subclasses say where the bytes come from (:meth:`_get`, :meth:`_size`) and what a recorded
    fault means (:meth:`error_for`).
    """

    def __init__(self, name: str):
        #: What messages call the file (the blob's container/name, or the local path).
        self.name = name
        #: The file's path within the plugin; GDAL opens it as /vsitilecommit/<token>/<path>
        #: (:func:`~.gdal_files.gdal_path`).
        self.path = name.lstrip("/") or "source"
        self.faults: list[ReadFault] = []
        self.requests = 0
        self._lock = threading.Lock()
        #: Fetched byte spans ``(start, bytes)``, oldest first, at most MAX_CACHED_BYTES in all.
        self._spans: list[tuple[int, bytes]] = []
        self._known_size: int | None = None
        #: Other sources the same GDAL calls read (a scene document's members): a read of theirs
        #: that failed fails those calls as one of this source's does (:meth:`checked`).
        self.members: tuple[Source, ...] = ()

    # -- where the bytes come from ----------------------------------------------------------
    def _size(self) -> int:
        raise NotImplementedError

    def _get(self, offset: int, length: int) -> bytes:
        """Bytes ``offset`` .. ``offset + length`` (already clipped to the file); raise on any failure."""
        raise NotImplementedError

    def _fault_for(self, exc: BaseException, offset: int, length: int) -> ReadFault:
        """What a failed read means: storage's answer, classified (:func:`~tilecommit.storage_answers.classify`),
        the one classification of the size request and of every read. A short answer is no
        answer (retried); a plain 4xx (a 403: no permission) is not retried, wherever it was answered."""
        return ReadFault(self.name, offset, length, classify(exc))

    def error_for(self, fault: ReadFault) -> Exception:
        if fault.answer is None:
            return GdalStepError(
                f"reading {self.name}: GDAL asked for its bytes on a thread of its own ({fault.reason}), which "
                "this app never lets it do: such a thread waits for Python's GIL while a Python thread can hold "
                "the GIL waiting for GDAL's threads, and the process deadlocks. The read was refused; a retry "
                "would meet the same settings, so it is not retried: the app's GDAL settings must be fixed "
                "(NUM_THREADS=1 on every dataset GDAL opens on an upload, tilecommit/raster/reading/source.py)",
                step=f"reading {self.name}",
            )
        what = f"reading {self.name} failed: storage did not deliver bytes {fault.offset}-{fault.offset + fault.length - 1}"
        if not fault.answer.retryable:
            return storage_fault(
                f"{what}: storage refused the request ({fault.reason}); it would refuse it again, so it is not retried",
                fault.answer,
            )
        return storage_fault(f"{what} ({fault.reason}); the read is retried", fault.answer)

    # -- the thread that asks ----------------------------------------------------------------
    def refused_on_gdal_thread(self, call: str) -> bool:
        """Whether the plugin was called on a thread Python did not start (one of GDAL's pool, see
        :data:`UPLOAD_READ_THREADS`), which is then recorded as a fault that fails the GDAL call
        (:meth:`checked`) and is not retried: the settings that keep GDAL's threads off the upload
        missed a path. The call is refused rather than served: the thread got the GIL this time,
        but under load such a call is how the process deadlocks, and a tile made through it would
        hide that until it does.

        Python gives a thread it did not start a ``_DummyThread`` as its current thread
        (``threading.current_thread``).
        """
        if not isinstance(threading.current_thread(), threading._DummyThread):
            return False
        reason = f"{call} on thread {threading.get_ident()}, which Python did not start"
        with self._lock:
            self.faults.append(ReadFault(self.name, 0, 0, None, reason))
        return True

    # -- counted reads -----------------------------------------------------------------------
    @property
    def file_size(self) -> int:
        if self._known_size is None:
            self._known_size = self._size()
        return self._known_size

    def fetch(self, offset: int, length: int) -> bytes:
        """Exactly the bytes ``offset .. offset + length`` that exist (fewer only past the end).

        Any failure, or fewer bytes than the file holds there, is recorded and raised as an
        ``OSError``: the caller (GDAL, through the plugin) cannot be trusted to notice.
        """
        expected = max(0, min(length, self.file_size - offset))
        if expected == 0:
            return b""
        try:
            self.requests += 1
            data = self._get(offset, expected)
            if len(data) != expected:
                raise OSError(f"got {len(data)} of {expected} bytes")
        except Exception as exc:
            fault = self._fault_for(exc, offset, expected)
            with self._lock:
                self.faults.append(fault)
            raise OSError(fault.reason) from exc
        return data

    def _cached(self, offset: int, length: int) -> bytes | None:
        with self._lock:
            for start, data in reversed(self._spans):
                if start <= offset and offset + length <= start + len(data):
                    return data[offset - start : offset - start + length]
        return None

    def _keep(self, start: int, data: bytes) -> None:
        with self._lock:
            self._spans.append((start, data))
            while len(self._spans) > 1 and sum(len(d) for _, d in self._spans) > MAX_CACHED_BYTES:
                self._spans.pop(0)

    def read_at(self, offset: int, length: int) -> bytes:
        """Bytes for one of GDAL's reads: from a prefetched span, else fetched (small reads a chunk at a time)."""
        length = max(0, min(length, self.file_size - offset))
        if length == 0:
            return b""
        hit = self._cached(offset, length)
        if hit is not None:
            return hit
        if length > READ_AHEAD:
            return self.fetch(offset, length)
        start = offset - offset % READ_AHEAD
        data = self.fetch(start, max(READ_AHEAD, offset + length - start))
        self._keep(start, data)
        return data[offset - start : offset - start + length]

    def prefetch(self, ranges: list[tuple[int, int]]) -> None:
        """Fetch ``(offset, size)`` ranges GDAL is about to read (a window's blocks), neighbours
        merged into one GET each, so its block-by-block reads are served without a request.

        GDAL's own multi-range read is not offered to it: on a COG whose blocks are sparse it
        returned other pixels than its plain reads of the same file (GDAL 3.10, the
        ``cog_strile_arrays_zeroified_when_possible.tif`` fixture: band 1 all 255 instead of 0).

        Ranges that add up to more than the cache keeps (:data:`MAX_CACHED_BYTES`; a warped
        window of a grid much coarser than its source maps back to a wide area) are not fetched
        ahead: the later spans would push the first ones out before GDAL read them, and each byte
        would cross the wire twice. GDAL's reads then fetch them as it asks, a chunk at a time.
        """
        if sum(size for _, size in ranges if size > 0) > MAX_CACHED_BYTES:
            return
        for start, length in merged_ranges(ranges):
            if self._cached(start, min(start + length, self.file_size) - start) is None:
                self._keep(start, self.fetch(start, length))

    # -- what a GDAL call may trust ----------------------------------------------------------
    def raise_faults(self, since: int = 0, cause: BaseException | None = None) -> None:
        """Raise the error for the first fault recorded since ``since`` (a :attr:`faults` length)."""
        with self._lock:
            recorded = self.faults[since:]
        if not recorded:
            return
        # A read refused on GDAL's thread first (a defect of the app), then a version that changed.
        first = next(
            (f for kind in (GDAL_THREAD, Meaning.REPLACED, Meaning.MISSING) for f in recorded if f.kind == kind), None
        )
        error = self.error_for(first or recorded[0])
        if len(recorded) > 1:
            error.args = (f"{error.args[0]} ({len(recorded)} reads failed)",)
        raise error from cause

    @contextmanager
    def checked(self) -> Iterator[None]:
        """Run GDAL calls on this source (and its :attr:`members`); a read that failed during them
        fails them, whatever GDAL returned."""
        sources = (self, *self.members)
        marks = [len(source.faults) for source in sources]
        try:
            yield
        except Exception as exc:
            for source, mark in zip(sources, marks, strict=True):
                source.raise_faults(mark, cause=exc)
            raise
        for source, mark in zip(sources, marks, strict=True):
            source.raise_faults(mark)

    # -- rasterio's plugin interface -------------------------------------------------------------
    def _is_mine(self, path: str) -> bool:
        # GDAL looks for companions (.ovr, .msk, .aux.xml) beside a file it opens; only the file
        # itself exists here, so none is ever read.
        path = path.rstrip("/")
        return path == self.path or path.endswith("/" + self.path)

    def open(self, path: str, mode: str = "rb", **kwds) -> SourceFile:
        if "r" not in mode or any(m in mode for m in "wa+") or not self._is_mine(path):
            raise FileNotFoundError(path)
        return SourceFile(self)

    def isfile(self, path: str) -> bool:
        return self._is_mine(path)

    def isdir(self, path: str) -> bool:
        return False

    def ls(self, path: str) -> list[str]:
        return []

    def mtime(self, path: str) -> int:
        return 0

    def rm(self, path: str) -> None:
        raise PermissionError(f"{self.name} is read-only")

    def size(self, path: str) -> int:
        if not self._is_mine(path):
            raise FileNotFoundError(path)
        self.refused_on_gdal_thread("size")  # recorded; the size is known since the open, no request
        return self.file_size


class SourceFile(io.RawIOBase):
    """One open handle GDAL holds on a :class:`Source` (it may hold several, each with its position)."""

    def __init__(self, source: Source):
        super().__init__()
        self._source = source
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._source.refused_on_gdal_thread("seek")  # recorded; a seek moves a number, no request
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._source.file_size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, size: int = -1) -> bytes:
        if self._source.refused_on_gdal_thread("read"):
            return b""  # recorded: the GDAL call fails (checked), nothing is fetched on GDAL's thread
        if size is None or size < 0:
            size = max(0, self._source.file_size - self._pos)
        try:
            data = self._source.read_at(self._pos, size)
        except OSError:
            return b""  # recorded by the source; raising here would only print and read 0 bytes
        self._pos += len(data)
        return data


class LocalFile(Source):
    """A file on this machine's disk, read through the same counted path as a blob."""

    def __init__(self, path: str | os.PathLike[str]):
        super().__init__(os.fspath(path))
        self._local = os.fspath(path)

    def _size(self) -> int:
        try:
            return os.path.getsize(self._local)
        except FileNotFoundError:
            raise InvalidRasterError(f"{self._local} does not exist") from None

    def _get(self, offset: int, length: int) -> bytes:
        with open(self._local, "rb") as f:
            f.seek(offset)
            return f.read(length)


class PinnedBlob(Source):
    """One version of a blob: its size and every range read with ``If-Match`` (the size from the first GET).

    ``etag`` is the version the job was started for. The service answers 412 to a request for
    any other version, so bytes of a newer upload can never reach a tile of this job; the
    first 412 fails the read with :class:`SourceChangedError` naming both versions.
    """

    def __init__(self, blob, etag: str, *, upload: bool = True):
        super().__init__(f"{blob.container_name}/{blob.blob_name}")
        self.blob = blob
        self.etag = etag.strip('"')
        #: An upload that changed is another job (not retried); one of the app's own outputs that
        #: changed while it was read (a concurrent rebuild) is read again by the retry.
        self.upload = upload

    def _condition(self) -> dict:
        return {"etag": f'"{self.etag}"', "match_condition": MatchConditions.IfNotModified}

    def _size(self) -> int:
        """The size, from the answer to a pinned GET of the first READ_AHEAD bytes, which are kept
        for GDAL's header reads: one request per open where a HEAD and then that GET were two.
        An empty blob has no range to GET (416): its size comes from a pinned HEAD."""
        try:
            self.requests += 1
            stream = self.blob.download_blob(offset=0, length=READ_AHEAD, max_concurrency=1, **self._condition())
            head = stream.readall()
        except STORAGE_ERRORS as exc:
            if status_of(exc) != 416:
                raise self._size_error(exc) from exc
            try:
                self.requests += 1
                return int(self.blob.get_blob_properties(**self._condition()).size)
            except STORAGE_ERRORS as head_exc:
                raise self._size_error(head_exc) from head_exc
        answered = stream.properties.content_range
        size = int(answered.rpartition("/")[2]) if answered else int(stream.properties.size)
        if len(head) == min(READ_AHEAD, size):
            self._keep(0, head)  # a short answer is not kept: GDAL's read of those bytes fetches and checks them
        return size

    def _size_error(self, exc: Exception) -> Exception:
        """What a failed size request means: the same as a failed read of those bytes (:meth:`_fault_for`)."""
        return self.error_for(self._fault_for(exc, 0, READ_AHEAD))

    def _get(self, offset: int, length: int) -> bytes:
        stream = self.blob.download_blob(offset=offset, length=length, max_concurrency=1, **self._condition())
        return stream.readall()

    def current_etag(self) -> str | None:
        """The ETag storage holds now (for a message only); None when it cannot be read."""
        try:
            return self.blob.get_blob_properties().etag.strip('"')
        except Exception:  # noqa: BLE001 - the message says "unknown" instead
            return None

    def error_for(self, fault: ReadFault) -> Exception:
        if fault.answer is None or not fault.answer.version_gone:
            return super().error_for(fault)
        if not self.upload:
            return storage_fault(
                f"{self.name} changed while it was read (ETag {self.etag}, storage now holds "
                f"{self.current_etag() or 'none'}); it is read again",
                fault.answer,
                retryable=True,
            )
        if fault.kind == Meaning.MISSING:
            return SourceChangedError(
                f"the upload {self.name!r} was deleted (the job was started for ETag {self.etag})"
            )
        now = self.current_etag() or "unknown"
        return SourceChangedError(
            f"the upload {self.name!r} was overwritten: the job was started for ETag {self.etag}, storage now "
            f"holds ETag {now}; the new version is a job of its own, and nothing of it went into this one"
        )


#: The source behind each open dataset (a dataset is a Python object; the plugin's files are not).
_SOURCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def as_source(path_or_source: str | os.PathLike[str] | Source) -> Source:
    return path_or_source if isinstance(path_or_source, Source) else LocalFile(path_or_source)


def upload_format_of(source: Source) -> UploadFormat:
    """The accepted format of ``source``, from its first bytes (served from the read-ahead
    GDAL's own open then reads); refused as :func:`~.upload.check_upload_content` refuses."""
    with source.checked():
        head = source.read_at(0, HEADER_BYTES)
    return check_upload_content(source.name, head, source.file_size)


def open_upload(
    path_or_source: str | os.PathLike | Source,
    *,
    upload_format: UploadFormat | None = None,
    variable: str | None = None,
    **open_options,
) -> rasterio.DatasetReader:
    """Open an upload (or a blob of the app's own, read the same way) with its format's driver
    alone, every byte read through its :class:`Source`.

    Call inside :func:`~tilecommit.raster.env.gdal_env` with
    :func:`~tilecommit.raster.reading.upload.upload_gdal_options`. The format is the one its first
    bytes are in (:func:`upload_format_of`) unless the caller checked it already. The open
    itself runs under :meth:`Source.checked`: a directory read that failed is a fault, not a
    corrupt file. ``open_options`` go to the driver (``overview_level``, say), besides the
    format's own (:attr:`~.upload.UploadFormat.open_options`: GDAL decodes it on the calling thread only).
    A format its driver cannot read through the reader is opened from a pinned local copy
    (:attr:`~.upload.UploadFormat.local_copy`, :mod:`.netcdf`), its ``variable`` (the job's
    option; None: its only one).
    """
    source = as_source(path_or_source)
    source.file_size  # noqa: B018 - the version check and size, raised as ours before GDAL stats the file
    fmt = upload_format if upload_format is not None else upload_format_of(source)
    if variable is not None and not fmt.local_copy:
        raise UnsupportedRasterError(
            f"{source.name} is {fmt.described}, which has no variables: the job names variable={variable!r}, "
            "which only a NetCDF or HDF5 upload has; accepted: no variable option for it"
        )
    if fmt is SCENE_DOCUMENT:  # never given to GDAL: .scene_document.open_any_upload stacks its members
        raise UnsupportedRasterError(f"{source.name} is a scene document, not a band file GDAL may open")
    if fmt.local_copy:
        dataset = open_copy(source, variable, **open_options)
    else:
        with source.checked():
            dataset = rasterio.open(gdal_path(source), driver=fmt.driver, **fmt.open_options, **open_options)
    _SOURCES[dataset] = source
    return dataset


@contextmanager
def reading(path_or_source: str | os.PathLike | Source, **open_options) -> Iterator[rasterio.DatasetReader]:
    """A dataset whose every GDAL call in the block is checked (:meth:`Source.checked`); a plain
    path (a local file of the app's own) is opened by GDAL directly."""
    if not isinstance(path_or_source, Source):
        with rasterio.open(path_or_source, **open_options) as dataset:
            yield dataset
        return
    with open_upload(path_or_source, **open_options) as dataset, path_or_source.checked():
        yield dataset


def source_of(dataset) -> Source | None:
    """The :class:`Source` an open dataset reads through (None for one opened otherwise)."""
    return _SOURCES.get(dataset)


def reads_through(dataset, source: Source | None) -> None:
    """Say that ``dataset`` (a view GDAL made of an upload, a warped VRT) reads through ``source``,
    so its reads are checked and classified as the upload's own are."""
    if source is not None:
        _SOURCES[dataset] = source


def window_ranges(src, col_off: int, row_off: int, width: int, height: int) -> list[tuple[int, int]]:
    """``(offset, size)`` of every full-resolution block a window of ``src`` touches, from its own tags."""
    block_h, block_w = src.block_shapes[0]
    bands = range(1, src.count + 1) if src.interleaving is not None and src.interleaving.name == "BAND" else (1,)
    ranges = []
    for band in bands:
        for by in range(row_off // block_h, -(-(row_off + height) // block_h)):
            for bx in range(col_off // block_w, -(-(col_off + width) // block_w)):
                offset = src.get_tag_item(f"BLOCK_OFFSET_{bx}_{by}", "TIFF", bidx=band)
                size = src.get_tag_item(f"BLOCK_SIZE_{bx}_{by}", "TIFF", bidx=band)
                if offset is not None and size is not None:
                    ranges.append((int(offset), int(size)))
    return ranges


#: How a window of a dataset that is no file of its own (a scene document's stack) is fetched ahead.
_PREFETCHERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def prefetches_by(dataset, prefetcher: Callable[[Any], None]) -> None:
    """Say that :func:`prefetch_window` of ``dataset`` is ``prefetcher(window)``."""
    _PREFETCHERS[dataset] = prefetcher


def prefetch_window(src, window) -> None:
    """Fetch the blocks a window read of an upload opened with :func:`open_upload` will ask for:
    a TIFF's from its block tags, a JPEG 2000's tiles from its TLM markers, a stack's by its own
    prefetcher (:func:`prefetches_by`)."""
    prefetcher = _PREFETCHERS.get(src)
    if prefetcher is not None:
        prefetcher(window)
        return
    source = source_of(src)
    if source is not None:
        col, row, width, height = int(window.col_off), int(window.row_off), int(window.width), int(window.height)
        if src.driver == "JP2OpenJPEG":
            stream = jpeg2000.indexed(source)
            source.prefetch(jpeg2000.window_ranges(stream, col, row, width, height) if stream else [])
            return
        source.prefetch(window_ranges(src, col, row, width, height))
