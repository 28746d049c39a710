"""The budgets an upload can exceed (tilecommit/raster/reading/budgets.py), each checked from the
header before a block is read and refused once as bad input, with the numbers: a window's read
(the blocks it decodes, a warped window's source area), the tags every tile carries, and the
assembly's temporary disk. Real files written here; jobs on Azurite through the local host."""

from __future__ import annotations

import json
import os
import re
import signal
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import rasterio
from rasterio.transform import from_origin
from rasterio.windows import Window

from devhost.session import job_summary, process_file
from testkit.scenes import SceneSpec, write_scene
from tilecommit.errors import UnsupportedRasterError
from tilecommit.grid import plan_windows
from tilecommit.manifest import count_manifest
from tilecommit.raster import inspect_source, tiff
from tilecommit.raster.assembly import block_copy, vrt_strategy
from tilecommit.raster.assembly.block_sources import TILE_HEAD_BYTES, BlockFetcher, FileRangeSource
from tilecommit.raster.assembly.pyramid import (
    TileHead,
    TileHeads,
    check_temporary_disk,
    coarse_copy_bytes,
    plan_tile_levels,
)
from tilecommit.raster.reading import budgets
from tilecommit.raster.reading.scene import SceneInfo
from tilecommit.raster.tiling.encode import encode_tile
from tilecommit.raster.tiling.render import window_of_upload
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec

from .app_jobs import ROOT, local_host, serve, upload, wait_for_state

SETTINGS = Settings()
NORTH_UP = from_origin(500000, 4600000, 10, 10)


def striped(path: Path, *, width: int, height: int, count: int, rows: int) -> str:
    """A pixel-interleaved DEFLATE GeoTIFF of uint16 zeros in strips of ``rows`` rows (the full width)."""
    profile = dict(
        driver="GTiff", width=width, height=height, count=count, dtype="uint16", crs="EPSG:32633",
        transform=NORTH_UP, tiled=False, blockysize=rows, compress="deflate", interleave="pixel",
    )  # fmt: skip
    with rasterio.open(path, "w", **profile) as dst:
        for row in range(0, height, rows):
            part = min(rows, height - row)
            dst.write(np.zeros((count, part, width), "uint16"), window=Window(0, row, width, part))
    return str(path)


