"""The source's acquisition time (tilecommit/raster/reading/acquisition.py): where GDAL keeps it in
a GeoTIFF, the forms GDAL writes it in, and what the parser takes and refuses. The item that uses
it is checked through the job in tests/test_real_rasters.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio
from rasterio.shutil import copy as gdal_create_copy
from rasterio.transform import from_origin

from tilecommit.raster import tiff
from tilecommit.raster.reading.acquisition import QUOTED_CHARS, acquisition_of, parse_acquisition_time

#: The TIFF tag GDAL keeps the metadata of its domains in (GDAL_METADATA).
GDAL_METADATA_TAG = 42112


def small_geotiff(path: Path, **imagery: str) -> Path:
    """A 16 x 16 GeoTIFF, with ``imagery`` set in the IMAGERY domain as rasterio sets tags."""
    profile = {
        "driver": "GTiff",
        "width": 16,
        "height": 16,
        "count": 1,
        "dtype": "uint8",
        "crs": "EPSG:32633",
        "transform": from_origin(500000, 4600000, 30, 30),
    }
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(np.arange(256, dtype="uint8").reshape(1, 16, 16))
        if imagery:
            dst.update_tags(ns="IMAGERY", **imagery)
    return path


def imagery_domain(path: Path) -> dict:
    """The IMAGERY domain of ``path`` as the job's GDAL sees it: no sidecar, no .aux.xml."""
    with rasterio.Env(GDAL_PAM_ENABLED="NO", GDAL_DISABLE_READDIR_ON_OPEN="EMPTY_DIR"), rasterio.open(path) as src:
        return src.tags(ns="IMAGERY")


def test_gdal_keeps_an_acquisition_time_set_on_a_geotiff_in_its_gdal_metadata_tag(tmp_path):
    path = small_geotiff(tmp_path / "tagged.tif", ACQUISITIONDATETIME="2021-03-04 10:11:12")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tagged.tif"]  # no .aux.xml beside it
    first = tiff.read_layout(path.read_bytes()).directories[0]
    stored = bytes(first.tags[GDAL_METADATA_TAG].data).decode("ascii")
    assert '<Item name="ACQUISITIONDATETIME" domain="IMAGERY">2021-03-04 10:11:12</Item>' in stored
    assert imagery_domain(path) == {"ACQUISITIONDATETIME": "2021-03-04 10:11:12"}


@pytest.mark.parametrize("driver", ["GTiff", "COG"])
def test_a_gdal_copy_leaves_the_imagery_domain_behind(tmp_path, driver):
    """What docs/raster.md says of a GDAL copy (GDAL 3.10): CreateCopy into a GeoTIFF or a COG
    drops the IMAGERY domain unless told COPY_SRC_MDD=YES (the tiles, encoded by the COG
    driver's copy, lose it too)."""
    source = small_geotiff(tmp_path / "tagged.tif", ACQUISITIONDATETIME="2021-03-04 10:11:12")
    gdal_create_copy(str(source), str(tmp_path / "copy.tif"), driver=driver)
    assert imagery_domain(tmp_path / "copy.tif") == {}
    gdal_create_copy(str(source), str(tmp_path / "asked.tif"), driver=driver, COPY_SRC_MDD="YES")
    assert imagery_domain(tmp_path / "asked.tif") == {"ACQUISITIONDATETIME": "2021-03-04 10:11:12"}


def landsat_pair(directory: Path, scene_center_time: str) -> Path:
    """A band file and the Landsat MTL sidecar GDAL's Landsat reader turns into IMAGERY metadata
    (Collection 1 names; USGS quotes SCENE_CENTER_TIME)."""
    directory.mkdir()
    band = small_geotiff(directory / "LC08_TEST_B1.TIF")
    (directory / "LC08_TEST_MTL.txt").write_text(
        "GROUP = L1_METADATA_FILE\n"
        "  GROUP = PRODUCT_METADATA\n"
        '    SPACECRAFT_ID = "LANDSAT_8"\n'
        "    DATE_ACQUIRED = 2013-04-07\n"
        f"    SCENE_CENTER_TIME = {scene_center_time}\n"
        "  END_GROUP = PRODUCT_METADATA\n"
        "END_GROUP = L1_METADATA_FILE\n"
        "END\n"
    )
    return band


