"""A collection's documents as data: what an index entry is, and how a page and the collection
document change when an item is added. Pure (no I/O): :mod:`.collections` reads and writes them.

Layout, in the output container (docs/catalog.md, "Collections in blob storage"):

- ``collections/{id}/collection.json``: a STAC Collection (extent, summaries, links to its
  pages), with ``tilecommit:revision`` (one more at every write), ``tilecommit:items`` (how many
  items its pages list) and ``tilecommit:pages`` (per page: its item count and revision, as
  last carried over from the page).
- ``collections/{id}/index/{page}.json``, ``page`` the first two hex digits of the sha256 of the
  item id (:data:`PAGES` pages at most): a MosaicJSON 0.0.3 document of that page's items
  (``tiles``: quadkey at :data:`QUADKEY_ZOOM` -> the URLs of the mosaics that cover it), with the
  items' index entries (``tilecommit:items``, item id -> :func:`entry`) and its own revision.

Adding an item reads and writes one page and the collection document, never the whole
index: a page holds about ``n / 256`` of a collection's ``n`` entries (100,000 items: about 390 a
page, some 400 KB of JSON), and the collection document at most 256 page records.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from datetime import datetime
from typing import Any

from ..errors import MosaicCheckError

#: Pages of a collection's index: the first two hex digits of the sha256 of the item id.
PAGES = 256
PAGE_DIGITS = 2
#: The zoom of the index's quadkeys (Web Mercator tiles of about 156 km at the equator): a scene
#: of 40,960 pixels at 10 m (410 km across) falls in some 9 to 25 of them.
QUADKEY_ZOOM = 8
MOSAICJSON_VERSION = "0.0.3"
STAC_VERSION = "1.0.0"
#: Web Mercator's latitude limit, where the quadkey grid ends.
MAX_LATITUDE = 85.0511287798066
WORLD = [-180.0, -MAX_LATITUDE, 180.0, MAX_LATITUDE]
REVISION = "tilecommit:revision"
ITEMS = "tilecommit:items"
PAGE_RECORDS = "tilecommit:pages"
#: The union of the items' bboxes (None while no item has one): the truth the STAC extent shows.
BBOX = "tilecommit:bbox"
#: Summaries kept: each the sorted distinct values its items give (a handful: CRS codes, profiles).
SUMMARY_FIELDS = ("proj:code", "tilecommit:profile")


def listed_entry(page: dict | None, item_id: str) -> dict | None:
    """The entry ``page`` lists for ``item_id`` (None: it lists none)."""
    return ((page or {}).get(ITEMS) or {}).get(item_id)


def canonical(document: dict) -> bytes:
    """One byte string for one document (sorted keys, no spaces): what is stored and compared."""
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def collection_blob_name(collection: str) -> str:
    return f"collections/{collection}/collection.json"


def page_key(item_id: str) -> str:
    return hashlib.sha256(item_id.encode()).hexdigest()[:PAGE_DIGITS]


def page_blob_name(collection: str, page: str) -> str:
    return f"collections/{collection}/index/{page}.json"


def entry(item: dict, *, item_blob: str, mosaic_blob: str, item_sha256: str) -> dict:
    """An item's index entry, all of it from the stored item: its id, blobs, WGS84 bbox (None when
    it has no footprint), datetime (its ``datetime``, else its ``start_datetime``), the summaries'
    values, the zooms its pixels and overviews span, and the sha256 of the item's comparable bytes
    (without what depends on the run that wrote it). A function of the stored item, so adding the
    same item again gives the same entry."""
    properties = item.get("properties") or {}
    bbox = _flat_bbox(item.get("bbox"))
    profile = properties.get("tilecommit:profile") or {}
    maxzoom = _zoom_of(bbox, properties.get("proj:shape"))
    return {
        "id": item["id"],
        "item": item_blob,
        "mosaic": mosaic_blob,
        "bbox": bbox,
        "datetime": properties.get("datetime") or properties.get("start_datetime"),
        "proj:code": properties.get("proj:code"),
        "tilecommit:profile": profile.get("name") if isinstance(profile, dict) else None,
        "maxzoom": maxzoom,
        "minzoom": max(0, maxzoom - int(properties.get("tilecommit:overview_levels") or 0)),
        "item_sha256": item_sha256,
    }


def _flat_bbox(bbox: list | None) -> list[float] | None:
    """A STAC bbox as west, south, east, north (a 3D one, of 6 numbers, without its heights)."""
    if not bbox:
        return None
    corners = (bbox[0], bbox[1], bbox[3], bbox[4]) if len(bbox) == 6 else bbox[:4]
    return [float(v) for v in corners]


def _zoom_of(bbox: list[float] | None, shape: list | None) -> int:
    """The Web Mercator zoom whose pixel is about the item's (degrees per pixel across its bbox)."""
    if not bbox or not shape or not shape[-1]:
        return QUADKEY_ZOOM
    degrees_per_pixel = abs(bbox[2] - bbox[0]) / shape[-1]
    if degrees_per_pixel <= 0:
        return QUADKEY_ZOOM
    return max(0, min(24, round(math.log2(360.0 / (256 * degrees_per_pixel)))))