def undecodable(path: str) -> str:
    """``path`` with every block's stored bytes overwritten (offsets and counts kept): any pixel
    read now fails, so a refusal other than "corrupt" shows that no block was decoded."""
    with rasterio.open(path) as src:
        block_h, block_w = src.block_shapes[0]
        extents = [
            (int(src.get_tag_item(f"BLOCK_OFFSET_{bx}_{by}", "TIFF", bidx=1)),
             int(src.get_tag_item(f"BLOCK_SIZE_{bx}_{by}", "TIFF", bidx=1)))
            for by in range(-(-src.height // block_h))
            for bx in range(-(-src.width // block_w))
        ]  # fmt: skip
    with open(path, "r+b") as f:
        for offset, size in extents:
            f.seek(offset)
            f.write(b"\xff" * size)
    with rasterio.open(path) as src, pytest.raises(rasterio.errors.RasterioIOError):
        src.read(1, window=Window(0, 0, 1, 1))
    return path


def sparse(path: Path, *, width: int, height: int, count: int, dtype: str = "uint16", block: int = 512) -> str:
    """A tiled GeoTIFF whose blocks were never written (GDAL reads them as zeros): a header only."""
    profile = dict(
        driver="GTiff", width=width, height=height, count=count, dtype=dtype, crs="EPSG:32633", transform=NORTH_UP,
        tiled=True, blockxsize=block, blockysize=block, compress="deflate", sparse_ok=True,
    )  # fmt: skip
    with rasterio.open(path, "w", **profile):
        pass
    return str(path)


def test_the_budgets_derive_from_the_instance_memory_and_host_jsons_activity_slots():
    host = json.loads((ROOT / "host.json").read_text())
    assert host["extensions"]["durableTask"]["maxConcurrentActivityFunctions"] == budgets.ACTIVITY_SLOTS
    assert budgets.ACTIVITY_MEMORY_BYTES == (1536 - 90 - 290) * 2**20 // 4 == 289 * 2**20
    # The window budget of before, now derived: 6 x 48 MiB fits one activity's 289 MiB.
    assert budgets.MAX_WINDOW_BYTES == 48 * 2**20
    assert budgets.MAX_BLOCK_BYTES == budgets.ACTIVITY_MEMORY_BYTES
    assert vrt_strategy.TEMP_BUDGET_BYTES == budgets.TEMPORARY_DISK_BYTES


def test_huge_strips_are_refused_from_the_header_with_the_numbers_and_the_strips_that_fit(tmp_path):
    """Strips of 1024 rows of a 65,536-pixel width hold 256 MiB decoded (under the old 256 MiB
    block limit, so accepted before): any window decodes one whole, 384 MiB held with the band
    GDAL copies out (387 MiB measured). The strips cannot be decoded: the refusal comes first."""
    path = undecodable(striped(tmp_path / "strips.tif", width=65536, height=2049, count=2, rows=1024))
    with pytest.raises(UnsupportedRasterError) as caught:
        inspect_source(path, settings=SETTINGS, spec=OutputSpec())
    message = str(caught.value)
    assert message.startswith(path), message
    assert "strips of 1024 rows (65536 x 1024 pixels) x 2 samples of uint16: 268435456 bytes (256.0 MiB)" in message
    assert "reading one 1024 x 1024 window holds about" in message, message
    assert f"more than the {budgets.ACTIVITY_MEMORY_BYTES} bytes (289.0 MiB) one activity may hold" in message
    assert budgets.RETILE in message, message
    rows = int(re.search(r"strips of at most (\d+) rows at this width", message).group(1))
    assert 0 < rows < 1024
    # What the message accepts is accepted: strips of that many rows, and one-row strips (a
    # window touches 1024 of them, decoded one at a time).
    for fits in (rows, 1):
        smaller = striped(tmp_path / f"strips-{fits}.tif", width=65536, height=2049, count=2, rows=fits)
        assert inspect_source(smaller, settings=SETTINGS, spec=OutputSpec()).width == 65536


def test_huge_tiles_are_refused_and_tiles_past_an_activitys_memory_before_they_are_listed(tmp_path):
    # 4096² tiles of 8 uint16 bands: 256 MiB decoded, 32 MiB for the band copied out, a 16 MiB window.
    tiles = sparse(tmp_path / "tiles.tif", width=4096, height=4096, count=8, block=4096)
    with pytest.raises(UnsupportedRasterError, match=r"tiles of 4096 x 4096 pixels x 8 samples of uint16: 268435456"):
        inspect_source(tiles, settings=SETTINGS, spec=OutputSpec())
    # 8192² tiles of 3 uint16 bands: 384 MiB decoded, more than an activity has at all.
    giant = sparse(tmp_path / "giant.tif", width=8192, height=8192, count=3, block=8192)
    with pytest.raises(UnsupportedRasterError) as caught:
        inspect_source(giant, settings=SETTINGS, spec=OutputSpec())
    assert f"blocks of at most {budgets.MAX_BLOCK_BYTES} bytes (289 MiB, what one activity may hold)" in str(
        caught.value
    )


def test_a_coarse_resolution_is_refused_with_the_resolution_that_fits(tmp_path):
    """At 640 m an 8192² source at 10 m is a 129² grid: its one 256² block maps to the whole
    source, 384 MiB decoded, which GDAL's warper reads at once (386 MiB measured)."""
    source = sparse(tmp_path / "source.tif", width=8192, height=8192, count=3)

    def spec(resolution: float) -> OutputSpec:
        return OutputSpec(profile_options=(("resolution", resolution), ("warp_resampling", "average")))

    with pytest.raises(UnsupportedRasterError) as caught:
        inspect_source(source, settings=SETTINGS, spec=spec(640))
    message = str(caught.value)
    assert "grid of 640-unit pixels (129 x 129 pixels)" in message, message
    assert "maps to 8192 x 8192 = 67108864 source pixels, 402653184 bytes (384.0 MiB) decoded" in message
    assert f"more than the {budgets.ACTIVITY_MEMORY_BYTES} bytes" in message
    finer = float(re.search(r"resolution=([0-9.]+) or less", message).group(1))
    assert 40 < finer < 640
    assert inspect_source(source, settings=SETTINGS, spec=spec(finer)).width == pytest.approx(8192 * 10 / finer, abs=2)
    assert inspect_source(source, settings=SETTINGS, spec=spec(40)).width == 2048


TEN_MB = 10_000_000


@pytest.mark.parametrize(
    "where, label, size",
    [
        # A tag counts its name and value; a description its value.
        ("description", "TIFFTAG_IMAGEDESCRIPTION", 24 + TEN_MB),
        ("gdal-metadata", "PROVENANCE", 10 + TEN_MB),
        ("band-description", "band 2 description", TEN_MB),
    ],
)
def test_tags_too_large_to_carry_into_every_tile_are_refused_naming_the_largest(where, label, size, tmp_path):
    path = str(tmp_path / f"{where}.tif")
    with rasterio.open(
        path, "w", driver="GTiff", width=300, height=200, count=3, dtype="uint8", crs="EPSG:32633", transform=NORTH_UP
    ) as dst:
        dst.write(np.ones((3, 200, 300), "uint8"))
        dst.update_tags(SENSOR="a small tag")
        if where == "description":
            dst.update_tags(TIFFTAG_IMAGEDESCRIPTION="d" * TEN_MB)
        elif where == "gdal-metadata":
            dst.update_tags(PROVENANCE="p" * TEN_MB)
        else:
            dst.set_band_description(2, "b" * TEN_MB)
    with pytest.raises(UnsupportedRasterError) as caught:
        inspect_source(path, settings=SETTINGS, spec=OutputSpec())
    message = str(caught.value)
    assert f"more than the {budgets.MAX_CARRIED_METADATA_BYTES} bytes (64 KiB)" in message, message[:600]
    assert f"the largest: {label} ({size} bytes), SENSOR (17 bytes)" in message, message[:600]
    assert len(message) < 2000  # the tag is named, never repeated


def scene_info(width: int, height: int, count: int = 3, dtype: str = "uint16", mask: str = "none") -> SceneInfo:
    return SceneInfo(
        width=width, height=height, count=count, dtype=dtype, crs="EPSG:32633",
        transform=list(NORTH_UP)[:6], nodata=None, block_shapes=[[512, 512]], mask=mask,
    )  # fmt: skip


def test_the_default_largest_scene_is_refused_for_its_coarse_copy_with_the_window_that_fits():
    """40960² x 3 uint16 (the default TILECOMMIT_MAX_PIXELS): with 1024-pixel windows the copy is
    of the tiles' level 2, 10240², and GDAL builds 6 levels into it: up to 1 GB, 720 MB measured
    scaled (45.0 MB at 10240²). With 2048-pixel windows the tiles carry level 3 and it fits."""
    largest = scene_info(40960, 40960)
    with pytest.raises(UnsupportedRasterError) as caught:
        check_temporary_disk("big.tif", largest, OutputSpec())
    message = str(caught.value)
    assert "a copy of the tiles' last level (10240 x 10240 pixels), up to 1048473600 bytes" in message, message
    assert f"more than the {budgets.TEMPORARY_DISK_BYTES} bytes" in message
    assert "a larger window (TILECOMMIT_WINDOW_SIZE=2048)" in message
    check_temporary_disk("big.tif", largest, OutputSpec(window_size=2048))
    check_temporary_disk("10240.tif", scene_info(10240, 10240), OutputSpec())


def test_the_coarse_copy_estimate_bounds_what_an_assembly_writes(tmp_path):
    """The levels the block-copy assemblies compute, from real tiles: the file on disk is at most
    the estimate validation uses (measured 45.0 MB against 65.4 estimated at 10240²)."""
    spec = OutputSpec(window_size=1024)
    scene_path = write_scene(str(tmp_path / "scene.tif"), SceneSpec(3072, 2560, nodata=0))
    scene = inspect_source(scene_path, settings=SETTINGS, spec=spec)
    windows = plan_windows(scene.width, scene.height, spec.window_size)
    sources, heads = {}, []
    for window in windows:
        with window_of_upload(scene_path, window, settings=SETTINGS, purpose="render", spec=spec) as src:
            body, _ = encode_tile(src, window, spec=spec)
        (tmp_path / f"{window.id}.tif").write_bytes(body)
        sources[window.id] = FileRangeSource(str(tmp_path / f"{window.id}.tif"))
        heads.append(TileHead(window, window.id, tiff.read_layout(body[:TILE_HEAD_BYTES], sources[window.id].read)))
    directories = plan_tile_levels(scene, TileHeads.of(heads), spec)
    workdir = tempfile.mkdtemp(dir=tmp_path)
    with ThreadPoolExecutor(4) as executor:
        nodata = heads[0].layout.directories[0].tags.get(tiff.GDAL_NODATA)
        coarse, copy = block_copy.build_coarse_levels(
            scene, directories[-1], nodata, heads[0].layout.byte_order, len(directories) - 1,
            BlockFetcher(sources, executor, spec.block_size), workdir, SETTINGS, spec,
        )  # fmt: skip
    copy.close()
    used = sum(os.path.getsize(os.path.join(workdir, name)) for name in os.listdir(workdir))
    estimate, level = coarse_copy_bytes(scene, spec)
    assert level == (directories[-1].width, directories[-1].height) == (768, 640)
    assert len(coarse) == 2
    assert 0 < used <= estimate


@pytest.mark.slow
def test_huge_strips_fail_their_job_at_validation_instead_of_recycling_the_instance(storage, app_env, tmp_path):
    """Under the Consumption plan's 1536 MB (``serve``'s default instance memory): before these
    budgets the four activities each decoded a 256 MiB strip at once (387 MiB held each) and the
    host was killed as an instance is recycled, again on every restart. Now the job fails at
    validation, once, with the numbers, and the host lives on."""
    path = Path(striped(tmp_path / "strips.tif", width=65536, height=2049, count=2, rows=1024))
    log = tmp_path / "serve.log"
    host = serve(app_env, log)
    try:
        job_id = upload(storage, app_env, path)
        state = wait_for_state(
            storage, app_env, job_id, lambda s: host.poll() is not None or s["status"] in ("Completed", "Failed")
        )
        alive = host.poll() is None
    finally:
        if host.poll() is None:
            os.killpg(host.pid, signal.SIGTERM)
            host.wait(timeout=60)
    assert alive and b"over the limit" not in log.read_bytes(), log.read_text()[-3000:]
    summary = job_summary(state)
    error = summary["error"]
    assert summary["status"] == "failed" and "(UnsupportedRasterError)" in error, summary
    assert "strips of 1024 rows (65536 x 1024 pixels) x 2 samples of uint16" in error, error
    assert f"more than the {budgets.ACTIVITY_MEMORY_BYTES} bytes (289.0 MiB) one activity may hold" in error
    tiles = storage.blob_service().get_container_client(app_env.tiles)
    assert list(tiles.list_blobs(name_starts_with=f"tiles/{job_id}/")) == []
    assert count_manifest(storage.table_service().get_table_client(app_env.manifest), job_id).rows == 0


@pytest.mark.slow
def test_a_scene_over_the_temporary_disk_fails_its_job_at_validation(storage, app_env, tmp_path):
    """With the tests' 256-pixel windows the tiles carry no level, so the coarse copy is of the
    whole mosaic: a 10000² x 3 uint16 scene (a header: its blocks are sparse) needs up to 1 GB."""
    path = Path(sparse(tmp_path / "wide.tif", width=10000, height=10000, count=3))
    with local_host(app_env) as host:
        summary = process_file(host, path, timeout=120)
        ran = [e.name for e in host.engine.executions]
    error = summary["error"]
    assert summary["status"] == "failed" and "(UnsupportedRasterError)" in error, summary
    assert "a copy of the tiles' last level (10000 x 10000 pixels)" in error, error
    assert f"more than the {budgets.TEMPORARY_DISK_BYTES} bytes" in error, error
    assert "render_tile" not in ran, ran
