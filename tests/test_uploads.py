"""Uploads are data: no file, URL or blob named inside an upload is ever opened.

Each hostile upload below is first opened the way GDAL opens a file when nobody restricts it
(the control): that shows the vector is real, i.e. the trap server is asked or the secret is
read. Then the same upload goes through ``inspect_source`` (what ``validate_source`` runs) and
must be refused with a message that says what is accepted, with zero requests to the trap and
no byte of the secret anywhere.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import rasterio
from rasterio.errors import RasterioIOError

from testkit.storage_proxy import RecordingProxy, TrapServer
from tilecommit.errors import BadInputError, InvalidNameError, UnsupportedRasterError
from tilecommit.raster import inspect_source
from tilecommit.raster.reading.scene import same_crs
from tilecommit.raster.reading.source import PinnedBlob
from tilecommit.raster.reading.upload import check_upload_content, describe_header
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec
from tilecommit.storage import StorageConnection, vsiaz_path

from .hostile import (
    MARKER,
    add_sidecars,
    geotiff,
    hfa,
    local_vectors,
    make_secret_raw,
    make_secret_tif,
    network_vectors,
    vrt,
    write,
)

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = Settings(window_size=256)


@pytest.fixture
def secret_raw(tmp_path):
    return make_secret_raw(tmp_path)


@pytest.fixture
def secret_tif(tmp_path):
    return make_secret_tif(tmp_path)


@pytest.fixture
def trap():
    with TrapServer() as server:
        yield server


def open_as_gdal_would(path: str):
    """The control: GDAL's defaults, any driver, Python pixel functions allowed."""
    with rasterio.Env(GDAL_VRT_ENABLE_PYTHON="YES", GDAL_HTTP_MAX_RETRY=0, GDAL_HTTP_TIMEOUT=5):
        try:
            with rasterio.open(path) as src:
                return src.read()
        except (RasterioIOError, rasterio.errors.RasterioError, SystemError):
            return None


def pinned(container, name: str) -> PinnedBlob:
    """The blob as the app reads an upload: at its current ETag, every read conditional."""
    blob = container.get_blob_client(name)
    return PinnedBlob(blob, blob.get_blob_properties().etag)


def assert_refused(path, gdal_options: dict | None = None) -> str:
    with pytest.raises(BadInputError) as caught:
        inspect_source(path, settings=SETTINGS, spec=OutputSpec.from_settings(SETTINGS), gdal_options=gdal_options)
    message = str(caught.value)
    assert "accepted: a self-contained GeoTIFF" in message, message
    assert not caught.value.retryable
    return message


def test_uploads_that_name_a_url_are_refused_and_the_url_is_never_asked(tmp_path, trap):
    vectors = network_vectors(tmp_path, trap.url)
    for name, path in vectors.items():
        del trap.requests[:]
        open_as_gdal_would(path)
        assert trap.requests, f"control: GDAL left alone did not ask the trap for {name}; the vector is not real"
        del trap.requests[:]
        message = assert_refused(path)
        assert trap.requests == [], (name, trap.requests)
        assert "names no other file or URL" in message, (name, message)


def test_uploads_that_name_a_local_file_are_refused_and_nothing_of_it_is_read(tmp_path, secret_tif, secret_raw, caplog):
    caplog.set_level(logging.DEBUG)
    for name, path in local_vectors(tmp_path, secret_tif, secret_raw).items():
        leaked = open_as_gdal_would(path)
        assert leaked is not None and MARKER[:8] in leaked.tobytes(), f"control: {name} did not read the secret"
        message = assert_refused(path)
        assert "GDAL VRT" in message, message
        assert MARKER.decode() not in message
    assert MARKER.decode() not in caplog.text


def test_other_formats_are_refused_by_content_with_what_is_accepted(tmp_path):
    """(A JSON object is read as a scene document and refused as one when it is not:
    tests/test_scene_documents.py.)"""
    cases = {
        "imagine.img": (hfa(tmp_path), "ERDAS Imagine"),
        "zip": (str(tmp_path / "a.zip"), "a ZIP archive"),
        "png": (str(tmp_path / "a.png"), "a PNG image"),
        "xml-declared-vrt": (write(tmp_path, "decl.tif", '<?xml version="1.0"?>\n' + vrt("/tmp/x.tif")), "a GDAL VRT"),
    }
    (tmp_path / "a.zip").write_bytes(b"PK\x03\x04" + b"\x00" * 60)
    (tmp_path / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 60)
    for name, (path, what) in cases.items():
        with pytest.raises(UnsupportedRasterError) as caught:
            inspect_source(path, settings=SETTINGS, spec=OutputSpec.from_settings(SETTINGS))
        assert what in str(caught.value) and "accepted" not in what, (name, str(caught.value))
        assert "accepted: a self-contained GeoTIFF" in str(caught.value)


