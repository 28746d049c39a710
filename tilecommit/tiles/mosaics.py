"""Committed mosaics opened for tiles: each at its version, through the app's pinned reader, kept
open for the next tile.

A mosaic is read as the assembly reads it (:class:`~tilecommit.raster.reading.source.PinnedBlob`,
``upload=False``): every range a GET with ``If-Match`` on the ETag it was opened at, with the
clients of the app's data connection (its managed identity in Azure; no key, no SAS). So the
pixels of a tile are of the version its ETag names, or the read fails: a mosaic replaced since
(a scrub's repair, ``If-Match`` on the version it inspected) answers 412, the open mosaic is
dropped and opened again at the new version once (:meth:`OpenMosaics.use`).

Opening costs a GET of the STAC item, a HEAD of the mosaic and the first 64 KiB of it (the
header and directories); a mosaic kept open serves a tile with the GETs of its blocks only, and
blocks already fetched (:class:`KeptMosaicBlob`, GDAL's block cache: :func:`keep_block_cache`) with none;
a tile's blocks are fetched ahead, merged and at once (:mod:`.prefetch`). Every
:data:`RECHECK_S` the mosaic's ETag is read again (one HEAD), so a repaired mosaic is shown
within that time even where no read of the old version reaches storage.

A mosaic's dataset is read by one thread at a time (its lock: a GDAL dataset is not to be used
by two threads at once), from whichever thread serves the tile: the app's GDAL file system
(:mod:`~tilecommit.raster.reading.gdal_files`) is one per process.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import rasterio
import rasterio.env
from azure.storage.blob import ContainerClient

from ..errors import StorageFaultError
from ..raster.env import gdal_config
from ..raster.reading.source import READ_AHEAD, PinnedBlob, open_upload
from ..raster.reading.upload import upload_gdal_options
from ..settings import Settings
from ..storage_answers import unless_missing

T = TypeVar("T")

#: Mosaics kept open per process (each holds its reader's fetched blocks, up to 64 MiB).
MAX_OPEN = 8
#: Bytes of a mosaic's fetched blocks kept per open mosaic, compressed as stored (beside GDAL's
#: cache of decoded blocks): 8 open mosaics keep at most 128 MiB.
KEPT_BYTES = 16 * 1024 * 1024
#: What storage answers to a pinned read of a version that is no longer stored.
VERSION_GONE = (404, 412)
#: Seconds a kept mosaic's ETag is trusted before it is read again (one HEAD).
RECHECK_S = 60.0


def keep_block_cache(size: int) -> None:
    """Give GDAL's process-wide block cache ``size`` bytes, left set after the tile.

    A tile server lives on that cache: a tile read again, or its neighbour, finds its blocks
    decoded in memory. rasterio's ``Env`` does not keep it: an integer ``GDAL_CACHEMAX`` goes to
    GDALSetCacheMax64 (bytes: tilecommit/raster/env.py gives it the setting's megabytes as
    bytes) while the environment is entered, and on leaving, each ``Env`` puts back the size it
    found on entering (GDAL's default before any job), which flushes the cache when that is
    smaller; environments that overlap put back one another's sizes in any order. So
    a tile's environment names no cache size, and the size is set here, outside any ``Env``,
    before each tile (no flush: the cache only grows to it). Measured in bench/tiles.py: under the
    app's environment every band of a pixel-interleaved block fetched the block again (three
    GETs of each block per tile), and a tile read again fetched all its blocks again.
    """
    if rasterio.env.get_gdal_config("GDAL_CACHEMAX") != size:
        rasterio.env.set_gdal_config("GDAL_CACHEMAX", size)


class KeptMosaicBlob(PinnedBlob):
    """A committed mosaic read for tiles: its blocks fetched are kept too, up to :data:`KEPT_BYTES`.

    The reader keeps only its small reads (a job reads each block once); a tile server reads the
    same blocks again, for the neighbouring tile or the same one at another time, after GDAL's
    cache of decoded blocks let them go (a 512 x 512 x 3 uint16 block is 1.5 MiB decoded, a few
    hundred KiB stored). Measured in bench/tiles.py: warm tiles at the coarse zooms read every
    block again, titiler (GDAL's ``VSI_CACHE`` of stored bytes) a quarter of them.
    """

    #: While not None, the ``(offset, size)`` of every block GDAL's reads fetched (not found kept):
    #: what a tile read, for :class:`~tilecommit.tiles.prefetch.TilePrefetcher` to learn from.
    fetched: list[tuple[int, int]] | None = None

    def read_at(self, offset: int, length: int) -> bytes:
        length = max(0, min(length, self.file_size - offset))
        if length <= READ_AHEAD:
            return super().read_at(offset, length)
        hit = self._cached(offset, length)
        if hit is not None:
            return hit
        data = self.fetch(offset, length)
        if self.fetched is not None:
            self.fetched.append((offset, length))
        self._keep(offset, data)
        return data

    def covered(self, offset: int, length: int) -> bool:
        """Whether kept spans hold every byte of ``offset .. offset + length`` (GDAL reads a large
        block in pieces, each kept as a span of its own)."""
        end, reached = offset + length, offset
        with self._lock:
            spans = sorted((start, start + len(data)) for start, data in self._spans)
        for start, stop in spans:
            if start <= reached < stop:
                reached = stop
            if reached >= end:
                return True
        return reached >= end

    def keep(self, start: int, data: bytes) -> None:
        """Keep bytes fetched ahead (``start``: their offset) for GDAL's reads."""
        self._keep(start, data)

    def _keep(self, start: int, data: bytes) -> None:
        with self._lock:
            self._spans.append((start, data))
            while len(self._spans) > 1 and sum(len(d) for _, d in self._spans) > KEPT_BYTES:
                self._spans.pop(0)


@dataclass
class OpenMosaic:
    """One committed mosaic, open at ``etag``, with its STAC item; one tile at a time reads it
    (a rasterio dataset is not to be shared by threads at once)."""

    name: str
    etag: str
    item: dict
    source: KeptMosaicBlob
    dataset: rasterio.DatasetReader
    checked: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: What a reader of the mosaic keeps beside it (rio-tiler's reader, :mod:`.render`).
    extra: dict = field(default_factory=dict)

    def close(self) -> None:
        with self.lock:
            self.dataset.close()


class OpenMosaics:
    """The mosaics of one output container kept open, the least recently used closed first."""

    def __init__(self, output: ContainerClient, settings: Settings, *, max_open: int = MAX_OPEN):
        self.output, self.settings, self.max_open = output, settings, max_open
        self._open: OrderedDict[str, OpenMosaic] = OrderedDict()
        self._lock = threading.Lock()

    def gdal_env(self, source: PinnedBlob) -> rasterio.Env:
        """GDAL's settings while a mosaic is opened and read: the app's, its network file systems
        closed, but for ``GDAL_CACHEMAX`` (:func:`keep_block_cache`)."""
        config = gdal_config(self.settings, upload_gdal_options(source.path))
        config.pop("GDAL_CACHEMAX", None)
        keep_block_cache(self.settings.gdal_cachemax_mb * 1024 * 1024)
        return rasterio.Env(**config)

    def read_item(self, item_name: str) -> dict | None:
        """The STAC item ``item_name`` (None: none is stored)."""
        body = unless_missing("reading", item_name, lambda: self.output.download_blob(item_name).readall())
        return json.loads(body) if body is not None else None

    def _etag(self, name: str) -> str | None:
        props = unless_missing("reading the properties of", name, self.output.get_blob_client(name).get_blob_properties)
        return props.etag.strip('"') if props is not None else None

    def _opened(self, name: str, item_name: str) -> OpenMosaic | None:
        item = self.read_item(item_name)
        etag = self._etag(name) if item is not None else None
        if item is None or etag is None:
            return None
        source = KeptMosaicBlob(self.output.get_blob_client(name), etag, upload=False)
        return OpenMosaic(name, etag, item, source, self._open_dataset(source), time.monotonic())

    def _open_dataset(self, source: PinnedBlob) -> rasterio.DatasetReader:
        with self.gdal_env(source):
            return open_upload(source)

    def get(self, name: str, item_name: str, *, fresh: bool = False) -> OpenMosaic | None:
        """The mosaic ``name`` open at its current version, with the item ``item_name``; None when
        either is not stored (the job has not committed them)."""
        with self._lock:
            kept = self._open.get(name)
            if kept is not None:
                self._open.move_to_end(name)
        if kept is not None and not fresh and time.monotonic() - kept.checked < RECHECK_S:
            return kept
        if kept is not None and not fresh and self._etag(name) == kept.etag:
            kept.checked = time.monotonic()
            return kept
        opened = self._opened(name, item_name)
        with self._lock:
            replaced = self._open.pop(name, None)
            if opened is not None:
                self._open[name] = opened
            closed = [self._open.popitem(last=False)[1] for _ in range(max(0, len(self._open) - self.max_open))]
        for old in ([replaced] if replaced is not None else []) + closed:
            old.close()
        return opened

    def use(self, name: str, item_name: str, work: Callable[[OpenMosaic], T]) -> T | None:
        """``work(mosaic)`` on the mosaic ``name`` (None: it is not stored), holding its lock, in
        GDAL's settings; once more on a fresh open when the version read was replaced meanwhile."""
        for attempt in range(2):
            mosaic = self.get(name, item_name, fresh=attempt > 0)
            if mosaic is None:
                return None
            try:
                with mosaic.lock:
                    return self._read(mosaic, work)
            except StorageFaultError as exc:
                if attempt or exc.status not in VERSION_GONE:
                    raise
        raise AssertionError("unreachable")

    def _read(self, mosaic: OpenMosaic, work: Callable[[OpenMosaic], T]) -> T:
        with self.gdal_env(mosaic.source), mosaic.source.checked():
            return work(mosaic)

    def close(self) -> None:
        with self._lock:
            kept, self._open = list(self._open.values()), OrderedDict()
        for mosaic in kept:
            mosaic.close()
