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

from tilecommit.errors import GdalStepError, InvalidRasterError
from tilecommit.raster.gdal_errors import GDAL_LOGGER, gdal_step, job_messages


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
