"""The ``web_optimized`` profile option, as ``rio cogeo create --web-optimized`` makes it: the
mosaic on the WebMercatorQuad grid rio-cogeo chooses (CRS, transform, size, blocks, overview
levels), its pixels those of one exact warp of the whole source (error threshold 0) with the same
kernel, for a UTM scene, a geographic scene across the antimeridian and a polar stereographic
one, and compared with what the gdalwarp program makes of the same source on the same grid; the
option is part of the job; the VRT and block assemblies take the warped tiles; what cannot be
warped is refused with the reason."""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
import rasterio
from rasterio.crs import CRS
from rasterio.dtypes import _gdal_typename
from rasterio.enums import MaskFlags, Resampling
from rasterio.rio.overview import get_maximum_overview_level
from rasterio.transform import from_origin
from rasterio.vrt import WarpedVRT
from rasterio.warp import transform, transform_bounds
from rio_cogeo.cogeo import cog_translate, cog_validate
from rio_cogeo.profiles import cog_profiles

from devhost.session import process_file
from orchestrators import names
from tilecommit import profiles
from tilecommit.errors import BadInputError, UnsupportedRasterError
from tilecommit.grid import plan_windows
from tilecommit.jobs import job_id_for
from tilecommit.raster import inspect_source
from tilecommit.raster.env import gdal_env
from tilecommit.raster.reading.alpha import alpha_band
from tilecommit.raster.reading.source import LocalFile, open_upload
from tilecommit.raster.reading.warp import exact_warp_xml, has_internal_mask, srs_grid, warped, web_optimized_grid
from tilecommit.raster.scrub import check_window
from tilecommit.raster.tiling import encode
from tilecommit.settings import SETTING_PROFILE, Settings
from tilecommit.spec import OutputSpec
from tilecommit.warping import WARP_RESAMPLINGS

from .app_jobs import WINDOW, download, local_host, wait_until
from .conftest import counter_total
from .made_rasters import made
from .raster_jobs import assert_complete_pyramid, job_of, job_stores, run_steps

WHERE = "blob metadata tilecommit_profile"


def utm_scene(path) -> str:
    """600 x 520 x 3 uint16 in UTM 33N at 10 m, nodata 0 in a corner."""
    rng = np.random.default_rng(5)
    data = rng.integers(1, 4000, size=(3, 520, 600), dtype=np.uint16)
    rows, cols = np.mgrid[0:520, 0:600]
    data[:, rows + cols < 150] = 0
    profile = dict(driver="GTiff", width=600, height=520, count=3, dtype="uint16", crs="EPSG:32633", nodata=0)
    profile.update(transform=from_origin(500000, 4600000, 10, 10), tiled=True, blockxsize=256, blockysize=256)
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(data)
    return str(path)


def masked_utm_scene(path, nodata: float | None = None) -> str:
    """The UTM scene without a nodata value (unless ``nodata``), its valid area an internal mask
    (a notch and a band cut off)."""
    rng = np.random.default_rng(7)
    data = rng.integers(1, 4000, size=(3, 520, 600), dtype=np.uint16)
    mask = np.full((520, 600), 255, np.uint8)
    mask[:, 500:] = 0
    mask[:100, :100] = 0
    profile = dict(driver="GTiff", width=600, height=520, count=3, dtype="uint16", crs="EPSG:32633", nodata=nodata)
    profile.update(transform=from_origin(500000, 4600000, 10, 10), tiled=True, blockxsize=256, blockysize=256)
    with rasterio.Env(GDAL_TIFF_INTERNAL_MASK=True), rasterio.open(path, "w", **profile) as dst:
        dst.write(data)
        dst.write_mask(mask)
    return str(path)


def antimeridian_scene(path) -> str:
    """640 x 400 x 3 uint8 in EPSG:4326 from 178.4 to 181.6 deg E (past 180), no nodata."""
    rng = np.random.default_rng(6)
    data = rng.integers(1, 250, size=(3, 400, 640), dtype=np.uint8)
    profile = dict(driver="GTiff", width=640, height=400, count=3, dtype="uint8", crs="EPSG:4326")
    profile.update(transform=from_origin(178.4, -15.0, 0.005, 0.005), tiled=True, blockxsize=256, blockysize=256)
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(data)
    return str(path)


def polar_scene(path) -> str:
    return str(made("polar_stereographic_south.tif"))


