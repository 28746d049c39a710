"""What a tile request asks for, checked: the tile's z/x/y and the query's bands and rescale.

Pure: no I/O, so every refusal of a malformed request is decided before storage is asked. A
refusal is a :class:`~tilecommit.errors.JobApiError` (the HTTP API's one refusal type), in
titiler's terms: a path or parameter that is not of its form is 422 (FastAPI's validation answer
in titiler), a band the mosaic does not have 400, a tile outside the grid 404.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import JobApiError

#: WebMercatorQuad's deepest zoom level (morecantile's definition, 0 to 24).
MAX_GRID_ZOOM = 24
#: Zoom levels past the mosaic's own resolution (its TileJSON ``maxzoom``) still served, each
#: pixel of the mosaic drawn as 2^n x 2^n tile pixels: a map can zoom in past the data as titiler
#: lets it; past this a request is refused (404), as a tile of nothing new.
MAX_OVERZOOM = 3
#: Tile edge in pixels (rio-tiler's and titiler's default).
TILE_SIZE = 256


@dataclass(frozen=True)
class TileQuery:
    """The bands shown (1-based, 1 or 3 of them; None: the default) and the display range given
    (``rescale=min,max``, one for every band; None: the stretch of :mod:`.stretch`)."""

    bands: tuple[int, ...] | None = None
    rescale: tuple[float, float] | None = None

    def key(self) -> str:
        """The query's canonical form, which a tile's ETag covers."""
        return json.dumps({"bands": self.bands, "rescale": self.rescale}, sort_keys=True)

    def params(self) -> dict[str, str]:
        """The query as URL parameters (what a TileJSON's tile URL carries)."""
        out = {}
        if self.bands is not None:
            out["bands"] = ",".join(str(b) for b in self.bands)
        if self.rescale is not None:
            out["rescale"] = ",".join(_number(v) for v in self.rescale)
        return out


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


def _integer(name: str, text: str) -> int:
    try:
        value = int(text, 10)
    except (TypeError, ValueError):
        raise JobApiError(422, "invalid-tile", f"{name} must be a whole number, not {text!r}") from None
    return value


def parse_tile(z: str, x: str, y: str) -> tuple[int, int, int]:
    """The tile ``z/x/y`` of the route: whole numbers (422 otherwise), ``z`` within the grid's
    levels (422), ``x`` and ``y`` within the grid at ``z`` (404 "outside bounds", titiler's answer)."""
    zi, xi, yi = _integer("z", z), _integer("x", x), _integer("y", y)
    if not 0 <= zi <= MAX_GRID_ZOOM:
        raise JobApiError(422, "invalid-tile", f"z must be 0 to {MAX_GRID_ZOOM} (WebMercatorQuad), not {zi}")
    if not (0 <= xi < 2**zi and 0 <= yi < 2**zi):
        raise outside_bounds(zi, xi, yi)
    return zi, xi, yi


def outside_bounds(z: int, x: int, y: int) -> JobApiError:
    """titiler's answer to a tile the mosaic does not cover (rio-tiler's ``TileOutsideBounds``)."""
    return JobApiError(404, "tile-outside-bounds", f"Tile {z}/{x}/{y} is outside bounds")


def parse_query(params: Mapping[str, str]) -> TileQuery:
    """``bands=1,2,3`` (1 or 3 band numbers from 1) and ``rescale=min,max`` (two finite numbers, min < max)."""
    bands = None
    if params.get("bands"):
        parts = params["bands"].split(",")
        numbers = [_integer("bands", p.strip()) for p in parts]
        if len(numbers) not in (1, 3) or min(numbers) < 1:
            raise JobApiError(
                422, "invalid-bands", f"bands must be 1 or 3 band numbers from 1 (grey or RGB), not {params['bands']!r}"
            )
        bands = tuple(numbers)
    rescale = None
    if params.get("rescale"):
        try:
            low, high = (float(v) for v in params["rescale"].split(","))
        except ValueError:
            raise JobApiError(422, "invalid-rescale", f"rescale must be min,max, not {params['rescale']!r}") from None
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise JobApiError(422, "invalid-rescale", f"rescale must be two finite numbers, min < max: {low},{high}")
        rescale = (low, high)
    return TileQuery(bands, rescale)


def checked_bands(query: TileQuery, count: int) -> tuple[int, ...]:
    """The bands to show of a mosaic of ``count`` bands: the query's (400 for one it lacks), else
    1, 2, 3 for three bands or more, else 1 (what the quicklook shows)."""
    if query.bands is None:
        return (1, 2, 3) if count >= 3 else (1,)
    missing = [b for b in query.bands if b > count]
    if missing:
        raise JobApiError(400, "invalid-bands", f"the mosaic has {count} band(s); it has no band {missing[0]}")
    return query.bands


def tile_etag(mosaic_etag: str, z: int, x: int, y: int, query: TileQuery, renderer: str) -> str:
    """A strong ETag for a tile: a digest of the mosaic's version (a committed mosaic is never
    changed in place, so its ETag names its bytes), the tile, the query and the renderer (the
    rio-tiler version and this module's rules), all a tile's bytes depend on."""
    text = json.dumps([mosaic_etag.strip('"'), z, x, y, query.key(), renderer])
    return '"' + hashlib.sha256(text.encode()).hexdigest()[:32] + '"'


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """Whether an ``If-None-Match`` header names ``etag`` (or is ``*``): then 304. Weak
    comparison, as RFC 9110 asks of ``If-None-Match``."""
    if not if_none_match:
        return False
    tags = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
    return "*" in tags or etag in tags
