"""JPEG 2000 (JP2) uploads: the same promises as a GeoTIFF's.

Every file is made by GDAL in the test (tests/hostile_jp2.py). A JP2 goes through the library as a
job calls it (inspect, render every window, assemble) against Azurite, and its mosaic must equal
``gdal_translate -of COG`` of the same file (lossless: Debian's gdal-bin, another GDAL and
OpenJPEG, decodes the same pixels), or, lossy, the COG rasterio's own GDAL makes, pixel for pixel,
with the metadata gdal_translate's COG has (rio-cogeo 7.0.4 refuses GeoJP2 files: docs/uploads.md).
Hostile files: boxes that name a URL or a local file (0 requests to the trap, 0 opens of the file),
sidecars, headers declaring what the file does not hold: each refused before any tile, with the
numbers. Damaged files, whole jobs on the local host and seeded read faults run at the end (slow).
"""

from __future__ import annotations

import json
import struct
import subprocess
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import rasterio
from rasterio.crs import CRS
from rasterio.enums import ColorInterp
from rio_cogeo.cogeo import cog_validate

from testkit.storage_proxy import RecordingProxy, TrapServer
from tilecommit.errors import BadInputError, InvalidRasterError, UnsupportedRasterError
from tilecommit.raster import inspect_source
from tilecommit.raster.assembly.pyramid import mosaic_overview_levels
from tilecommit.raster.reading.jpeg2000 import NEXT_PART_PEEK
from tilecommit.raster.reading.metadata import said
from tilecommit.raster.reading.scene import same_crs
from tilecommit.raster.reading.source import READ_AHEAD, LocalFile, PinnedBlob
from tilecommit.raster.reading.upload import JP2_SIGNATURE
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec
from tilecommit.storage import StorageConnection

from .app_jobs import download as download_blob
from .app_jobs import local_host
from .hostile_jp2 import CRS as FILE_CRS
from .hostile_jp2 import (
    LocalFileTrap,
    box,
    crs_dictionary,
    gml_boxes,
    gml_coverage,
    pixels,
    sentinel2_like,
    single_tiled,
    with_boxes,
    with_cod,
    with_siz,
    write_jp2,
)
from .raster_jobs import (
    assemble,
    assert_complete_pyramid,
    blob_names,
    download,
    job_of,
    job_stores,
    manifest_rows,
    render_all,
    run_steps,
)
from .test_real_rasters import check_band_fields

SETTINGS = Settings(window_size=512)


def spec_of(settings: Settings = SETTINGS) -> OutputSpec:
    return OutputSpec.from_settings(settings)


def run_library_job(path: Path, settings: Settings, stores, storage):
    scene = inspect_source(str(path), settings=settings, spec=spec_of(settings))
    results = render_all(str(path), scene, settings, stores)
    assert {r.outcome for r in results} == {"written"}
    return scene, assemble(scene, settings, stores, storage, source_name=path.name)


def gdal_translate_cog(source: Path, target: Path) -> Path:
    """The reference: Debian's ``gdal_translate -of COG`` (DEFLATE, as the app's default profile)."""
    subprocess.run(
        ["gdal_translate", "-q", "-of", "COG", "-co", "COMPRESS=DEFLATE", str(source), str(target)],
        check=True,
        capture_output=True,
    )
    return target


def assert_same_mosaic(mosaic: Path, reference: Path) -> None:
    with rasterio.open(mosaic) as m, rasterio.open(reference) as r:
        assert (m.width, m.height, m.count, m.dtypes) == (r.width, r.height, r.count, r.dtypes)
        assert m.transform == r.transform and same_crs(m.crs, r.crs)
        assert m.nodata == r.nodata
        assert np.array_equal(m.read(), r.read())
        assert np.array_equal(m.read_masks(), r.read_masks())


# --------------------------------------------------------------------------- pixel-exact mosaics