#: scene maker, warp kernel
SCENES = {
    "utm": (utm_scene, "nearest"),
    "utm-average": (utm_scene, "average"),
    "utm-rms": (utm_scene, "rms"),
    "utm-internal-mask": (masked_utm_scene, "nearest"),
    "antimeridian": (antimeridian_scene, "nearest"),
    "polar": (polar_scene, "nearest"),
    "polar-average": (polar_scene, "average"),
}


def whole_warp_xml(path: str, resampling: str, grid_of=web_optimized_grid) -> str:
    """The VRT of the whole source warped onto its web-optimized grid (or ``grid_of`` it) in one
    chunk, GDAL's exact transformer (gdalwarp -et 0): one block the size of the grid, memory enough
    for one chunk. With the alpha band the warper makes of a source's internal mask, as rio-cogeo's
    add_alpha; a source's own alpha band, where it is the valid area, declared to the warper as
    rio-cogeo's is."""
    with rasterio.open(path) as src:
        grid = grid_of(src)
        block = max(grid.width, grid.height)
        alpha, src_alpha = has_internal_mask(src), alpha_band(src)
        return exact_warp_xml(
            src, grid, resampling=resampling, nodata=src.nodata, alpha=alpha, src_alpha=src_alpha, block=block
        )


def whole_warp(path: str, resampling: str, grid_of=web_optimized_grid) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`whole_warp_xml` read through rasterio's GDAL (the one the job warps with): the image
    bands, and the alpha band when there is one."""
    xml = whole_warp_xml(path, resampling, grid_of)
    with rasterio.open(path) as src:
        count, alpha = src.count, has_internal_mask(src)
    with rasterio.Env(GDAL_CACHEMAX=512), rasterio.open(xml) as whole:
        return whole.read(list(range(1, count + 1))), whole.read(count + 1) if alpha else None


def rasterio_warp(path: str, resampling: str, grid_of=web_optimized_grid) -> tuple[np.ndarray, np.ndarray | None]:
    """The same warp built by rasterio's own ``WarpedVRT`` (GDALCreateWarpedVRT, another code path
    than :func:`exact_warp_xml`), its approximating transformer held to 1e-9 pixel: a check that the
    reference above is the warp GDAL makes, not a mistake both sides of the comparison share."""
    with rasterio.open(path) as src:
        grid = grid_of(src)
        options = dict(crs=grid.crs, transform=grid.transform, width=grid.width, height=grid.height)
        options.update(resampling=Resampling[resampling], tolerance=1e-9)
        if src.nodata is not None:
            options.update(nodata=src.nodata, src_nodata=src.nodata)
        alpha = src.nodata is None and has_internal_mask(src)
        with rasterio.Env(GDAL_CACHEMAX=512), WarpedVRT(src, add_alpha=alpha, **options) as view:
            return view.read(list(range(1, src.count + 1))), view.read(src.count + 1) if alpha else None


def differing(a: np.ndarray, b: np.ndarray) -> int:
    same = (a == b) | (np.isnan(a) & np.isnan(b)) if a.dtype.kind == "f" else a == b
    return int((~same).sum())


def differing_pixels(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Where (row, column) any band of ``a`` differs from ``b``'s (a NaN equal to a NaN)."""
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
    same = (a == b) | (np.isnan(a) & np.isnan(b)) if a.dtype.kind == "f" else a == b
    return ~same.all(axis=0)


# The gdalwarp program (Debian's gdal-bin; `make setup` installs it): the warp of the whole source
# made by GDAL's own tool in one process, not by this project's code. It links the machine's GDAL
# (3.6.2 on Debian 12), not the 3.10.3 rasterio bundles and the job warps with.


def gdal_program(name: str) -> str:
    path = shutil.which(name)
    # Fails, not skips: the comparison is what the tests are for, and `make setup` installs it.
    assert path, f"{name} is not installed: `make setup` installs it (Debian's gdal-bin)"
    return path


def run_program(*command: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}: {done.stderr}"
    return done.stdout


@functools.cache
def gdalwarp_version() -> tuple[int, int, int]:
    """gdalwarp's GDAL version, as ``gdalwarp --version`` prints it ("GDAL 3.6.2, released ...")."""
    printed = run_program(gdal_program("gdalwarp"), "--version")
    return tuple(int(part) for part in re.match(r"GDAL (\d+)\.(\d+)\.(\d+)", printed).groups())