def quadkeys(bbox: list[float] | None, zoom: int = QUADKEY_ZOOM) -> list[str]:
    """The quadkeys at ``zoom`` of the Web Mercator tiles ``bbox`` (WGS84) touches."""
    if bbox is None:
        return []
    west, south, east, north = bbox
    x0, y0 = _tile(west, min(north, MAX_LATITUDE), zoom)
    x1, y1 = _tile(east, max(south, -MAX_LATITUDE), zoom)
    return [_quadkey(x, y, zoom) for x in range(x0, x1 + 1) for y in range(y0, y1 + 1)]


def _tile(lon: float, lat: float, zoom: int) -> tuple[int, int]:
    n = 2**zoom
    lat = max(-MAX_LATITUDE, min(MAX_LATITUDE, lat))
    x = int((lon + 180.0) / 360.0 * n)
    sin = math.sin(math.radians(lat))
    y = int((0.5 - math.log((1 + sin) / (1 - sin)) / (4 * math.pi)) * n)
    return min(max(x, 0), n - 1), min(max(y, 0), n - 1)


def _quadkey(x: int, y: int, zoom: int) -> str:
    digits = []
    for level in range(zoom, 0, -1):
        mask = 1 << (level - 1)
        digits.append(str((1 if x & mask else 0) + (2 if y & mask else 0)))
    return "".join(digits)


def union(a: list[float] | None, b: list[float] | None) -> list[float] | None:
    if a is None or b is None:
        return a or b
    return [min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3])]


def page_with(page: dict | None, collection: str, key: str, item: dict, mosaic_url: str) -> dict | None:
    """``page`` with ``item`` (an :func:`entry`) listed, its revision one more; None when it lists
    it already with this very entry. Raises :class:`~tilecommit.errors.MosaicCheckError` when it
    lists it otherwise (known bad).

    The MosaicJSON fields are recomputed from the entries, the mosaics' URLs from the container
    URL of this write (``mosaic_url`` is the new item's): a page is one writer's view of its items.
    """
    items: dict[str, dict] = dict((page or {}).get(ITEMS) or {})
    held = items.get(item["id"])
    if held is not None:
        if held != item:
            raise MosaicCheckError(
                f"listed as {canonical(held).decode()}, the stored item gives {canonical(item).decode()}"
            )
        return None
    items[item["id"]] = item
    base = mosaic_url[: -len(item["mosaic"])] if mosaic_url.endswith(item["mosaic"]) else ""
    tiles: dict[str, list[str]] = {}
    bounds = None
    for listed in sorted(items.values(), key=lambda e: (e["datetime"] or "", e["id"])):
        bounds = union(bounds, listed["bbox"])
        for quadkey in quadkeys(listed["bbox"]):
            tiles.setdefault(quadkey, []).append(base + listed["mosaic"])
    bounds = bounds or list(WORLD)
    minzoom = min(e["minzoom"] for e in items.values())
    return {
        "mosaicjson": MOSAICJSON_VERSION,
        "name": f"{collection} index page {key}",
        "description": f"The mosaics of collection {collection} whose item id hashes to page {key}",
        "version": "1.0.0",
        "minzoom": minzoom,
        "maxzoom": max(e["maxzoom"] for e in items.values()),
        "quadkey_zoom": QUADKEY_ZOOM,
        "bounds": bounds,
        "center": [(bounds[0] + bounds[2]) / 2, (bounds[1] + bounds[3]) / 2, minzoom],
        "tiles": dict(sorted(tiles.items())),
        "tilecommit:collection": collection,
        "tilecommit:page": key,
        REVISION: int((page or {}).get(REVISION, 0)) + 1,
        ITEMS: dict(sorted(items.items())),
    }