def test_a_sentinel2_like_jp2_becomes_the_mosaic_gdal_translate_makes(stores, storage, tmp_path):
    """2048² uint16 in lossless 1024² tiles with TLM markers (a Sentinel-2 band is 10980²: bench/formats_jp2.py)."""
    source = sentinel2_like(tmp_path / "T33UUP_B04.jp2")
    scene, result = run_library_job(source, Settings(window_size=1024), stores, storage)
    assert scene.driver == "JP2OpenJPEG" and scene.block_shapes == [[1024, 1024]] and same_crs(scene.crs, FILE_CRS)
    assert result.outcome == "written"
    mosaic = Path(download(stores["output"], result.mosaic, tmp_path / "mosaic.tif"))
    assert cog_validate(str(mosaic), quiet=True)[0]
    reference = gdal_translate_cog(source, tmp_path / "reference.tif")
    assert_same_mosaic(mosaic, reference)
    # What the source says of its pixels (tags, descriptions, scales, offsets, units, colour
    # interpretation) is what gdal_translate's COG says (rio-cogeo 7.0.4 refuses a GeoJP2 file:
    # docs/uploads.md), AREA_OR_POINT=Area among it, which a GeoTIFF always states.
    with rasterio.open(mosaic) as m, rasterio.open(reference) as r:
        assert said(m) == said(r) and said(m)["tags"] == {"AREA_OR_POINT": "Area"}
        assert len(m.overviews(1)) == result.overview_levels == mosaic_overview_levels(m.width, m.height)
        # Where we differ: gdal_translate packs the 15-bit samples (NBITS=15); the tiles hold them in
        # 16 bits, as rio-cogeo writes them (its profile names no NBITS). The values are the same.
        assert r.tags(1, ns="IMAGE_STRUCTURE").get("NBITS") == "15"
        assert "NBITS" not in m.tags(1, ns="IMAGE_STRUCTURE")
    assert_complete_pyramid(str(mosaic))


def test_an_rgb_jp2_keeps_its_bands_named_in_the_item(stores, storage, tmp_path):
    """Colour from the JP2's colr box, tags from GDAL's metadata box: kept as gdal_translate keeps them."""
    source = write_jp2(
        tmp_path / "rgb.jp2",
        pixels(700, 600, count=3, dtype="uint8", seed=4),
        tile=256,
        colorinterp=[ColorInterp.red, ColorInterp.green, ColorInterp.blue],
        tags={"SPACECRAFT": "stand-in", "PROCESSING_LEVEL": "L2A"},
    )
    _, result = run_library_job(source, SETTINGS, stores, storage)
    mosaic = Path(download(stores["output"], result.mosaic, tmp_path / "mosaic.tif"))
    reference = gdal_translate_cog(source, tmp_path / "reference.tif")
    assert_same_mosaic(mosaic, reference)
    with rasterio.open(mosaic) as m, rasterio.open(reference) as r:
        assert said(m) == said(r) and m.tags()["PROCESSING_LEVEL"] == "L2A"
    item = json.loads(stores["output"].download_blob(result.stac).readall())
    check_band_fields(item, str(source))
    assert [b["common_name"] for b in item["assets"]["data"]["eo:bands"]] == ["red", "green", "blue"]


def test_a_jp2_of_one_tile_is_decoded_by_areas_and_becomes_gdal_translates_mosaic(stores, storage, tmp_path):
    """One 1300 x 1100 tile: GDAL decodes it by blocks of 1024 (a decode area each), which is what
    a window's read is counted by (scene._jpeg2000_blocks)."""
    source = single_tiled(tmp_path / "one-tile.jp2", pixels(1300, 1100, seed=7))
    scene, result = run_library_job(source, Settings(window_size=1024), stores, storage)
    assert scene.block_shapes == [[1024, 1024]]
    mosaic = Path(download(stores["output"], result.mosaic, tmp_path / "mosaic.tif"))
    assert_same_mosaic(mosaic, gdal_translate_cog(source, tmp_path / "reference.tif"))