def gdalwarp(
    source: str, mosaic: str, out: Path, resampling: str, *options: str
) -> tuple[np.ndarray, np.ndarray | None]:
    """``source`` warped by gdalwarp onto exactly ``mosaic``'s grid: the exact transformer
    (``-et 0``), the job's kernel, the mosaic's CRS, its bounds (``-te``) and pixel size (``-tr``:
    ``-ts`` would make the pixel size a division of the extent, a few units off in the last place),
    the source's sample type, and the no-data handling the job's warp has: a source's nodata value
    as source and output nodata, and for a source with an internal mask (the warper takes it as the
    source's validity by itself) the warper's alpha band (``-dstalpha``), whose non-zero pixels are
    the mosaic's mask. The image bands, and the alpha band (None without one)."""
    with rasterio.open(source) as src, rasterio.open(mosaic) as ours:
        nodata, count, alpha = src.nodata, src.count, has_internal_mask(src)
        command = [gdal_program("gdalwarp"), "-q", "-et", "0", "-r", resampling, "-t_srs", ours.crs.to_string()]
        command += ["-te", *map(repr, ours.bounds), "-tr", repr(ours.transform.a), repr(-ours.transform.e)]
        command += ["-ot", _gdal_typename(src.dtypes[0])]
        if nodata is not None:
            command += ["-srcnodata", repr(nodata), "-dstnodata", repr(nodata)]
        if alpha:
            command.append("-dstalpha")
        run_program(*command, *options, source, str(out))
        with rasterio.open(out) as made:
            # the same grid by construction, and checked: a pixel compared is one position
            assert (made.crs, made.transform, made.width, made.height) == (
                ours.crs,
                ours.transform,
                ours.width,
                ours.height,
            )
            assert made.count == count + alpha and made.nodata == ours.nodata
            return made.read(list(range(1, count + 1))), made.read(count + 1) if alpha else None


def warp_with_gdalwarps_gdal(xml: str, out: Path) -> np.ndarray:
    """The warp of ``xml`` (:func:`whole_warp_xml`) made by the GDAL gdalwarp links (gdal_translate
    of that VRT), not rasterio's: the same warp in gdalwarp's GDAL version."""
    vrt = out.with_suffix(".vrt")
    vrt.write_text(xml)
    run_program(gdal_program("gdal_translate"), "-q", "--config", "GDAL_CACHEMAX", "512", str(vrt), str(out))
    with rasterio.open(out) as made:
        return made.read()


def centres_outside_the_source(source: str, mosaic: str, where: np.ndarray) -> bool:
    """Whether the centre of every pixel of ``mosaic`` in ``where`` maps (exactly) outside ``source``'s raster."""
    rows, cols = np.nonzero(where)
    with rasterio.open(source) as src, rasterio.open(mosaic) as ours:
        xs, ys = ours.transform * (cols + 0.5, rows + 0.5)
        sx, sy = transform(ours.crs, src.crs, xs.tolist(), ys.tolist())
        col, row = ~src.transform * (np.asarray(sx), np.asarray(sy))
        return bool(np.all((col < 0) | (col >= src.width) | (row < 0) | (row >= src.height)))


def rio_cogeo_web_optimized(path: str, out: str, resampling: str) -> str:
    """``rio cogeo create --web-optimized --resampling R -p deflate --blocksize 256``."""
    profile = {**cog_profiles.get("deflate"), "blockxsize": 256, "blockysize": 256}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # web_optimized, which the CLI still names
        cog_translate(path, out, profile, web_optimized=True, resampling=resampling, quiet=True)
    return out


def overview_count(path: str) -> int:
    with rasterio.open(path) as src:
        return len(src.overviews(1))


# ------------------------------------------------------------------------------------ the option