def sensor_reader_value(band: Path) -> str:
    """ACQUISITIONDATETIME as GDAL's sensor reader writes it (sidecars read, as gdalinfo does)."""
    with rasterio.open(band) as src:
        return src.get_tag_item("ACQUISITIONDATETIME", "IMAGERY")


def test_gdals_sensor_readers_write_utc_to_the_second(tmp_path):
    value = sensor_reader_value(landsat_pair(tmp_path / "bare", "15:47:03.0882620Z"))
    assert value == "2013-04-07 15:47:03"
    assert parse_acquisition_time(value) == "2013-04-07T15:47:03Z"


def test_gdals_sensor_readers_write_the_epoch_for_a_date_they_cannot_read(tmp_path):
    value = sensor_reader_value(landsat_pair(tmp_path / "quoted", '"15:47:03.0882620Z"'))
    assert value == "1970-01-01 00:00:00"
    with pytest.raises(ValueError, match="Unix epoch"):
        parse_acquisition_time(value)


@pytest.mark.parametrize(
    ("value", "rfc3339"),
    [
        ("2021-03-04 10:11:12", "2021-03-04T10:11:12Z"),  # GDAL's form, UTC
        ("2021-03-04T10:11:12", "2021-03-04T10:11:12Z"),  # no zone: UTC, as the key is defined
        ("2021-03-04T10:11:12Z", "2021-03-04T10:11:12Z"),
        ("2021-03-04t10:11:12z", "2021-03-04T10:11:12Z"),  # RFC 3339 allows lower case
        ("2021-03-04T10:11:12.5Z", "2021-03-04T10:11:12.500000Z"),
        ("2021-03-04 10:11:12.000000", "2021-03-04T10:11:12Z"),
        ("2013-04-07T15:47:03.0882620Z", "2013-04-07T15:47:03.088262Z"),  # beyond microseconds: cut
        ("2021-03-04T12:11:12+02:00", "2021-03-04T10:11:12Z"),
        ("2021-03-03T23:41:12-10:30", "2021-03-04T10:11:12Z"),  # across midnight
        (" 2021-03-04 10:11:12\n", "2021-03-04T10:11:12Z"),
    ],
)
def test_the_parser_gives_rfc3339_utc(value, rfc3339):
    assert parse_acquisition_time(value) == rfc3339


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "not a date and time"),
        ("yesterday", "not a date and time"),
        ("2021-03-04", "not a date and time"),  # a day is not a time of it
        ("2021-03-04T10:11", "not a date and time"),
        ("20210304T101112Z", "not a date and time"),  # ISO 8601's basic form
        ("2021:03:04 10:11:12", "not a date and time"),  # TIFFTAG_DATETIME's form: a write time
        ("2021-03-04 10:11:12 UTC", "not a date and time"),
        ("2021-13-04 10:11:12", "month must be in 1..12"),
        ("2021-02-29 10:11:12", "day is out of range"),
        ("2021-03-04 24:00:00", "hour must be in 0..23"),
        ("2021-03-04T10:11:12+05:60", "60 minutes"),
        ("0001-01-01T00:30:00+01:00", "outside the years 1 to 9999"),
        ("1970-01-01 00:00:00", "Unix epoch"),
    ],
)
def test_the_parser_refuses_what_is_not_a_time_and_says_why(value, reason):
    with pytest.raises(ValueError, match=reason):
        parse_acquisition_time(value)


def test_a_value_that_is_not_a_time_is_noted_briefly_and_logged(tmp_path, caplog):
    path = small_geotiff(tmp_path / "long.tif", ACQUISITIONDATETIME="x" * 1000)
    with rasterio.open(path) as src:
        found = acquisition_of(src, "in/long.tif")
    assert found.time is None
    assert found.note.startswith("IMAGERY ACQUISITIONDATETIME 'xxx")
    assert "x" * (QUOTED_CHARS + 1) not in found.note and "...' not used: it is not a date and time" in found.note
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [f"in/long.tif: {found.note}"]


def test_a_source_without_the_tag_has_no_time_and_no_note(tmp_path, caplog):
    with rasterio.open(small_geotiff(tmp_path / "plain.tif")) as src:
        assert acquisition_of(src, "in/plain.tif") == (None, "")
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
