"""Lossy profiles (JPEG, WEBP, LERC above max_z_error 0) and every profile's levels, through the
library steps a job runs (render every window, assemble) against Azurite, on every assembly path.

What must hold for every profile: a valid COG whose every level (the tiles' own overviews copied,
the coarse levels computed) is encoded to the profile; a mask exactly the source's; on the
block-copy paths, full-resolution pixels exactly the tiles'; LERC within its max_z_error of the
source. And the scrub compares a lossy tile with its window encoded again, not with the source.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import rasterio
from rasterio.io import MemoryFile
from rio_cogeo.cogeo import cog_validate

from testkit.scenes import SceneSpec, write_scene
from tilecommit.grid import plan_windows
from tilecommit.raster.assembly.pyramid import mosaic_overview_levels
from tilecommit.raster.scrub import OTHER_PIXELS, _pixel_difference, check_window
from tilecommit.raster.tiling.encode import read_window
from tilecommit.settings import Settings

from .raster_jobs import JOB, assert_complete_pyramid, download, job_of, job_stores, run_steps

#: (profile text as TILECOMMIT_PROFILE takes it, the scene, the codec GDAL reports, LERC's bound).
CASES = {
    "jpeg-rgb": ("jpeg", SceneSpec(1200, 1100, 3, "uint8"), "jpeg", None),
    "jpeg-grey-q90": ("jpeg,quality=90", SceneSpec(1200, 1100, 1, "uint8"), "jpeg", None),
    "webp-rgba": ("webp", SceneSpec(1200, 1100, 4, "uint8"), "webp", None),
    "lerc-float": ("lerc,max_z_error=0.5", SceneSpec(1200, 1100, 1, "float32", nodata=-9999.0), "lerc", 0.5),
    "lerc_deflate-int16": ("lerc_deflate,max_z_error=3", SceneSpec(1200, 1100, 2, "int16"), "lerc_deflate", 3),
    "lerc_zstd-lossless": ("lerc_zstd", SceneSpec(1200, 1100, 4, "uint16", nodata=0), "lerc_zstd", 0),
    # Lossless profiles too: at windows of 512 their tiles carry an overview level of their own.
    "zstd": ("zstd", SceneSpec(1200, 1100, 3, "uint16"), "zstd", 0),
    "lzw": ("lzw", SceneSpec(1200, 1100, 1, "float32"), "lzw", 0),
}
WINDOW = 512


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("lossy-scenes")
    return {name: write_scene(str(root / f"{name}.tif"), case[1]) for name, case in CASES.items()}


def run_job(source: str, profile: str, stores, storage, **assembly):
    settings = Settings(window_size=WINDOW, profile=profile)
    return (settings, *run_steps(source, settings, stores, storage, **assembly))


def codecs(path: str) -> list[str]:
    with rasterio.open(path) as src:
        levels = len(src.overviews(1))
    found = []
    for level in [None, *range(levels)]:
        with rasterio.open(path, **({} if level is None else {"overview_level": level})) as src:
            found.append(src.compression.value.lower() if src.compression else None)
    return found


def tile_pixels(stores, window_id: str) -> np.ndarray:
    body = stores["tiles"].download_blob(f"tiles/{JOB}/{window_id}.tif").readall()
    with MemoryFile(body) as memory, memory.open() as tile:
        return tile.read()


def tiles_pixels(stores, scene) -> np.ndarray:
    """The full-resolution pixels the tiles hold, laid out as the scene."""
    out = None
    for window in plan_windows(scene.width, scene.height, WINDOW):
        pixels = tile_pixels(stores, window.id)
        if out is None:
            out = np.zeros((scene.count, scene.height, scene.width), dtype=pixels.dtype)
        rows = slice(window.row_off, window.row_off + window.height)
        cols = slice(window.col_off, window.col_off + window.width)
        out[:, rows, cols] = pixels
    return out


@pytest.mark.parametrize("method", ["server", "blocks"])
@pytest.mark.parametrize("case", CASES)
def test_every_level_of_the_mosaic_is_the_profiles_and_holds_the_tiles_pixels(
    case, method, scenes, stores, storage, tmp_path
):
    profile, _, codec, bound = CASES[case]
    source = scenes[case]
    _, _, scene, result = run_job(source, profile, stores, storage, method=method)
    assert result.method == method
    mosaic = download(stores["output"], result.mosaic, tmp_path / "mosaic.tif")
    valid, errors, _ = cog_validate(mosaic, quiet=True)
    assert valid, errors
    assert_complete_pyramid(mosaic)
    assert set(codecs(mosaic)) == {codec}, codecs(mosaic)
    with rasterio.open(mosaic) as m, rasterio.open(source) as src:
        ours, theirs = m.read(), src.read()
        assert np.array_equal(m.read_masks(), src.read_masks())
        assert m.nodata == src.nodata
    # Block copy: the mosaic's full resolution is the tiles' blocks, so their pixels exactly.
    assert np.array_equal(ours, tiles_pixels(stores, scene))
    if bound is not None:
        valid_pixels = theirs != theirs.dtype.type(-9999) if theirs.dtype.kind == "f" else slice(None)
        error = np.abs(ours.astype("float64") - theirs.astype("float64"))[valid_pixels]
        assert error.max() <= bound
        if bound == 0:
            assert np.array_equal(ours, theirs)
    else:
        # JPEG and WEBP promise no bound; a broken encode would be far off (the scene is noise).
        assert 0 < np.abs(ours.astype("float64") - theirs.astype("float64")).mean() < 8


def test_the_vrt_path_takes_a_lossy_profile_and_says_it_loses_twice(scenes, stores, storage, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="tilecommit.raster.assembly.vrt_strategy"):
        _, _, _, result = run_job(scenes["jpeg-rgb"], "jpeg", stores, storage, method="vrt")
    assert result.method == "vrt"
    assert "lose twice" in caplog.text
    mosaic = download(stores["output"], result.mosaic, tmp_path / "mosaic.tif")
    assert set(codecs(mosaic)) == {"jpeg"}
    assert cog_validate(mosaic, quiet=True)[0]


@pytest.mark.parametrize("case", ["jpeg-rgb", "lerc-float"])
def test_the_scrub_compares_a_lossy_tile_with_its_window_encoded_again(case, scenes, stores, storage):
    profile = CASES[case][0]
    source = scenes[case]
    settings, spec, scene, _ = run_job(source, profile, stores, storage)
    windows = plan_windows(scene.width, scene.height, WINDOW)
    job, job_stores_ = job_of(settings, spec=spec), job_stores(stores, settings)
    for window in windows:
        report = check_window(job, job_stores_, source, window)
        assert report.differences == [], report.details
    # The control: against the source itself, the same tile differs (so the comparison above is
    # not the lossless one), and a tile of other pixels is found by the scrub.
    first = windows[0]
    body = stores["tiles"].download_blob(f"tiles/{JOB}/{first.id}.tif").readall()
    with rasterio.open(source) as src:
        assert _pixel_difference(read_window(src, first), body) is not None
    other = windows[1]
    stores["tiles"].upload_blob(
        f"tiles/{JOB}/{first.id}.tif",
        stores["tiles"].download_blob(f"tiles/{JOB}/{other.id}.tif").readall(),
        overwrite=True,
    )
    report = check_window(job, job_stores_, source, first)
    assert OTHER_PIXELS in report.differences, report


BLOCK_CASES = {
    "default-512": ("default,blocksize=512", SceneSpec(2300, 1700, 3, "uint16", nodata=0), "deflate"),
    "jpeg-512": ("jpeg,blocksize=512", SceneSpec(2300, 1700, 3, "uint8"), "jpeg"),
    "lerc-512-mask": ("lerc_zstd,blocksize=512", SceneSpec(2300, 1700, 1, "float32", nodata=-9999.0), "lerc_zstd"),
}


def block_shapes(path: str) -> set[tuple[int, int]]:
    with rasterio.open(path) as src:
        levels = len(src.overviews(1))
        shapes = {src.block_shapes[0]}
    for level in range(levels):
        with rasterio.open(path, overview_level=level) as src:
            if src.width > 512 or src.height > 512:
                shapes.add(src.block_shapes[0])
    return shapes


@pytest.mark.parametrize("method", ["server", "blocks", "vrt"])
@pytest.mark.parametrize("case", BLOCK_CASES)
def test_blocks_of_512_on_every_level_and_every_path(case, method, stores, storage, tmp_path):
    profile, scene_spec, codec = BLOCK_CASES[case]
    source = write_scene(str(tmp_path / "scene.tif"), scene_spec)
    spec, _, result = run_steps(source, Settings(window_size=1024, profile=profile), stores, storage, method=method)
    assert spec.block_size == 512 and "blocksize" not in dict(spec.profile_options)
    assert result.method == method
    mosaic = download(stores["output"], result.mosaic, tmp_path / "mosaic.tif")
    valid, errors, _ = cog_validate(mosaic, quiet=True)
    assert valid, errors
    assert_complete_pyramid(mosaic, block=512)
    assert block_shapes(mosaic) == {(512, 512)}
    assert set(codecs(mosaic)) == {codec}
    with rasterio.open(mosaic) as m, rasterio.open(source) as src:
        assert np.array_equal(m.read_masks(), src.read_masks())
        if not spec.choice.lossy:
            assert np.array_equal(m.read(), src.read())


def whole_scene_overviews(source: str, resampling: str, tmp_path) -> list[np.ndarray]:
    """GDAL's own overviews of the whole source (what rio-cogeo would compute), every level."""
    import shutil

    from rasterio.enums import Resampling

    copy = tmp_path / "whole.tif"
    shutil.copy(source, copy)
    with rasterio.open(source) as src:
        levels = mosaic_overview_levels(src.width, src.height)
    with rasterio.open(copy, "r+") as dst:
        dst.build_overviews([2**k for k in range(1, levels + 1)], Resampling[resampling])
    out = []
    for level in range(levels):
        with rasterio.open(copy, overview_level=level) as overview:
            out.append(overview.read())
    return out


