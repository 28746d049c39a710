"""Bytes from this process into a block blob, committed once: the streaming sink (Put Block) and the
create-only commits (Put Block List, or a whole file, with ``If-None-Match: *``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError
from azure.storage.blob import BlobClient, ContainerClient, ContentSettings

from ... import conditional, gates
from ...errors import CommittedElsewhere, StorageFaultError
from ...storage_answers import TRANSPORT_FAULTS, classify, storage_fault
from ...usage import ContextExecutor
from . import attempt

logger = logging.getLogger(__name__)

#: Bytes of a streamed mosaic buffered before they are sent as one staged block.
#: 50,000 blocks (Azure's limit) of 8 MiB allow a 400 GiB mosaic.
STREAM_BLOCK_BYTES = 8 * 1024 * 1024
#: While it streams, an attempt asks this often (one HEAD) whether another attempt has committed
#: the mosaic meanwhile, and stops if so: a duplicate that started late wastes seconds, not a
#: whole assembly.
COMMITTED_ELSEWHERE_CHECK_S = 2.0
#: Staged blocks in flight at once. Memory of the stream: the buffer plus this many blocks.
STAGE_IN_FLIGHT = 2


def staging_fault(what: str, blob_name: str, exc: HttpResponseError) -> StorageFaultError:
    """The error for a Put Block (or Put Block From URL) that storage refused.

    409 ``BlockCountExceedsLimit``: the blob holds the 100,000 uncommitted blocks it may (Put
    Block, remarks), left by earlier attempts. No retry can succeed before the service drops them,
    a week after the last block staged, and nothing but a commit removes them sooner, so it is not
    retryable and says so. Anything else follows its status (a 5xx is retried).
    """
    answer = classify(exc)
    if (answer.status, answer.code) == (409, "BlockCountExceedsLimit"):
        return storage_fault(
            f"{what} {blob_name} was refused: the blob holds the 100,000 uncommitted blocks Azure allows, "
            "staged by earlier attempts that did not commit; the service drops them a week after the last "
            "block staged, and the job can be delivered again then",
            answer,
        )
    return storage_fault(f"{what} {blob_name} failed: {exc}", answer)


class CommitWatch:
    """Asks ``committed_elsewhere`` at most every ``every_s`` seconds whether another attempt has
    committed ``blob_name``, and stops this one with :class:`~tilecommit.errors.CommittedElsewhere` when it has."""

    def __init__(self, blob_name: str, committed_elsewhere: Callable[[], bool] | None, every_s: float):
        self.blob_name = blob_name
        self.committed_elsewhere = committed_elsewhere
        self.every_s = every_s
        self._checked_at: float | None = None

    def check(self) -> None:
        if self.committed_elsewhere is None:
            return
        now = time.monotonic()
        if self._checked_at is not None and now - self._checked_at < self.every_s:
            return
        self._checked_at = now
        if self.committed_elsewhere():
            raise CommittedElsewhere(f"{self.blob_name} was committed by another attempt")


class StagedBlockSink:
    """A write-only file that streams into a block blob: every ``block_bytes`` become one Put Block.

    :meth:`close` stages the tail and waits for every block, returning the ids for
    :func:`commit_staged_blob`. Nothing is visible in the container until that commit: staged
    blocks are uncommitted (the service drops them after a week, or when the blob is committed
    from another list). Put Block carries no condition, and no claim keeps a second attempt
    from streaming into the same blob at the same time: each sink stages under ids of its own
    (:func:`attempt.block_id`, a random tag per sink), so the list it commits names only blocks
    it staged, and the create-only commit lets one list through.

    ``committed_elsewhere`` (a callable, asked at most every ``check_every_s`` seconds before a
    block is staged, the first time before the first block) ends the stream with
    :class:`~tilecommit.errors.CommittedElsewhere` when it answers True.

    Memory: ``in_flight + 1`` buffers of ``block_bytes``, allocated once and reused (one being
    filled, the others being sent; a block is sent from its buffer without a copy). Allocating a
    new 8 MiB object per block instead cost about 30 MB more peak RSS at 4096², which glibc kept
    after freeing.
    """

    def __init__(
        self,
        blob: BlobClient,
        *,
        block_bytes: int | None = None,
        in_flight: int | None = None,
        committed_elsewhere: Callable[[], bool] | None = None,
        check_every_s: float | None = None,
    ):
        self.blob = blob
        self.block_bytes = int(block_bytes or STREAM_BLOCK_BYTES)
        self.in_flight = int(in_flight or STAGE_IN_FLIGHT)
        if self.block_bytes <= 0 or self.in_flight <= 0:
            raise ValueError("block_bytes and in_flight must be positive")
        self.tag = attempt.new_attempt_tag()
        self._watch = CommitWatch(
            blob.blob_name, committed_elsewhere, COMMITTED_ELSEWHERE_CHECK_S if check_every_s is None else check_every_s
        )
        self.nbytes = 0
        self.block_ids: list[str] = []
        self._free: list[bytearray] = []
        self._allocated = 0
        self._current: bytearray | None = None
        self._fill = 0
        self._pending: deque[tuple[Future, bytearray]] = deque()
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False

    def write(self, data: bytes) -> int:
        if self._closed:
            raise ValueError("write to a closed StagedBlockSink")
        with memoryview(data) as view:
            length, position = view.nbytes, 0
            while position < length:
                if self._current is None:
                    self._current, self._fill = self._take_buffer(), 0
                take = min(self.block_bytes - self._fill, length - position)
                self._current[self._fill : self._fill + take] = view[position : position + take]
                self._fill += take
                position += take
                if self._fill == self.block_bytes:
                    self._stage(self._current, self._fill)
                    self._current = None
        self.nbytes += length
        return length

    def _wait_oldest(self) -> None:
        future, buffer = self._pending.popleft()
        try:
            future.result()  # raises that block's fault, if any
        finally:
            self._free.append(buffer)

    def _take_buffer(self) -> bytearray:
        if not self._free and self._allocated <= self.in_flight:
            self._allocated += 1
            return bytearray(self.block_bytes)
        while not self._free:
            self._wait_oldest()
        return self._free.pop()

    def _stage(self, buffer: bytearray, length: int) -> None:
        self._watch.check()
        while len(self._pending) >= self.in_flight:
            self._wait_oldest()
        if self._executor is None:
            self._executor = ContextExecutor(max_workers=self.in_flight, thread_name_prefix="stageblock")
        index = len(self.block_ids)
        self.block_ids.append(attempt.block_id(self.tag, index))
        # The buffer is not written again until this future is done (_wait_oldest frees it).
        self._pending.append((self._executor.submit(self._put_block, index, memoryview(buffer)[:length]), buffer))

    def _put_block(self, index: int, chunk: memoryview) -> None:
        name = self.blob.blob_name
        for _ in range(conditional.UNKNOWN_OUTCOME_ATTEMPTS):
            try:
                # The SDK sends any buffer; its types say bytes. A view spares copying 8 MiB a block.
                self.blob.stage_block(attempt.block_id(self.tag, index), chunk, length=chunk.nbytes)  # type: ignore[arg-type]
                return
            except HttpResponseError as exc:
                raise staging_fault(f"staging block {index} ({chunk.nbytes} bytes) of", name, exc) from exc
            except TRANSPORT_FAULTS as exc:
                # Staging our own id with the same bytes again is harmless: the later one replaces it.
                logger.warning("staging block %d of %s had no answer (%s): staging it again", index, name, exc)
        raise storage_fault(
            f"staging block {index} of {name}: no answer after {conditional.UNKNOWN_OUTCOME_ATTEMPTS} attempts"
        )

    def close(self) -> list[str]:
        """Stage what is buffered, wait for every block, and return the block ids in order."""
        if not self._closed:
            try:
                if self._current is not None and self._fill:
                    self._stage(self._current, self._fill)
                    self._current = None
                while self._pending:
                    self._wait_oldest()
            except BaseException:
                self.abort()
                raise
            self._closed = True
            if self._executor is not None:
                self._executor.shutdown(wait=True)
            self._free.clear()
        return list(self.block_ids)

    def abort(self) -> None:
        """Give up: cancel blocks not yet sent, wait for those being sent, drop the buffers."""
        self._closed = True
        for future, _ in self._pending:
            future.cancel()
        self._pending.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
        self._current = None
        self._free.clear()


def commit_staged_blob(
    container: ContainerClient,
    name: str,
    block_ids: list[str],
    *,
    sha256: str,
    content_type: str,
    job_id: str = "",
    metadata: dict[str, str] | None = None,
    evidence: tuple[str, str] | None = None,
    expect_etag: str | None = None,
) -> gates.Outcome:
    """Commit staged blocks as ``name`` only if nothing holds the key: Put Block List, ``If-None-Match: *``.

    The same outcomes and evidence as :func:`gates.commit_blob`: ``WRITTEN`` when this request
    created the blob; ``ALREADY_PRESENT`` on 409/412 (the stored sha256 is compared with ours; a
    difference is logged at WARNING and counted); a transport fault with an unknown outcome is
    resolved from the stored sha256 (ours: ``WRITTEN``; absent: the same conditional commit again,
    the blocks are still staged). The sha256 and ``metadata`` go into the blob in the same request.
    ``evidence`` (metadata key, value) replaces the sha256 as that evidence: a mosaic the service
    copied is known by its plan's digest, since no one hashes its bytes.

    The condition is ``match_condition=MatchConditions.IfMissing`` alone: the SDK turns it into
    ``If-None-Match: *``. Adding ``etag="*"`` (the upload_blob trap of docs/design.md, 'Storage semantics') leaves
    ``etag`` among the keyword arguments the SDK hands to its transport, which raises TypeError
    (azure-storage-blob 12.31.1, ``_get_match_headers`` pops ``etag`` only for IfNotModified/IfModified).

    ``expect_etag`` (a rebuild): replace exactly that version instead, ``If-Match`` on the same
    one Put Block List (:func:`gates.replace_once`: ``SUPERSEDED`` when something newer landed).
    """
    key, digest = evidence or (gates.SHA256_METADATA_KEY, sha256)
    blob = container.get_blob_client(name)
    write_id = conditional.new_write_id()
    condition = (
        {"match_condition": MatchConditions.IfMissing}
        if expect_etag is None
        else {"etag": expect_etag, "match_condition": MatchConditions.IfNotModified}
    )

    def commit() -> None:
        blob.commit_block_list(
            block_ids,  # type: ignore[arg-type]  # the SDK takes block ids as strings too (the latest block of each)
            content_settings=ContentSettings(content_type=content_type),
            metadata={**(metadata or {}), key: digest, conditional.WRITE_ID_KEY: write_id},
            **condition,
        )

    if expect_etag is not None:
        return gates.replace_once(
            blob, commit, expect_etag=expect_etag, digest=digest, write_id=write_id, job_id=job_id, digest_key=key
        )
    return gates.create_once(blob, commit, digest=digest, write_id=write_id, job_id=job_id, digest_key=key)


def commit_file(
    container: ContainerClient,
    name: str,
    path: str,
    *,
    sha256: str,
    content_type: str,
    job_id: str,
    metadata: dict[str, str] | None = None,
    expect_etag: str | None = None,
) -> gates.Outcome:
    """Create ``name`` from the file at ``path`` only if nothing holds the key (If-None-Match: *).

    The file is staged as blocks under this attempt's own ids (:class:`StagedBlockSink`), and the
    condition rides on the one Put Block List (:func:`commit_staged_blob`). Not the SDK's
    ``upload_blob``: above 64 MiB it stages blocks under ids of its own length, and the service
    refuses a block whose id length differs from the blob's other blocks' (400 InvalidBlobOrBlock,
    Put Block's ``blockid``), so one attempt through it could keep every other path to the same
    mosaic from staging for the week the service keeps uncommitted blocks.
    ``expect_etag`` (a rebuild): replace exactly that version instead (If-Match, same request).
    """
    sink = StagedBlockSink(container.get_blob_client(name))
    try:
        with open(path, "rb") as body:
            for chunk in iter(lambda: body.read(sink.block_bytes), b""):
                sink.write(chunk)
        block_ids = sink.close()
    except BaseException:
        sink.abort()
        raise
    return commit_staged_blob(
        container,
        name,
        block_ids,
        sha256=sha256,
        content_type=content_type,
        job_id=job_id,
        metadata=metadata,
        expect_etag=expect_etag,
    )