def test_a_lossy_jp2_becomes_the_mosaic_rasterios_own_gdal_makes(stores, storage, tmp_path):
    """The 9/7 wavelet's decode is deterministic for one OpenJPEG: the reference is made by the GDAL
    the app runs (rasterio's), Debian's may link another OpenJPEG."""
    source = write_jp2(tmp_path / "lossy.jp2", pixels(900, 700, seed=5), tile=512, lossless=False)
    _, result = run_library_job(source, SETTINGS, stores, storage)
    mosaic = Path(download(stores["output"], result.mosaic, tmp_path / "mosaic.tif"))
    reference = tmp_path / "reference.tif"
    with rasterio.Env(GDAL_PAM_ENABLED="NO"):
        rasterio.shutil.copy(str(source), str(reference), driver="COG", COMPRESS="DEFLATE")
    assert_same_mosaic(mosaic, reference)


def test_a_jp2_georeferenced_by_its_gmljp2_box_alone_is_placed_by_it(tmp_path):
    source = write_jp2(tmp_path / "gml.jp2", pixels(300, 200), GeoJP2="NO", GMLJP2="YES")
    scene = inspect_source(str(source), settings=SETTINGS, spec=spec_of())
    assert same_crs(scene.crs, FILE_CRS) and scene.transform == [10.0, 0.0, 300000.0, 0.0, -10.0, 5000040.0]


def test_a_web_optimized_jp2_job_is_the_exact_warp_of_the_jp2(stores, storage, tmp_path):
    """A warped job reads the JP2 through the warper's own open of it (its format's open options,
    tilecommit/raster/reading/warp.py): the mosaic is the exact warp of the source, as a GeoTIFF's."""
    from .test_web_optimized import differing, whole_warp

    source = write_jp2(tmp_path / "band.jp2", pixels(600, 520, seed=6), tile=256)
    settings = Settings(window_size=512, profile="default,web_optimized=true")
    spec, scene, result = run_steps(str(source), settings, stores, storage)
    assert result.outcome == "written" and same_crs(scene.crs, "EPSG:3857")
    mosaic = Path(download(stores["output"], result.mosaic, tmp_path / "mosaic.tif"))
    with rasterio.open(mosaic) as m:
        assert differing(m.read(), whole_warp(str(source), "nearest")[0]) == 0


# --------------------------------------------------------------------------- names inside the file


@pytest.fixture
def trap():
    with TrapServer() as server:
        yield server


def named_url_boxes(trap_url: str, width: int, height: int) -> bytes:
    """A GMLJP2 box whose CRS, feature collection and schema are the trap's URLs, and an XML box
    holding a VRT that names the trap."""
    gml = gml_coverage(
        width, height, f"{trap_url}/def/crs/EPSG/0/4326", feature=f"{trap_url}/features.gml", schema=f"{trap_url}/a.xsd"
    )
    vrt = f"<VRTDataset><SourceFilename>/vsicurl/{trap_url}/vrt.tif</SourceFilename></VRTDataset>"
    return gml_boxes(gml) + box(b"xml ", vrt.encode())


def test_gmljp2_and_xml_boxes_naming_a_url_are_never_asked(tmp_path, trap):
    bare = write_jp2(tmp_path / "bare.jp2", pixels(300, 200), georeferenced=False)
    named = with_boxes(bare, tmp_path / "named.jp2", named_url_boxes(trap.url, 300, 200))
    # The control: GDAL asked for the file's vector layers with OPEN_REMOTE_GML=YES fetches the feature collection.
    subprocess.run(["ogrinfo", "-ro", "-oo", "OPEN_REMOTE_GML=YES", str(named)], capture_output=True, timeout=60)
    assert ("HEAD", "/features.gml") in trap.requests or ("GET", "/features.gml") in trap.requests, trap.requests
    del trap.requests[:]
    started = time.perf_counter()
    with pytest.raises(UnsupportedRasterError, match="has no georeferencing") as caught:
        inspect_source(str(named), settings=SETTINGS, spec=spec_of())
    assert time.perf_counter() - started < 2 and "accepted:" in str(caught.value)
    assert f"its GMLJP2 box names its CRS '{trap.url}/def/crs/EPSG/0/4326'" in str(caught.value)
    # With a GeoJP2 box of its own: accepted, placed by that box, the names never followed.
    own = write_jp2(tmp_path / "own.jp2", pixels(300, 200), GMLJP2="NO")
    scene = inspect_source(
        str(with_boxes(own, tmp_path / "own-named.jp2", named_url_boxes(trap.url, 300, 200))),
        settings=SETTINGS,
        spec=spec_of(),
    )
    assert same_crs(scene.crs, FILE_CRS)
    assert trap.requests == []


