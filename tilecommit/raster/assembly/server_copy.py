"""Server-side assembly: the storage service stages the mosaic from byte ranges of the tiles.

Each :class:`copy_plan.CopyRange` is one Put Block From URL (``x-ms-copy-source`` the tile's URL,
``x-ms-source-range``), conditioned on the tile version its manifest row recorded
(``x-ms-source-if-match``): a tile replaced since then answers 412 and the assembly fails naming
the window, before anything is committed. The head and the coarse levels are ordinary Put
Blocks from this process. The caller commits the list once, create-only.

Block ids (:mod:`.attempt`): the plan's ranges, in file order, are blocks ``0 .. N-1`` under the
range tag; the local blocks follow as ``N ..`` under the stager's own random tag. The range tag
is a pure function of the ranges and the tile versions they are pinned to (:func:`ranges_tag`),
so a range's id names one (tile version, offset, length): staging it again, from any execution
of any attempt, in one activity or in shares (:mod:`.shares`), stages the same bytes under the
same id, in place of the earlier copy. A blob keeps at most 100,000 uncommitted blocks, and a
large mosaic's ranges are thousands, so attempts that each staged their own would run out after
a few. The local blocks keep a tag of each committing execution, since their bytes come from
this process (another GDAL build could make other bytes).

How the service may read the tiles (:func:`copy_source_for`), from the credential the tiles'
client already has:

- an account key (the local development account): a blob SAS, read-only, valid for
  :data:`SAS_LIFETIME`, signed locally for each tile;
- a token credential (the managed identity in Azure): OAuth copy-source authorisation, the
  identity's bearer token in ``x-ms-copy-source-authorization``. The identity needs read access
  to the tiles, which its Storage Blob Data role on the account gives; no key, no SAS.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from datetime import UTC, datetime, timedelta

from azure.core.exceptions import HttpResponseError
from azure.storage.blob import BlobClient, BlobSasPermissions, ContainerClient, generate_blob_sas

# Private import, on purpose: the public stage_block_from_url has no keyword for the source's
# If-Match, but hands ``source_modified_access_conditions`` to the generated layer, whose model
# lives only here (azure-storage-blob 12.x). It is the one way to send x-ms-source-if-match.
from azure.storage.blob._generated.models import SourceModifiedAccessConditions

from ... import conditional, jobs
from ...errors import ConfigurationError, CopyFromUrlUnsupported
from ...storage_answers import TRANSPORT_FAULTS, Meaning, classify, storage_fault
from ...usage import ContextExecutor
from .. import tiff
from . import attempt
from .block_sources import tile_not_as_recorded
from .copy_plan import LOCAL_BLOCK_BYTES, CopyPlan, CopyRange, LocalRun
from .staging import COMMITTED_ELSEWHERE_CHECK_S, CommitWatch, staging_fault

logger = logging.getLogger(__name__)


#: How long a tile's SAS stays valid: longer than one assembly may run (the 10-minute limit).
SAS_LIFETIME = timedelta(minutes=30)
#: The scope of a token for Azure Storage (the copy source is read with it).
STORAGE_SCOPE = "https://storage.azure.com/.default"
#: A bearer token is fetched again when it has less than this left.
TOKEN_MARGIN_S = 300
#: Put Block (From URL) requests in flight at once, within the client's pool of connections
#: (tilecommit.storage.STORAGE_CONNECTIONS). The service moves the bytes, so these wait on the
#: service, not on this process's network; locally more in flight was no faster (Azurite copies
#: on one thread: docs/benchmarks.md).
COPY_IN_FLIGHT = 8


class SasCopySource:
    """The tile's URL with a short-lived, read-only blob SAS signed with the account key."""

    def __init__(self, account_name: str, account_key: str, lifetime: timedelta = SAS_LIFETIME):
        self.account_name = account_name
        self.account_key = account_key
        self.lifetime = lifetime

    def authorise(self, blob: BlobClient) -> tuple[str, dict]:
        now = datetime.now(UTC)
        sas = generate_blob_sas(
            self.account_name,
            blob.container_name,
            blob.blob_name,
            account_key=self.account_key,
            permission=BlobSasPermissions(read=True),
            start=now - timedelta(minutes=5),  # clock skew between this host and the service
            expiry=now + self.lifetime,
        )
        return f"{blob.url}?{sas}", {}


class BearerCopySource:
    """The tile's plain URL, read by the service with this identity's token (OAuth source authorisation)."""

    def __init__(self, credential):
        self.credential = credential
        self._token = None

    def authorise(self, blob: BlobClient) -> tuple[str, dict]:
        if self._token is None or self._token.expires_on - time.time() < TOKEN_MARGIN_S:
            self._token = self.credential.get_token(STORAGE_SCOPE)
        return blob.url, {"source_authorization": f"Bearer {self._token.token}"}


