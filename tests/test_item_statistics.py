"""The bands' statistics and histograms in the STAC item: rio-stac's, from one overview level.

- the level is the coarsest with at least ``MIN_PIXELS`` pixels, and the item names it;
- the numbers are what rio-stac itself (pinned in requirements-dev.txt) computes on that level
  of the committed mosaic, nodata and invalid values left out as it leaves them out;
- an item a build before the statistics stored (a job it completed, delivered again) is still
  good; anything else that differs is still known bad.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import rasterio
from azure.core import MatchConditions
from rio_stac.stac import _get_stats, get_raster_info

from tilecommit import jobs
from tilecommit.errors import MosaicCheckError
from tilecommit.raster.assembly import stac
from tilecommit.raster.assembly.statistics import (
    MIN_PIXELS,
    band_statistics,
    masked_level,
    mosaic_statistics,
    statistics_level,
)

from .raster_jobs import JOB, assemble, download
from .rio_stac_check import assert_rio_stacs, check_item_statistics

REAL = Path(__file__).resolve().parent / "fixtures" / "real"


def test_the_level_is_the_coarsest_with_at_least_min_pixels():
    assert MIN_PIXELS == 512 * 512
    # 8192 x 8192: 4096, 2048, 1024, 512 (exactly MIN_PIXELS), 256 on a side.
    assert statistics_level(8192, 8192, [2, 4, 8, 16, 32]) == 4
    # 5000 x 3000: 1250 x 750 holds 937,500 pixels, 625 x 375 fewer than MIN_PIXELS.
    assert statistics_level(5000, 3000, [2, 4, 8]) == 2
    # Overview sizes round up: 2045 x 2048 by 4 is 512 x 512 (by 4, rounded down, 511 x 512).
    assert statistics_level(2045, 2048, [2, 4]) == 2
    # No overview as large: the first, never the full resolution, which only a mosaic without
    # overviews (one block) is read at.
    assert statistics_level(600, 520, [2, 4]) == 1
    assert statistics_level(900, 900, [2, 4]) == 1
    assert statistics_level(256, 200, []) == 0


def test_the_items_statistics_are_rio_stacs_on_the_overview_level_it_names(rendered, stores, storage, tmp_path):
    spec, _, scene, settings, _ = rendered
    # 600 x 520 pixels with levels of 300 x 260 and 150 x 130, none of MIN_PIXELS: the first overview.
    assert assemble(scene, settings, stores, storage).outcome == "written"
    item = json.loads(stores["output"].download_blob(jobs.stac_blob_name(JOB)).readall())
    note = item["properties"][stac.STATISTICS_PROPERTY]
    assert note == {"approximate": True, "overview_level": 1, "width": 300, "height": 260, "histogram_bins": 10}
    bands = item["assets"]["data"]["raster:bands"]
    assert len(bands) == spec.count == 3

    mosaic = download(stores["output"], jobs.mosaic_blob_name(JOB), tmp_path / "mosaic.tif")
    check_item_statistics(item, mosaic)
    with rasterio.open(mosaic, overview_level=0) as level:
        assert level.nodata == 0  # the scene's nodata, left out by both
    assert all(0 < band["statistics"]["valid_percent"] < 100 for band in bands)
    with rasterio.open(mosaic) as full:
        whole = get_raster_info(full, max_size=None)
    # The control: the full resolution gives other figures, so the level read is the one named.
    assert [b["histogram"] for b in whole] != [b["histogram"] for b in bands]


@pytest.mark.parametrize("path", sorted(REAL.glob("*.tif")), ids=lambda p: p.name)
def test_the_level_read_once_is_masked_as_rasterio_masks_it(path):
    """Every real file (nodata, NaN nodata, internal masks, alpha bands, none): the pixels read
    once and masked by GDAL in memory are rasterio's ``read(masked=True)``, mask and values."""
    with rasterio.open(path) as src:
        expected, found = src.read(masked=True), masked_level(src)
    assert np.array_equal(np.ma.getmaskarray(found), np.ma.getmaskarray(expected))
    assert np.array_equal(found.data, expected.data, equal_nan=True)


@pytest.mark.parametrize(
    "name",
    ["alpha.tif", "cog_uint8_rgb_mask.tif", "nan32_nodata.tif", "float_raster_with_extra_nodata.tif", "clp.tif"],
)
def test_real_files_are_described_as_rio_stac_describes_the_level_read(name):
    found = mosaic_statistics(str(REAL / name))
    options = {"overview_level": found.level - 1} if found.level else {}
    with rasterio.open(REAL / name, **options) as level:
        assert (level.width, level.height) == (found.width, found.height)
        theirs = get_raster_info(level, max_size=None)
    for ours, its in zip(found.bands, theirs, strict=True):
        assert ours is not None
        assert_rio_stacs({"statistics": ours.statistics, "histogram": ours.histogram}, its, its["data_type"])


