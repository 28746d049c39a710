"""Scene documents: one upload naming the band files of a scene, stacked into one COG.

A scene document is a JSON object in one of two forms, told apart by its content:

- a STAC item (``"type": "Feature"`` with ``"assets"``): its members are the assets whose
  ``roles`` include ``"data"``, in the item's order; a band's name is the asset's first
  ``eo:bands`` entry's ``name`` (else the asset's key), its description that entry's
  ``description`` (else the asset's ``title``). The kernel is ``properties["tilecommit:resampling"]``.
- a list: ``{"tilecommit:scene": 1, "bands": [{"href", "name", "description"}, ...]}`` with an
  optional ``"resampling"``.

A member's ``href`` is a path relative to the document's folder in the same container: never a
URL (no ``:`` at all, so no scheme), an absolute path, a ``.`` or ``..`` segment, an empty
segment, a backslash, a ``%`` (no percent-encoding to undo), ``?`` or ``#``. The document names
nothing else that is read: other assets of a STAC item are ignored. A document larger than
:data:`MAX_DOCUMENT_BYTES` is refused before it is parsed, one naming more than
:data:`MAX_MEMBERS` members before any member is looked at.

Pure: bytes in, a :class:`SceneDocument` out; the starter and the reading room both parse with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .errors import InvalidNameError, UnsupportedRasterError
from .jobs import check_upload_name

#: Largest scene document read (bytes): a STAC item of a Sentinel-2 scene is about 30 KB.
MAX_DOCUMENT_BYTES = 256 * 1024
#: Most members one document may name (a Sentinel-2 L2A item has 13 band files).
MAX_MEMBERS = 64
#: Longest band name and description kept from a document (characters).
MAX_NAME_CHARS = 256
MAX_DESCRIPTION_CHARS = 1024
#: Kernels a document may choose for its coarser members; the first is the default, as
#: gdalbuildvrt's ``-r`` defaults to nearest.
RESAMPLING_KERNELS = ("nearest", "bilinear")
#: The list form's marker and version.
LIST_MARKER = "tilecommit:scene"
#: What a refusal says is accepted.
ACCEPTED = (
    f"accepted: a scene document of at most {MAX_DOCUMENT_BYTES} bytes (a STAC item whose data assets, or a "
    f'{{"{LIST_MARKER}": 1, "bands": [...]}} list whose bands, name 1 to {MAX_MEMBERS} band files by paths relative '
    "to the document in the same container)"
)
_FORBIDDEN = {":": "a colon (a URL scheme)", "\\": "a backslash", "%": "percent-encoding", "?": "a '?'", "#": "a '#'"}


@dataclass(frozen=True)
class Band:
    """One member: its blob name in the document's container, and the band's name and description."""

    blob: str
    name: str
    description: str


@dataclass(frozen=True)
class SceneDocument:
    bands: tuple[Band, ...]
    resampling: str


def looks_like_document(head: bytes) -> bool:
    """Whether a file starting with ``head`` is JSON (an object): a scene document, or refused as one."""
    return head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{")


def member_blob(document_blob: str, href: object) -> str:
    """The blob name ``href`` names, relative to the folder of ``document_blob``; refused unless
    it is a plain relative path (the module's rules)."""
    if not isinstance(href, str) or not href:
        raise UnsupportedRasterError(f"a member's href must be a non-empty path, got {href!r}; {ACCEPTED}")
    for char, what in _FORBIDDEN.items():
        if char in href:
            raise UnsupportedRasterError(
                f"member {href!r} contains {what}: a member is a blob beside the document, never a URL, another "
                f"container or account; {ACCEPTED}"
            )
    if href.startswith("/"):
        raise UnsupportedRasterError(f"member {href!r} is an absolute path; {ACCEPTED}")
    if any(segment in ("", ".", "..") for segment in href.split("/")):
        raise UnsupportedRasterError(f"member {href!r} has an empty, '.' or '..' segment; {ACCEPTED}")
    folder = document_blob.rpartition("/")[0]
    name = f"{folder}/{href}" if folder else href
    try:
        return check_upload_name(name)
    except InvalidNameError as exc:
        raise UnsupportedRasterError(f"member {href!r}: {exc}; {ACCEPTED}") from None


def _text(value: object, what: str, limit: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > limit or any(ord(ch) < 0x20 for ch in value):
        raise UnsupportedRasterError(f"{what} must be text of at most {limit} characters, got {value!r:.80}")
    return value


def _stac_bands(item: dict) -> tuple[list[tuple[object, object, object]], object]:
    assets = item.get("assets")
    if not isinstance(assets, dict):
        raise UnsupportedRasterError(f"the STAC item has no assets object; {ACCEPTED}")
    bands = []
    for key, asset in assets.items():
        if not isinstance(asset, dict) or "data" not in (asset.get("roles") or []):
            continue
        eo = asset.get("eo:bands")
        first = eo[0] if isinstance(eo, list) and eo and isinstance(eo[0], dict) else {}
        bands.append((asset.get("href"), first.get("name") or key, first.get("description") or asset.get("title")))
    properties = item.get("properties")
    resampling = properties.get("tilecommit:resampling") if isinstance(properties, dict) else None
    return bands, resampling


def _list_bands(document: dict) -> tuple[list[tuple[object, object, object]], object]:
    if document.get(LIST_MARKER) != 1:
        raise UnsupportedRasterError(f"{LIST_MARKER} must be 1, got {document.get(LIST_MARKER)!r}; {ACCEPTED}")
    listed = document.get("bands")
    if not isinstance(listed, list):
        raise UnsupportedRasterError(f"the document's bands must be a list; {ACCEPTED}")
    if len(listed) > MAX_MEMBERS:
        return [(None, None, None)] * len(listed), None  # counted, refused below before any is looked at
    bands = []
    for band in listed:
        if not isinstance(band, dict):
            raise UnsupportedRasterError(f"a band must be an object with an href, got {band!r:.80}; {ACCEPTED}")
        bands.append((band.get("href"), band.get("name"), band.get("description")))
    return bands, document.get("resampling")


def parse_document(document_blob: str, body: bytes, size: int | None = None) -> SceneDocument:
    """The members of the scene document ``document_blob`` whose bytes are ``body`` (``size``: its
    stored size, refused before parsing when too large); :class:`UnsupportedRasterError` saying why not."""
    size = len(body) if size is None else size
    if size > MAX_DOCUMENT_BYTES:
        raise UnsupportedRasterError(
            f"{document_blob} is a JSON document of {size} bytes, more than a scene document may be; {ACCEPTED}"
        )
    try:
        document = json.loads(body.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise UnsupportedRasterError(f"{document_blob} is not a JSON document ({exc}); {ACCEPTED}") from None
    if not isinstance(document, dict):
        raise UnsupportedRasterError(f"{document_blob} is JSON but not an object; {ACCEPTED}")
    if document.get("type") == "Feature" and "assets" in document:
        listed, resampling = _stac_bands(document)
    elif LIST_MARKER in document:
        listed, resampling = _list_bands(document)
    else:
        raise UnsupportedRasterError(
            f"{document_blob} is a JSON document but neither a STAC item with assets nor a {LIST_MARKER} list "
            f"(a STAC or tile-matrix description naming URLs is never fetched); {ACCEPTED}"
        )
    if not listed or len(listed) > MAX_MEMBERS:
        raise UnsupportedRasterError(f"{document_blob} names {len(listed)} members; {ACCEPTED}")
    resampling = RESAMPLING_KERNELS[0] if resampling is None else resampling
    if resampling not in RESAMPLING_KERNELS:
        raise UnsupportedRasterError(
            f"{document_blob} asks for resampling {resampling!r}; accepted: {', '.join(RESAMPLING_KERNELS)}"
        )
    bands = []
    for href, name, description in listed:
        blob = member_blob(document_blob, href)
        label = _text(name, f"band {href!r}'s name", MAX_NAME_CHARS) or blob.rpartition("/")[2]
        bands.append(Band(blob, label, _text(description, f"band {href!r}'s description", MAX_DESCRIPTION_CHARS)))
    if len({band.blob for band in bands}) != len(bands):
        raise UnsupportedRasterError(f"{document_blob} names a member twice; {ACCEPTED}")
    return SceneDocument(tuple(bands), resampling)