def test_gmljp2_and_xml_boxes_naming_a_local_file_never_open_it(tmp_path):
    dictionary = tmp_path / "crs-dictionary.xml"
    with LocalFileTrap(dictionary, crs_dictionary(4326).encode()) as local:
        with open(dictionary) as f:  # the control: the trap sees an open
            assert "EPSG:4326" in f.read()
        assert local.opens == 1
        own = write_jp2(tmp_path / "own.jp2", pixels(300, 200), GMLJP2="NO")
        bare = write_jp2(tmp_path / "bare.jp2", pixels(300, 200), georeferenced=False)
        extra = b"".join(
            [
                gml_boxes(gml_coverage(300, 200, f"file://{dictionary}#crs1")),
                gml_boxes(gml_coverage(300, 200, f"{dictionary}#crs1")),
                box(b"xml ", f"<VRTDataset><SourceFilename>{dictionary}</SourceFilename></VRTDataset>".encode()),
            ]
        )
        scene = inspect_source(str(with_boxes(own, tmp_path / "o.jp2", extra)), settings=SETTINGS, spec=spec_of())
        assert same_crs(scene.crs, FILE_CRS)  # the GeoJP2 box's own, not the dictionary's EPSG:4326
        with pytest.raises(UnsupportedRasterError, match="has no georeferencing"):
            inspect_source(str(with_boxes(bare, tmp_path / "b.jp2", extra)), settings=SETTINGS, spec=spec_of())
        # GDAL left alone does not open it either: the name is looked up among the file's own boxes
        # (GMLSRSLookup in GDAL's gcore/gdaljp2metadata.cpp); the trap would see a GDAL that did.
        with rasterio.open(tmp_path / "b.jp2") as left_alone:
            assert left_alone.crs is None
        assert local.opens == 1


def test_sidecars_beside_a_jp2_are_never_read(tmp_path):
    bare = write_jp2(tmp_path / "scene.jp2", pixels(300, 200), georeferenced=False)
    (tmp_path / "scene.jp2.aux.xml").write_text(
        "<PAMDataset><SRS>EPSG:4326</SRS><GeoTransform>10, 1, 0, 50, 0, -1</GeoTransform></PAMDataset>"
    )
    with LocalFileTrap(tmp_path / "scene.j2w", b"10\n0\n0\n-10\n500000\n4600000\n") as world:
        with rasterio.open(bare) as left_alone:  # the control: GDAL's defaults take the world file and the .aux.xml
            assert left_alone.crs == CRS.from_epsg(4326) and not left_alone.transform.is_identity
        assert world.opens >= 1
        opened = world.opens
        with pytest.raises(UnsupportedRasterError, match="has no georeferencing"):
            inspect_source(str(bare), settings=SETTINGS, spec=spec_of())
        assert world.opens == opened


