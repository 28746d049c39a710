"""Server-side assembly: the service stages the mosaic from tile ranges (Put Block From URL).

Against Azurite 3.37, which implements Put Block From URL and enforces the source's If-Match.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import rasterio
from azure.core.credentials import AccessToken
from azure.storage.blob import ExponentialRetry

from testkit import storage_ops
from testkit.scenes import SceneSpec, read_scene, write_scene
from testkit.storage_proxy import CANNOT_VERIFY, FaultPlan, FaultProxy
from tilecommit import jobs
from tilecommit.errors import IncompleteManifestError, StorageFaultError, is_retryable
from tilecommit.grid import plan_windows
from tilecommit.manifest import get_manifest_entry
from tilecommit.raster import inspect_source, render_tile, tiff
from tilecommit.raster.assembly import attempt
from tilecommit.raster.assembly.copy_plan import MAX_COMMITTED_BLOCKS, CopyRange, LocalRun, plan_copy
from tilecommit.raster.assembly.pyramid import TileHead, TileHeads, plan_tile_levels
from tilecommit.raster.assembly.server_copy import (
    BearerCopySource,
    SasCopySource,
    ServerSideStager,
    copy_source_for,
)
from tilecommit.raster.tiling.encode import encode_tile
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec
from tilecommit.storage import StorageConnection

from .raster_jobs import JOB, assemble, assert_same_pixels, download, job_of, job_stores, render_all


def test_a_tile_changed_after_its_manifest_row_fails_the_assembly_naming_the_window(stores, storage, tmp_path):
    """The tile is overwritten with its own bytes (same size, new ETag): the size check passes, the
    service refuses the pinned copy, the error names the window, nothing is committed; once the
    window is rendered again (new tile, new row) the re-run succeeds pixel-exact."""
    spec = SceneSpec(700, 520, 3, "uint16", nodata=0)
    path = write_scene(str(tmp_path / "scene.tif"), spec)
    settings = Settings(window_size=256)
    scene = inspect_source(path, settings=settings, spec=OutputSpec.from_settings(settings))
    render_all(path, scene, settings, stores)
    changed = "0001_0002"
    row = get_manifest_entry(stores["manifest"], JOB, changed)
    assert row.etag  # recorded from the tile's commit
    tile = stores["tiles"].get_blob_client(row.uri)
    body = tile.download_blob().readall()
    tile.upload_blob(body, overwrite=True)
    assert tile.get_blob_properties().etag != row.etag

    with pytest.raises(IncompleteManifestError) as failure:
        assemble(scene, settings, stores, storage)
    assert f"window {changed}" in str(failure.value) and row.uri in str(failure.value)
    assert failure.value.mismatched == [changed]
    assert not stores["output"].get_blob_client(jobs.mosaic_blob_name(JOB)).exists()

    # Repair: the window's tile and row go, the window is rendered again, the job assembled again.
    tile.delete_blob()
    stores["manifest"].delete_entity(JOB, changed)
    window = next(w for w in plan_windows(scene.width, scene.height, settings.window_size) if w.id == changed)
    render_tile(job_of(settings), job_stores(stores, settings), path, window)
    result = assemble(scene, settings, stores, storage)
    assert (result.outcome, result.method) == ("written", "server")
    with rasterio.open(download(stores["output"], result.mosaic, tmp_path / "mosaic.tif")) as mosaic:
        assert_same_pixels(mosaic.read(), read_scene(spec))


def test_server_side_bytes_through_the_instance_are_the_head_and_coarse_levels(rendered, stores, storage):
    _, _, scene, settings, _ = rendered
    result = assemble(scene, settings, stores, storage)
    transfer = result.transfer
    assert result.method == "server"
    assert transfer["copied_by_service"] + transfer["sent_from_instance"] == result.nbytes
    assert transfer["copy_ranges"] > 0 and transfer["staged_blocks"] >= transfer["copy_ranges"] + 1


class FixedToken:
    """Stands in for the managed identity, which cannot be had outside Azure: a fixed token."""

    def __init__(self):
        self.asked = []

    def get_token(self, *scopes, **kwargs):
        self.asked.append(scopes)
        return AccessToken("identity-token-123", int(time.time()) + 3600)


def test_the_identity_paths_copy_request_carries_the_bearer_token_and_the_pinned_range(stores, storage):
    """OAuth copy-source authorisation: the tile's plain URL (no SAS), the identity's token in
    x-ms-copy-source-authorization, the range and the recorded ETag as x-ms-source-if-match.
    The request is captured as sent; Azurite then refuses a bearer token over plain HTTP, which
    this test does not depend on."""
    tile = stores["tiles"].get_blob_client("tiles/x/0000_0000.tif")
    tile.upload_blob(b"0123456789" * 100)
    etag = tile.get_blob_properties().etag
    sent = []
    output = storage.blob_service().get_container_client(stores["output"].container_name)
    blob = output.get_blob_client("mosaics/x/mosaic.tif")
    credential = FixedToken()
    stager = one_tile_stager(blob, stores["tiles"], tile, etag, BearerCopySource(credential))
    plan = SimpleNamespace(pieces=[CopyRange("0000_0000", 100, 250)])
    original = blob.stage_block_from_url

    def capture(*args, **kwargs):
        return original(*args, raw_request_hook=lambda request: sent.append(request.http_request), **kwargs)

    blob.stage_block_from_url = capture
    try:
        stager.stage(plan)
    except Exception:  # noqa: BLE001 - only the request's shape is asserted
        pass
    assert credential.asked == [("https://storage.azure.com/.default",)]
    (request,) = sent
    headers = {k.lower(): v for k, v in request.headers.items()}
    assert request.method == "PUT" and "comp=block" in request.url and "blockid=" in request.url
    assert headers["x-ms-copy-source"] == tile.url and "sig=" not in headers["x-ms-copy-source"]
    assert headers["x-ms-copy-source-authorization"] == "Bearer identity-token-123"
    assert headers["x-ms-source-range"] == "bytes=100-349"
    assert headers["x-ms-source-if-match"] == etag
    assert "authorization" in headers  # the request itself is authorised as the output client is


def test_the_copy_source_follows_the_tiles_credential(stores):
    local = copy_source_for(stores["tiles"])
    assert isinstance(local, SasCopySource)
    tile = stores["tiles"].get_blob_client("tiles/y/0000_0000.tif")
    url, auth = local.authorise(tile)
    assert url.startswith(tile.url + "?") and "sp=r" in url and "se=" in url and auth == {}
    identity = SimpleNamespace(credential=FixedToken())
    assert isinstance(copy_source_for(identity), BearerCopySource)


def _planned_40960(tmp_path, window_size: int) -> tuple[int, int]:
    """(staged blocks, copy ranges) for a 40960² x 3 uint16 scene, from one real encoded tile's
    directories repeated over every window (no pixel data of the scene is made)."""
    spec = SceneSpec(window_size, window_size, 3, "uint16", nodata=0)
    path = write_scene(str(tmp_path / f"tile{window_size}.tif"), spec)
    output_spec = OutputSpec(window_size=window_size)
    with rasterio.open(path) as src:
        body, _ = encode_tile(src, plan_windows(window_size, window_size, window_size)[0], spec=output_spec)
    layout = tiff.read_layout(body, None)
    windows = plan_windows(40960, 40960, window_size)
    heads = [TileHead(w, w.id, layout) for w in windows]
    directories = plan_tile_levels(None, TileHeads.of(heads), output_spec)
    # The coarse levels are computed locally; counted here at their uncompressed size (a bound).
    width, height, bytes_per_block = directories[-1].width, directories[-1].height, 256 * 256 * 3 * 2
    while width > 256 or height > 256:
        width, height = width // 2, height // 2
        blocks = [tiff.BlockRef("coarse", 0, bytes_per_block)] * (-(-width // 256) * -(-height // 256))
        directories.append(
            tiff.OutputDirectory(tags=dict(directories[-1].tags), blocks=blocks, width=width, height=height)
        )
    writer = tiff.TiffWriter(
        layout.byte_order, ghost=layout.ghost, leaders=layout.block_leaders, trailers=layout.block_trailers
    )
    head, order, total = writer.block_order(directories)
    plan = plan_copy(head, order, total, leaders=writer.leaders, trailers=writer.trailers)
    assert sum(p.nbytes for p in plan.pieces if isinstance(p, LocalRun)) + plan.copied_bytes == total
    return plan.staged_blocks(), sum(isinstance(p, CopyRange) for p in plan.pieces)


@pytest.mark.parametrize("window_size", [256, 1024])
def test_block_grouping_for_the_largest_scene_stays_under_the_blob_limits(tmp_path, window_size):
    blocks, ranges = _planned_40960(tmp_path, window_size)
    print(f"\n40960² at {window_size}-px windows: {blocks} staged blocks, {ranges} copy ranges")
    # One range per tile block row and level: 40960²/(256 W) at full resolution, halving per level.
    tiles_across = 40960 // window_size
    full_resolution_ranges = tiles_across**2 * (window_size // 256)
    assert full_resolution_ranges <= ranges < 2 * full_resolution_ranges
    assert blocks <= MAX_COMMITTED_BLOCKS


def copy_one_range(output, tiles, tile, etag: str | None) -> list[str]:
    """Stage one range of ``tile`` into the mosaic through ``output``'s client (SAS copy source)."""
    stager = one_tile_stager(output.get_blob_client("mosaics/x/mosaic.tif"), tiles, tile, etag, copy_source_for(tiles))
    return stager.stage_ranges([CopyRange("0000_0000", 0, 500)])


