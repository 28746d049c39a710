"""A read that failed is not bad input, and a read that was not answered in full never makes a tile.

The upload is read through the app's own reader (tilecommit/raster/reading/source.py): every range GET
pinned to the job's ETag with If-Match, every answer counted. Storage is Azurite behind the
fault-injecting proxy (503 ServerBusy, reset connections, answers cut half-way), with the SDK's
retries shortened so a refused read fails here in about a second.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import rasterio
from azure.storage.blob import ExponentialRetry
from rasterio.windows import Window as RioWindow

from testkit.scenes import SceneSpec, write_scene
from testkit.storage_proxy import FaultPlan, FaultProxy
from tilecommit.errors import InvalidRasterError, SourceChangedError, StorageFaultError, is_retryable
from tilecommit.raster import inspect_source
from tilecommit.raster.env import gdal_env
from tilecommit.raster.reading.source import LocalFile, PinnedBlob, open_upload
from tilecommit.raster.tiling.encode import encode_tile
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec
from tilecommit.storage import StorageConnection

SETTINGS = Settings(window_size=256)
SPEC = OutputSpec.from_settings(SETTINGS)
WINDOW = RioWindow(256, 0, 256, 256)


def quick_client(azurite, proxy: FaultProxy):
    """Blob clients that send through ``proxy`` and give up after one quick retry."""
    connection_string = azurite.connection_string.replace(f":{azurite.blob_port}/", f":{proxy.port}/")
    retry = ExponentialRetry(initial_backoff=0, increment_base=1, retry_total=1, random_jitter_range=0)
    return StorageConnection.from_connection_string(connection_string).blob_service(retry_policy=retry)


@pytest.fixture
def scene(tmp_path) -> str:
    return write_scene(str(tmp_path / "scene.tif"), SceneSpec(512, 512, blocksize=256))


@pytest.fixture
def uploaded(container, scene) -> tuple[str, str]:
    with open(scene, "rb") as data:
        etag = container.upload_blob("scene.tif", data).get_blob_properties().etag
    return "scene.tif", etag


def pinned_through(proxy: FaultProxy, azurite, container, name: str, etag: str) -> PinnedBlob:
    blobs = quick_client(azurite, proxy)
    return PinnedBlob(blobs.get_container_client(container.container_name).get_blob_client(name), etag)


def local_window(path: str) -> np.ndarray:
    with rasterio.open(path) as src:
        return src.read(window=WINDOW)


@pytest.mark.parametrize("fault", ["busy", "reset", "cut"])
def test_a_window_read_storage_did_not_answer_in_full_is_a_retryable_fault_then_recovers(
    azurite, container, uploaded, scene, fault
):
    plan = FaultPlan(applies=lambda method, path: method == "GET")
    with FaultProxy(f"http://127.0.0.1:{azurite.blob_port}", plan) as proxy:
        source = pinned_through(proxy, azurite, container, *uploaded)
        with gdal_env(SETTINGS), open_upload(source) as src:
            setattr(plan, fault, 1.0)
            with pytest.raises(StorageFaultError) as caught:
                encode_tile(src, WINDOW, spec=SPEC)
            setattr(plan, fault, 0.0)
            body, _ = encode_tile(src, WINDOW, spec=SPEC)
    assert is_retryable(caught.value) and not isinstance(caught.value, InvalidRasterError)
    assert "storage did not deliver bytes" in str(caught.value) and "corrupt" not in str(caught.value)
    assert proxy.injected[fault if fault != "reset" else "reset-before"] + proxy.injected["reset-after"] >= 1
    with rasterio.MemoryFile(body) as memory, memory.open() as tile:
        np.testing.assert_array_equal(tile.read(), local_window(scene))


def test_an_open_during_an_outage_is_a_fault_and_the_next_attempt_succeeds(azurite, container, uploaded):
    plan = FaultPlan(busy=1.0)
    with FaultProxy(f"http://127.0.0.1:{azurite.blob_port}", plan) as proxy:
        with pytest.raises(StorageFaultError) as caught:
            inspect_source(pinned_through(proxy, azurite, container, *uploaded), settings=SETTINGS, spec=SPEC)
        plan.busy = 0.0
        scene = inspect_source(pinned_through(proxy, azurite, container, *uploaded), settings=SETTINGS, spec=SPEC)
    assert is_retryable(caught.value) and "corrupt" not in str(caught.value)
    assert (scene.width, scene.height) == (512, 512)


def test_an_upload_overwritten_while_it_is_read_fails_once_naming_both_versions(container, uploaded, tmp_path):
    name, etag = uploaded
    source = PinnedBlob(container.get_blob_client(name), etag)
    other = write_scene(str(tmp_path / "other.tif"), SceneSpec(512, 512, blocksize=256, seed=99))
    with gdal_env(SETTINGS), open_upload(source) as src:
        with open(other, "rb") as data:
            new_etag = container.upload_blob(name, data, overwrite=True).get_blob_properties().etag
        with pytest.raises(SourceChangedError) as caught:
            encode_tile(src, WINDOW, spec=SPEC)
    message = str(caught.value)
    assert etag.strip('"') in message and new_etag.strip('"') in message, message
    assert not is_retryable(caught.value)


def test_an_upload_overwritten_before_it_is_opened_is_refused_by_the_service(container, uploaded, scene):
    name, etag = uploaded
    with open(scene, "rb") as data:
        container.upload_blob(name, data, overwrite=True)  # same bytes, a new version
    with pytest.raises(SourceChangedError, match="overwritten"):
        inspect_source(PinnedBlob(container.get_blob_client(name), etag), settings=SETTINGS, spec=SPEC)


def test_every_request_for_a_window_is_a_get_pinned_to_the_job_version(container, uploaded, scene, monkeypatch):
    """The size comes from the first ranged GET (no HEAD), and every request carries If-Match."""
    import requests.adapters

    name, etag = uploaded
    sent: list[tuple[str, str | None]] = []
    send = requests.adapters.HTTPAdapter.send

    def recording(adapter, request, *args, **kwargs):
        if name in request.url:
            sent.append((request.method, request.headers.get("If-Match")))
        return send(adapter, request, *args, **kwargs)

    monkeypatch.setattr(requests.adapters.HTTPAdapter, "send", recording)
    source = PinnedBlob(container.get_blob_client(name), etag)
    with gdal_env(SETTINGS), open_upload(source) as src, source.checked():
        body, _ = encode_tile(src, WINDOW, spec=SPEC)
    with rasterio.MemoryFile(body) as memory, memory.open() as tile:
        assert np.array_equal(tile.read(), local_window(scene))
    assert sent and all(method == "GET" for method, _ in sent), sent
    assert {condition for _, condition in sent} == {etag if etag.startswith('"') else f'"{etag}"'}, sent
    assert source.requests == len(sent)


def test_an_empty_upload_has_its_size_from_a_pinned_head(container):
    etag = container.upload_blob("empty.tif", b"").get_blob_properties().etag
    source = PinnedBlob(container.get_blob_client("empty.tif"), etag)
    assert source.file_size == 0
    with pytest.raises(InvalidRasterError):
        inspect_source(source, settings=SETTINGS, spec=SPEC)
    container.upload_blob("empty.tif", b"", overwrite=True)
    with pytest.raises(SourceChangedError, match="overwritten"):
        _ = PinnedBlob(container.get_blob_client("empty.tif"), etag).file_size


def test_a_recorded_read_failure_fails_the_call_even_when_gdal_returned_pixels(scene):
    """The contract itself, with a test double of the one fault that cannot be caused on demand:
    GDAL accepting a short read and returning pixels (seen with its own /vsiaz/ reader during an
    outage, under load). A range the reader could not fetch is recorded; GDAL's next read of the
    window succeeds; the call still fails as a storage fault, and its pixels are never used."""

    class FailsOnce(LocalFile):
        failed = False

        def _get(self, offset: int, length: int) -> bytes:
            if offset > 0 and not self.failed:
                self.failed = True
                raise ConnectionResetError("connection reset by peer")
            return super()._get(offset, length)

    source = FailsOnce(scene)
    refused = pytest.raises(StorageFaultError, match="connection reset")
    with gdal_env(SETTINGS), open_upload(source) as src, refused, source.checked():
        with pytest.raises(OSError):
            source.fetch(10_000, 100)  # what a plugin read swallows: GDAL sees a short read
        pixels = src.read(window=WINDOW)
    np.testing.assert_array_equal(pixels, local_window(scene))  # GDAL's result was fine, and still refused


def damage_block(path: Path, bx: int, by: int) -> None:
    """Overwrite one compressed block with bytes that do not inflate."""
    with rasterio.open(path) as src:
        offset = int(src.get_tag_item(f"BLOCK_OFFSET_{bx}_{by}", "TIFF", bidx=1))
        size = int(src.get_tag_item(f"BLOCK_SIZE_{bx}_{by}", "TIFF", bidx=1))
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(b"\xff" * size)


@pytest.mark.parametrize("where", ["local", "blob"])
def test_bytes_that_arrived_and_do_not_decode_are_corrupt_input(tmp_path, container, where):
    path = Path(write_scene(str(tmp_path / "damaged.tif"), SceneSpec(512, 512, blocksize=256)))
    damage_block(path, 1, 0)
    if where == "blob":
        with path.open("rb") as data:
            etag = container.upload_blob("damaged.tif", data).get_blob_properties().etag
        source = PinnedBlob(container.get_blob_client("damaged.tif"), etag)
    else:
        source = LocalFile(str(path))
    with gdal_env(SETTINGS), open_upload(source) as src:
        with pytest.raises(InvalidRasterError) as caught:
            encode_tile(src, WINDOW, spec=SPEC)
        intact, _ = encode_tile(src, RioWindow(0, 0, 256, 256), spec=SPEC)
    assert not is_retryable(caught.value) and source.faults == []
    assert "col=256 row=0" in str(caught.value) and "corrupt" in str(caught.value)
    assert intact[:4] == b"II*\x00"


def test_ranges_wider_than_the_cache_are_not_fetched_ahead_to_be_pushed_out_again(tmp_path, monkeypatch):
    """A prefetch keeps what it fetched in a bounded cache. Ranges adding up to more than the cache
    (a warped window of a much coarser grid maps back to a wide source area) would push their own
    first spans out before GDAL read them, every byte fetched twice: they are left to GDAL's reads.
    The cache's bound is shrunk here so that a small file shows it."""
    from tilecommit.raster.reading import source as source_module

    monkeypatch.setattr(source_module, "MAX_CACHED_BYTES", 256 * 1024)
    path = tmp_path / "bytes.bin"
    path.write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    wide = LocalFile(str(path))
    wide.prefetch([(offset, 64 * 1024) for offset in range(0, 1024 * 1024, 128 * 1024)])  # 512 KiB
    assert wide.requests == 0
    narrow = LocalFile(str(path))
    narrow.prefetch([(offset, 64 * 1024) for offset in range(0, 256 * 1024, 128 * 1024)])  # 128 KiB
    fetched = narrow.requests
    assert fetched >= 1
    assert narrow.read_at(128 * 1024, 1000) == path.read_bytes()[128 * 1024 : 128 * 1024 + 1000]
    assert narrow.requests == fetched  # served by what was fetched ahead


