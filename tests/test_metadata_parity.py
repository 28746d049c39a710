"""Nothing the source says is lost, on every assembly path, checked against rio-cogeo's own output.

`tests/test_real_rasters.py` checks that every accepted real file's mosaic says what its source
says (``metadata.said``) on the default path. Here: the same files against what
``rio cogeo create`` makes of them (rio-cogeo 7.0.4, with its options to forward band and
namespace tags, the most it carries), the VRT path for the files whose metadata is richest, and a
raster whose pixels are points, which no file of the corpus is.
"""

from __future__ import annotations

import pytest
import rasterio
from rio_cogeo.cogeo import cog_translate
from rio_cogeo.profiles import cog_profiles

from tilecommit.raster.reading.metadata import said
from tilecommit.settings import Settings

from .raster_jobs import download, run_steps
from .test_real_rasters import ACCEPTED, check_mosaic, corpus, derived, window_size_for

#: rio-cogeo's own product tag (the overview resampling it used): not something the source said.
RIO_PRODUCT_TAGS = ("OVERVIEW_RESAMPLING",)
#: Files whose metadata goes beyond the raster type: dataset tags (TIFF tags, a JSON image
#: description), band tags (statistics, classes), an RPC domain, units, a colormap.
RICH = [
    "all-nodata.tif",
    "byte_user_defined_geokeys.tif",
    "cog_rgb.tif",
    "labels.tif",
    "test_color_table.tif",
    "tif_webp.tif",
    "world.byte.tif",
]


def mosaic_of(source: str, stores, storage, tmp_path, **assembly) -> tuple[str, str]:
    settings = Settings(window_size=window_size_for(source))
    _, _, result = run_steps(source, settings, stores, storage, **assembly)
    return download(stores["output"], result.mosaic, tmp_path / "mosaic.tif"), result.method


def rio_cogeo_says(source: str, tmp_path) -> dict:
    path = tmp_path / "rio-cogeo.tif"
    profile = cog_profiles.get("deflate")
    cog_translate(source, str(path), profile, forward_band_tags=True, forward_ns_tags=True, quiet=True)
    with rasterio.open(path) as made:
        says = said(made)
    for tag in RIO_PRODUCT_TAGS:
        says["tags"].pop(tag)
    return says


@pytest.mark.parametrize("name", ACCEPTED)
def test_the_mosaic_carries_all_that_rio_cogeo_carries(name, stores, storage, tmp_path):
    source = str(corpus(name))
    mosaic, _ = mosaic_of(source, stores, storage, tmp_path)
    with rasterio.open(mosaic) as m, rasterio.open(source) as src:
        ours, theirs = said(m), said(src)
    assert ours == theirs
    rio = rio_cogeo_says(source, tmp_path)
    differ = {key for key in rio if rio[key] != ours[key]}
    # rio-cogeo does not copy units (cog_translate sets descriptions, scales and offsets only),
    # so where a source has them its output says less than ours, never more.
    assert differ <= {"units"}, {key: (rio[key], ours[key]) for key in differ}
    if differ:
        assert any(ours["units"]) and not any(rio["units"])


@pytest.mark.parametrize("name", RICH)
def test_the_vrt_path_carries_it_too(name, stores, storage, tmp_path):
    source = str(corpus(name))
    mosaic, method = mosaic_of(source, stores, storage, tmp_path, method="vrt")
    assert method == "vrt"
    with rasterio.open(mosaic) as m, rasterio.open(source) as src:
        assert said(m) == said(src)


def test_the_rich_files_say_more_than_the_raster_type(tmp_path):
    # The control for the VRT test: each of its files has metadata a dropped copy would lose.
    for name in RICH:
        with rasterio.open(corpus(name)) as src:
            says = said(src)
        beyond = {k: v for k, v in says["tags"].items() if k != "AREA_OR_POINT"}
        assert beyond or says["domains"] or any(says["band_tags"]) or any(says["units"]) or says["colormap"], name


@pytest.mark.parametrize("method", ["server", "vrt"])
def test_a_point_raster_stays_a_point_raster(method, stores, storage, tmp_path):
    """AREA_OR_POINT=Point (pixel values are samples at the pixel's corner, GeoTIFF's
    RasterPixelIsPoint): a mosaic that said Area would move every reader's view by half a pixel."""

    def build(src):
        return {**src.profile, "driver": "GTiff"}, src.read()

    path = derived(tmp_path, "dem-hills.tif", build)
    with rasterio.open(path, "r+") as dst:
        dst.update_tags(AREA_OR_POINT="Point")
    with rasterio.open(path) as src:
        assert src.tags()["AREA_OR_POINT"] == "Point"
        transform = src.transform
    mosaic, used = mosaic_of(path, stores, storage, tmp_path, method=method)
    assert used == method
    with rasterio.open(mosaic) as m:
        assert m.tags()["AREA_OR_POINT"] == "Point"
        assert m.transform == transform
    with rasterio.open(mosaic) as m, rasterio.open(path) as src:
        levels = len(m.overviews(1))
    check_mosaic(path, mosaic, levels)