def test_the_options_are_checked_and_their_defaults_are_todays_job():
    assert profiles.choose("default", {"web_optimized": "false"}, where=WHERE) == profiles.DEFAULT_CHOICE
    chosen = profiles.choose("zstd", {"web_optimized": "Yes", "warp_resampling": "Average"}, where=WHERE)
    assert chosen.web_optimized and chosen.warp_resampling == "average"
    # nearest is the warp's default, as rio cogeo create --resampling's: giving it is the same job
    assert profiles.choose("default", {"web_optimized": "1", "warp_resampling": "nearest"}, where=WHERE) == (
        profiles.choose("default", {"web_optimized": "true"}, where=WHERE)
    )
    with pytest.raises(BadInputError, match=rf"{WHERE}: web_optimized='maybe': accepted true, yes, 1"):
        profiles.choose("default", {"web_optimized": "maybe"}, where=WHERE)
    with pytest.raises(BadInputError, match=r"warp_resampling='sum': accepted nearest, average, mode, rms"):
        profiles.choose("default", {"web_optimized": "true", "warp_resampling": "sum"}, where=WHERE)
    with pytest.raises(BadInputError, match=r"warp_resampling=bilinear is refused: where the warp downsamples"):
        profiles.choose("default", {"web_optimized": "true", "warp_resampling": "bilinear"}, where=WHERE)
    with pytest.raises(BadInputError, match="warp_resampling=average without web_optimized=true, target_srs or resol"):
        profiles.choose("default", {"warp_resampling": "average"}, where=WHERE)
    custom = profiles.choose("default", {"target_srs": " epsg:04326", "resolution": "0.0001"}, where=WHERE)
    assert custom.options == (("resolution", 0.0001), ("target_srs", "EPSG:4326")) and custom.warped
    for options, message in (
        ({"target_srs": "WGS84"}, r"target_srs='WGS84': accepted an EPSG code, EPSG:<number>"),
        ({"resolution": "-1"}, r"resolution=-1: accepted a number > 0"),
        ({"resolution": "fine"}, r"resolution='fine' is not a number"),
        ({"web_optimized": "true", "target_srs": "EPSG:3857"}, r"web_optimized=true with target_srs: the web-optim"),
    ):
        with pytest.raises(BadInputError, match=message):
            profiles.choose("default", options, where=WHERE)
    from_metadata = profiles.resolve(
        {"tilecommit_web_optimized": "true"}, "a.tif", rules=[], default=profiles.DEFAULT_CHOICE
    )
    assert from_metadata == profiles.Choice("default", (("web_optimized", "true"),))

    url, etag = "https://a.blob.core.windows.net/in/s.tif", '"0x1"'
    plain = OutputSpec(window_size=512)
    web = OutputSpec.with_choice(512, from_metadata)
    assert OutputSpec.from_dict(web.to_dict()) == web
    assert job_id_for(url, etag, plain) != job_id_for(url, etag, web)
    assert job_id_for(url, etag, plain) == job_id_for(
        url, etag, OutputSpec.with_choice(512, profiles.choose("default", {"web_optimized": "no"}, where=WHERE))
    )


def test_what_cannot_be_warped_is_refused_at_validation_with_the_reason(tmp_path):
    settings = Settings(window_size=256)
    spec = OutputSpec.with_choice(256, profiles.choose("default", {"web_optimized": "true"}, where=WHERE))
    bare = tmp_path / "bare.tif"
    with rasterio.open(bare, "w", driver="GTiff", width=64, height=64, count=1, dtype="uint8") as dst:
        dst.write(np.ones((1, 64, 64), np.uint8))
    with pytest.raises(UnsupportedRasterError, match="has no georeferencing \\(it lacks a CRS\\)"):
        inspect_source(bare, settings=settings, spec=spec)
    rgba = tmp_path / "rgba.tif"
    profile = dict(driver="GTiff", width=64, height=64, count=4, dtype="uint8", crs="EPSG:32633", alpha="YES")
    with rasterio.open(rgba, "w", transform=from_origin(500000, 4600000, 10, 10), **profile) as dst:
        dst.write(np.ones((4, 64, 64), np.uint8))
    assert inspect_source(rgba, settings=settings, spec=spec).mask == "alpha"  # warped as the warper's alpha
    alpha_and_nodata = OutputSpec.with_choice(
        256, profiles.choose("default", {"web_optimized": "true", "nodata": "0"}, where=WHERE)
    )
    with pytest.raises(
        UnsupportedRasterError, match="carries its valid area as an alpha band, and the profile's nodata=0 would"
    ):
        inspect_source(rgba, settings=settings, spec=alpha_and_nodata)
    masked = masked_utm_scene(tmp_path / "masked.tif")
    assert inspect_source(masked, settings=settings, spec=spec).mask == "per-dataset"
    with_nodata = OutputSpec.with_choice(
        256, profiles.choose("default", {"web_optimized": "true", "nodata": "0"}, where=WHERE)
    )
    with pytest.raises(UnsupportedRasterError, match="has an internal mask, and the profile's nodata=0 would replace"):
        inspect_source(masked, settings=settings, spec=with_nodata)
    both = masked_utm_scene(tmp_path / "both.tif", nodata=0)
    with pytest.raises(UnsupportedRasterError, match="has an internal mask, and its own nodata=0 would replace"):
        inspect_source(both, settings=settings, spec=spec)
    small = Settings(window_size=256, max_pixels=400_000)  # the source fits, its web-optimized grid does not
    with pytest.raises(UnsupportedRasterError, match="on the WebMercatorQuad grid at zoom 14 is 1024 x 1024"):
        inspect_source(utm_scene(tmp_path / "utm.tif"), settings=small, spec=spec)


