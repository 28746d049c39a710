"""Bad inputs are refused by inspect_source with a typed error and a message saying what is wrong
and what would be accepted, before any tile is written (run as the job runs: inspect, then render)."""

from __future__ import annotations

import numpy as np
import pytest
import rasterio
from rasterio.control import GroundControlPoint
from rasterio.transform import Affine, from_origin
from rasterio.windows import Window

from testkit.scenes import SceneSpec, write_scene
from tilecommit.errors import BadInputError, InvalidRasterError, UnsupportedRasterError
from tilecommit.raster import inspect_source
from tilecommit.raster.reading.scene import MAX_WINDOW_BYTES
from tilecommit.raster.reading.source import PinnedBlob
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec

from .raster_jobs import blob_names, manifest_rows, render_all
from .tiff_fuzz import write_window_budget_files

SETTINGS = Settings(window_size=256)


def run_job(path: str, stores, gdal_options=None, settings: Settings = SETTINGS) -> None:
    """What the orchestration does with an upload: inspect it, then render every window."""
    scene = inspect_source(path, settings=settings, spec=OutputSpec.from_settings(settings), gdal_options=gdal_options)
    render_all(path, scene, settings, stores, gdal_options=gdal_options)


NORTH_UP = from_origin(500000, 4600000, 10, 10)


def write_raster(
    path,
    *,
    dtype="uint16",
    transform=NORTH_UP,
    crs="EPSG:32633",
    width=300,
    height=200,
    count=1,
    pixels: bool = True,
    **extra,
) -> str:
    """A tiled GeoTIFF of ones (``pixels``; else its header only, for ``sparse_ok=True``)."""
    with rasterio.open(
        path,
        "w",
        driver="GTiff",
        width=width,
        height=height,
        count=count,
        dtype=dtype,
        crs=crs,
        transform=transform,
        tiled=True,
        blockxsize=256,
        blockysize=256,
        **extra,
    ) as dst:
        if pixels:
            dst.write(np.ones((count, height, width), dtype=dtype))
    return str(path)


def cog_bytes(tmp_path) -> bytes:
    spec = SceneSpec(1024, 1024, 1, "uint16", blocksize=256)
    source = write_scene(str(tmp_path / "whole.tif"), spec)
    target = str(tmp_path / "whole_cog.tif")
    with rasterio.open(source) as src:
        rasterio.shutil.copy(src, target, driver="COG", BLOCKSIZE=256, COMPRESS="DEFLATE")
    return open(target, "rb").read()


def make_not_a_raster(tmp_path):
    path = tmp_path / "notes.tif"
    path.write_text("these are meeting notes, saved with the wrong extension\n" * 20)
    return str(path)


def make_zero_bytes(tmp_path):
    path = tmp_path / "empty.tif"
    path.write_bytes(b"")
    return str(path)


def make_corrupt_tiff(tmp_path):
    path = tmp_path / "corrupt.tif"
    path.write_bytes(b"II*\x00" + b"\x08\x00\x00\x00" + bytes(range(256)) * 8)
    return str(path)


def make_truncated_header(tmp_path):
    path = tmp_path / "cut-early.tif"
    path.write_bytes(cog_bytes(tmp_path)[:100])
    return str(path)