def test_on_storage_only_the_jp2_itself_is_requested(tmp_path, new_container, azurite, trap):
    uploads = new_container("up-")
    own = write_jp2(tmp_path / "own.jp2", pixels(600, 500), tile=256, GMLJP2="NO")
    named = with_boxes(own, tmp_path / "scene.jp2", named_url_boxes(trap.url, 600, 500))
    for name, body in [
        ("scene.jp2", named.read_bytes()),
        ("scene.j2w", b"1\n0\n0\n-1\n0\n0\n"),
        ("scene.jp2.aux.xml", b"<PAMDataset><SRS>EPSG:4326</SRS></PAMDataset>"),
    ]:
        uploads.upload_blob("scenes/" + name, body)
    with RecordingProxy(azurite.blob_endpoint.rsplit("/", 1)[0]) as proxy:
        proxied = azurite.connection_string.replace(f":{azurite.blob_port}/", f":{proxy.port}/")
        connection = StorageConnection.from_connection_string(proxied)
        blob = connection.blob_service().get_blob_client(uploads.container_name, "scenes/scene.jp2")
        scene = inspect_source(
            PinnedBlob(blob, blob.get_blob_properties().etag),
            settings=SETTINGS,
            spec=spec_of(),
            gdal_options=connection.gdal_options(),
        )
        asked = proxy.paths()
    assert same_crs(scene.crs, FILE_CRS) and scene.width == 600
    assert asked and {p.split("?")[0].rsplit("/", 1)[1] for p in asked} == {"scene.jp2"}, asked
    assert trap.requests == []


# --------------------------------------------------------------------------- the header's budgets


def refused(path: Path, error: type[BadInputError], settings: Settings = SETTINGS) -> tuple[str, LocalFile, float]:
    """``path`` refused by the validation as ``error``: the message, the reader, the seconds taken."""
    source = LocalFile(path)
    started = time.perf_counter()
    with pytest.raises(error) as caught:
        inspect_source(source, settings=settings, spec=spec_of(settings))
    return str(caught.value), source, time.perf_counter() - started


def test_a_small_jp2_declaring_a_500000_square_image_is_refused_before_gdal_opens_it(tmp_path):
    small = write_jp2(tmp_path / "small.jp2", pixels(256, 256), tile=256)
    huge = with_siz(small, tmp_path / "huge.jp2", width=500000, height=500000, tile_width=500000, tile_height=500000)
    assert huge.stat().st_size < 60_000
    message, source, seconds = refused(huge, UnsupportedRasterError)
    assert "500000 x 500000 = 250000000000 pixels" in message and str(SETTINGS.max_pixels) in message
    assert seconds < 1 and source.requests == 1  # the first 64 KiB: header, boxes and main header


def test_tiles_too_large_to_decode_are_refused_with_the_numbers(tmp_path):
    small = write_jp2(tmp_path / "small.jp2", pixels(256, 256), tile=256)
    tall = with_siz(small, tmp_path / "tall.jp2", width=16384, height=16384, tile_width=16384, tile_height=8192)
    message, _, _ = refused(tall, UnsupportedRasterError)
    assert "tiles of 16384 x 8192 pixels x 1 components" in message, message
    assert f"{16384 * 8192 * 4} bytes" in message and "accepted: tiles of at most" in message


def test_tiles_too_many_for_openjpegs_structures_are_refused_with_the_numbers(tmp_path):
    """40960² in tiles of 200: OpenJPEG would keep 42025 tiles' structures from its reading of the
    header on (+406 MiB measured, jpeg2000.HEADER_BYTES_PER_TILE)."""
    small = write_jp2(tmp_path / "small.jp2", pixels(256, 256), tile=256)
    many = with_siz(small, tmp_path / "many.jp2", width=40960, height=40960, tile_width=200, tile_height=200)
    message, source, seconds = refused(many, UnsupportedRasterError)
    assert "stored in 42025 JPEG 2000 tiles of 200 x 200" in message and "fewer, larger tiles" in message, message
    assert seconds < 1 and source.requests == 1


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"levels": 40}, "declares 40 decomposition levels: JPEG 2000 allows at most 32"),
        ({"codeblock_exponents": (8, 8)}, "code-blocks of 1024 x 1024 samples"),
    ],
)
def test_a_coding_style_past_the_standard_is_refused_as_damaged(tmp_path, change, words):
    source = with_cod(write_jp2(tmp_path / "a.jp2", pixels(256, 256)), tmp_path / "b.jp2", **change)
    message, _, _ = refused(source, InvalidRasterError)
    assert words in message, message