@pytest.mark.parametrize("resampling", ["nearest", "average", "rms", "mode"])
def test_the_overviews_resampling_is_the_profiles_and_shows_no_seam_at_the_windows(
    resampling, stores, storage, tmp_path
):
    source = write_scene(str(tmp_path / "scene.tif"), SceneSpec(1100, 1300, 1, "uint8"))
    settings = Settings(window_size=WINDOW, profile=f"zstd,resampling={resampling}")
    spec, _, result = run_steps(source, settings, stores, storage, method="server")
    assert spec.overview_resampling("average") == resampling
    mosaic = download(stores["output"], result.mosaic, tmp_path / "mosaic.tif")
    expected = whole_scene_overviews(source, resampling, tmp_path)
    with rasterio.open(mosaic, overview_level=0) as first:
        # The first level is the tiles' own overviews side by side, made window by window.
        assert np.array_equal(first.read(), expected[0]), f"{resampling}: the tiles' overviews show seams"


@pytest.mark.parametrize(
    ("profile", "width", "height", "count", "dtype"),
    [
        ("jpeg,blocksize=512", 1, 1, 3, "uint8"),
        ("webp", 1, 700, 3, "uint8"),
        ("lerc,max_z_error=1", 1025, 1, 1, "float32"),
        ("default,blocksize=512", 513, 1, 2, "uint16"),
        ("zstd", 1, 1, 1, "int16"),
        # One pixel past a window edge both ways: a 1 x 1 corner window, which GDAL gives no overview.
        ("default", 1025, 1025, 1, "uint8"),
        ("jpeg", 2049, 1025, 3, "uint8"),
    ],
)
def test_every_size_from_a_single_pixel_up_makes_a_valid_mosaic(
    profile, width, height, count, dtype, stores, storage, tmp_path
):
    source = write_scene(str(tmp_path / "scene.tif"), SceneSpec(width, height, count, dtype, blocksize=256))
    spec, _, result = run_steps(source, Settings(window_size=1024, profile=profile), stores, storage)
    mosaic = download(stores["output"], result.mosaic, tmp_path / "mosaic.tif")
    valid, errors, _ = cog_validate(mosaic, quiet=True)
    if width == 1:
        # rio-cogeo measures an overview's decimation along x alone (rasterio's overviews()), and
        # a one-pixel-wide image keeps width 1 however it is halved: its levels read as
        # "decimation 1". Nothing else may be wrong.
        assert all(e.startswith("Invalid Decimation 1 for overview level") for e in errors), errors
    else:
        assert valid, errors
    with rasterio.open(mosaic) as m, rasterio.open(source) as src:
        assert (m.width, m.height, m.count) == (width, height, count)
        assert np.array_equal(m.read_masks(), src.read_masks())
        assert len(m.overviews(1)) == mosaic_overview_levels(width, height, spec.block_size)