def make_truncated_data(tmp_path):
    # A COG's directories come first, so a cut-off upload still opens: only its blocks are missing.
    body = cog_bytes(tmp_path)
    path = tmp_path / "cut-late.tif"
    path.write_bytes(body[: len(body) * 6 // 10])
    return str(path)


def make_no_georeferencing(tmp_path):
    return write_raster(tmp_path / "plain.tif", crs=None, transform=Affine.identity())


def make_gcps_only(tmp_path):
    path = str(tmp_path / "gcps.tif")
    gcps = [
        GroundControlPoint(0, 0, 10.0, 46.0),
        GroundControlPoint(0, 300, 10.1, 46.0),
        GroundControlPoint(200, 0, 10.0, 45.9),
        GroundControlPoint(200, 300, 10.1, 45.9),
    ]
    with rasterio.open(
        path, "w", driver="GTiff", width=300, height=200, count=1, dtype="uint8", gcps=gcps, crs="EPSG:4326"
    ) as dst:
        dst.write(np.ones((1, 200, 300), dtype="uint8"))
    return path


def make_rotated(tmp_path):
    return write_raster(tmp_path / "rotated.tif", transform=Affine(10, 2, 500000, 1, -10, 4600000))


def make_too_many_pixels(tmp_path):
    # 300 x 200 = 60,000 pixels, tested against a 50,000-pixel limit below.
    return write_raster(tmp_path / "big.tif")


def make_complex(tmp_path):
    return write_raster(tmp_path / "complex.tif", dtype="complex64")


def sparse_raster(path, *, count: int, dtype: str, width: int = 1024, height: int = 1024) -> str:
    """A GeoTIFF whose blocks were never written (GDAL reads them as zeros): header only."""
    return write_raster(path, count=count, dtype=dtype, width=width, height=height, pixels=False, sparse_ok=True)


def make_too_many_bands(tmp_path):
    # 200 float64 bands: a 256 x 256 window needs 100 MiB.
    return sparse_raster(tmp_path / "bands.tif", count=200, dtype="float64", width=512, height=512)


BAD_INPUTS = {
    # id: (maker, error type, message fragments, settings)
    "not-a-raster": (make_not_a_raster, InvalidRasterError, ["is not a TIFF", "accepted: a self-contained GeoTIFF"]),
    "zero-bytes": (make_zero_bytes, InvalidRasterError, ["is empty (0 bytes)", "upload the raster itself"]),
    "corrupt-tiff": (make_corrupt_tiff, InvalidRasterError, ["starts like a TIFF", "truncated or corrupt"]),
    "truncated-header": (make_truncated_header, InvalidRasterError, ["starts like a TIFF", "truncated or corrupt"]),
    "truncated-data": (
        make_truncated_data,
        InvalidRasterError,
        ["is truncated", "extends to byte", "upload the complete file"],
    ),
    "no-georeferencing": (
        make_no_georeferencing,
        UnsupportedRasterError,
        ["has no georeferencing", "accepted: a raster with a CRS"],
    ),
    "gcps-only": (make_gcps_only, UnsupportedRasterError, ["ground control points", "warp it to a regular grid"]),
    "rotated": (make_rotated, UnsupportedRasterError, ["rotated or sheared", "north-up grids only"]),
    "too-many-pixels": (make_too_many_pixels, UnsupportedRasterError, ["60000 pixels", "more than the 50000 allowed"]),
    "complex-dtype": (make_complex, UnsupportedRasterError, ["sample type complex64", "accepted: uint8"]),
    "too-many-bands": (
        make_too_many_bands,
        UnsupportedRasterError,
        [
            "200 bands of float64: one 256 x 256 window of it needs 104857600 bytes",
            f"more than the {MAX_WINDOW_BYTES} bytes",
            "at most 96 bands of float64 per file",
            "a smaller window would not do",
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_refused_before_any_tile(case, tmp_path, stores):
    maker, error, fragments = BAD_INPUTS[case]
    path = maker(tmp_path)
    settings = Settings(window_size=256, max_pixels=50_000) if case == "too-many-pixels" else SETTINGS
    with pytest.raises(error) as caught:
        run_job(path, stores, settings=settings)
    assert isinstance(caught.value, BadInputError) and not caught.value.retryable
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, message
    assert path in message
    assert blob_names(stores["tiles"]) == []
    assert manifest_rows(stores["manifest"]) == []


@pytest.mark.parametrize("case", ["zero-bytes", "not-a-raster", "truncated-data"])
def test_bad_blob_on_azurite_is_refused_through_the_pinned_reader(case, tmp_path, stores):
    """The same refusals for a blob read as the app reads an upload (Event Grid delivers zero-byte creates)."""
    maker, error, fragments = BAD_INPUTS[case]
    local = maker(tmp_path)
    with open(local, "rb") as f:
        blob = stores["output"].upload_blob(f"uploads/{case}.tif", f)
    remote = PinnedBlob(blob, blob.get_blob_properties().etag)
    with pytest.raises(error) as caught:
        run_job(remote, stores)
    for fragment in fragments:
        assert fragment in str(caught.value), str(caught.value)
    assert blob_names(stores["tiles"]) == []
    assert manifest_rows(stores["manifest"]) == []


def test_the_window_budget_is_measured_in_the_jobs_window(tmp_path):
    """24 uint16 bands of 1024² fill the budget exactly; a 25th is refused at 1024-px windows and
    accepted at 512 (where the message says it would fit)."""
    at_budget = sparse_raster(tmp_path / "24.tif", count=24, dtype="uint16")
    assert MAX_WINDOW_BYTES == 24 * 1024 * 1024 * 2
    assert inspect_source(at_budget, settings=SETTINGS, spec=OutputSpec(window_size=1024)).count == 24
    over = sparse_raster(tmp_path / "25.tif", count=25, dtype="uint16")
    with pytest.raises(UnsupportedRasterError) as caught:
        inspect_source(over, settings=SETTINGS, spec=OutputSpec(window_size=1024))
    message = str(caught.value)
    assert f"needs {25 * 1024 * 1024 * 2} bytes" in message and f"the {MAX_WINDOW_BYTES} bytes" in message, message
    assert "at most 24 bands of uint16 per file" in message and "TILECOMMIT_WINDOW_SIZE=768 fits 25 bands" in message
    assert inspect_source(over, settings=SETTINGS, spec=OutputSpec(window_size=768)).count == 25


def test_a_file_over_the_window_budget_is_refused_before_any_block_is_read(tmp_path):
    """The 65,535-band file of the fuzz corpus declares its strips past its end: any pixel read
    fails, so a refusal for the budget (not as truncated or corrupt) shows none was made."""
    path = str(next(p for p in write_window_budget_files(tmp_path) if "65535" in p.name))
    with rasterio.open(path) as src, pytest.raises(rasterio.errors.RasterioIOError):
        src.read(1, window=Window(0, 0, 1, 1))
    with pytest.raises(UnsupportedRasterError, match="65535 bands of uint8: one 64 x 64 window of it needs 268431360"):
        inspect_source(path, settings=SETTINGS, spec=OutputSpec(window_size=256))
