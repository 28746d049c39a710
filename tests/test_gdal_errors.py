"""A GDAL failure reaches the user with its step, its window and GDAL's own words, never as
"Unknown GDAL Error"; recording GDAL's messages leaves the logging configuration as it was."""

from __future__ import annotations

import contextlib
import logging

import numpy as np
import pytest
import rasterio
import rasterio.shutil
from rasterio.io import MemoryFile
from rasterio.transform import from_origin

from tilecommit.errors import (
    GdalStepError,
    InvalidRasterError,
    MosaicCheckError,
    StorageFaultError,
    is_retryable,
)
from tilecommit.raster.assembly.checks import check_mosaic_file
from tilecommit.raster.assembly.stac import mosaic_footprint
from tilecommit.raster.gdal_errors import GDAL_LOGGER, gdal_step, job_messages
from tilecommit.raster.reading.scene import scene_from_dataset
from tilecommit.raster.reading.source import LocalFile
from tilecommit.settings import Settings

from .tiff_fuzz import _put, parse


def write_cog_without_overviews_the_wrong_way() -> None:
    # GDAL 3.10's COG driver fails on OVERVIEW_COUNT=0 for an image larger than one block, and
    # says nothing: rasterio can only raise SystemError("Unknown GDAL Error ...").
    with (
        MemoryFile() as memory,
        memory.open(
            driver="COG",
            width=600,
            height=600,
            count=1,
            dtype="uint8",
            crs="EPSG:32633",
            transform=from_origin(0, 0, 1, 1),
            OVERVIEW_COUNT=0,
            BLOCKSIZE=256,
        ) as dst,
    ):
        dst.write(np.ones((1, 600, 600), dtype="uint8"))


def test_a_failure_without_a_message_is_named_by_its_step_and_window():
    with pytest.raises(SystemError, match="Unknown GDAL Error"), rasterio.Env():
        write_cog_without_overviews_the_wrong_way()
    with (
        pytest.raises(GdalStepError) as caught,
        rasterio.Env(),
        gdal_step("encoding tile 0000_0001 as a COG", window="col=256 row=0 600x600"),
    ):
        write_cog_without_overviews_the_wrong_way()
    message = str(caught.value)
    assert "Unknown GDAL Error" not in message
    assert message.startswith("encoding tile 0000_0001 as a COG (window col=256 row=0 600x600) failed in GDAL")
    assert "without a message" in message
    assert caught.value.step == "encoding tile 0000_0001 as a COG" and caught.value.window == "col=256 row=0 600x600"


def copy_vrt_with_a_missing_source(tmp_path) -> None:
    vrt = tmp_path / "mosaic.vrt"
    vrt.write_text(
        '<VRTDataset rasterXSize="10" rasterYSize="10"><VRTRasterBand dataType="Byte" band="1"><SimpleSource>'
        f'<SourceFilename relativeToVRT="0">{tmp_path}/missing-tile.tif</SourceFilename><SourceBand>1</SourceBand>'
        "</SimpleSource></VRTRasterBand></VRTDataset>"
    )
    rasterio.shutil.copy(str(vrt), str(tmp_path / "out.tif"), driver="GTiff")


def test_the_messages_gdal_sent_during_the_step_are_in_the_error(tmp_path):
    with (
        pytest.raises(GdalStepError) as caught,
        rasterio.Env(),
        gdal_step("assembling the mosaic through a VRT", window="10x10, 1 tile"),
    ):
        copy_vrt_with_a_missing_source(tmp_path)
    message = str(caught.value)
    assert message.startswith("assembling the mosaic through a VRT (window 10x10, 1 tile) failed in GDAL: ")
    assert "missing-tile.tif: No such file or directory" in message
    assert caught.value.gdal_messages and all("missing-tile.tif" in m for m in caught.value.gdal_messages)


def test_a_silent_failure_cites_what_gdal_said_last_in_an_earlier_step_of_the_same_job(tmp_path):
    with pytest.raises(GdalStepError), job_messages("job-a"), rasterio.Env(), gdal_step("first step"):
        copy_vrt_with_a_missing_source(tmp_path)
    with (
        pytest.raises(GdalStepError) as caught,
        job_messages("job-a"),
        rasterio.Env(),
        gdal_step("second step", window="col=0 row=0 600x600"),
    ):
        write_cog_without_overviews_the_wrong_way()
    message = str(caught.value)
    assert message.startswith(
        "second step (window col=0 row=0 600x600) failed in GDAL: GDAL reported the failure without a message"
    )
    assert "its last messages in this job were: " in message and "missing-tile.tif" in message


def test_a_jobs_error_never_carries_another_jobs_gdal_messages(tmp_path):
    """Job A's GDAL failure, in another thread, leaves messages behind; job B's silent failure
    names none of them (and neither does a step that belongs to no job)."""
    import threading

    def job_a() -> None:
        with pytest.raises(GdalStepError), job_messages("job-a"), rasterio.Env(), gdal_step("a's step"):
            copy_vrt_with_a_missing_source(tmp_path)

    thread = threading.Thread(target=job_a)
    thread.start()
    thread.join()
    for scope in (job_messages("job-b"), contextlib.nullcontext()):
        with pytest.raises(GdalStepError) as caught, scope, rasterio.Env(), gdal_step("b's step"):
            write_cog_without_overviews_the_wrong_way()
        assert "missing-tile.tif" not in str(caught.value) and "last messages" not in str(caught.value)