def test_one_band_is_described_as_rio_stac_describes_it():
    """Invalid values and the mask left out, the narrow-range fallback of the histogram, integer
    extremes kept integers; a band with no valid pixel has only its valid_percent."""
    rng = np.random.default_rng(7)
    floats = rng.normal(100.0, 15.0, (300, 200)).astype("float32")
    floats[:10] = np.nan
    floats[10:12] = np.inf
    floats[50:60] = -9999.0
    integers = rng.integers(0, 65535, (300, 200), dtype="uint16")
    integers[:5] = 0
    # Two values 6 ulps apart: too narrow for 10 buckets, wide enough for 3.
    narrow = np.full((64, 64), 1.0, dtype="float64")
    narrow[0, :5] = 1.0 + 6 * np.spacing(1.0)
    # Each with a mask array, as rasterio's masked reads give (rio-stac counts an array with no
    # mask at all, numpy's ``nomask``, as one valid pixel; here it has no invalid one).
    cases = [
        np.ma.masked_equal(floats, -9999.0),
        np.ma.masked_equal(integers, 0),
        np.ma.masked_array(integers, mask=np.zeros(integers.shape, bool)),
        np.ma.masked_array(narrow, mask=np.zeros(narrow.shape, bool)),
    ]
    with pytest.warns(UserWarning, match="fall back to automatic bin"):
        theirs = [_get_stats(case) for case in cases]
    for case, its in zip(cases, theirs, strict=True):
        ours = band_statistics(case)
        assert ours is not None
        assert_rio_stacs({"statistics": ours.statistics, "histogram": ours.histogram}, its, str(case.dtype))
        # In float64 throughout, numpy agrees with ours to the last bits, float32 samples included.
        valid = np.ma.fix_invalid(case).compressed().astype(np.float64)
        assert ours.statistics["mean"] == pytest.approx(valid.mean(), rel=1e-13)
        assert ours.statistics["stddev"] == pytest.approx(valid.std(), rel=1e-12)
    assert theirs[-1]["histogram"]["count"] == 4  # the control: the fallback was taken (3 buckets)
    empty = band_statistics(np.ma.masked_all((4, 4), dtype="uint8"))
    assert empty is not None and (empty.statistics, empty.histogram) == ({"valid_percent": 0.0}, None)


def test_the_figures_do_not_depend_on_the_order_of_the_pixels():
    """The item is compared byte for byte when it is made again: the same pixels in another
    order (another machine's summation) give the very same numbers."""
    rng = np.random.default_rng(11)
    values = rng.normal(0.0, 1e6, 100_003)
    shuffled = rng.permutation(values)
    first, second = band_statistics(np.ma.masked_array(values)), band_statistics(np.ma.masked_array(shuffled))
    assert first == second


def replace_stored(container, name: str, body: bytes) -> None:
    blob = container.get_blob_client(name)
    props = blob.get_blob_properties()
    blob.upload_blob(
        body, overwrite=True, etag=props.etag, match_condition=MatchConditions.IfNotModified, metadata=props.metadata
    )


def canonical(item: dict) -> bytes:
    return (json.dumps(item, sort_keys=True, indent=2) + "\n").encode()


def test_an_item_stored_before_the_statistics_is_good_and_any_other_difference_is_not(rendered, stores, storage):
    """A job completed by a build before the statistics, delivered again: its item has none of
    them (the rest of the item that build made is this one's), and it is already-present, kept
    as it was. The same item with another geometry is known bad; so is an item with statistics
    that are not the mosaic's."""
    _, _, scene, settings, _ = rendered
    assert assemble(scene, settings, stores, storage).outcome == "written"
    output, name = stores["output"], jobs.stac_blob_name(JOB)
    made = json.loads(output.download_blob(name).readall())
    assert all("statistics" in b and "histogram" in b for b in made["assets"]["data"]["raster:bands"])

    before = json.loads(stac.without_statistics(canonical(made)))
    assert stac.STATISTICS_PROPERTY not in before["properties"]
    assert not any("statistics" in b for b in before["assets"]["data"]["raster:bands"])
    replace_stored(output, name, canonical(before))
    assert assemble(scene, settings, stores, storage).outcome == "already-present"
    assert json.loads(output.download_blob(name).readall()) == before

    moved = {**before, "bbox": [b + 1.0 for b in before["bbox"]]}
    replace_stored(output, name, canonical(moved))
    with pytest.raises(MosaicCheckError, match=f"{name} is not what the committed mosaic gives"):
        assemble(scene, settings, stores, storage)

    wrong = json.loads(canonical(made))
    wrong["assets"]["data"]["raster:bands"][0]["statistics"]["mean"] += 1.0
    replace_stored(output, name, canonical(wrong))
    with pytest.raises(MosaicCheckError, match=f"{name} is not what the committed mosaic gives"):
        assemble(scene, settings, stores, storage)

    replace_stored(output, name, canonical(made))
    assert assemble(scene, settings, stores, storage).outcome == "already-present"
