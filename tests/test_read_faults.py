"""A read that failed is not bad input until it is proven so.

GDAL reports a window it could not read as "Read failed" whatever the cause. When storage
refused the bytes (503 ServerBusy, a reset connection), GDAL's network layer said so while the
read ran, and the failure is a retryable storage fault; only a failure that repeats on bytes
that did arrive is a corrupt upload. Storage is Azurite behind the fault-injecting proxy.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rasterio.windows import Window as RioWindow

from devhost.scenes import SceneSpec, write_scene
from tilecommit.errors import InvalidRasterError, StorageFaultError, is_retryable
from tilecommit.raster import inspect_source
from tilecommit.raster.env import gdal_env
from tilecommit.raster.tiles import encode_tile
from tilecommit.raster.upload import open_upload, upload_gdal_options
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec
from tilecommit.storage import StorageConnection, vsiaz_path

from .storage_proxy import FaultPlan, FaultProxy

SETTINGS = Settings(window_size=256)
#: GDAL's own retries, shortened so a refused read fails in about a second here.
QUICK_GDAL_RETRIES = {"GDAL_HTTP_MAX_RETRY": "1", "GDAL_HTTP_RETRY_DELAY": "0.2"}


def proxied(azurite, proxy: FaultProxy) -> StorageConnection:
    return StorageConnection.from_connection_string(
        azurite.connection_string.replace(f":{azurite.blob_port}/", f":{proxy.port}/")
    )


@pytest.fixture
def uploaded(container, tmp_path) -> str:
    scene = write_scene(str(tmp_path / "scene.tif"), SceneSpec(512, 512, blocksize=256))
    with open(scene, "rb") as data:
        container.upload_blob("scene.tif", data)
    return vsiaz_path(container.container_name, "scene.tif")


@pytest.mark.parametrize("fault", ["busy", "reset"])
def test_a_window_read_storage_refused_is_a_retryable_fault_and_the_same_handle_recovers(azurite, uploaded, fault):
    plan = FaultPlan()
    with FaultProxy(f"http://127.0.0.1:{azurite.blob_port}", plan) as proxy:
        options = {**proxied(azurite, proxy).gdal_options(), **upload_gdal_options(uploaded), **QUICK_GDAL_RETRIES}
        window = RioWindow(256, 0, 256, 256)
        with gdal_env(SETTINGS, options), open_upload(uploaded) as src:
            setattr(plan, fault, 1.0)
            with pytest.raises(StorageFaultError) as caught:
                encode_tile(src, window, spec=OutputSpec(window_size=256))
            setattr(plan, fault, 0.0)
            body, _ = encode_tile(src, window, spec=OutputSpec(window_size=256))
    assert is_retryable(caught.value)
    assert "storage did not deliver the bytes" in str(caught.value)
    assert "corrupt" not in str(caught.value)
    assert proxy.injected[fault if fault == "busy" else "reset-before"] >= 1
    assert body[:4] == b"II*\x00"


def test_an_open_during_an_outage_is_a_fault_and_the_next_attempt_in_the_same_worker_succeeds(azurite, uploaded):
    """GDAL caches "does not exist" for a file it could not open; the upload's options drop that
    cache, so the activity's retry in the same process is not told the upload is missing."""
    plan = FaultPlan(busy=1.0)
    with FaultProxy(f"http://127.0.0.1:{azurite.blob_port}", plan) as proxy:
        options = {**proxied(azurite, proxy).gdal_options(), **QUICK_GDAL_RETRIES}
        with pytest.raises(StorageFaultError) as caught:
            inspect_source(uploaded, settings=SETTINGS, spec=OutputSpec.from_settings(SETTINGS), gdal_options=options)
        plan.busy = 0.0
        scene = inspect_source(
            uploaded, settings=SETTINGS, spec=OutputSpec.from_settings(SETTINGS), gdal_options=options
        )
    assert is_retryable(caught.value) and "503" in str(caught.value)
    assert (scene.width, scene.height) == (512, 512)


def damage_block(path: Path, bx: int, by: int) -> None:
    """Overwrite one compressed block with bytes that do not inflate."""
    import rasterio

    with rasterio.open(path) as src:
        offset = int(src.get_tag_item(f"BLOCK_OFFSET_{bx}_{by}", "TIFF", bidx=1))
        size = int(src.get_tag_item(f"BLOCK_SIZE_{bx}_{by}", "TIFF", bidx=1))
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(b"\xff" * size)


def test_bytes_that_arrived_and_do_not_decode_are_corrupt_input(tmp_path):
    path = Path(write_scene(str(tmp_path / "damaged.tif"), SceneSpec(512, 512, blocksize=256)))
    damage_block(path, 1, 0)
    with gdal_env(SETTINGS, upload_gdal_options(str(path))), open_upload(str(path)) as src:
        with pytest.raises(InvalidRasterError) as caught:
            encode_tile(src, RioWindow(256, 0, 256, 256), spec=OutputSpec(window_size=256))
        intact, _ = encode_tile(src, RioWindow(0, 0, 256, 256), spec=OutputSpec(window_size=256))
    assert not is_retryable(caught.value)
    assert "col=256 row=0" in str(caught.value) and "corrupt" in str(caught.value)
    assert intact[:4] == b"II*\x00"
