"""The ``nodata`` and ``add_mask`` profile options, as ``rio cogeo create --nodata`` and
``--add-mask`` make them: the override is part of the job; the tiles and the mosaic carry it as
their nodata value and mask (a source's own internal mask is kept, masked by the value too), or,
with ``add_mask``, as an internal mask with no nodata value; each case compared with rio-cogeo's
own output; the pixels stay the source's; what the data type cannot hold is refused."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import rasterio
from rasterio.enums import MaskFlags
from rasterio.transform import from_origin
from rio_cogeo.cogeo import cog_translate, cog_validate
from rio_cogeo.errors import NodataAlphaMaskWarning
from rio_cogeo.profiles import cog_profiles

from tilecommit import profiles
from tilecommit.errors import BadInputError
from tilecommit.grid import plan_windows
from tilecommit.jobs import job_id_for
from tilecommit.raster.scrub import check_window
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec

from .raster_jobs import download, job_of, job_stores, run_steps

WHERE = "blob metadata tilecommit_profile"


def write_source(path, *, masked: bool = False, nodata: float | None = None) -> str:
    """A 3-band uint16 scene of 1100 x 900 (windows of 512 cross it unevenly) with a corner of
    zeros; ``masked``: with an internal per-dataset mask besides; ``nodata``: the file's own."""
    rng = np.random.default_rng(11)
    data = rng.integers(1, 4000, size=(3, 900, 1100), dtype=np.uint16)
    rows, cols = np.mgrid[0:900, 0:1100]
    data[:, rows + cols < 400] = 0
    profile = dict(driver="GTiff", width=1100, height=900, count=3, dtype="uint16", crs="EPSG:32633")
    profile.update(transform=from_origin(500000, 4600000, 10, 10), tiled=True, blockxsize=256, blockysize=256)
    profile.update(nodata=nodata)
    with rasterio.Env(GDAL_TIFF_INTERNAL_MASK=True), rasterio.open(path, "w", **profile) as dst:
        dst.write(data)
        if masked:
            dst.write_mask(np.where(cols < 1000, 255, 0).astype(np.uint8))
    return str(path)


def test_the_option_is_checked_and_kept_as_text():
    assert profiles.choose("default", {"nodata": "0"}, where=WHERE).options == (("nodata", "0.0"),)
    assert profiles.choose("zstd", {"nodata": " -9999 "}, where=WHERE).nodata == -9999.0
    assert profiles.choose("lerc", {"nodata": "NaN"}, where=WHERE).options == (("nodata", "nan"),)
    for raw in ("none", "inf", ""):
        with pytest.raises(BadInputError, match=rf"{WHERE}: nodata="):
            profiles.choose("default", {"nodata": raw}, where=WHERE)
    # From the upload's metadata, as every option.
    chosen = profiles.resolve({"tilecommit_nodata": "0"}, "a.tif", rules=[], default=profiles.DEFAULT_CHOICE)
    assert chosen == profiles.Choice("default", (("nodata", "0.0"),))


def test_the_override_is_part_of_the_job_id():
    plain = OutputSpec(window_size=512)
    overridden = OutputSpec.with_choice(512, profiles.choose("default", {"nodata": "0"}, where=WHERE))
    assert OutputSpec.from_dict(overridden.to_dict()) == overridden
    url, etag = "https://a.blob.core.windows.net/in/s.tif", '"0x1"'
    assert job_id_for(url, etag, plain) != job_id_for(url, etag, overridden)


@pytest.mark.parametrize(
    ("dtype", "raw", "why"),
    [
        ("uint8", "300", "nodata=300 on uint8 data: accepted a whole number from 0 to 255"),
        ("uint16", "0.5", "nodata=0.5 on uint16 data: accepted a whole number"),
        ("int16", "nan", "nodata=nan on int16 data: accepted a whole number"),
        ("float32", "1e39", "nodata=1e\\+39 on float32 data: beyond the largest float32"),
    ],
)
def test_a_value_the_data_type_cannot_hold_is_refused_saying_what_is(dtype, raw, why):
    choice = profiles.choose("default", {"nodata": raw}, where=WHERE)
    with pytest.raises(BadInputError, match=why):
        profiles.check_for(choice, dtype, count=1, nodata=choice.nodata, alpha=False)


def test_a_lossy_codec_with_an_override_is_refused_as_with_the_sources_own_nodata():
    choice = profiles.choose("webp", {"nodata": "0"}, where=WHERE)
    with pytest.raises(BadInputError, match="WEBP on data with a nodata value"):
        profiles.check_for(choice, "uint8", count=3, nodata=choice.nodata, alpha=False)


#: (the profile's options, rio-cogeo's keywords for the same, whether the outputs have an
#: internal mask, the file's own nodata value)
CASES = {
    "nodata": ("nodata=0", {"nodata": 0}, False, None),
    "nodata-add-mask": ("nodata=0,add_mask=true", {"nodata": 0, "add_mask": True}, True, None),
    "own-nodata-add-mask": ("add_mask=yes", {"add_mask": True}, True, 0),
    "add-mask-nothing-to-mask": ("add_mask=1", {"add_mask": True}, True, 5000),
}


