"""Where a mosaic's valid pixels lie on the Earth, in longitude/latitude: the STAC item's geometry.

Works for any projection GDAL knows, including ones whose corners have no geographic position
(a full-disk geostationary scene: its corners look past the Earth into space) and ones around a
pole or across the antimeridian:

1. the valid pixels are taken from the dataset mask of the mosaic's smallest overview (nodata,
   alpha or internal mask alike; at most a block of pixels to read);
2. their convex hull, in the scene's CRS (an affine image of the hull in pixel space), with
   each edge densified so that curved edges stay close once reprojected;
3. every point is reprojected on its own terms: a point without a geographic position is left
   out instead of failing the whole geometry;
4. a ring that winds around a pole is closed through the pole; a ring that crosses the
   antimeridian is split into two polygons there (GeoJSON, RFC 7946 section 3.1.9), and its
   bbox then has west > east.

When no sensible geometry exists (no valid pixel; fewer than three points with a geographic
position) the item gets ``geometry: null`` and no bbox, as STAC allows, and
:attr:`Footprint.note` says why. The footprint is a pure function of the committed mosaic, so a
retry writes the same item.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from affine import Affine
from rasterio.crs import CRS
from rasterio.warp import transform as warp_transform

#: Points along the hull's whole perimeter once densified (edges are split in proportion to length).
DENSIFY_POINTS = 128
#: Decimal places kept in longitude/latitude (about 0.1 mm): stable bytes, no false precision.
PRECISION = 9
#: Degrees of longitude below which a difference is a rounding error, not a crossing.
EPSILON = 1e-9
#: How far (in pixels of the mask's grid) a boundary point is moved inward to find a geographic position.
PULL_PIXELS = (0.5, 1.0, 2.0)
_WGS84 = CRS.from_epsg(4326)


@dataclass(frozen=True)
class Footprint:
    """A GeoJSON geometry in EPSG:4326 (or None), its bbox (or None) and a note on how it was made."""

    geometry: dict | None
    bbox: list[float] | None
    note: str


def _convex_hull(points: np.ndarray) -> np.ndarray:
    """Andrew's monotone chain: the hull's vertices, counter-clockwise, without repeating the first."""
    pts = np.unique(points, axis=0)
    if len(pts) < 3:
        return pts

    def cross(o, a, b) -> float:
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    lower: list = []
    for p in pts:
        while len(lower) >= 2 and cross(lower[-2], lower[-1], p) <= 0:
            lower.pop()
        lower.append(p)
    upper: list = []
    for p in pts[::-1]:
        while len(upper) >= 2 and cross(upper[-2], upper[-1], p) <= 0:
            upper.pop()
        upper.append(p)
    return np.array(lower[:-1] + upper[:-1], dtype="float64")


def valid_hull(mask: np.ndarray, transform: Affine) -> np.ndarray | None:
    """The convex hull of the valid pixels (``mask`` > 0), in the CRS of ``transform``; None if none."""
    rows = np.flatnonzero(mask.any(axis=1))
    if rows.size == 0:
        return None
    corners = []
    for row in rows:
        cols = np.flatnonzero(mask[row])
        first, last = cols[0], cols[-1] + 1
        corners += [(first, row), (first, row + 1), (last, row), (last, row + 1)]
    hull = _convex_hull(np.array(corners, dtype="float64"))
    xs, ys = transform * (hull[:, 0], hull[:, 1])  # type: ignore[operator]  # affine maps arrays element-wise; its types say floats
    return np.column_stack([xs, ys])


def densify(ring: np.ndarray, points: int = DENSIFY_POINTS) -> np.ndarray:
    """The closed ring's edges split in proportion to their length, about ``points`` points in all."""
    ends = np.roll(ring, -1, axis=0)
    lengths = np.hypot(*(ends - ring).T)
    perimeter = lengths.sum()
    out = []
    for start, end, length in zip(ring, ends, lengths, strict=True):
        steps = max(1, int(math.ceil(points * length / perimeter))) if perimeter > 0 else 1
        for i in range(steps):
            out.append(start + (end - start) * (i / steps))
    return np.array(out)