def collection_with(doc: dict | None, collection: str, item: dict, key: str, page: dict) -> dict | None:
    """``doc`` (None: no collection yet) with what ``item`` adds, and the record of page ``key``
    as ``page`` holds it (after ``item`` was listed in it), its revision one more; None when it
    holds all of that already.

    Every change is a merge that repeating leaves as it is: the extent and the summaries grow by
    union, and a page's record is replaced only by one of a higher page revision (a page's
    revision grows by one at each of its writes, and its item count is a function of it). So a
    retry, or a writer that read the page before another's item landed, never takes anything away.
    """
    current = copy.deepcopy(doc) if doc is not None else _empty_collection(collection)
    new = copy.deepcopy(current)
    new[BBOX] = union(new.get(BBOX), item["bbox"])
    new["extent"]["spatial"]["bbox"] = [new[BBOX] or [-180.0, -90.0, 180.0, 90.0]]
    moment = item["datetime"]
    if moment is not None:
        start, end = new["extent"]["temporal"]["interval"][0]
        new["extent"]["temporal"]["interval"] = [
            [min(start, moment, key=_instant) if start else moment, max(end, moment, key=_instant) if end else moment]
        ]
    for field in SUMMARY_FIELDS:
        if item.get(field) is not None:
            new["summaries"][field] = sorted({*new["summaries"].get(field, []), item[field]})
    records = new[PAGE_RECORDS]
    held = records.get(key)
    if held is None or held["revision"] < page[REVISION]:
        records[key] = {"items": len(page[ITEMS]), "revision": page[REVISION]}
    new[PAGE_RECORDS] = dict(sorted(records.items()))
    new[ITEMS] = sum(r["items"] for r in records.values())
    new["links"] = _links(collection, new[PAGE_RECORDS])
    if new == current:
        return None
    new[REVISION] = int(current.get(REVISION, 0)) + 1
    return new


def _instant(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _empty_collection(collection: str) -> dict[str, Any]:
    return {
        "type": "Collection",
        "stac_version": STAC_VERSION,
        "id": collection,
        "description": f"Every mosaic tilecommit made for uploads of collection {collection}",
        "license": "proprietary",
        "extent": {"spatial": {"bbox": [[-180.0, -90.0, 180.0, 90.0]]}, "temporal": {"interval": [[None, None]]}},
        "summaries": {},
        "links": [],
        BBOX: None,
        PAGE_RECORDS: {},
        ITEMS: 0,
        REVISION: 0,
    }


def _links(collection: str, records: dict) -> list[dict]:
    """Self and root, and one link per index page (256 at most), relative to the document."""
    links = [
        {"rel": "self", "href": "./collection.json", "type": "application/json"},
        {"rel": "root", "href": "./collection.json", "type": "application/json"},
    ]
    links += [
        {"rel": "tilecommit:index", "href": f"./index/{key}.json", "type": "application/json", "title": f"page {key}"}
        for key in records
    ]
    return links