# ------------------------------------------------------------------------------------ through the local host


@pytest.fixture
def host(app_env):
    with local_host(app_env) as running:
        running.ensure_storage()
        yield running


@pytest.mark.slow
@pytest.mark.parametrize("resampling", WARP_RESAMPLINGS)
def test_every_warp_kernel_reaches_gdals_warper_under_the_name_it_reads(tmp_path, resampling):
    """A ResampleAlg name GDAL's VRT reader does not know is warped with nearest, silently (rms was
    written as "RMS", GDAL's name is "RootMeanSquare", and rms jobs got nearest pixels). Each kernel
    the option accepts is compared with rasterio's own WarpedVRT of the same kernel (another code
    path, which passes GDAL the kernel as a number), and each but nearest differs from nearest."""
    source = utm_scene(tmp_path / "utm.tif")
    # 25 m pixels in Web Mercator from 10 m ones: each output pixel has several source pixels
    # under it, so the footprint kernels differ from nearest, on a grid small enough for mode.
    grid_of = functools.partial(srs_grid, crs=CRS.from_epsg(3857), resolution=25.0)
    exact, _ = whole_warp(source, resampling, grid_of)
    other, _ = rasterio_warp(source, resampling, grid_of)
    assert differing(exact, other) == 0, f"{differing(exact, other)} values differ from rasterio's {resampling}"
    if resampling != "nearest":
        assert differing(exact, whole_warp(source, "nearest", grid_of)[0]) > 0