# ------------------------------------------------------------------ a refusal is one answer, wherever it comes

#: Storage refusing the reader's GETs as Azure refuses an identity without read permission.
FORBIDDEN = {"busy": 1.0, "status": 403, "code": "AuthorizationPermissionMismatch", "retry_after": None}


def assert_refused_not_retried(error: StorageFaultError) -> None:
    assert error.status == 403 and not is_retryable(error), error
    assert "AuthorizationPermissionMismatch" in str(error) and "not retried" in str(error), error


@contextlib.contextmanager
def opened_then_forbidden(azurite, container, uploaded) -> Iterator[tuple]:
    """The upload opened through a proxy, then every GET refused as :data:`FORBIDDEN`:
    (the proxy, the pinned source, the opened dataset)."""
    plan = FaultPlan(applies=lambda method, path: method == "GET")
    with FaultProxy(f"http://127.0.0.1:{azurite.blob_port}", plan) as proxy:
        source = pinned_through(proxy, azurite, container, *uploaded)
        with gdal_env(SETTINGS), open_upload(source) as src:
            for option, value in FORBIDDEN.items():
                setattr(plan, option, value)
            yield proxy, source, src


def test_a_403_to_the_request_that_learns_the_size_is_a_storage_fault_not_retried(azurite, container, uploaded):
    plan = FaultPlan(**FORBIDDEN, applies=lambda method, path: method == "GET")
    with (
        FaultProxy(f"http://127.0.0.1:{azurite.blob_port}", plan) as proxy,
        pytest.raises(StorageFaultError) as caught,
    ):
        inspect_source(pinned_through(proxy, azurite, container, *uploaded), settings=SETTINGS, spec=SPEC)
    assert_refused_not_retried(caught.value)


def test_a_403_to_a_windows_prefetch_is_the_same_storage_fault_not_retried(azurite, container, uploaded):
    """Before, the same 403 answered to a window's reads was recorded as a fault without its status:
    retried, six attempts over 135 s, for an answer that cannot change."""
    with (
        opened_then_forbidden(azurite, container, uploaded) as (proxy, _, src),
        pytest.raises(StorageFaultError) as caught,
    ):
        encode_tile(src, WINDOW, spec=SPEC)  # its blocks fetched ahead first (source.prefetch)
    assert_refused_not_retried(caught.value)
    assert proxy.injected["busy"] >= 1


def test_a_403_to_gdals_own_block_read_is_the_same_storage_fault_not_retried(azurite, container, uploaded):
    """GDAL's block reads through the plugin, without a prefetch (Source.read_at)."""
    with (
        opened_then_forbidden(azurite, container, uploaded) as (_, source, src),
        pytest.raises(StorageFaultError) as caught,
        source.checked(),
    ):
        src.read(window=WINDOW)
    assert_refused_not_retried(caught.value)
    assert [fault.status for fault in source.faults] == [403] * len(source.faults) and source.faults
