"""An item's band statistics held to rio-stac's own (pinned in requirements-dev.txt)."""

from __future__ import annotations

import numpy as np
import pytest
import rasterio
from rasterio.enums import MaskFlags
from rio_stac.stac import get_raster_info

from tilecommit.raster.assembly import stac

#: The sample types numpy sums in their own precision (rio-stac's mean and stddev then carry it).
SINGLE = ("float16", "float32")


def assert_rio_stacs(ours: dict, theirs: dict, data_type: str) -> None:
    """Exactly rio-stac's, but for the mean and standard deviation, which are correctly rounded
    float64 sums here and numpy's pairwise ones there: the last bits may differ, and for float32
    samples numpy sums in float32, so its precision."""
    rel = 1e-6 if data_type in SINGLE else 1e-12
    mine, its = dict(ours["statistics"]), dict(theirs["statistics"])
    assert mine.pop("mean") == pytest.approx(its.pop("mean"), rel=rel)
    assert mine.pop("stddev") == pytest.approx(its.pop("stddev"), rel=rel)
    assert mine == its and type(mine["minimum"]) is type(its["minimum"])
    assert ours["histogram"] == theirs["histogram"]


def check_level(mosaic_path: str, chosen: int) -> None:
    """``chosen`` is the coarsest overview with at least 512 x 512 pixels, or the first when none
    has as many; the full resolution only for a mosaic without overviews (sizes as GDAL reads them)."""
    with rasterio.open(mosaic_path) as full:
        count = len(full.overviews(1))
    pixels = []
    for level in range(count):
        with rasterio.open(mosaic_path, overview_level=level) as overview:
            pixels.append(overview.width * overview.height)
    if count == 0:
        assert chosen == 0
        return
    assert 1 <= chosen <= count
    coarser = pixels[chosen:]  # the overviews after the chosen one (pixels[chosen - 1] is it)
    assert all(p < 512 * 512 for p in coarser)
    assert chosen == 1 or pixels[chosen - 1] >= 512 * 512


def check_item_statistics(item: dict, mosaic_path: str) -> None:
    """The item names the level its statistics come from, and they are what rio-stac computes on
    that level of the mosaic (complex samples have none: rio-stac cannot order them either)."""
    note = item["properties"][stac.STATISTICS_PROPERTY]
    assert note["approximate"] is True
    options = {"overview_level": note["overview_level"] - 1} if note["overview_level"] else {}
    check_level(mosaic_path, note["overview_level"])
    with rasterio.open(mosaic_path, **options) as level:
        assert (level.width, level.height) == (note["width"], note["height"])
        complex_samples = level.dtypes[0].startswith("complex")
        theirs = None if complex_samples else get_raster_info(level, max_size=None)
        unmasked = all(flags == [MaskFlags.all_valid] for flags in level.mask_flag_enums)
        pixels = level.read()
    bands = item["assets"]["data"]["raster:bands"]
    if theirs is None:
        assert not any("statistics" in band for band in bands)
        return
    for ours, its, band in zip(bands, theirs, pixels, strict=True):
        if unmasked and np.isfinite(band).all():
            # rasterio reads a level with no mask at all with numpy's ``nomask``, which rio-stac
            # counts as one valid pixel (``~arr.mask`` is one True): every pixel is valid.
            assert its["statistics"]["valid_percent"] == 100 / band.size
            its = {**its, "statistics": {**its["statistics"], "valid_percent": 100.0}}
        if its["statistics"]["valid_percent"] == 0:
            # No valid pixel: rio-stac writes zeros (numpy's masked constant read as 0) and a
            # histogram of empty buckets over [0, 1]; the item says only that none is valid.
            assert ours["statistics"] == {"valid_percent": 0.0} and "histogram" not in ours
            continue
        assert_rio_stacs(ours, its, ours["data_type"])
