"""Per-band statistics and histograms of the committed mosaic for its STAC item, approximate.

The fields are rio-stac's (``rio_stac/stac.py``, ``_get_stats``), under ``raster:bands``:
``statistics`` {minimum, maximum, mean, stddev, valid_percent} and ``histogram`` {count, min,
max, buckets}, with its rules: invalid values (NaN, infinities) and the mask (nodata, the
internal mask, alpha) left out; ``valid_percent`` over every pixel of the level read; ten
buckets between the minimum and maximum, or one per distinct value plus one when the range is
too narrow for ten (numpy's "Too many bins for data range").

rio-stac reads a decimated copy of the dataset (1024 pixels on the longer edge by default),
which GDAL serves from an overview. Here the level is named instead: the coarsest overview with
at least :data:`MIN_PIXELS` pixels, the first overview when none has as many, the full
resolution only for a mosaic without overviews (one block at most). So a mosaic costs one
overview's read, never a full one, and the item says which level
(:attr:`MosaicStatistics.note`: ``approximate`` and the level).

The item is committed create-only and compared byte for byte when it is made again, possibly on
another machine: its numbers must not depend on the order a sum was taken in. So the mean and
the standard deviation are correctly rounded sums (:func:`math.fsum`) rather than numpy's
pairwise ones; they agree with numpy's to the last few bits.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import rasterio
from rasterio.enums import MaskFlags
from rasterio.errors import NotGeoreferencedWarning

from ..reading.source import Source, reading

#: The statistics are read from the coarsest overview with at least this many pixels. A level
#: is a quarter of the one above it, so the level read holds from 512 x 512 to about 1024 x 1024
#: pixels: as many as rio-stac's default sample (1024 pixels on the longer edge).
MIN_PIXELS = 512 * 512
#: Histogram buckets, rio-stac's default.
HISTOGRAM_BINS = 10
#: Values summed at a time (:func:`_exact_sum`).
SUM_CHUNK = 65536


@dataclass(frozen=True)
class BandStatistics:
    """One band's ``statistics`` and ``histogram`` (None when it has no valid pixel: only its
    ``valid_percent``, 0, is known)."""

    statistics: dict
    histogram: dict | None


@dataclass(frozen=True)
class MosaicStatistics:
    """Every band's statistics and the level they were read from: 0 the full resolution, ``k`` the
    ``k``-th overview (``tilecommit:overview_levels`` counts them), ``width`` x ``height`` pixels."""

    level: int
    width: int
    height: int
    bands: tuple[BandStatistics | None, ...]

    @property
    def note(self) -> dict:
        """What the item says of its statistics (``tilecommit:statistics``)."""
        return {
            "approximate": True,
            "overview_level": self.level,
            "width": self.width,
            "height": self.height,
            "histogram_bins": HISTOGRAM_BINS,
        }


def statistics_level(width: int, height: int, factors: list[int]) -> int:
    """The coarsest overview with at least :data:`MIN_PIXELS` pixels, else the first: its
    1-based index among the overviews whose decimation factors are ``factors`` (GDAL's, band 1);
    0 (the full resolution) when there are none. An overview of factor ``f`` is
    ``ceil(width / f)`` x ``ceil(height / f)`` pixels."""
    chosen = 1 if factors else 0
    for index, factor in enumerate(factors, start=1):
        if -(-width // factor) * -(-height // factor) >= MIN_PIXELS:
            chosen = index
    return chosen


def mosaic_statistics(mosaic: str | Source) -> MosaicStatistics:
    """The statistics of every band of ``mosaic``, from the level :func:`statistics_level` picks,
    read once, all bands together (a pixel-interleaved block holds them all), through the reader
    the mosaic is given by (a read storage did not deliver raises, as every read of the committed
    mosaic does)."""
    with reading(mosaic) as src:
        level = statistics_level(src.width, src.height, src.overviews(1))
    open_options = {"overview_level": level - 1} if level else {}
    with reading(mosaic, **open_options) as src:
        data = masked_level(src)
        return MosaicStatistics(
            level=level, width=src.width, height=src.height, bands=tuple(band_statistics(band) for band in data)
        )


def masked_level(src) -> np.ma.MaskedArray:
    """Every band of ``src`` read once, masked as rasterio's ``read(masked=True)`` masks it.

    GDAL computes a band's mask (nodata, alpha or an internal mask) by reading the band again,
    and its GTiff reader fetches those bytes again for each band (what a read of the mosaic costs
    tripled for three bands, seen through the pinned reader). So the pixels are read once and
    handed to GDAL in memory with the nodata, the colour interpretation (an alpha band) and the
    internal mask (read from its own blocks), and GDAL masks that copy by its own rules.
    """
    data = src.read()
    flags = src.mask_flag_enums
    internal = any(MaskFlags.per_dataset in f for f in flags) and not any(MaskFlags.alpha in f for f in flags)
    mask = src.dataset_mask() if internal else None
    profile = {"width": src.width, "height": src.height, "count": src.count, "dtype": src.dtypes[0]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)  # pixels only
        with rasterio.open("", "w+", driver="MEM", nodata=src.nodata, **profile) as copy:
            copy.write(data)
            copy.colorinterp = src.colorinterp
            if mask is not None:
                copy.write_mask(mask)
            return copy.read(masked=True)


def band_statistics(band: np.ma.MaskedArray) -> BandStatistics | None:
    """rio-stac's statistics and histogram of one band read masked; None for complex samples
    (which have no order, and which rio-stac cannot describe either)."""
    if band.dtype.kind == "c":
        return None
    band = np.ma.fix_invalid(band, copy=True)
    valid_mask = ~np.ma.getmaskarray(band)
    valid_percent = float(np.count_nonzero(valid_mask) / float(band.data.size) * 100)
    valid = band.data[valid_mask]
    if valid.size == 0:
        return BandStatistics(statistics={"valid_percent": valid_percent}, histogram=None)
    mean = _exact_sum(valid, lambda chunk: chunk) / valid.size
    stddev = math.sqrt(_exact_sum(valid, lambda chunk: (chunk - mean) ** 2) / valid.size)
    statistics = {
        "minimum": valid.min().item(),
        "maximum": valid.max().item(),
        "mean": mean,
        "stddev": stddev,
        "valid_percent": valid_percent,
    }
    return BandStatistics(statistics=statistics, histogram=_histogram(valid))


def _exact_sum(valid: np.ndarray, term: Callable[[np.ndarray], np.ndarray]) -> float:
    """The correctly rounded sum of ``term`` of every value (as float64), :data:`SUM_CHUNK`
    values at a time: a Python list of them all would cost 32 bytes a value (128 MiB for a
    level of four million pixels), a chunk's a couple of MiB."""
    chunks = (term(valid[i : i + SUM_CHUNK].astype(np.float64)).tolist() for i in range(0, valid.size, SUM_CHUNK))
    return math.fsum(itertools.chain.from_iterable(chunks))


def _histogram(valid: np.ndarray) -> dict:
    """rio-stac's histogram of the valid values: :data:`HISTOGRAM_BINS` buckets over their range,
    or, where numpy finds that range too narrow for them, one per distinct value plus one."""
    try:
        buckets, edges = np.histogram(valid, bins=HISTOGRAM_BINS)
    except ValueError as exc:
        if "Too many bins for data range" not in str(exc):
            raise
        buckets, edges = np.histogram(valid, bins=len(np.unique(valid)) + 1)
    return {
        "count": len(edges),
        "min": float(edges.min()),
        "max": float(edges.max()),
        "buckets": buckets.tolist(),
    }