def one_tile_stager(blob, tiles, tile, etag: str | None, copy_source) -> ServerSideStager:
    """A stager into ``blob`` whose one source, window 0000_0000, is ``tile`` at ``etag``."""
    return ServerSideStager(
        blob,
        tiles,
        uris={"0000_0000": tile.blob_name},
        etags={"0000_0000": etag},
        copy_source=copy_source,
        read_local=lambda ref: b"",
        leaders=False,
        trailers=False,
        range_tag=attempt.new_attempt_tag(),
    )


@pytest.mark.parametrize("refusals", [2, 10])
def test_a_copy_source_the_service_could_not_verify_in_time_is_a_storage_fault_not_a_changed_tile(
    stores, azurite, refusals
):
    """Azure answers 500 CannotVerifyCopySource when it could not read the copy source in time (a
    throttled source account, as when many shares copy at once). The tile is intact: a retry
    within the call succeeds (2 refusals, the SDK retries 3 times), and when the refusals outlast
    the SDK's retries (10) the error is a retryable storage fault, never the non-retryable "tile
    changed, render it again" of a 412 or a missing tile."""
    tile = stores["tiles"].get_blob_client("tiles/x/0000_0000.tif")
    tile.upload_blob(b"0123456789" * 100)
    etag = tile.get_blob_properties().etag
    plan = FaultPlan(
        every=1, limit=refusals, answers=(CANNOT_VERIFY,), operations=frozenset({storage_ops.PUT_BLOCK_FROM_URL})
    )
    with FaultProxy(f"http://127.0.0.1:{azurite.blob_port}", plan) as proxy:
        connection = StorageConnection.from_connection_string(
            azurite.connection_string.replace(f":{azurite.blob_port}/", f":{proxy.port}/")
        )
        # Both through the proxy: Azurite reads a copy source named on the host it was asked on.
        service = connection.blob_service(retry_policy=ExponentialRetry(initial_backoff=0, increment_base=0))
        output = service.get_container_client(stores["output"].container_name)
        tiles = service.get_container_client(stores["tiles"].container_name)
        if refusals == 2:
            assert len(copy_one_range(output, tiles, tile, etag)) == 1
        else:
            with pytest.raises(StorageFaultError) as raised:
                copy_one_range(output, tiles, tile, etag)
            assert not isinstance(raised.value, IncompleteManifestError)
            assert is_retryable(raised.value) and raised.value.status == 500
            assert "CannotVerifyCopySource" in str(raised.value) and tile.blob_name in str(raised.value)
    assert proxy.injected[CANNOT_VERIFY] == min(refusals, 4)


def test_a_copy_source_gone_or_changed_is_a_manifest_error_naming_the_window(stores):
    tile = stores["tiles"].get_blob_client("tiles/x/0000_0000.tif")
    tile.upload_blob(b"0123456789" * 100)
    etag = tile.get_blob_properties().etag
    tile.upload_blob(b"other bytes" * 100, overwrite=True)
    with pytest.raises(IncompleteManifestError, match="0000_0000.*changed") as changed:
        copy_one_range(stores["output"], stores["tiles"], tile, etag)
    tile.delete_blob()
    with pytest.raises(IncompleteManifestError, match="0000_0000.*gone") as gone:
        copy_one_range(stores["output"], stores["tiles"], tile, None)  # unpinned: only the 404 can answer
    assert not is_retryable(changed.value) and not is_retryable(gone.value)