def to_lonlat(crs: CRS, xy: np.ndarray) -> np.ndarray:
    """Longitude/latitude of each point; NaN where the point has no geographic position.

    GDAL refuses a whole batch when one point fails ("Point outside of projection domain",
    "Reprojection failed"), so a failed batch is redone point by point.
    """
    xs, ys = list(xy[:, 0]), list(xy[:, 1])
    try:
        lons, lats = warp_transform(crs, _WGS84, xs, ys)
        out = np.column_stack([lons, lats]).astype("float64")
    except Exception:  # noqa: BLE001 - GDAL's error classes vary; each point is tried on its own below
        out = np.full((len(xs), 2), np.nan)
        for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
            try:
                (lon,), (lat,) = warp_transform(crs, _WGS84, [x], [y])
            except Exception:  # noqa: BLE001 - this point has no geographic position
                continue
            out[i] = (lon, lat)
    bad = ~np.isfinite(out).all(axis=1) | (np.abs(out[:, 1]) > 90.0 + 1e-9)
    out[bad] = np.nan
    return out


def _pull_inward(crs: CRS, ring: np.ndarray, lonlat: np.ndarray, pixel: float) -> int:
    """Give a point without a geographic position a nearby one, a little inside the hull, if there is one.

    The hull runs along the outer corners of the edge pixels. Where the valid data end at the
    edge of the projection's domain (a geostationary disk's limb), those corners lie just past
    it, while the pixels' own centres are on the Earth. Moving such a point towards the hull's
    centre by up to :data:`PULL_PIXELS` pixels keeps the footprint at the data's edge instead of
    dropping most of it. ``lonlat`` is updated in place; returns how many points moved.
    """
    center = ring.mean(axis=0)
    moved = 0
    for i in np.flatnonzero(~np.isfinite(lonlat).all(axis=1)):
        direction = center - ring[i]
        distance = float(np.hypot(*direction))
        for pixels in PULL_PIXELS:
            if distance <= pixels * pixel:
                break
            candidate = to_lonlat(crs, (ring[i] + direction * (pixels * pixel / distance))[None, :])[0]
            if np.isfinite(candidate).all():
                lonlat[i] = candidate
                moved += 1
                break
    return moved


def _unwrap(lons: np.ndarray) -> np.ndarray:
    """Longitudes made continuous along the ring (no jump of more than 180 degrees between neighbours)."""
    out = lons.copy()
    for i in range(1, len(out)):
        step = out[i] - out[i - 1]
        out[i] -= 360.0 * round(step / 360.0)
    return out


def _clip(ring: list[tuple[float, float]], limit: float, keep_below: bool) -> list[tuple[float, float]]:
    """Sutherland-Hodgman against the half-plane lon <= limit (or >= limit)."""

    def inside(p) -> bool:
        return p[0] <= limit if keep_below else p[0] >= limit

    out: list[tuple[float, float]] = []
    for i, current in enumerate(ring):
        previous = ring[i - 1]
        if inside(current):
            if not inside(previous):
                out.append(_cross_at(previous, current, limit))
            out.append(current)
        elif inside(previous):
            out.append(_cross_at(previous, current, limit))
    return out


def _cross_at(a, b, lon: float) -> tuple[float, float]:
    f = (lon - a[0]) / (b[0] - a[0])
    return (lon, a[1] + (b[1] - a[1]) * f)


def _close(ring: list[tuple[float, float]]) -> list[list[float]]:
    """A closed, counter-clockwise GeoJSON ring, rounded."""
    pts = [(round(x, PRECISION), round(y, PRECISION)) for x, y in ring]
    area = sum(x0 * y1 - x1 * y0 for (x0, y0), (x1, y1) in zip(pts, pts[1:] + pts[:1], strict=True))
    if area < 0:
        pts.reverse()
    return [list(p) for p in pts] + [list(pts[0])]