def test_a_window_of_too_many_components_is_refused_from_the_header(tmp_path):
    many = write_jp2(tmp_path / "many.jp2", pixels(64, 64, count=60, dtype="uint8"), tile=64)
    wide = with_siz(many, tmp_path / "wide.jp2", width=4096, height=4096)
    settings = Settings(window_size=1024)
    message, _, _ = refused(wide, UnsupportedRasterError, settings)
    assert "has 60 bands of uint8: one 1024 x 1024 window of it needs 62914560 bytes" in message, message


def test_a_truncated_jp2_is_refused_before_any_tile(tmp_path, stores):
    whole = sentinel2_like(tmp_path / "whole.jp2", size=1024, tile=512)
    cut = tmp_path / "cut.jp2"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size * 2 // 3])
    message, _, _ = refused(cut, InvalidRasterError)
    assert "truncated" in message, message
    assert blob_names(stores["tiles"]) == [] and manifest_rows(stores["manifest"]) == []


def test_a_raw_codestream_is_refused_saying_it_cannot_hold_georeferencing(tmp_path):
    raw = write_jp2(tmp_path / "raw.j2k", pixels(128, 128), CODEC="J2K")
    assert raw.read_bytes()[:4] == b"\xff\x4f\xff\x51"
    message, _, _ = refused(raw, UnsupportedRasterError)
    assert "raw JPEG 2000 codestream" in message and "no box to hold georeferencing" in message


def synthetic_jp2(*markers: bytes, parts: int = 4) -> bytes:
    """A JP2 of 512² in four 256² tiles whose codestream is SOC, SIZ (one 16-bit component),
    ``markers``, then ``parts`` empty tile-parts, one per tile: written byte by byte."""
    siz = struct.pack(">HIIIIIIIIH3B", 0, 512, 512, 0, 0, 256, 256, 0, 0, 1, 15, 1, 1)
    stream = b"\xff\x4f" + marker(0xFF51, siz) + b"".join(markers)
    for index in range(parts):
        stream += b"\xff\x90" + struct.pack(">HHIBB", 10, index, 14, 0, 1) + b"\xff\x93"
    stream += b"\xff\xd9"
    return JP2_SIGNATURE + box(b"ftyp", b"jp2 \x00\x00\x00\x00jp2 ") + box(b"jp2c", stream)


def marker(code: int, body: bytes) -> bytes:
    return struct.pack(">HH", code, 2 + len(body)) + body


#: A COD: Scod, progression, 1 layer, no MCT; 5 levels, 64 x 64 code-blocks, 5/3 wavelet.
COD = marker(0xFF52, bytes([0, 0, 0, 1, 0, 5, 4, 4, 0, 1]))


@pytest.mark.parametrize(
    ("markers", "parts", "words"),
    [
        ((marker(0xFF52, b"\x00"),), 4, "damaged marker FF52 (1 bytes)"),
        ((COD, marker(0xFF53, bytes([0, 0, 40, 4, 4, 0, 1]))), 4, "declares 40 decomposition levels"),
        ((COD, marker(0xFF55, bytes([0, 0x40]) + struct.pack(">I", 10**9))), 4, "truncated: tile 0's data extends"),
        ((COD,), 1, "3 of its 4 tiles have no data"),
    ],
    ids=["short-cod", "coc-levels", "tlm-past-the-end", "tiles-missing"],
)
def test_a_header_written_byte_by_byte_is_refused_before_gdal_opens_it(tmp_path, markers, parts, words):
    """A marker too short for its fields, a component's own COC past the standard, a TLM naming
    bytes past the end, tiles without a tile-part: each found by the app's reading of the header."""
    path = tmp_path / "made.jp2"
    path.write_bytes(synthetic_jp2(*markers, parts=parts))
    message, _, _ = refused(path, InvalidRasterError)
    assert words in message, message


# --------------------------------------------------------------------------- reads per window