@pytest.mark.parametrize("case", SCENES)
def test_the_mosaic_is_rio_cogeos_web_optimized_grid_and_an_exact_warp_of_the_source(
    host, storage, app_env, tmp_path, case
):
    make, resampling = SCENES[case]
    source = make(tmp_path / "source.tif")
    metadata = {"tilecommit_web_optimized": "true", "tilecommit_warp_resampling": resampling}
    summary = process_file(host, Path(source), name=f"{case}.tif", timeout=300, metadata=metadata)
    assert summary["status"] == "completed", summary
    job = summary["job_id"]
    mosaic = tmp_path / "mosaic.tif"
    mosaic.write_bytes(download(storage, app_env.output, f"mosaics/{job}/mosaic.tif"))
    valid, errors, _ = cog_validate(str(mosaic))
    assert valid and not errors, errors
    if case.startswith("utm"):  # square: rio-cogeo's pyramid is the complete one
        assert_complete_pyramid(str(mosaic))

    reference = rio_cogeo_web_optimized(source, str(tmp_path / "rio.tif"), resampling)
    with rasterio.open(mosaic) as ours, rasterio.open(reference) as theirs:
        assert ours.crs == theirs.crs == "EPSG:3857"
        assert ours.transform == theirs.transform
        assert (ours.width, ours.height, ours.count, ours.dtypes) == (
            theirs.width,
            theirs.height,
            theirs.count,
            theirs.dtypes,
        )
        assert ours.block_shapes == theirs.block_shapes
        assert ours.nodata == theirs.nodata
        nodata = ours.nodata
        assert ours.tags()["TILING_SCHEME_ZOOM_LEVEL"] == theirs.tags()["TILING_SCHEME_ZOOM_LEVEL"]
        pixels, theirs_pixels = ours.read(), theirs.read()
        assert ours.mask_flag_enums == theirs.mask_flag_enums
        mask = ours.dataset_mask()
        exact_width, exact_height = ours.width, ours.height
    # Overview levels: rio-cogeo 7.0.4's, halvings while the shorter side stays above a block
    # (rasterio's get_maximum_overview_level), fewer than a complete pyramid on an elongated grid.
    ours_levels, theirs_levels = overview_count(str(mosaic)), overview_count(reference)
    assert ours_levels == theirs_levels == get_maximum_overview_level(exact_width, exact_height, minsize=256)
    for level in range(theirs_levels):
        with rasterio.open(reference, overview_level=level) as a, rasterio.open(mosaic, overview_level=level) as b:
            assert a.shape == b.shape, level
    exact, exact_alpha = whole_warp(source, resampling)
    assert differing(pixels, exact) == 0, f"{differing(pixels, exact)} of {exact.size} differ from the exact warp"
    other, other_alpha = rasterio_warp(source, resampling)
    assert differing(other, exact) == 0
    assert (other_alpha is None) == (exact_alpha is None)
    if exact_alpha is not None:
        assert np.array_equal(other_alpha > 0, exact_alpha > 0)
    if exact_alpha is not None:  # the internal mask is the warped footprint of the source's
        assert np.array_equal(mask > 0, exact_alpha > 0) and 0 < (mask > 0).sum() < mask.size

    # The gdalwarp program on the same source, to the mosaic's grid, the same kernel.
    by_gdalwarp, gdalwarp_alpha = gdalwarp(source, str(mosaic), tmp_path / "gdalwarp.tif", resampling)
    differ = differing_pixels(pixels, by_gdalwarp)
    assert (gdalwarp_alpha is None) == (exact_alpha is None)
    gdalwarp_mask_differs = 0 if gdalwarp_alpha is None else int(((gdalwarp_alpha > 0) != (mask > 0)).sum())
    assert gdalwarp_mask_differs == 0
    if case == "antimeridian":
        # gdalwarp centres a geographic source's longitudes on the scene (its transformer's
        # INSERT_CENTER_LONG, on by default; CENTER_LONG=180 here): an output pixel at -179.9 deg
        # reads the source at 180.1 deg, so the scene's part east of 180 deg lands on the grid's
        # west edge, 5 x 6 pixels that the job's warp, as rio-cogeo's, leaves 0. With the option
        # off gdalwarp makes the mosaic's pixels: the option is the whole difference.
        assert differ.sum() == 30 and not pixels[:, differ].any() and by_gdalwarp[:, differ].all()
        assert np.nonzero(differ)[1].max() < 5
        unwrapped, _ = gdalwarp(
            source, str(mosaic), tmp_path / "unwrapped.tif", resampling, "-to", "INSERT_CENTER_LONG=FALSE"
        )
        assert not differing_pixels(pixels, unwrapped).any()
    elif resampling in ("average", "rms") and gdalwarp_version() < (3, 7, 1):
        # Where the warp oversamples (an output pixel here 0.72 source pixel wide on the UTM scene,
        # 0.94 on the polar one), GDAL before 3.7.1 gives the output pixels along the source's edge
        # whose centre falls outside it the average (rms: root mean square) of the edge pixels their footprint overlaps;
        # GDAL 3.7.1 and later (rasterio's 3.10.3, the job's) leave them nodata, as nearest does.
        # Those pixels are the whole difference: the reference's own VRT, warped by gdalwarp's
        # GDAL, gives gdalwarp's pixels.
        assert differ.sum() == {"utm-average": 1149, "utm-rms": 1149, "polar-average": 115}[case]
        assert (pixels[:, differ] == nodata).all() and (by_gdalwarp[:, differ] != nodata).all()
        assert centres_outside_the_source(source, str(mosaic), differ)
        same_warp = warp_with_gdalwarps_gdal(whole_warp_xml(source, resampling), tmp_path / "older.tif")
        assert not differing_pixels(same_warp, by_gdalwarp).any()
    else:
        assert differ.sum() == 0, f"{differ.sum()} of {differ.size} pixels differ from gdalwarp's"
    # rio-cogeo warps with the approximating transformer (0.125 pixel): its pixels may differ.
    with rasterio.open(reference) as theirs:
        mask_differs = int(((theirs.dataset_mask() > 0) != (mask > 0)).sum())
    print(
        f"{case}: {exact.shape}, rio-cogeo's own values differ in {differing(theirs_pixels, exact)}, its mask in {mask_differs}; "
        f"gdalwarp {'.'.join(map(str, gdalwarp_version()))}'s pixels in {differ.sum()} ({differing(pixels, by_gdalwarp)} values), "
        f"its mask in {gdalwarp_mask_differs}"
    )

    item = json.loads(download(storage, app_env.output, f"mosaics/{job}/item.json"))
    with rasterio.open(mosaic) as ours:
        assert item["properties"]["proj:code"] == "EPSG:3857"
        assert item["properties"]["proj:shape"] == [ours.height, ours.width]
        assert item["properties"]["proj:transform"][:6] == list(ours.transform)[:6]
        left, bottom, right, top = ours.bounds
    assert item["properties"]["proj:bbox"] == [left, bottom, right, top]
    assert item["geometry"] is not None and len(item["bbox"]) == 4