def copy_source_for(container: ContainerClient):
    """The copy-source authorisation for tiles read through ``container``'s own credential."""
    credential = container.credential
    key = getattr(credential, "account_key", None)
    if key:
        return SasCopySource(credential.account_name, key)
    if hasattr(credential, "get_token"):
        return BearerCopySource(credential)
    raise ConfigurationError(
        "the tiles' client has neither an account key nor a token credential: the storage service "
        "cannot be authorised to read the tiles for the server-side copy"
    )


def ranges_tag(job_id: str, ranges: list[CopyRange], versions: dict[str, str | None]) -> str:
    """The block-id tag of a plan's copied ranges: a pure function of the job, each range (its
    tile, offset and length, in file order) and the tile version it is pinned to."""
    return attempt.content_tag(
        job_id, *(f"{r.source} {versions.get(r.source) or ''} {r.offset} {r.length}" for r in ranges)
    )


class ServerSideStager:
    """Stages a :class:`CopyPlan` into ``blob``; returns the block ids in file order for one commit.

    ``uris`` and ``etags`` map a range's source (a window id) to its tile blob and the ETag its
    manifest row recorded; ``read_local(ref)`` returns a local block's bytes (the coarse levels).
    ``range_tag`` (:func:`ranges_tag` of the whole plan's ranges) names the ranges' blocks. ``committed_elsewhere``
    is asked at most every ``check_every_s`` seconds: when another attempt has committed the
    mosaic meanwhile, staging stops with :class:`~tilecommit.errors.CommittedElsewhere`.
    """

    def __init__(
        self,
        blob: BlobClient,
        tiles: ContainerClient,
        *,
        uris: dict[str, str],
        etags: dict[str, str | None],
        copy_source,
        read_local: Callable[[tiff.BlockRef], bytes],
        leaders: bool,
        trailers: bool,
        committed_elsewhere: Callable[[], bool] | None = None,
        check_every_s: float = COMMITTED_ELSEWHERE_CHECK_S,
        in_flight: int = COPY_IN_FLIGHT,
        range_tag: str,
        local_block_bytes: int = LOCAL_BLOCK_BYTES,
    ):
        self.blob = blob
        self.tiles = tiles
        self.uris = uris
        self.etags = etags
        self.copy_source = copy_source
        self.read_local = read_local
        self.leaders = leaders
        self.trailers = trailers
        self._watch = CommitWatch(blob.blob_name, committed_elsewhere, check_every_s)
        self.in_flight = in_flight
        self.local_block_bytes = local_block_bytes
        self.tag = attempt.new_attempt_tag()
        self.range_tag = range_tag
        self.local_bytes_sent = 0
        self.ranges_staged = 0

    # ------------------------------------------------------------------ pieces to requests

    def _local_chunks(self, run: LocalRun) -> Iterator[bytes]:
        buffer = bytearray(run.data)
        for ref in run.blocks:
            data = self.read_local(ref)
            if len(data) != ref.length:
                raise storage_fault(f"local block at {ref.offset} has {len(data)} bytes, not {ref.length}")
            if self.leaders:
                buffer += ref.length.to_bytes(4, "little")  # GDAL writes the leader little-endian
            buffer += data
            if self.trailers:
                buffer += (b"\0\0\0\0" + data)[-4:]
            while len(buffer) >= self.local_block_bytes:
                yield bytes(buffer[: self.local_block_bytes])
                del buffer[: self.local_block_bytes]
        if buffer:
            yield bytes(buffer)

    def range_id(self, index: int) -> str:
        """The block id of the plan's ``index``-th range (in file order)."""
        return attempt.block_id(self.range_tag, index)

    def _range_requests(self, ranges: list[CopyRange], first: int) -> Iterator[tuple[str, Callable[[str], None], str]]:
        for index, piece in enumerate(ranges, start=first):
            yield (
                self.range_id(index),
                functools.partial(self._copy_range, piece=piece),
                (f"range of {piece.source}"),
            )

    def _plan_requests(
        self, plan: CopyPlan, order: list[str], *, ranges_staged: bool
    ) -> Iterator[tuple[str, Callable[[str], None], str]]:
        """The plan's requests; appends every block id to ``order`` in file order as it goes."""
        ranges = 0
        local = sum(isinstance(p, CopyRange) for p in plan.pieces)  # local blocks follow the range ids
        for piece in plan.pieces:
            if isinstance(piece, CopyRange):
                order.append(self.range_id(ranges))
                if not ranges_staged:
                    yield from self._range_requests([piece], ranges)
                ranges += 1
                continue
            for chunk in self._local_chunks(piece):
                order.append(attempt.block_id(self.tag, local))
                local += 1
                yield order[-1], functools.partial(self._put_local, chunk=chunk), "local bytes"

    def _copy_range(self, block_id: str, piece: CopyRange) -> None:
        tile = self.tiles.get_blob_client(self.uris[piece.source])
        url, auth = self.copy_source.authorise(tile)
        etag = self.etags.get(piece.source)
        conditions = SourceModifiedAccessConditions(source_if_match=etag) if etag else None
        try:
            self.blob.stage_block_from_url(
                block_id,
                url,
                source_offset=piece.offset,
                source_length=piece.length,
                source_modified_access_conditions=conditions,
                **auth,
            )
        except HttpResponseError as exc:
            raise self._copy_fault(piece, etag, exc) from exc
        self.ranges_staged += 1

    def _copy_fault(self, piece: CopyRange, etag: str | None, exc: HttpResponseError) -> Exception:
        """What a refused Put Block From URL means, by its status (:func:`~tilecommit.storage_answers.classify`:
        the service wraps what went wrong with the source in the code ``CannotVerifyCopySource``
        whatever it was, and says which by the status: Put Block From URL's error codes).

        - 412 (``SourceConditionNotMet``): the tile is not the version its manifest row
          recorded: the window must be rendered again;
        - 404: the tile is gone;
        - 5xx, 408, 429: the source could not be read or verified in time, as when the tiles'
          account is throttled while many shares copy at once; the tile is intact and the copy is
          retried, as any storage fault;
        - 501: the service has no Put Block From URL (an emulator).
        """
        answer = classify(exc)
        said = answer.code or answer.status
        uri = self.uris[piece.source]
        if answer.meaning is Meaning.UNSUPPORTED:
            return CopyFromUrlUnsupported(f"Put Block From URL: {exc.reason}")
        remedy = (
            "Run the job again: the reduction tree computes the intermediate again and repairs it"
            if jobs.is_level_row_key(piece.source)
            else "Render the window again (delete its tile and manifest row) and re-run"
        )
        refused = tile_not_as_recorded(
            answer,
            piece.source,
            uri,
            replaced=f"(recorded ETag {etag}; the service refused to copy from it: {said}); nothing was committed. "
            + remedy,
            missing=f"is gone ({said}); nothing was committed",
        )
        if refused is not None:
            return refused
        return staging_fault(f"staging {piece.length} bytes of {uri} into", self.blob.blob_name, exc)

    def _put_local(self, block_id: str, chunk: bytes) -> None:
        try:
            self.blob.stage_block(block_id, chunk, length=len(chunk))
        except HttpResponseError as exc:
            raise staging_fault(f"staging {len(chunk)} bytes of", self.blob.blob_name, exc) from exc
        self.local_bytes_sent += len(chunk)

    def _send(self, block_id: str, request: Callable[[str], None], what: str) -> None:
        for _ in range(conditional.UNKNOWN_OUTCOME_ATTEMPTS):
            try:
                request(block_id)
                return
            except TRANSPORT_FAULTS as exc:
                # Staging an id again with the same bytes is harmless: the later one replaces it.
                logger.warning(
                    "block %s of %s (%s) had no answer (%s): staging it again", block_id, self.blob.blob_name, what, exc
                )
        raise storage_fault(
            f"staging block {block_id} of {self.blob.blob_name}: no answer after {conditional.UNKNOWN_OUTCOME_ATTEMPTS} attempts"
        )

    def _run(self, requests: Iterator[tuple[str, Callable[[str], None], str]]) -> None:
        """Send the requests, at most ``in_flight`` at once, as the iterator makes them."""
        pending: deque[Future] = deque()
        with ContextExecutor(max_workers=self.in_flight, thread_name_prefix="copyblock") as executor:
            try:
                for block_id, request, what in requests:
                    self._watch.check()
                    while len(pending) >= self.in_flight:
                        pending.popleft().result()
                    pending.append(executor.submit(self._send, block_id, request, what))
                while pending:
                    pending.popleft().result()
            except BaseException:
                for future in pending:
                    future.cancel()
                raise

    def stage(self, plan: CopyPlan, *, ranges_staged: bool = False) -> list[str]:
        """Stage the plan's blocks; the ids of all of them in file order. ``ranges_staged``: the
        ranges were staged already under ``range_tag`` (:meth:`stage_ranges`): only the local
        blocks are sent."""
        order: list[str] = []
        self._run(self._plan_requests(plan, order, ranges_staged=ranges_staged))
        return order

    def stage_ranges(self, ranges: list[CopyRange], first: int = 0) -> list[str]:
        """Stage a share: ``ranges`` are the plan's ranges ``first, first + 1, ...``; their ids."""
        self._run(self._range_requests(ranges, first))
        return [self.range_id(i) for i in range(first, first + len(ranges))]


__all__ = [
    "BearerCopySource",
    "ranges_tag",
    "SasCopySource",
    "ServerSideStager",
    "copy_source_for",
]
