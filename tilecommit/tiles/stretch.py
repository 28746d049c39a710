"""The display range of a band: which values are drawn black and white when a tile is made 8-bit.

In this order (docs/tiles.md):
1. the request's ``rescale=min,max``;
2. an 8-bit band: its values as they are (0 to 255, the dtype's range), as titiler and the
   quicklook draw them;
3. any other band: the 2nd to 98th percentile of the band's histogram in the STAC item
   (``raster:bands`` ``histogram``, rio-stac's fields, read from one overview level), found by
   linear interpolation inside a bucket; the quicklook stretches between the same percentiles of
   its own pixels;
4. a band with statistics and no histogram: its ``minimum`` to ``maximum``;
5. else (an item made before the statistics): the dtype's range for an integer band; a float
   band has no range to take, so the request is refused (422) asking for ``rescale``.

Pure: the item is given, already read.
"""

from __future__ import annotations

import numpy as np

from ..errors import JobApiError

#: The histogram percentiles of the default stretch (the quicklook's).
LOW_PERCENTILE, HIGH_PERCENTILE = 2.0, 98.0


def band_ranges(item: dict, bands: tuple[int, ...], dtype: str, rescale: tuple[float, float] | None) -> list | None:
    """``[(low, high), ...]`` per band shown, or None: an 8-bit mosaic shown as it is."""
    if rescale is not None:
        return [rescale] * len(bands)
    if np.dtype(dtype) in (np.dtype("uint8"), np.dtype("int8")):
        return None
    described = _raster_bands(item)
    return [_band_range(described[b - 1] if b - 1 < len(described) else {}, dtype, b) for b in bands]


def _raster_bands(item: dict) -> list[dict]:
    asset = (item.get("assets") or {}).get("data") or {}
    return list(asset.get("raster:bands") or [])


def _band_range(band: dict, dtype: str, number: int) -> tuple[float, float]:
    histogram, statistics = band.get("histogram"), band.get("statistics")
    if histogram and histogram.get("buckets"):
        low, high = histogram_percentiles(histogram, LOW_PERCENTILE, HIGH_PERCENTILE)
    elif statistics and statistics.get("minimum") is not None:
        low, high = float(statistics["minimum"]), float(statistics["maximum"])
    elif np.issubdtype(np.dtype(dtype), np.integer):
        info = np.iinfo(np.dtype(dtype))
        low, high = float(info.min), float(info.max)
    else:
        raise JobApiError(
            422,
            "rescale-required",
            f"band {number} ({dtype}) has no statistics in its STAC item to stretch it by: give rescale=min,max",
        )
    return (low, high) if high > low else (low, low + 1.0)


def histogram_percentiles(histogram: dict, *percentiles: float) -> tuple[float, ...]:
    """The values at ``percentiles`` of a STAC histogram (``count`` equal buckets from ``min`` to
    ``max``), each interpolated linearly inside the bucket where the cumulative count reaches it."""
    buckets = np.asarray(histogram["buckets"], dtype="float64")
    edges = np.linspace(float(histogram["min"]), float(histogram["max"]), len(buckets) + 1)
    total = buckets.sum()
    if total <= 0:
        return tuple(float(edges[0]) for _ in percentiles)
    cumulative = np.concatenate([[0.0], np.cumsum(buckets)]) / total * 100.0
    return tuple(float(np.interp(p, cumulative, edges)) for p in percentiles)