@pytest.mark.parametrize("method", ["blocks", "vrt"])
def test_the_other_assemblies_take_the_warped_tiles(tmp_path, stores, storage, method):
    """Windows of 1024 on the polar scene's 1024 x 512 grid: the tiles carry two overview
    levels, rio-cogeo's pyramid has one, which block copy takes from the tiles."""
    source = polar_scene(tmp_path)
    settings = Settings(window_size=1024, profile="default,web_optimized=true")
    spec, scene, result = run_steps(source, settings, stores, storage, method=method)
    assert result.outcome == "written"
    # A scrub reads each window warped as the render did, and finds every tile as made.
    for window in plan_windows(scene.width, scene.height, spec.window_size):
        report = check_window(job_of(settings, spec=spec), job_stores(stores, settings), source, window)
        assert report.differences == [], report.details
    mosaic = tmp_path / "mosaic.tif"
    with open(mosaic, "wb") as f:
        stores["output"].download_blob(result.mosaic).readinto(f)
    assert cog_validate(str(mosaic))[0]
    with rasterio.open(mosaic) as src:
        assert (src.width, src.height) == (scene.width, scene.height) == (1024, 512)
        assert src.overviews(1) == [2]
        assert differing(src.read(), whole_warp(source, "nearest")[0]) == 0


def test_add_mask_masks_what_the_warp_leaves_outside_the_source(tmp_path, stores, storage):
    source = polar_scene(tmp_path)
    settings = Settings(window_size=512, profile="default,web_optimized=true,add_mask=true")
    _, scene, result = run_steps(source, settings, stores, storage)
    assert (scene.nodata, scene.mask) == (None, "per-dataset")
    mosaic = tmp_path / "mosaic.tif"
    with open(mosaic, "wb") as f:
        stores["output"].download_blob(result.mosaic).readinto(f)
    exact = whole_warp(source, "nearest")[0]
    with rasterio.open(mosaic) as src, rasterio.open(source) as original:
        assert src.nodata is None and src.mask_flag_enums == ([MaskFlags.per_dataset],)
        valid = exact[0] != np.float32(original.nodata)
        assert 0 < valid.sum() < valid.size
        assert np.array_equal(src.dataset_mask() > 0, valid)
        assert differing(src.read(), exact) == 0


@pytest.mark.slow
def test_one_upload_with_and_without_web_optimized_is_two_jobs_each_delivered_again_a_duplicate(
    host, storage, app_env, tmp_path, monkeypatch
):
    path = utm_scene(tmp_path / "twice.tif")
    plain = process_file(host, Path(path), name="twice.tif", timeout=300)
    assert plain["status"] == "completed"
    blob = host.blobs.get_blob_client(app_env.input, "twice.tif")
    etag = blob.get_blob_properties().etag
    web_spec = OutputSpec.with_choice(WINDOW, profiles.choose("default", {"web_optimized": "true"}, where=WHERE))
    web = job_id_for(blob.url, etag, web_spec)
    assert web != plain["job_id"]
    monkeypatch.setenv(SETTING_PROFILE, "default,web_optimized=true")  # the app's default changes, not the upload
    host.deliver_blob_created("twice.tif")
    assert host.engine.wait_for(web, timeout=300)["status"] == "Completed"
    duplicates = counter_total("StartDecisions", action="duplicate")
    host.deliver_blob_created("twice.tif")
    monkeypatch.setenv(SETTING_PROFILE, "default")
    host.deliver_blob_created("twice.tif")
    wait_until(lambda: counter_total("StartDecisions", action="duplicate") - duplicates == 2, timeout=30)
    jobs = [i["id"] for i in host.engine.list_instances() if i["name"] == names.TILE_SCENE]
    assert sorted(jobs) == sorted([plain["job_id"], web])
    sizes = {}
    for job in jobs:
        body = download(storage, app_env.output, f"mosaics/{job}/mosaic.tif")
        with rasterio.MemoryFile(body) as memory, memory.open() as src:
            sizes[job] = (src.crs.to_epsg(), src.width, src.height)
    assert sizes == {plain["job_id"]: (32633, 600, 520), web: (3857, 1024, 1024)}


# ------------------------------------------------------------------------------------ target_srs, resolution