@pytest.mark.parametrize("method", ["server", "vrt"])
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "internal-mask"])
@pytest.mark.parametrize("case", CASES)
def test_the_mosaic_carries_the_options_as_rio_cogeo_does(tmp_path, stores, storage, method, masked, case):
    options, theirs_options, with_mask, own_nodata = CASES[case]
    source = write_source(tmp_path / "source.tif", masked=masked, nodata=own_nodata)
    settings = Settings(window_size=512, profile=f"default,{options}")
    spec, scene, result = run_steps(source, settings, stores, storage, method=method)
    nodata = None if with_mask else 0.0
    assert (scene.nodata, scene.mask) == (nodata, "per-dataset" if masked or with_mask else "nodata")
    assert result.outcome == "written"
    mosaic = download(stores["output"], result.mosaic, tmp_path / "mosaic.tif")

    reference = str(tmp_path / "rio.tif")
    # rio-cogeo says so when a nodata value and the source's internal mask meet.
    warns = masked and (own_nodata is not None or "nodata" in theirs_options)
    with pytest.warns(NodataAlphaMaskWarning) if warns else contextlib.nullcontext():
        cog_translate(source, reference, cog_profiles.get("deflate"), quiet=True, **theirs_options)
    valid, errors, _ = cog_validate(mosaic)
    assert valid and not errors, errors
    with rasterio.open(mosaic) as ours, rasterio.open(reference) as theirs, rasterio.open(source) as src:
        assert ours.nodata == theirs.nodata == nodata
        # With the source's internal mask, rio-cogeo writes one too: the source's, and the override's.
        flags = [MaskFlags.per_dataset] if masked or with_mask else [MaskFlags.nodata]
        assert ours.mask_flag_enums == theirs.mask_flag_enums == (flags,) * 3
        assert np.array_equal(ours.read(), src.read())  # the pixels are the source's, the zeros too
        assert np.array_equal(ours.dataset_mask(), theirs.dataset_mask())
        masks_zeros = own_nodata != 5000
        assert ours.dataset_mask()[0, 0] == (0 if masks_zeros else 255) and ours.dataset_mask()[-1, 500]

    # A scrub of the job finds every tile as the options make it.
    for window in plan_windows(scene.width, scene.height, spec.window_size):
        report = check_window(job_of(settings, spec=spec), job_stores(stores, settings), source, window)
        assert report.differences == [], report.details


def test_add_mask_is_checked_and_false_is_the_same_job_as_not_giving_it():
    assert profiles.choose("default", {"add_mask": "TRUE"}, where=WHERE).options == (("add_mask", "true"),)
    assert profiles.choose("default", {"add_mask": "no"}, where=WHERE) == profiles.DEFAULT_CHOICE
    with pytest.raises(BadInputError, match=rf"{WHERE}: add_mask='maybe': accepted true, yes, 1, false, no, 0"):
        profiles.choose("default", {"add_mask": "maybe"}, where=WHERE)


def test_with_add_mask_a_lossy_codec_takes_data_with_nodata_and_an_alpha_band_becomes_the_mask():
    jpeg = profiles.choose("jpeg", {"add_mask": "true"}, where=WHERE)
    profiles.check_for(jpeg, "uint8", count=3, nodata=0, alpha=False)  # the mask, not the pixels, says what is valid
    lerc = profiles.choose("lerc", {"max_z_error": "2", "add_mask": "true"}, where=WHERE)
    profiles.check_for(lerc, "uint16", count=1, nodata=0, alpha=False)
    masked = profiles.choose("default", {"add_mask": "true"}, where=WHERE)
    profiles.check_for(masked, "uint8", count=4, nodata=None, alpha=True)  # tests/test_alpha_band.py
    profiles.check_for(jpeg, "uint8", count=4, nodata=None, alpha=True)  # JPEG encodes the RGB left
    with pytest.raises(BadInputError, match="JPEG would blur the alpha band's edges"):
        profiles.check_for(profiles.choose("jpeg", {}, where=WHERE), "uint8", count=4, nodata=None, alpha=True)


def test_a_jpeg_mosaic_with_add_mask_keeps_the_valid_area_exact(tmp_path, stores, storage):
    """JPEG moves pixel values, so on data with a nodata value it is refused; with ``add_mask``
    the valid area is the mask, encoded losslessly beside the JPEG blocks, and stays exact."""
    rng = np.random.default_rng(5)
    data = rng.integers(1, 255, size=(3, 700, 900), dtype=np.uint8)
    rows, cols = np.mgrid[0:700, 0:900]
    data[:, rows + cols < 300] = 0
    source = str(tmp_path / "rgb.tif")
    profile = dict(driver="GTiff", width=900, height=700, count=3, dtype="uint8", crs="EPSG:32633", nodata=0)
    with rasterio.open(source, "w", transform=from_origin(500000, 4600000, 10, 10), **profile) as dst:
        dst.write(data)
    settings = Settings(window_size=512, profile="jpeg,add_mask=true")
    _, scene, result = run_steps(source, settings, stores, storage)
    mosaic = download(stores["output"], result.mosaic, tmp_path / "mosaic.tif")
    valid, errors, _ = cog_validate(mosaic)
    assert valid and not errors, errors
    with rasterio.open(mosaic) as ours:
        assert ours.compression.value == "JPEG" and ours.nodata is None
        assert ours.mask_flag_enums == ([MaskFlags.per_dataset],) * 3
        assert np.array_equal(ours.dataset_mask() == 0, (data == 0).all(axis=0))