def fetched_per_window(source: Path, window_size: int, stores) -> tuple[int, int]:
    """Bytes the app's reader fetched to render every window of ``source`` (each window opened
    afresh, as an activity opens it), and the windows."""
    from tilecommit.grid import plan_windows
    from tilecommit.raster import render_tile

    settings = Settings(window_size=window_size)
    scene = inspect_source(str(source), settings=settings, spec=spec_of(settings))
    fetched = 0

    class Counted(LocalFile):
        def _get(self, offset: int, length: int) -> bytes:
            nonlocal fetched
            fetched += length
            return super()._get(offset, length)

    job, job_stores_ = job_of(settings), job_stores(stores, settings)
    windows = plan_windows(scene.width, scene.height, window_size)
    for window in windows:
        render_tile(job, job_stores_, Counted(source), window)
    return fetched, len(windows)


def test_windows_on_the_jp2_tiles_read_each_tile_once(tmp_path, stores, new_container, new_table):
    """Windows of the tiles' size read the file once, besides each window's read of the header (one
    read-ahead chunk) and of the next tile-part's marker; windows of half of it read each tile four
    times (OpenJPEG decodes a tile whole): the figures are in docs/uploads.md."""
    source = sentinel2_like(tmp_path / "s2.jp2", size=1024, tile=512)
    size = source.stat().st_size
    aligned, windows = fetched_per_window(source, 512, stores)
    print(f"\n{size} bytes: windows on the tiles fetched {aligned}", end="")
    assert windows == 4 and aligned <= size + windows * (READ_AHEAD + NEXT_PART_PEEK), (aligned, size)
    other = {"tiles": new_container("halves-"), "output": stores["output"], "manifest": new_table("halves")}
    halves, windows = fetched_per_window(source, 256, other)
    print(f", windows of half a tile {halves}")
    assert windows == 16 and halves >= 3.5 * size, (halves, size)


@pytest.mark.slow
def test_damaged_jp2s_are_refused_or_processed_never_crash_or_hang(tmp_path, capsys):
    """Seeded damage (tests/hostile_jp2.py) through the fuzz worker GeoTIFFs go through
    (tests/test_upload_fuzz.py): each file validated in a worker process, every window encoded and
    compared with the file's own pixels; a worker that dies or hangs is recorded against its file."""
    from .hostile_jp2 import damaged_corpus
    from .test_upload_fuzz import MAX_RSS_BYTES, MAX_SECONDS, run_worker

    corpus = damaged_corpus(tmp_path / "corpus")
    started = time.perf_counter()
    results, broken = run_worker(tmp_path / "corpus")
    outcomes = {family: Counter() for _, family in corpus}
    for path, family in corpus:
        outcomes[family][results.get(path.name, {}).get("outcome", "crashed or hung")] += 1
    slowest = max(results.values(), key=lambda r: r["seconds"])
    peak = max(r["peak_rss"] for r in results.values())
    with capsys.disabled():
        print(f"\nJP2 damage: {len(corpus)} files in {time.perf_counter() - started:.1f} s; crashed or hung: {broken}")
        for family, counts in outcomes.items():
            print(f"  {family:14s} {dict(counts)}")
        print(f"  slowest: {slowest['file']} {slowest['seconds']:.2f} s; worker peak RSS {peak / 2**20:.0f} MiB")
    assert broken == {}, broken
    assert len(results) == len(corpus)
    assert all(results[path.name]["outcome"] == "processed" for path, family in corpus if family == "intact")
    unexpected = {n: r for n, r in results.items() if r["outcome"] not in ("refused", "processed")}
    assert unexpected == {}, unexpected
    refusals = [r for r in results.values() if r["outcome"] == "refused"]
    assert all(r["error_type"] in ("InvalidRasterError", "UnsupportedRasterError") for r in refusals)
    assert slowest["seconds"] < MAX_SECONDS and peak < MAX_RSS_BYTES


# --------------------------------------------------------------------------- whole jobs on the local host