@pytest.mark.slow
def test_a_target_crs_and_resolution_give_gdalwarps_aligned_grid_and_an_exact_warp(host, storage, app_env, tmp_path):
    """The UTM scene to EPSG:4326 at 0.0001 deg (gdalwarp -t_srs EPSG:4326 -tr 0.0001 0.0001 -tap),
    through the local host: the exact whole warp's pixels, and the gdalwarp program's on that grid."""
    source = utm_scene(tmp_path / "source.tif")
    metadata = {"tilecommit_target_srs": "EPSG:4326", "tilecommit_resolution": "0.0001"}
    summary = process_file(host, Path(source), name="geographic.tif", timeout=300, metadata=metadata)
    assert summary["status"] == "completed", summary
    mosaic = tmp_path / "mosaic.tif"
    mosaic.write_bytes(download(storage, app_env.output, f"mosaics/{summary['job_id']}/mosaic.tif"))
    assert cog_validate(str(mosaic))[0]
    assert_complete_pyramid(str(mosaic))
    with rasterio.open(source) as src:
        west, south, east, north = transform_bounds(src.crs, "EPSG:4326", *src.bounds, densify_pts=21)
    with rasterio.open(mosaic) as ours:
        assert ours.crs == "EPSG:4326" and ours.res == (0.0001, 0.0001)
        left, bottom, right, top = ours.bounds
        # -tap: edges on multiples of the resolution, around the source's extent, less than a pixel wider
        for edge in (left, bottom, right, top):
            assert abs(edge / 0.0001 - round(edge / 0.0001)) < 1e-6
        assert left <= west < left + 0.0001 and right - 0.0001 < east <= right
        assert bottom <= south < bottom + 0.0001 and top - 0.0001 < north <= top
        assert "TILING_SCHEME_NAME" not in ours.tags()
        pixels = ours.read()

    def grid(src):
        return srs_grid(src, CRS.from_epsg(4326), 0.0001)

    exact, _ = whole_warp(source, "nearest", grid_of=grid)
    assert differing(pixels, exact) == 0, f"{differing(pixels, exact)} of {exact.size} differ from the exact warp"
    by_gdalwarp, _ = gdalwarp(source, str(mosaic), tmp_path / "gdalwarp.tif", "nearest")
    differ = differing_pixels(pixels, by_gdalwarp)
    assert differ.sum() == 0, f"{differ.sum()} of {differ.size} pixels differ from gdalwarp's"


def test_a_resolution_alone_resamples_on_the_sources_crs(tmp_path, stores, storage):
    """The polar scene (316 x 332 at 25 km, its corner on a multiple of 50 km) at 50 km on its own
    CRS: 158 x 166 pixels, the warp averaging 2 x 2 source pixels."""
    source = polar_scene(tmp_path)
    settings = Settings(window_size=256, profile="default,resolution=50000,warp_resampling=average")
    spec, scene, result = run_steps(source, settings, stores, storage)
    assert (scene.transform[0], scene.transform[4]) == (50000.0, -50000.0)
    mosaic = tmp_path / "mosaic.tif"
    with open(mosaic, "wb") as f:
        stores["output"].download_blob(result.mosaic).readinto(f)
    with rasterio.open(mosaic) as ours, rasterio.open(source) as src:
        assert ours.crs == src.crs and (ours.width, ours.height) == (scene.width, scene.height) == (158, 166)
        pixels = ours.read()
    exact, _ = whole_warp(source, "average", grid_of=lambda src: srs_grid(src, None, 50000.0))
    assert differing(pixels, exact) == 0


def test_a_warped_windows_source_blocks_are_fetched_ahead_in_merged_reads(tmp_path, monkeypatch):
    """The source pixels under each window (its edges mapped back, with a margin) are fetched in
    merged ranges before GDAL's warper asks for them block by block."""
    source = utm_scene(tmp_path / "source.tif")

    def requests_to_read_every_window() -> int:
        upload = LocalFile(source)
        with gdal_env(Settings()), open_upload(upload) as src:
            grid = web_optimized_grid(src)
            with warped(src, grid, resampling="nearest", nodata=0) as view:
                before = upload.requests
                for window in plan_windows(grid.width, grid.height, 512):
                    encode.read_window(view, window)
                return upload.requests - before

    ahead = requests_to_read_every_window()
    monkeypatch.setattr(encode, "prefetch", lambda dataset, window: None)
    on_demand = requests_to_read_every_window()
    assert ahead < on_demand, (ahead, on_demand)
