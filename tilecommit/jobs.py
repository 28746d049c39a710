"""Jobs: the payload every step of one reads (:class:`Job`), its identity and its output keys,
pure functions with no uuid, clock, host or attempt in them.

The same upload (URL + ETag) made to the same output spec (window size, block size, profile)
always maps to the same job id, and a job's tile keys are a pure function of that id and the
window; that is what lets storage refuse the second copy.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from .errors import BadInputError, InvalidNameError
from .grid import Window
from .records import Record, unreadable
from .settings import DEFAULT_ASSEMBLY_SHARE_MB, Settings
from .spec import OutputSpec

_JOB_ID = re.compile(r"[0-9a-f]{16}")
#: Azure's limit for a blob name, in characters (1024) when URL-decoded.
MAX_BLOB_NAME_CHARS = 1024


def normalise_blob_url(blob_url: str) -> str:
    """Canonical form of a blob URL: what two deliveries of the same blob have in common.

    Scheme and host are lower-cased, the default port dropped, the query (SAS tokens, snapshot
    parameters added by a client) and fragment removed, and the path percent-decoded then
    re-encoded one canonical way, so ``a%20b.tif`` and ``a b.tif`` are the same blob.
    Unicode is NFC-normalised: the service stores the name as UTF-8 of what it received, and
    Event Grid and the SDK both send NFC.
    """
    if not isinstance(blob_url, str) or not blob_url.strip():
        raise InvalidNameError("blob URL is empty")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in blob_url):
        raise InvalidNameError(f"blob URL contains control characters: {blob_url!r}")
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in blob_url):
        raise InvalidNameError(f"blob URL contains unpaired surrogates: {blob_url!r}")
    # Not stripped: a trailing space is part of the blob's name (urlsplit drops leading spaces).
    try:
        parts = urlsplit(blob_url)
        port = parts.port
    except ValueError as exc:  # bad port, unbalanced IPv6 brackets
        raise InvalidNameError(f"not a valid blob URL ({exc}): {blob_url!r}") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise InvalidNameError(f"not an http(s) blob URL: {blob_url!r}")
    host = parts.hostname.lower()
    if (
        port
        and not (parts.scheme.lower() == "https" and port == 443)
        and not (parts.scheme.lower() == "http" and port == 80)
    ):
        host = f"{host}:{port}"
    path = unicodedata.normalize("NFC", unquote(parts.path))
    # Empty segments are kept: "a//b" and "a/b" are two different blobs.
    segments = path[1:].split("/") if path.startswith("/") else path.split("/")
    # Azurite and other emulators put the account in the path: http://127.0.0.1:10000/acct/container/blob
    if len(segments) < 2 or not segments[0] or not "".join(segments[1:]):
        raise InvalidNameError(f"blob URL names no container and blob: {blob_url!r}")
    canonical_path = "/" + "/".join(quote(s, safe="") for s in segments)
    return urlunsplit((parts.scheme.lower(), host, canonical_path, "", ""))


def normalise_etag(etag: str) -> str:
    """An ETag without its quotes or weak marker (``"0x8D..."`` -> ``0x8D...``)."""
    if not isinstance(etag, str):
        raise InvalidNameError(f"ETag must be text, got {type(etag).__name__}")
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in etag):
        raise InvalidNameError(f"ETag contains unpaired surrogates: {etag!r}")
    value = etag.strip()
    if value.startswith("W/"):
        value = value[2:]
    value = value.strip('"').strip()
    if not value:
        raise InvalidNameError("ETag is empty: the job id needs the version of the upload")
    return value


def job_id_for(blob_url: str, etag: str, spec: OutputSpec, members: Sequence[tuple[str, str | None]] = ()) -> str:
    """Deterministic job id: 16 lowercase hex characters from the normalised URL, the ETag and
    the output spec, and, for a scene document, every member's URL and ETag (None: missing).

    Same inputs, same id; a new ETag (the blob, or a member, was overwritten) or another spec
    (another window size: another grid of tiles) gives a new job, whose tiles and manifest rows are
    its own. A single file's material is what it was before documents existed (no member lines), so
    its id is unchanged. The id is a valid Durable instance id, table key and blob-name segment
    whatever the upload was called.
    """
    if not isinstance(spec, OutputSpec):
        raise TypeError(f"spec must be an OutputSpec, got {type(spec).__name__}")
    material = f"{normalise_blob_url(blob_url)}\n{normalise_etag(etag)}\n{spec.canonical()}"
    for url, member_etag in members:
        # "-" for a member missing when the job started: no ETag is empty or "-" (normalise_etag).
        material += f"\nmember {normalise_blob_url(url)}\n{normalise_etag(member_etag) if member_etag else '-'}"
    return hashlib.sha256(material.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class SceneMember(Record):
    """A band file a scene document names: its blob name, URL and the version every read of it is
    pinned to (None: it did not exist when the job started, which then fails naming it)."""

    blob: str
    url: str
    etag: str | None


def _members_in(values: Sequence[Mapping[str, Any]] | None) -> tuple[SceneMember, ...] | None:
    return None if values is None else tuple(SceneMember.from_dict(v) for v in values)


@dataclass(frozen=True)
class Job(Record):
    """One job: the upload version it is made from and what it is made to, as the starter fixed
    them when it started the job (:meth:`for_upload`).

    The orchestrations carry it as :meth:`to_dict` (the payload, kept in their Durable history)
    and every activity reads it back with :meth:`from_dict`; nothing a job's outputs depend on is
    read from the app settings once it has started. The payload's shape is stored state: fields
    are never renamed or reordered, and an optional one is left out of the payload while it is
    None, so that payloads made before it existed read back, and write, as they were.
    """

    job_id: str
    #: The upload's blob name, its URL and the version (ETag, unquoted) every read of it is pinned to.
    blob: str
    url: str
    etag: str
    size: int
    spec: OutputSpec
    #: Windows per batch orchestration.
    batch_size: int
    #: Bytes of copied ranges per share of the mosaic's split staging; None in payloads made
    #: before the split staging existed (:attr:`share_bytes` then gives the default).
    assembly_share_bytes: int | None = None
    #: Why the upload's metadata names a profile this build cannot make; the job then fails at
    #: once saying so (its validation raises it before the upload is read).
    profile_error: str | None = None
    #: The collection the job's item joins once its mosaic is assembled (tilecommit/catalog/naming.py).
    #: None in payloads made before collections existed: such a job was started by a release whose
    #: orchestration announced the job right after its assembly, and its Durable history replays
    #: only if it still does, so it completes as it did then, in no collection. Not part of the job
    #: id: the item and the mosaic do not name their collection (membership lives in the
    #: collection's own documents), so the same upload version is the same outputs whichever
    #: collection lists them, and jobs made before collections verify as they did.
    collection: str | None = None
    #: Why the upload's metadata names no valid collection; the job then fails at once saying so.
    collection_error: str | None = None
    #: A scene document's members, in its order (:mod:`tilecommit.scene_documents`); None for a single file.
    members: tuple[SceneMember, ...] | None = None
    #: True when the instance that started the job had a pgstac catalog configured: the job then
    #: publishes its item (tilecommit/catalog/pgstac.py) before its completion event. None (left
    #: out of the payload) otherwise, and in payloads made before publication existed, whose
    #: orchestrations so replay as they ran.
    publish: bool | None = None
    #: Levels each node of the mosaic's coarse-level reduction tree computes
    #: (tilecommit/raster/assembly/reduction.py); None (left out of the payload, as in payloads
    #: made before the tree existed): the commit computes the coarse levels itself, as it did.
    coarse_levels_per_node: int | None = None
    #: True: the tree's intermediates are copied into the mosaic by the storage service, pinned to
    #: the ETags their rows recorded, and the commit reads only the heads the tree carries up
    #: (tilecommit/raster/assembly/coarse_levels.py). None (left out of the payload, as in payloads
    #: made before): the commit reads every intermediate whole and stages their blocks itself, so
    #: a job planned in shares by an earlier release commits the ranges it planned.
    coarse_levels_copied: bool | None = None

    JSON_IN = {"spec": OutputSpec.from_dict, "members": _members_in}

    @property
    def share_bytes(self) -> int:
        return self.assembly_share_bytes if self.assembly_share_bytes is not None else DEFAULT_SHARE_BYTES

    def to_dict(self) -> dict:
        data = {**super().to_dict(), "spec": self.spec.to_dict()}
        return {k: v for k, v in data.items() if v is not None or k not in _OPTIONAL}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """The job of a payload the starter made; unknown keys are ignored.

        A payload from before the spec was part of it carries only ``window_size``: its tiles were
        made with the default block size and profile, which is the spec it gets (and the form it
        is written in from then on).
        """
        if isinstance(data, Mapping) and "spec" not in data:
            if "window_size" not in data:
                raise unreadable(cls, data, KeyError("spec"))
            data = {**data, "spec": {"window_size": data["window_size"]}}
        return super().from_dict(data)

    @classmethod
    def for_upload(
        cls,
        name: str,
        url: str,
        etag: str,
        size: int,
        settings: Settings,
        metadata: dict[str, str] | None = None,
        members: Sequence[SceneMember] | None = None,
    ) -> Job:
        """The job started now for one upload version: its id, its source and its output spec.

        The spec comes from ``settings`` (the instance that starts the job) and from the upload's
        blob ``metadata`` (its profile, tilecommit/profiles.py), and is then the job's: a change of
        the app settings while the job runs cannot give it tiles of two grids or two encodings. Metadata
        naming a profile this build cannot make still gives a job, with the settings' spec and the
        reason in ``profile_error``: the user finds it where they find every job's, not in the
        host's log alone. The collection is chosen alike (``collection``, ``collection_error``).
        ``members``: a scene document's, as the starter found them (their ETags).
        """
        spec, profile_error = OutputSpec.started_for(settings, name, metadata)
        try:
            collection, collection_error = settings.collection_for(name, metadata), None
        except BadInputError as exc:
            collection, collection_error = settings.collection, str(exc)
        listed = [(m.url, m.etag) for m in members or ()]
        return cls(
            job_id=job_id_for(url, etag, spec, listed),
            blob=name,
            url=url,
            etag=etag.strip('"'),
            size=size,
            spec=spec,
            batch_size=settings.batch_size,
            assembly_share_bytes=settings.assembly_share_mb * 2**20,
            profile_error=profile_error or None,
            collection=collection,
            collection_error=collection_error,
            members=None if members is None else tuple(_unquoted(m) for m in members),
            publish=True if settings.publishes else None,
            coarse_levels_per_node=COARSE_LEVELS_PER_NODE,
            coarse_levels_copied=True,
        )


def _unquoted(member: SceneMember) -> SceneMember:
    return SceneMember(member.blob, member.url, member.etag.strip('"') if member.etag else None)


#: The fields a payload carries only when they are set.
_OPTIONAL = (
    "assembly_share_bytes",
    "profile_error",
    "collection",
    "collection_error",
    "members",
    "publish",
    "coarse_levels_per_node",
    "coarse_levels_copied",
)
#: Levels a node of the coarse-level reduction tree computes in the jobs started now: its region
#: is 4 x 4 blocks of the level it reads, one block of each of its 16 children.
COARSE_LEVELS_PER_NODE = 2
#: The share size of a job whose payload names none.
DEFAULT_SHARE_BYTES = DEFAULT_ASSEMBLY_SHARE_MB * 2**20


def check_job_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):  # not match: '$' allows a final newline
        raise InvalidNameError(f"not a job id: {job_id!r} (expected 16 lowercase hex characters)")
    return job_id


#: The manifest row that marks a job cancelled, in the job's own partition so a tile's one
#: lookup sees it. Window ids are digits and ``_``; ``~`` sorts after all of them, so
#: ``RowKey lt '~'`` is every window row and nothing else.
CANCELLED_ROW_KEY = "~cancelled"
WINDOW_ROWS_FILTER = "RowKey lt '~'"


def tile_blob_name(job_id: str, window: Window) -> str:
    """``tiles/{job_id}/{row:04d}_{col:04d}.tif``: a pure function of the job id and the window."""
    check_job_id(job_id)
    if window.row < 0 or window.col < 0:
        raise InvalidNameError(f"window grid position must be non-negative, got {window.row},{window.col}")
    return f"tiles/{job_id}/{window.id}.tif"


def mosaic_blob_name(job_id: str) -> str:
    return f"mosaics/{check_job_id(job_id)}/mosaic.tif"


def stac_blob_name(job_id: str) -> str:
    return f"mosaics/{check_job_id(job_id)}/item.json"


def quicklook_blob_name(job_id: str) -> str:
    return f"mosaics/{check_job_id(job_id)}/quicklook.png"


#: A block-id tag (tilecommit.raster.assembly.attempt): five characters of the URL-safe base64 alphabet.
BLOCK_TAG = r"[A-Za-z0-9_-]{5}"


def share_plan_blob_name(job_id: str, tag: str) -> str:
    """``plans/{job_id}/{tag}.json`` (tiles container): the mosaic's staging plan named by its ranges' tag."""
    if not re.fullmatch(BLOCK_TAG, tag):
        raise InvalidNameError(f"not a block tag: {tag!r}")
    return f"plans/{check_job_id(job_id)}/{tag}.json"


#: Manifest rows of the mosaic's coarse-level intermediates sort between the window rows and the
#: cancellation row: ``~L`` is after every window id and before ``~c``.
LEVEL_ROWS_FILTER = "RowKey ge '~L' and RowKey lt '~M'"


def level_row_key(level: int, row: int, col: int) -> str:
    """``~L{level:02d}_{row:04d}_{col:04d}``: the manifest row of the intermediate of the node
    (``row``, ``col``) of the reduction stage that reads level ``level`` (never a window id)."""
    if min(level, row, col) < 0:
        raise InvalidNameError(f"a level node's position must be non-negative, got {level},{row},{col}")
    return f"~L{level:02d}_{row:04d}_{col:04d}"


def is_level_row_key(key: str) -> bool:
    """Whether ``key`` names an intermediate's row (:func:`level_row_key`), not a window's."""
    return key.startswith("~L")


def level_blob_name(job_id: str, level: int, row: int, col: int) -> str:
    """``levels/{job_id}/L{level:02d}_{row:04d}_{col:04d}.tif`` (tiles container): that node's
    intermediate, a pure function of the job id, the level its stage reads and the node."""
    return f"levels/{check_job_id(job_id)}/{level_row_key(level, row, col)[1:]}.tif"


#: The gate a job's blob is written through, by the name the functions above give it.
_GATES = (
    (re.compile(r"^tiles/[0-9a-f]{16}/[^/]+\.tif$"), "tile"),
    (re.compile(r"^mosaics/[0-9a-f]{16}/mosaic\.tif$"), "mosaic"),
    (re.compile(r"^mosaics/[0-9a-f]{16}/item\.json$"), "stac"),
    (re.compile(r"^mosaics/[0-9a-f]{16}/quicklook\.png$"), "quicklook"),
    (re.compile(rf"^plans/[0-9a-f]{{16}}/{BLOCK_TAG}\.json$"), "plan"),
    (re.compile(r"^levels/[0-9a-f]{16}/L[0-9]{2}_[0-9]{4}_[0-9]{4}\.tif$"), "level"),
    (re.compile(r"^collections/[^/]+/collection\.json$"), "collection"),
    (re.compile(r"^collections/[^/]+/index/[0-9a-f]+\.json$"), "collection-index"),
)


def blob_gate(name: str) -> str:
    """``tile``, ``mosaic``, ``stac``, ``quicklook`` or ``plan`` for a job's blob, ``collection`` or
    ``collection-index`` for a collection's documents (tilecommit/catalog/documents.py), else ``blob``.

    The counters of refused writes are labelled with it, so the label follows from the key and
    no caller has to pass it along.
    """
    return next((gate for pattern, gate in _GATES if pattern.match(name)), "blob")


def check_upload_name(name: str) -> str:
    """Validate the name of an uploaded blob (data from outside, never a path).

    Returns the name unchanged when Azure could have stored it; raises :class:`InvalidNameError`
    saying what is wrong otherwise. ``..`` and spaces are legal in blob names and are kept: they
    never reach a filesystem path or a key, only the URL the job id is hashed from.
    """
    if not isinstance(name, str) or not name:
        raise InvalidNameError("blob name is empty")
    if len(name) > MAX_BLOB_NAME_CHARS:
        raise InvalidNameError(f"blob name is {len(name)} characters; Azure allows at most {MAX_BLOB_NAME_CHARS}")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name):
        raise InvalidNameError(f"blob name contains control characters: {name!r}")
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in name):
        raise InvalidNameError(f"blob name contains unpaired surrogates: {name!r}")
    if name.endswith(("/", ".")) or name.startswith("/"):
        raise InvalidNameError(f"blob name may not start with '/' or end with '/' or '.': {name!r}")
    return name