def test_project_errors_and_other_exceptions_pass_through_unchanged():
    with pytest.raises(InvalidRasterError, match="already named"), gdal_step("a step"):
        raise InvalidRasterError("already named")
    with pytest.raises(KeyError), gdal_step("a step"):
        raise KeyError("not GDAL's")


def test_recording_leaves_the_gdal_logger_as_it_was(caplog):
    logger = logging.getLogger(GDAL_LOGGER)
    before = (logger.level, list(logger.filters))
    caplog.set_level(logging.WARNING)
    with pytest.raises(GdalStepError), rasterio.Env(), gdal_step("outer"), gdal_step("inner"):
        write_cog_without_overviews_the_wrong_way()
    assert (logger.level, list(logger.filters)) == before
    # GDAL's INFO-level messages were read for the error, not passed on to the application's logs.
    assert not [r for r in caplog.records if r.name == GDAL_LOGGER and r.levelno < logging.WARNING]


# ------------------------------------------------------------------ retryable from evidence, never from words

#: A folder whose name holds the words the app once took for a transport failure in GDAL's text:
#: "ssl" in "classlabels", "curl" in "curlew", and "timeout" and "ssl" themselves. GDAL names the
#: file in its messages.
WORDS = "classlabels-curlew-timeout-ssl"


def mosaic_with_two_levels(tmp_path) -> str:
    """A 1024 x 1024 COG with two overview levels and a nodata value (so its mask is read from its
    pixels), in the folder :data:`WORDS`."""
    folder = tmp_path / WORDS
    folder.mkdir()
    path = str(folder / "mosaic.tif")
    pixels = np.random.default_rng(4).integers(1, 255, size=(1, 1024, 1024), dtype="uint8")
    profile = dict(driver="GTiff", width=1024, height=1024, count=1, dtype="uint8", nodata=0, crs="EPSG:32633")
    profile.update(transform=from_origin(500000, 4600000, 10, 10), tiled=True, blockxsize=256, blockysize=256)
    with MemoryFile() as memory:
        with memory.open(**profile) as dst:
            dst.write(pixels)
        rasterio.shutil.copy(memory.name, path, driver="COG", BLOCKSIZE=256, OVERVIEW_COUNT=2, COMPRESS="DEFLATE")
    return path


def rewrite(path: str, change) -> None:
    with open(path, "rb") as f:
        data = bytearray(f.read())
    change(data, parse(bytes(data)))
    with open(path, "wb") as f:
        f.write(data)


def test_a_gdal_failure_on_bytes_that_all_arrived_is_not_retryable_whatever_words_its_messages_hold(tmp_path):
    """The header points at a first directory past the end of the file: every byte the footprint
    asks for arrives (nothing recorded by the reader), GDAL fails to open it and names the file.
    Before, the words of that name in GDAL's text made the failure a retryable transport fault."""
    path = mosaic_with_two_levels(tmp_path)
    rewrite(path, lambda data, layout: _put(data, 4, layout.order + "I", len(data) + 4096))
    mosaic = LocalFile(path)
    with rasterio.Env(), pytest.raises(GdalStepError) as caught:
        mosaic_footprint(mosaic, "EPSG:32633")
    assert mosaic.faults == []
    assert not is_retryable(caught.value)
    # GDAL's messages still tell what happened, naming the file.
    assert any(WORDS in m for m in caught.value.gdal_messages) and "Can not read TIFF directory" in str(caught.value)


def test_a_mosaic_check_on_bytes_that_all_arrived_is_a_known_bad_mosaic_whatever_words_gdal_said(tmp_path):
    """The second level's directory is cut from the chain (its predecessor points past the end of
    the file): GDAL sees one level, and says so naming the file. Before, the words in that text made
    the check a retryable storage fault instead of a mosaic known bad."""
    path = mosaic_with_two_levels(tmp_path)
    with rasterio.open(path) as src:
        scene = scene_from_dataset(src)
    rewrite(path, lambda data, layout: _put(data, layout.next_at[1], layout.order + "I", len(data) + 4096))
    mosaic = LocalFile(path)
    with pytest.raises(MosaicCheckError) as caught:
        check_mosaic_file(mosaic, scene, 2, settings=Settings(), label="committed mosaic of job j")
    assert mosaic.faults == []
    assert "1 overview levels instead of 2" in str(caught.value) and not is_retryable(caught.value)


def test_a_read_the_reader_recorded_still_fails_the_step_as_a_retryable_fault(tmp_path):
    """The other side: the file is cut after its size was learnt, so the reader records reads
    that come back short; that record, not GDAL's text, makes the step a retryable fault."""
    path = mosaic_with_two_levels(tmp_path)
    mosaic = LocalFile(path)
    assert mosaic.file_size > 4096
    rewrite(path, lambda data, layout: data.__delitem__(slice(4096, None)))
    with rasterio.Env(), pytest.raises(StorageFaultError) as caught:
        mosaic_footprint(mosaic, "EPSG:32633")
    assert mosaic.faults and is_retryable(caught.value)
    assert "storage did not deliver bytes" in str(caught.value)