def _around_pole(lonlat: np.ndarray) -> Footprint:
    """A ring that winds once around a pole: closed along the antimeridian through the pole."""
    north = float(np.mean(lonlat[:, 1])) > 0
    pole = 90.0 if north else -90.0
    lons = ((lonlat[:, 0] + 180.0) % 360.0) - 180.0
    order = np.argsort(lons, kind="stable")
    pts = [(float(lons[i]), float(lonlat[i, 1])) for i in order]
    # The latitude where the ring meets the antimeridian, from its two points nearest to it.
    (lon_a, lat_a), (lon_b, lat_b) = pts[-1], pts[0]
    span = (lon_b + 360.0) - lon_a
    edge_lat = lat_a if span <= 0 else lat_a + (lat_b - lat_a) * ((180.0 - lon_a) / span)
    ring = [(-180.0, edge_lat)] + pts + [(180.0, edge_lat), (180.0, pole), (-180.0, pole)]
    lats = [p[1] for p in ring]
    bbox = [-180.0, round(min(lats), PRECISION), 180.0, round(max(lats), PRECISION)]
    return Footprint(
        {"type": "Polygon", "coordinates": [_close(ring)]},
        bbox,
        f"valid data around the {'north' if north else 'south'} pole",
    )


def footprint(crs: CRS | str, mask: np.ndarray, transform: Affine) -> Footprint:
    """The footprint of the valid pixels of ``mask`` (pixel grid ``transform`` in ``crs``)."""
    crs = crs if isinstance(crs, CRS) else CRS.from_user_input(crs)
    hull = valid_hull(mask, transform)
    if hull is None:
        return Footprint(None, None, "none: the mosaic has no valid pixel")
    ring = densify(hull) if len(hull) >= 2 else hull
    lonlat = to_lonlat(crs, ring)
    pulled = _pull_inward(crs, ring, lonlat, math.hypot(transform.a, transform.e))
    kept = lonlat[np.isfinite(lonlat).all(axis=1)]
    dropped = len(lonlat) - len(kept)
    if len(kept) < 3:
        return Footprint(None, None, f"none: {len(kept)} of {len(lonlat)} boundary points have a geographic position")
    left_out = (
        f"; {pulled} boundary points moved inward by at most {PULL_PIXELS[-1]} pixels of the smallest overview "
        "to find a geographic position"
        if pulled
        else ""
    )
    left_out += (
        f"; {dropped} of {len(lonlat)} boundary points without a geographic position left out" if dropped else ""
    )
    closed = _unwrap(np.append(kept[:, 0], kept[0, 0]))
    if abs(closed[-1] - closed[0]) > 180.0:  # the ring winds once around a pole
        around = _around_pole(kept)
        return Footprint(around.geometry, around.bbox, around.note + left_out)
    note = "valid data" + left_out
    lons = closed[:-1]
    # Shifted by whole turns so that the westernmost point lies in [-180, 180) (to a rounding error:
    # a world-wide grid's edge at -180 must not count as crossing the antimeridian).
    shift = 360.0 * math.floor((lons.min() + 180.0 + EPSILON) / 360.0)
    lons = lons - shift
    ring_pts = [(float(x), float(y)) for x, y in zip(lons, kept[:, 1], strict=True)]
    lats = kept[:, 1]
    south, north = round(float(lats.min()), PRECISION), round(float(lats.max()), PRECISION)
    if lons.max() <= 180.0 + EPSILON:
        bbox = [round(float(lons.min()), PRECISION), south, round(float(lons.max()), PRECISION), north]
        return Footprint({"type": "Polygon", "coordinates": [_close(ring_pts)]}, bbox, note)
    west_part = _clip(ring_pts, 180.0, keep_below=True)
    east_part = [(x - 360.0, y) for x, y in _clip(ring_pts, 180.0, keep_below=False)]
    geometry = {"type": "MultiPolygon", "coordinates": [[_close(west_part)], [_close(east_part)]]}
    bbox = [
        round(min(x for x, _ in west_part), PRECISION),
        south,
        round(max(x for x, _ in east_part), PRECISION),
        north,
    ]
    return Footprint(geometry, bbox, note + "; split at the antimeridian")