@pytest.mark.slow
def test_jp2_uploads_as_whole_jobs_on_the_local_host(storage, app_env, tmp_path, trap):
    """Through the real orchestration: a JP2 becomes gdal_translate's mosaic; a 500000² header and
    a file whose boxes name the trap fail their jobs at validation, with no tile and no request."""
    from devhost.session import process_file

    band = sentinel2_like(tmp_path / "T33UUP_B08.jp2", size=1024, tile=512, seed=8)
    huge = with_siz(
        write_jp2(tmp_path / "small.jp2", pixels(256, 256)),
        tmp_path / "huge.jp2",
        width=500000,
        height=500000,
        tile_width=500000,
        tile_height=500000,
    )
    bare = write_jp2(tmp_path / "bare.jp2", pixels(300, 200), georeferenced=False)
    named = with_boxes(bare, tmp_path / "named.jp2", named_url_boxes(trap.url, 300, 200))
    with local_host(app_env) as host:
        done = process_file(host, band, timeout=180)
        failed = {path.name: process_file(host, path, timeout=120) for path in (huge, named)}
    assert done["status"] == "completed", done
    mosaic = tmp_path / "mosaic.tif"
    mosaic.write_bytes(download_blob(storage, app_env.output, f"mosaics/{done['job_id']}/mosaic.tif"))
    assert_same_mosaic(mosaic, gdal_translate_cog(band, tmp_path / "reference.tif"))
    tiles = storage.blob_service().get_container_client(app_env.tiles)
    for name, fragment in (
        ("huge.jp2", "500000 x 500000 = 250000000000 pixels"),
        ("named.jp2", "has no georeferencing"),
    ):
        summary = failed[name]
        print(f"\n{name}: {summary['status']} in {summary.get('elapsed_s')} s: {summary.get('error', '')[:160]}")
        assert summary["status"] == "failed" and summary["windows"] is None, summary
        assert fragment in summary["error"], summary["error"]
        assert not list(tiles.list_blobs(name_starts_with=f"tiles/{summary['job_id']}/"))
    assert trap.requests == []


@pytest.mark.slow
def test_seeded_read_faults_on_jp2_uploads_never_make_a_wrong_tile_nor_bad_input(
    storage, app_env, azurite, monkeypatch, tmp_path
):
    """1 in 4 of the GETs for the uploads' bytes refused, reset or cut (as tests/test_seeded_read_faults.py
    does to GeoTIFFs): each job completes, at once or when its upload is delivered again, every tile
    and the mosaic equal to the JP2's pixels."""
    from devhost.session import job_summary, process_file
    from testkit.storage_proxy import FaultPlan

    from .app_jobs import check_outputs
    from .fault_jobs import app_behind_proxy
    from .test_seeded_read_faults import BAD_INPUT_TYPES, upload_gets, wrong_tiles

    plan = FaultPlan(every=4, applies=upload_gets(app_env), seed=4)
    bands = [sentinel2_like(tmp_path / f"B0{i}.jp2", size=768, tile=256, seed=i) for i in (2, 3)]
    delivered_again = 0
    with app_behind_proxy(azurite, monkeypatch, plan) as (blobs, _), local_host(app_env) as host:
        for band in bands:
            summary = process_file(host, band, timeout=300)
            if summary["status"] != "completed":
                error = summary.get("error", "")
                assert not any(f"({t})" in error for t in BAD_INPUT_TYPES), f"a storage fault called bad input: {error}"
                delivered_again += 1
                host.deliver_blob_created(band.name)
                summary = job_summary(host.engine.wait_for(summary["job_id"], timeout=300))
            check_outputs(storage, app_env, summary, band)
            checked, wrong = wrong_tiles(storage, app_env, summary["job_id"], band)
            assert checked == 9 and wrong == []
    injected = sum(blobs.injected.values())
    print(f"\nJP2 under 1 in 4 broken GETs: {dict(blobs.injected)} injected, {delivered_again} delivered again")
    assert injected >= 5
