"""Where the mosaic's block bytes come from when they pass through this process: ranged reads of
tile blobs and of the local coarse-level file, and the fetcher that yields a directory's blocks
in order. (The server-side path reads only the tiles' heads through here.)
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from azure.core import MatchConditions
from azure.storage.blob import ContainerClient

from ...errors import CorruptTileError, IncompleteManifestError
from ...grid import Window
from ...storage_answers import STORAGE_ERRORS, Answer, Meaning, classify, storage_fault
from .. import tiff
from ..env import BLOCK_SIZE
from ..tiff_alike import read_alike
from .pyramid import TileHeads

#: Bytes read from the start of each tile: a tile COG's directories and block arrays fit.
TILE_HEAD_BYTES = 16 * 1024
#: Concurrent ranged reads of tile blobs while copying blocks.
FETCH_THREADS = 8
#: Two block runs of one tile closer than this are fetched in one ranged read (leaders/trailers lie between).
MERGE_GAP_BYTES = 4096


def tile_not_as_recorded(
    answer: Answer, window: str, tile: str, *, replaced: str, missing: str
) -> IncompleteManifestError | None:
    """What storage's refusal to serve a tile at the version its manifest row recorded means for
    the mosaic: the tile of ``window`` changed since (``replaced`` says what was refused and the
    remedy) or is gone (``missing``), the window named as mismatched; None for any other answer."""
    if answer.meaning is Meaning.REPLACED:
        said = f"changed after its manifest row was written {replaced}"
    elif answer.meaning is Meaning.MISSING:
        said = missing
    else:
        return None
    return IncompleteManifestError(f"window {window}: tile {tile} {said}", mismatched=[window])


class BlobRangeSource:
    """Ranged reads of one tile blob at the version its manifest row recorded.

    Each GET carries ``If-Match`` with the row's ETag (when the row has one), so the service
    refuses bytes of any other version; each answer must hold every byte asked for. A tile
    changed since its row is :class:`IncompleteManifestError` naming it (repairable: verify
    --repair); a short or failed read is a retryable :class:`StorageFaultError`.
    """

    def __init__(
        self, container: ContainerClient, name: str, expected_size: int | None = None, etag: str = "", window: str = ""
    ):
        self.container = container
        self.name = name
        self.expected_size = expected_size
        self.etag = etag
        #: The window whose tile this is (named by the errors; the name otherwise).
        self.window = window or name

    def _download(self, offset: int, length: int):
        condition: dict[str, Any] = (
            {"etag": self.etag, "match_condition": MatchConditions.IfNotModified} if self.etag else {}
        )
        try:
            downloader = self.container.download_blob(
                self.name, offset=offset, length=length, max_concurrency=1, **condition
            )
            return downloader, downloader.readall()
        except STORAGE_ERRORS as exc:
            raise self._read_error(exc, offset, length) from exc

    def _read_error(self, exc: BaseException, offset: int, length: int) -> Exception:
        """What a failed ranged read of the tile means: a version other than its row's, or none,
        needs a repair; anything else is a storage fault as its answer says."""
        answer = classify(exc)
        refused = tile_not_as_recorded(
            answer,
            self.window,
            self.name,
            replaced=f"(recorded ETag {self.etag}): the service refused to read another version; nothing was committed. "
            "Repair the job's tiles (verify --repair) and re-run",
            missing="is in the manifest but not in storage",
        )
        if refused is not None:
            return refused
        return storage_fault(f"reading {length} bytes at {offset} of {self.name} failed: {exc}", answer)

    def head(self, length: int) -> tuple[bytes, int]:
        downloader, data = self._download(0, length)
        # For a ranged read, properties.size is the range's length; the blob's is after the "/".
        content_range = downloader.properties.content_range or ""
        total = content_range.rsplit("/", 1)[-1]
        size = int(total) if total.isdigit() else int(downloader.properties.size)
        if len(data) != min(length, size):
            raise storage_fault(
                f"reading the head of {self.name}: storage delivered {len(data)} of {min(length, size)} bytes"
            )
        return data, size

    def read(self, offset: int, length: int) -> bytes:
        _, data = self._download(offset, length)
        expected = length if self.expected_size is None else max(0, min(length, self.expected_size - offset))
        if len(data) != expected:
            raise storage_fault(
                f"reading {length} bytes at {offset} of {self.name}: storage delivered {len(data)} of {expected}"
            )
        return data

    def __repr__(self) -> str:
        return f"blob:{self.name}"


class FileRangeSource:
    """Ranged reads of a local file (os.pread: safe from the fetcher's threads)."""

    def __init__(self, path: str):
        self.path = path
        self._fd: int | None = os.open(path, os.O_RDONLY)

    def read(self, offset: int, length: int) -> bytes:
        if self._fd is None:
            raise ValueError(f"{self.path} is closed")
        return os.pread(self._fd, length, offset)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __repr__(self) -> str:
        return f"file:{self.path}"


class BlockFetcher:
    """Yields a directory's blocks in order, reading each block row's runs concurrently.

    Blocks of one tile in one block row are stored next to each other (COG row-major order), so a
    row costs one ranged read per tile; the next row is fetched while the current one is written.
    Memory: two block rows of compressed data.
    """

    def __init__(self, sources: dict, executor: ThreadPoolExecutor, block_size: int = BLOCK_SIZE):
        self.sources = sources
        self.executor = executor
        self.block_size = block_size

    def _row_futures(self, refs: Sequence[tiff.BlockRef]) -> list[tuple[Future, int, list[tuple[int, tiff.BlockRef]]]]:
        by_source: dict = {}
        for position, ref in enumerate(refs):
            if ref.length:
                by_source.setdefault(ref.source, []).append((position, ref))
        runs = []
        for key, items in by_source.items():
            items.sort(key=lambda item: item[1].offset)
            run: list[tuple[int, tiff.BlockRef]] = [items[0]]
            for item in items[1:]:
                last = run[-1][1]
                if item[1].offset - (last.offset + last.length) <= MERGE_GAP_BYTES:
                    run.append(item)
                else:
                    runs.append((key, run))
                    run = [item]
            runs.append((key, run))
        futures = []
        for key, run in runs:
            start = run[0][1].offset
            end = max(ref.offset + ref.length for _, ref in run)
            futures.append((self.executor.submit(self.sources[key].read, start, end - start), start, run))
        return futures

    def __call__(self, index: int, directory: tiff.OutputDirectory) -> Iterator[bytes]:
        across = -(-directory.width // self.block_size)
        rows = [directory.blocks[i : i + across] for i in range(0, len(directory.blocks), across)]
        pending = self._row_futures(rows[0]) if rows else []
        for r, row in enumerate(rows):
            current = pending
            pending = self._row_futures(rows[r + 1]) if r + 1 < len(rows) else []
            out: list[bytes] = [b""] * len(row)
            for future, start, run in current:
                data = future.result()
                for position, ref in run:
                    piece = data[ref.offset - start : ref.offset - start + ref.length]
                    if len(piece) != ref.length:
                        raise CorruptTileError(f"{self.sources[ref.source]!r} is shorter than its directory says")
                    out[position] = piece
            yield from out


#: A tile's head as read, pinned: the ETag it was read at, the tile's size, its first bytes.
Head = tuple[str, int, bytes]


def read_heads(
    entries: dict, tiles: ContainerClient, executor, known: dict[str, Head] | None = None
) -> tuple[dict[str, BlobRangeSource], dict[str, Head]]:
    """The head of each blob a manifest row names (``entries``: key -> :class:`~tilecommit.manifest.ManifestEntry`),
    pinned to the row's ETag and of the row's size: (key -> its :class:`BlobRangeSource`, key ->
    the head read). ``known``: heads read before (by a reduction node, pinned too), used for a row
    whose ETag and size they were read at; any other head is read here, by the executor's threads.
    Nothing is parsed: the source reads whatever a head's directories need beyond it."""
    sources = {key: BlobRangeSource(tiles, e.uri, e.nbytes, e.etag or "", key) for key, e in entries.items()}
    known = known or {}

    def of_its_version(key: str) -> bool:
        given, source = known.get(key), sources[key]
        return given is not None and bool(source.etag) and given[:2] == (source.etag, source.expected_size)

    def read(key: str) -> Head:
        source = sources[key]
        head, size = source.head(TILE_HEAD_BYTES)
        if size != source.expected_size:
            raise IncompleteManifestError(
                f"{source.name} has {size} bytes, its manifest row says {source.expected_size}", mismatched=[key]
            )
        return source.etag, size, head

    heads = {key: known[key] for key in sources if of_its_version(key)}
    to_read = [key for key in sources if key not in heads]
    heads.update(zip(to_read, executor.map(read, to_read), strict=True))
    return sources, {key: heads[key] for key in sources}


def read_tile_heads(
    windows: list[Window], summary, tiles: ContainerClient, executor, known: dict[str, Head] | None = None
) -> tuple[dict, TileHeads]:
    """The tiles' heads (:func:`read_heads`), parsed in groups alike (:func:`..tiff_alike.read_alike`)."""
    keys = [w.id for w in windows]
    sources, heads = read_heads({key: summary.entries[key] for key in keys}, tiles, executor, known)
    groups = read_alike([heads[key][2] for key in keys], lambda i: sources[keys[i]].read)
    return sources, TileHeads(windows, keys, groups)
