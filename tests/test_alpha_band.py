"""Sources whose valid area is an alpha band, with the profile options ``rio cogeo create`` gives
them (rio-cogeo 7.0.4 reads every source through rasterio's WarpedVRT, which declares the alpha
band to GDAL's warper):

- ``add_mask``: the alpha band becomes the mask (valid where it is above 0) and is dropped, what
  is fully transparent becomes 0; the mosaic equals rio-cogeo's output, band for band, mask and pixels;
- ``web_optimized``: the band is kept, warped as the warper's alpha; the mosaic is on rio-cogeo's
  grid, its pixels and alpha those of one exact warp of the whole source (nearest and average,
  a geographic scene across the antimeridian among them); with ``add_mask`` too, the warped alpha
  becomes the mask;
- what is not built is refused at validation with the reason.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import rasterio
from rasterio.enums import MaskFlags
from rasterio.transform import from_origin
from rio_cogeo.cogeo import cog_translate, cog_validate
from rio_cogeo.profiles import cog_profiles

from devhost.session import process_file
from tilecommit import profiles
from tilecommit.errors import UnsupportedRasterError
from tilecommit.grid import plan_windows
from tilecommit.raster import inspect_source
from tilecommit.raster.scrub import check_window
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec

from .app_jobs import download as download_output
from .app_jobs import local_host
from .raster_jobs import download, job_of, job_stores, run_steps
from .test_web_optimized import differing, overview_count, rasterio_warp, rio_cogeo_web_optimized, whole_warp

WHERE = "blob metadata tilecommit_profile"
UTM = ("EPSG:32633", from_origin(500000, 4600000, 10, 10))
#: From 178.4 to 181.6 deg E (past 180), 0.005 deg pixels: the warp to WebMercatorQuad crosses the antimeridian.
ANTIMERIDIAN = ("EPSG:4326", from_origin(178.4, -15.0, 0.005, 0.005))


def alpha_scene(
    path, bands: int = 4, dtype: str = "uint8", where=UTM, nodata: float | None = None, compress: str | None = None
) -> str:
    """600 x 520 random pixels (none 0), the last of ``bands`` an alpha band: fully transparent in a
    corner and a strip cut off (the pixels under it not 0, so what turns them 0 shows), a row of
    every value from 0 to 255 (the warper's low values among them), opaque elsewhere; stored raw,
    or with ``compress``."""
    rng = np.random.default_rng(bands)
    top = np.iinfo(dtype).max
    data = rng.integers(1, top, size=(bands, 520, 600), dtype=dtype)
    rows, cols = np.mgrid[0:520, 0:600]
    alpha = np.full((520, 600), top, dtype)
    alpha[(rows + cols < 150) | (cols >= 500)] = 0
    alpha[200:210, 100:356] = np.arange(256, dtype=dtype)
    data[-1] = alpha
    crs, transform = where
    profile = dict(driver="GTiff", width=600, height=520, count=bands, dtype=dtype, crs=crs, transform=transform)
    profile.update(tiled=True, blockxsize=256, blockysize=256, alpha="YES", nodata=nodata)
    if compress:
        profile["compress"] = compress
    if bands == 4:
        profile["photometric"] = "RGB"
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(data)
    return str(path)


def assert_every_tile_as_made(source: str, scene, settings: Settings, spec: OutputSpec, stores) -> None:
    """A scrub reads every window as the render did, and finds its tile as made."""
    for window in plan_windows(scene.width, scene.height, spec.window_size):
        report = check_window(job_of(settings, spec=spec), job_stores(stores, settings), source, window)
        assert report.differences == [], report.details


# ------------------------------------------------------------------------------------ add_mask

#: bands, sample type: RGBA, grey + alpha, and grey + a 16-bit alpha (whose values below 7 the
#: warper takes as fully transparent: 7/65535 is the first density it counts)
ADD_MASK_CASES = {"rgba": (4, "uint8"), "grey-alpha": (2, "uint8"), "grey-alpha-uint16": (2, "uint16")}


def valid_mosaic_and_rio_add_mask(tmp_path, stores, result, source: str, rio_profile: str) -> tuple[str, str]:
    """The job's mosaic, downloaded and checked a valid COG, and ``rio cogeo create --add-mask``'s
    output of the same source with rio-cogeo's profile ``rio_profile``."""
    mosaic = download(stores["output"], result.mosaic, tmp_path / "mosaic.tif")
    valid, errors, _ = cog_validate(mosaic)
    assert valid and not errors, errors
    reference = str(tmp_path / "rio.tif")
    cog_translate(source, reference, cog_profiles.get(rio_profile), add_mask=True, quiet=True)
    return mosaic, reference


@pytest.mark.parametrize("method", ["server", "vrt"])
@pytest.mark.parametrize("case", ADD_MASK_CASES)
def test_add_mask_makes_the_alpha_band_the_mask_as_rio_cogeo_does(tmp_path, stores, storage, method, case):
    bands, dtype = ADD_MASK_CASES[case]
    source = alpha_scene(tmp_path / "source.tif", bands, dtype)
    settings = Settings(window_size=256, profile="default,add_mask=true")
    spec, scene, result = run_steps(source, settings, stores, storage, method=method)
    assert (scene.count, scene.mask, scene.nodata) == (bands - 1, "per-dataset", None)
    assert result.outcome == "written"
    mosaic, reference = valid_mosaic_and_rio_add_mask(tmp_path, stores, result, source, "deflate")
    with rasterio.open(mosaic) as ours, rasterio.open(reference) as theirs, rasterio.open(source) as src:
        kept = (bands - 1, (dtype,) * (bands - 1), None)
        assert (ours.count, ours.dtypes, ours.nodata) == (theirs.count, theirs.dtypes, theirs.nodata) == kept
        assert ours.colorinterp == theirs.colorinterp == src.colorinterp[: bands - 1]
        assert ours.mask_flag_enums == theirs.mask_flag_enums == ([MaskFlags.per_dataset],) * (bands - 1)
        pixels, mask = ours.read(), ours.dataset_mask()
        assert differing(pixels, theirs.read()) == 0
        assert differing(mask, theirs.dataset_mask()) == 0
        original = src.read()
    # What rio-cogeo makes, in words: valid where the warper counts the alpha, 0 elsewhere, the
    # source's pixels in between (partly transparent ones too).
    alpha = original[-1]
    transparent = alpha < (7 if dtype == "uint16" else 1)
    assert np.array_equal(mask == 0, transparent) and 0 < transparent.sum() < transparent.size
    assert (pixels[:, transparent] == 0).all() and (original[:-1, transparent] != 0).all()
    assert np.array_equal(pixels[:, ~transparent], original[:-1, ~transparent])
    assert_every_tile_as_made(source, scene, settings, spec, stores)


def test_jpeg_with_add_mask_encodes_the_rgb_and_makes_the_alpha_band_an_exact_mask(tmp_path, stores, storage):
    """``-p jpeg --add-mask`` on RGBA: JPEG takes the three colour bands, the mask stays exact."""
    source = alpha_scene(tmp_path / "source.tif")
    settings = Settings(window_size=256, profile="jpeg,add_mask=true")
    spec, scene, result = run_steps(source, settings, stores, storage)
    mosaic, reference = valid_mosaic_and_rio_add_mask(tmp_path, stores, result, source, "jpeg")
    with rasterio.open(mosaic) as ours, rasterio.open(reference) as theirs, rasterio.open(source) as src:
        assert ours.compression.value == theirs.compression.value == "JPEG"
        assert ours.count == theirs.count == 3 and ours.colorinterp == theirs.colorinterp
        assert ours.mask_flag_enums == theirs.mask_flag_enums == ([MaskFlags.per_dataset],) * 3
        assert np.array_equal(ours.dataset_mask(), theirs.dataset_mask())
        assert np.array_equal(ours.dataset_mask() == 0, src.read(4) == 0)
    assert_every_tile_as_made(source, scene, settings, spec, stores)


# ------------------------------------------------------------------------------------ web_optimized


@pytest.fixture
def host(app_env):
    with local_host(app_env) as running:
        running.ensure_storage()
        yield running


#: bands, where, warp kernel
WEB_CASES = {
    "rgba": (4, UTM, "nearest"),
    "grey-alpha-average": (2, UTM, "average"),
    "rgba-antimeridian-average": (4, ANTIMERIDIAN, "average"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", WEB_CASES)
def test_web_optimized_keeps_the_alpha_band_warped_on_rio_cogeos_grid_as_an_exact_warp(
    host, storage, app_env, tmp_path, case
):
    bands, where, resampling = WEB_CASES[case]
    source = alpha_scene(tmp_path / "source.tif", bands, where=where)
    metadata = {"tilecommit_web_optimized": "true", "tilecommit_warp_resampling": resampling}
    summary = process_file(host, Path(source), name=f"{case}.tif", timeout=300, metadata=metadata)
    assert summary["status"] == "completed", summary
    mosaic = tmp_path / "mosaic.tif"
    mosaic.write_bytes(download_output(storage, app_env.output, f"mosaics/{summary['job_id']}/mosaic.tif"))
    valid, errors, _ = cog_validate(str(mosaic))
    assert valid and not errors, errors

    reference = rio_cogeo_web_optimized(source, str(tmp_path / "rio.tif"), resampling)
    with rasterio.open(mosaic) as ours, rasterio.open(reference) as theirs, rasterio.open(source) as src:
        assert ours.crs == theirs.crs == "EPSG:3857" and ours.transform == theirs.transform
        assert (ours.width, ours.height, ours.count, ours.dtypes) == (
            theirs.width,
            theirs.height,
            theirs.count,
            theirs.dtypes,
        )
        assert ours.block_shapes == theirs.block_shapes and ours.nodata == theirs.nodata is None
        assert ours.colorinterp == theirs.colorinterp == src.colorinterp
        assert ours.mask_flag_enums == theirs.mask_flag_enums  # the alpha band is the mask
        assert MaskFlags.alpha in ours.mask_flag_enums[0]
        assert ours.tags()["TILING_SCHEME_ZOOM_LEVEL"] == theirs.tags()["TILING_SCHEME_ZOOM_LEVEL"]
        pixels, theirs_pixels = ours.read(), theirs.read()
    assert overview_count(str(mosaic)) == overview_count(reference)
    exact, _ = whole_warp(source, resampling)
    assert differing(pixels, exact) == 0, f"{differing(pixels, exact)} of {exact.size} differ from the exact warp"
    assert differing(rasterio_warp(source, resampling)[0], exact) == 0  # rasterio declares the alpha band itself
    # The warper's alpha: what was fully transparent is 0 (its pixels too), and partly so in between.
    alpha = pixels[-1]
    assert 0 < (alpha == 0).sum() < alpha.size and ((alpha > 0) & (alpha < 255)).any()
    assert (pixels[:-1, alpha == 0] == 0).all()
    # rio-cogeo warps with the approximating transformer (0.125 pixel): its pixels may differ.
    print(
        f"{case}: {exact.shape}, rio-cogeo's own values differ in {differing(theirs_pixels[:-1], exact[:-1])}, "
        f"its alpha in {differing(theirs_pixels[-1], exact[-1])}"
    )


def test_web_optimized_with_add_mask_makes_the_warped_alpha_the_mask(tmp_path, stores, storage):
    source = alpha_scene(tmp_path / "source.tif")
    settings = Settings(window_size=512, profile="default,web_optimized=true,add_mask=true")
    spec, scene, result = run_steps(source, settings, stores, storage)
    assert (scene.count, scene.mask, scene.nodata) == (3, "per-dataset", None)
    mosaic = download(stores["output"], result.mosaic, tmp_path / "mosaic.tif")
    assert cog_validate(mosaic)[0]
    reference = str(tmp_path / "rio.tif")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # web_optimized, which the CLI still names
        profile = {**cog_profiles.get("deflate"), "blockxsize": 256, "blockysize": 256}
        cog_translate(source, reference, profile, web_optimized=True, add_mask=True, quiet=True)
    exact, _ = whole_warp(source, "nearest")
    with rasterio.open(mosaic) as ours, rasterio.open(reference) as theirs:
        assert (ours.transform, ours.width, ours.height) == (theirs.transform, theirs.width, theirs.height)
        assert ours.count == theirs.count == 3 and ours.colorinterp == theirs.colorinterp
        assert ours.mask_flag_enums == theirs.mask_flag_enums == ([MaskFlags.per_dataset],) * 3
        assert differing(ours.read(), exact[:3]) == 0
        assert np.array_equal(ours.dataset_mask() > 0, exact[3] > 0)
        mask_differs = int(((theirs.dataset_mask() > 0) != (exact[3] > 0)).sum())
    print(f"web_optimized + add_mask: rio-cogeo's mask differs from the exact warp's alpha in {mask_differs}")
    assert_every_tile_as_made(source, scene, settings, spec, stores)


# ------------------------------------------------------------------------------------ refused


def test_what_is_not_built_for_an_alpha_band_is_refused_at_validation_with_the_reason(tmp_path):
    settings = Settings(window_size=256)

    def spec(**options) -> OutputSpec:
        return OutputSpec.with_choice(256, profiles.choose("default", options, where=WHERE))

    rgba = alpha_scene(tmp_path / "rgba.tif")
    assert inspect_source(rgba, settings=settings, spec=spec(add_mask="true")).colorinterp == ["red", "green", "blue"]
    for options in ({"add_mask": "true", "nodata": "0"}, {"web_optimized": "true", "nodata": "0"}):
        with pytest.raises(UnsupportedRasterError, match="as an alpha band, and the profile's nodata=0 would mark"):
            inspect_source(rgba, settings=settings, spec=spec(**options))
    own_nodata = alpha_scene(tmp_path / "nodata.tif", nodata=0)
    with pytest.raises(UnsupportedRasterError, match=r"has an alpha band and a nodata value \(0\), which GDAL takes"):
        inspect_source(own_nodata, settings=settings, spec=spec(add_mask="true"))
    # GDAL takes no int16 alpha band as a mask; rio-cogeo would drop it and write a mask of all valid
    int16 = alpha_scene(tmp_path / "int16.tif", bands=2, dtype="int16")
    with pytest.raises(UnsupportedRasterError, match=r"does not take as its valid area \(band 2 of 2, int16\)"):
        inspect_source(int16, settings=settings, spec=spec(add_mask="true"))