@pytest.mark.parametrize("head", [b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"])
def test_every_tiff_flavour_passes_the_content_check(head):
    check_upload_content("x", head + b"\x00" * 12, 16)
    assert describe_header(head) is None


def test_sidecars_beside_a_local_upload_are_never_read(tmp_path):
    plain = geotiff(tmp_path / "plain.tif", georeferenced=False)
    add_sidecars(plain)
    with rasterio.open(plain) as src:  # the control: GDAL left alone takes the sidecars' word
        assert src.crs is not None and src.nodata == 7 and src.overviews(1)
    with pytest.raises(UnsupportedRasterError, match="has no georeferencing"):
        inspect_source(plain, settings=SETTINGS, spec=OutputSpec.from_settings(SETTINGS))

    georeferenced = geotiff(tmp_path / "geo.tif")
    add_sidecars(georeferenced)
    scene = inspect_source(georeferenced, settings=SETTINGS, spec=OutputSpec.from_settings(SETTINGS))
    assert scene.nodata is None and scene.mask == "none" and same_crs(scene.crs, "EPSG:32633")


def upload(container, name: str, path: str) -> None:
    with open(path, "rb") as f:
        container.upload_blob(name, f, overwrite=True)


def test_on_storage_sidecars_and_other_blobs_are_never_requested(tmp_path, new_container, azurite, trap):
    """Through the pinned reader, behind a recording proxy: the only blob read is the upload."""
    uploads, other = new_container("up-"), new_container("secret-")
    upload(other, "secret.tif", geotiff(tmp_path / "secret.tif"))
    georeferenced = geotiff(tmp_path / "geo.tif")
    for sidecar in add_sidecars(georeferenced):
        upload(uploads, "scenes/" + sidecar.rsplit("/", 1)[1], sidecar)
    upload(uploads, "scenes/geo.tif", georeferenced)
    upload(uploads, "scenes/steal.vrt", write(tmp_path, "steal.vrt", vrt(f"/vsiaz/{other.container_name}/secret.tif")))
    upload(uploads, "scenes/fetch.tif", write(tmp_path, "fetch.tif", vrt(f"/vsicurl/{trap.url}/x.tif")))

    with RecordingProxy(azurite.blob_endpoint.rsplit("/", 1)[0]) as proxy:
        proxied = azurite.connection_string.replace(f":{azurite.blob_port}/", f":{proxy.port}/")
        connection = StorageConnection.from_connection_string(proxied)
        options = connection.gdal_options()
        through_proxy = connection.blob_service().get_container_client(uploads.container_name)
        steal = vsiaz_path(uploads.container_name, "scenes/steal.vrt")

        with rasterio.Env(**options):  # the control: GDAL left alone reads the other container's blob
            open_as_gdal_would(steal)
        assert any(other.container_name in p for p in proxy.paths()), proxy.paths()
        del proxy.requests[:]

        scene = inspect_source(
            pinned(through_proxy, "scenes/geo.tif"),
            settings=SETTINGS,
            spec=OutputSpec.from_settings(SETTINGS),
            gdal_options=options,
        )
        assert scene.nodata is None and scene.mask == "none" and same_crs(scene.crs, "EPSG:32633")
        message = assert_refused(pinned(through_proxy, "scenes/steal.vrt"), options)
        assert "GDAL VRT" in message
        assert_refused(pinned(through_proxy, "scenes/fetch.tif"), options)
        asked = proxy.paths()
    assert asked and all("/scenes/" in p for p in asked), asked
    assert not [p for p in asked if any(s in p for s in (".aux.xml", ".tfw", ".msk", ".ovr"))], asked
    assert not [p for p in asked if other.container_name in p], asked
    assert {p.split("?")[0].rsplit("/", 1)[1] for p in asked} <= {"geo.tif", "steal.vrt", "fetch.tif"}, asked
    assert trap.requests == []


def test_a_name_with_dot_segments_never_becomes_a_gdal_path():
    for name in ("../other/secret.tif", "a/../../other/secret.tif", "./x.tif", "a/./b.tif", "a\\b.tif"):
        with pytest.raises(InvalidNameError, match="segment or a backslash"):
            vsiaz_path("raster-uploads", name)
    assert vsiaz_path("raster-uploads", "a..b/c...tif") == "/vsiaz/raster-uploads/a..b/c...tif"


PROJ_PROBE = """
import sys
import function_app  # noqa: F401 - the worker's process settings
from rasterio.crs import CRS
from rasterio.warp import transform
crs = CRS.from_proj4("+proj=longlat +ellps=GRS80 +nadgrids=" + sys.argv[1] + "/grid.tif +no_defs")
try:
    transform(crs, "EPSG:4326", [10.0], [50.0])
except Exception:
    pass
"""


def test_a_crs_naming_a_grid_by_url_fetches_nothing_in_the_worker(trap):
    """With PROJ_NETWORK=ON in the app settings, PROJ would fetch (and here hang on) the grid;
    the worker process turns it off when function_app is imported."""
    env = {**os.environ, "PROJ_NETWORK": "ON"}
    subprocess.run(
        [sys.executable, "-c", PROJ_PROBE, trap.url], cwd=ROOT, env=env, timeout=60, check=True, capture_output=True
    )
    assert trap.requests == []
