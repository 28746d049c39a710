"""Real rasters from public test suites (tests/fixtures/real/, sources in its README) through the pipeline.

Each accepted file goes through the library functions as a job calls them (inspect, render every
window, assemble) against Azurite: the committed mosaic must be a valid COG, pixel for pixel and
mask for mask the source, with a complete pyramid, the source's CRS (as PROJ compares CRSs) and a
STAC item whose projection fields and footprint fit the CRS. Each refused file must be refused by
``inspect_source``, with a message that says why, before any tile is written. A few files also
run as whole jobs on the local host (slower: one host each).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import rasterio
from rasterio.crs import CRS
from rasterio.warp import transform as warp_transform
from rio_cogeo.cogeo import cog_validate

from tilecommit.errors import BadInputError, UnsupportedRasterError
from tilecommit.grid import plan_windows
from tilecommit.raster import SceneInfo, inspect_source
from tilecommit.raster.assembly.pyramid import mosaic_overview_levels
from tilecommit.raster.reading.metadata import said
from tilecommit.raster.reading.scene import same_crs
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec

from .app_jobs import download as download_blob
from .app_jobs import local_host
from .made_rasters import MAKERS, made
from .raster_jobs import assemble, assert_complete_pyramid, blob_names, download, manifest_rows, render_all
from .rio_stac_check import check_item_statistics

REAL = Path(__file__).resolve().parent / "fixtures" / "real"


def corpus(name: str) -> Path:
    """A file of the corpus (tests/fixtures/real/), or one the tests make in its place
    (tests/made_rasters.py: a grid no licensed file of the corpus stands for)."""
    return made(name) if name in MAKERS else REAL / name


#: Accepted files. Windows of 512 for the larger ones, so the tiles carry an overview level that
#: the mosaic copies (with its mask, where there is one); 256 for the rest.
ACCEPTED = sorted(
    [
        "6band_wrong_number_extrasamples.tif",
        "RGBA.uint16.tif",
        "all-nodata.tif",
        "alpha.tif",
        "byte_signed.tif",
        "byte_user_defined_geokeys.tif",
        "byte_zstd.tif",
        "clp.tif",
        "cog_rgb.tif",
        "dem-hills.tif",
        "cog_strile_arrays_zeroified_when_possible.tif",
        "cog_uint8_rgb_mask.tif",
        "cog_uint8_rgb_nodata.tif",
        "cog_uint8_rgba.tif",
        "epsg_2853_with_us_feet.tif",
        "float16.tif",
        "float64.tif",
        "float_raster_with_extra_nodata.tif",
        "goes.tif",
        "image_webp.tif",
        "int32.tif",
        "inverted_lat.tif",
        "labels.tif",
        "nan32_nodata.tif",
        "polar_stereographic_south.tif",
        "rgb-byte-tenth.tif",
        "rgba.tif",
        "small_world_pct.tif",
        "test_color_table.tif",
        "test_esri_wkt.tif",
        "tif_webp.tif",
        "uint32.tif",
        "weird_mercator_2sp.tif",
        "world.byte.tif",
    ]
)

#: Refused files: (error type, fragments of the message).
REFUSED = {
    "byte_gcp.tif": (UnsupportedRasterError, ["ground control points (2 GCPs)", "warp it to a regular grid"]),
    "cog_gcps_ovr.tif": (UnsupportedRasterError, ["ground control points (210 GCPs)", "warp it to a regular grid"]),
    "geomatrix.tif": (UnsupportedRasterError, ["rotated or sheared", "north-up grids only"]),
    "cint16.tif": (UnsupportedRasterError, ["sample type complex_int16", "does not tile", "accepted: uint8"]),
    "contig_tiled.tif": (UnsupportedRasterError, ["has no georeferencing", "lacks a CRS"]),
}


def window_size_for(path: Path) -> int:
    with rasterio.open(path) as src:
        return 512 if max(src.width, src.height) > 512 else 256


def test_the_corpus_is_what_its_readme_lists():
    files = sorted(p.name for p in REAL.glob("*.tif"))
    assert files == sorted(name for name in ACCEPTED + list(REFUSED) if name not in MAKERS)
    readme = (REAL / "README.md").read_text()
    for name in files:
        assert f"`{name}`" in readme, f"{name} is not described in tests/fixtures/real/README.md"
    assert sum(p.stat().st_size for p in REAL.glob("*.tif")) < 5 * 10**6


def run_library_job(path: str, settings: Settings, stores, storage):
    scene = inspect_source(path, settings=settings, spec=OutputSpec.from_settings(settings))
    assert SceneInfo.from_dict(json.loads(json.dumps(scene.to_dict(), allow_nan=False))).to_dict() == scene.to_dict()
    results = render_all(path, scene, settings, stores)
    assert [r.outcome for r in results] == ["written"] * len(
        plan_windows(scene.width, scene.height, settings.window_size)
    )
    return scene, assemble(scene, settings, stores, storage, source_name=Path(path).name)


def check_mosaic(source: str, mosaic_path: str, levels: int) -> None:
    valid, errors, _ = cog_validate(mosaic_path, quiet=True)
    assert valid, errors
    with rasterio.open(source) as src, rasterio.open(mosaic_path) as m:
        assert (m.width, m.height, m.count, m.dtypes) == (src.width, src.height, src.count, src.dtypes)
        assert m.transform == src.transform
        assert m.crs == src.crs and same_crs(m.crs, src.crs.to_wkt())
        assert np.array_equal(m.read(), src.read(), equal_nan=True)
        assert np.array_equal(m.read_masks(), src.read_masks())
        assert [f.name for f in m.mask_flag_enums[0]] == [f.name for f in src.mask_flag_enums[0]]
        assert [c.name for c in m.colorinterp] == [c.name for c in src.colorinterp]
        if src.nodata is None or not math.isnan(src.nodata):
            assert m.nodata == src.nodata
        else:
            assert math.isnan(m.nodata)
        assert len(m.overviews(1)) == levels == mosaic_overview_levels(src.width, src.height)
        # Nothing the source says is lost: tags of every carried domain, band tags, descriptions,
        # scales, offsets, units, colour interpretation, colormap (tilecommit/raster/reading/metadata.py).
        assert said(m) == said(src)
    assert_complete_pyramid(mosaic_path)


def eroded(valid: np.ndarray, pixels: int) -> np.ndarray:
    """``valid`` without the pixels within ``pixels`` (4-connected steps) of an invalid one or the edge."""
    out = valid.copy()
    for _ in range(pixels):
        shrunk = np.zeros_like(out)
        shrunk[1:-1, 1:-1] = out[1:-1, 1:-1] & out[:-2, 1:-1] & out[2:, 1:-1] & out[1:-1, :-2] & out[1:-1, 2:]
        out = shrunk
    return out


def interior_points_lonlat(path: str, margin: int, samples: int = 25) -> np.ndarray:
    """Longitude/latitude of the centres of some valid pixels at least ``margin`` pixels inside the valid area."""
    with rasterio.open(path) as src:
        rows, cols = np.nonzero(eroded(src.dataset_mask() > 0, margin))
        if rows.size == 0:
            return np.empty((0, 2))
        pick = np.linspace(0, rows.size - 1, min(samples, rows.size)).astype(int)
        xs, ys = src.xy(rows[pick], cols[pick])
        points = []
        for x, y in zip(xs, ys, strict=True):
            try:
                (lon,), (lat,) = warp_transform(src.crs, "EPSG:4326", [x], [y])
            except Exception:  # noqa: BLE001 - a pixel centre off the Earth has no position: not sampled
                continue
            if np.isfinite([lon, lat]).all():
                points.append((lon, lat))
    return np.array(points)


def in_bbox(lon: float, lat: float, bbox: list[float], tolerance: float) -> bool:
    west, south, east, north = bbox
    lat_ok = south - tolerance <= lat <= north + tolerance
    if west <= east:
        return lat_ok and west - tolerance <= lon <= east + tolerance
    return lat_ok and (lon >= west - tolerance or lon <= east + tolerance)  # across the antimeridian


def validate_against_the_core_schema(item: dict) -> None:
    """The item against STAC's own item schema (the copy pystac ships, the item's version).

    The extensions' schemas are published only on their web sites and no registry package ships
    them, so they cannot be read here; their fields are checked against the source instead."""
    from jsonschema import Draft7Validator
    from pystac.validation.local_validator import VERSION, get_local_schema_cache
    from referencing import Registry, Resource

    assert item["stac_version"] == VERSION
    cache = get_local_schema_cache()
    registry = Registry().with_resources((uri, Resource.from_contents(schema)) for uri, schema in cache.items())
    schema = cache[f"https://schemas.stacspec.org/v{VERSION}/item-spec/json-schema/item.json"]
    Draft7Validator(schema, registry=registry).validate(item)


def check_band_fields(item: dict, source: str) -> None:
    """``raster:bands`` and ``eo:bands`` say what the source says about its bands."""
    asset = item["assets"]["data"]
    with rasterio.open(source) as src:
        bands = asset["raster:bands"]
        assert len(bands) == src.count
        for band, scale, offset, unit in zip(bands, src.scales, src.offsets, src.units, strict=True):
            assert band.get("scale", 1.0) == scale and band.get("offset", 0.0) == offset
            assert band.get("unit") == (unit or None)
            assert band["data_type"] == src.dtypes[0]
        named = any(src.descriptions) or any(c.name in ("red", "green", "blue") for c in src.colorinterp)
        assert ("eo:bands" in asset) == named
        if named:
            for eo, description, colour in zip(asset["eo:bands"], src.descriptions, src.colorinterp, strict=True):
                assert eo["name"] == (description or eo.get("common_name") or eo["name"])
                if colour.name in ("red", "green", "blue"):
                    assert eo["common_name"] == colour.name


def check_datetime_of_a_source_without_acquisition_time(item: dict, source: str) -> None:
    """Without an IMAGERY ACQUISITIONDATETIME the item's ``datetime`` is its creation time and
    says so; never TIFFTAG_DATETIME, the file's write time (all-nodata.tif and
    test_color_table.tif have one). Sources with the tag: :data:`ACQUISITION_CASES`."""
    with rasterio.open(source) as src:
        if src.get_tag_item("ACQUISITIONDATETIME", "IMAGERY") is not None:
            return
    props = item["properties"]
    assert props["tilecommit:datetime"] == "created"
    assert props["datetime"] == props["created"]
    assert "tilecommit:datetime_note" not in props


def check_stac(item: dict, source: str) -> None:
    validate_against_the_core_schema(item)
    check_band_fields(item, source)
    check_datetime_of_a_source_without_acquisition_time(item, source)
    with rasterio.open(source) as src:
        crs = src.crs
        has_valid = bool(src.dataset_mask().any())
        # The footprint is made on the smallest overview's grid, its points moved inward by up to
        # 2 of its pixels where they have no geographic position: pixels well inside lie within it.
        margin = 4 * 2 ** mosaic_overview_levels(src.width, src.height)
    props = item["properties"]
    epsg = crs.to_epsg()
    if epsg is not None and CRS.from_epsg(epsg) == crs:
        assert props["proj:code"] == f"EPSG:{epsg}"
        assert "proj:wkt2" not in props
    else:
        assert props.get("proj:code") is None
        assert CRS.from_wkt(props["proj:wkt2"]) == crs
        assert CRS.from_user_input(json.dumps(props["proj:projjson"])) == crs
    note = props["tilecommit:footprint"]
    if not has_valid:
        assert item["geometry"] is None and "bbox" not in item
        assert note == "none: the mosaic has no valid pixel"
        return
    assert item["geometry"]["type"] in ("Polygon", "MultiPolygon"), note
    west, south, east, north = item["bbox"]
    assert -180 <= west <= 180 and -180 <= east <= 180 and -90 <= south < north <= 90
    coordinates = np.array(
        [
            p
            for polygon in (
                [item["geometry"]["coordinates"]]
                if item["geometry"]["type"] == "Polygon"
                else item["geometry"]["coordinates"]
            )
            for ring in polygon
            for p in ring
        ]
    )
    assert np.isfinite(coordinates).all()
    for lon, lat in interior_points_lonlat(source, margin):
        assert in_bbox(lon, lat, item["bbox"], 1e-7), (lon, lat, item["bbox"], note)


@pytest.mark.parametrize("name", ACCEPTED)
def test_real_raster_becomes_an_exact_cog_mosaic(name, stores, storage, tmp_path):
    source = str(corpus(name))
    settings = Settings(window_size=window_size_for(corpus(name)))
    scene, result = run_library_job(source, settings, stores, storage)
    assert result.outcome == "written"
    assert result.method == "server"  # every real file assembles by block copy, masks included
    with rasterio.open(source) as src:
        assert same_crs(scene.crs, src.crs)
    mosaic_path = download(stores["output"], result.mosaic, tmp_path / "mosaic.tif")
    check_mosaic(source, mosaic_path, result.overview_levels)
    item = json.loads(stores["output"].download_blob(result.stac).readall())
    check_stac(item, source)
    check_item_statistics(item, mosaic_path)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_real_raster_is_refused_before_any_tile(name, stores):
    error, fragments = REFUSED[name]
    path = str(corpus(name))
    with pytest.raises(error) as caught:
        inspect_source(path, settings=Settings(), spec=OutputSpec(window_size=256))
    assert isinstance(caught.value, BadInputError)
    for fragment in fragments:
        assert fragment in str(caught.value), str(caught.value)
    assert blob_names(stores["tiles"]) == [] and manifest_rows(stores["manifest"]) == []


def derived(tmp_path, name: str, build) -> str:
    """A variant of a real file made at test time (never committed): ``build(src) -> (profile, data, mask)``."""
    with rasterio.open(corpus(name)) as src:
        profile, data = build(src)
    path = str(tmp_path / f"derived-{name}")
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(data)
    return path


def test_big_endian_uint16_with_alpha(stores, storage, tmp_path):
    """Big-endian: RGBA.uint16.tif rewritten with GDAL's ENDIANNESS=BIG (no small real big-endian GeoTIFF
    with georeferencing was found; the corpus's big-endian file has none and is refused)."""

    def build(src):
        profile = {
            **src.profile,
            "driver": "GTiff",
            "ENDIANNESS": "BIG",
            "tiled": True,
            "blockxsize": 256,
            "blockysize": 256,
        }
        return profile, src.read()

    path = derived(tmp_path, "RGBA.uint16.tif", build)
    with open(path, "rb") as f:
        assert f.read(2) == b"MM"
    _, result = run_library_job(path, Settings(window_size=256), stores, storage)
    assert result.method == "server"
    check_mosaic(path, download(stores["output"], result.mosaic, tmp_path / "mosaic.tif"), result.overview_levels)


def test_sixteen_bands(stores, storage, tmp_path):
    """16 bands: the four uint16 bands of RGBA.uint16.tif, each four times (the corpus has at most 6)."""

    def build(src):
        data = np.concatenate([src.read()] * 4)
        profile = {
            **src.profile,
            "count": 16,
            "photometric": "MINISBLACK",
            "tiled": True,
            "blockxsize": 256,
            "blockysize": 256,
        }
        return profile, data

    path = derived(tmp_path, "RGBA.uint16.tif", build)
    scene, result = run_library_job(path, Settings(window_size=256), stores, storage)
    assert scene.count == 16 and result.method == "server"
    check_mosaic(path, download(stores["output"], result.mosaic, tmp_path / "mosaic.tif"), result.overview_levels)


# --------------------------------------------------------------------------- the item's datetime

#: The item's ``datetime`` is then its ``created``.
CREATED = "created"
#: Per case: the IMAGERY ACQUISITIONDATETIME written into the source (None: none), the item's
#: ``datetime``, its ``tilecommit:datetime``, and words of its ``tilecommit:datetime_note`` (None: no note).
ACQUISITION_CASES = {
    "gdal-form": ("2021-03-04 10:11:12", "2021-03-04T10:11:12Z", "acquired", None),
    "offset-and-fraction": ("2013-04-07T17:47:03.0882620+02:00", "2013-04-07T15:47:03.088262Z", "acquired", None),
    "no-tag": (None, CREATED, "created", None),
    "not-a-time": ("yesterday", CREATED, "created", "ACQUISITIONDATETIME 'yesterday' not used: it is not a date"),
    "gdal-placeholder": ("1970-01-01 00:00:00", CREATED, "created", "'1970-01-01 00:00:00' not used: it is the Unix"),
}
#: A small real RGB file: its copies carry the cases' tags.
ACQUISITION_SOURCE = "rgb-byte-tenth.tif"


def with_acquisition_tag(tmp_path, value: str | None) -> str:
    """:data:`ACQUISITION_SOURCE` rewritten, with ``value`` as its IMAGERY ACQUISITIONDATETIME
    (set as a writer sets it: in the GeoTIFF's GDAL_METADATA tag, no sidecar)."""
    path = derived(tmp_path, ACQUISITION_SOURCE, lambda src: (src.profile, src.read()))
    if value is not None:
        with rasterio.open(path, "r+") as dst:
            dst.update_tags(ns="IMAGERY", ACQUISITIONDATETIME=value)
    assert not Path(path + ".aux.xml").exists()
    return path


def check_datetime_of_case(item: dict, case: str) -> None:
    _, expected, which, note = ACQUISITION_CASES[case]
    props = item["properties"]
    assert props["datetime"] == (props["created"] if expected == CREATED else expected)
    assert props["tilecommit:datetime"] == which
    if note is None:
        assert "tilecommit:datetime_note" not in props
    else:
        assert note in props["tilecommit:datetime_note"]


@pytest.mark.parametrize("case", sorted(ACQUISITION_CASES))
def test_the_items_datetime_is_the_sources_acquisition_time_or_says_it_is_the_creation_time(
    case, stores, storage, tmp_path, caplog
):
    path = with_acquisition_tag(tmp_path, ACQUISITION_CASES[case][0])
    settings = Settings(window_size=256)
    scene, result = run_library_job(path, settings, stores, storage)
    body = stores["output"].download_blob(result.stac).readall()
    item = json.loads(body)
    check_stac(item, path)
    check_datetime_of_case(item, case)
    note = ACQUISITION_CASES[case][3]
    warned = [r.getMessage() for r in caplog.records if r.name.endswith(".acquisition")]
    assert warned == ([f"{path}: {item['properties']['tilecommit:datetime_note']}"] if note else [])
    # A retry finds the item the mosaic and the scene give, and one lost is written again, the same bytes.
    assert assemble(scene, settings, stores, storage, source_name=Path(path).name).outcome == "already-present"
    stores["output"].delete_blob(result.stac)
    assemble(scene, settings, stores, storage, source_name=Path(path).name)
    assert stores["output"].download_blob(result.stac).readall() == body


# --------------------------------------------------------------------------- whole jobs on the local host

#: The files that failed after tiling before (a WKT-only CRS; a geostationary disk with a mask),
#: the polar one, and a refusal: each as a whole job. The rest run through the library above (a
#: host per file would add about ten seconds each).
WHOLE_JOBS = ["float_raster_with_extra_nodata.tif", "goes.tif", "polar_stereographic_south.tif", "geomatrix.tif"]


@pytest.mark.slow
@pytest.mark.parametrize("name", WHOLE_JOBS)
def test_real_raster_as_a_whole_job_on_the_local_host(name, storage, app_env, tmp_path):
    from devhost.session import process_file

    source = corpus(name)
    with local_host(app_env) as host:
        summary = process_file(host, source, timeout=120)
    if name in REFUSED:
        error, fragments = REFUSED[name]
        assert summary["status"] == "failed" and summary["windows"] is None, summary
        for fragment in fragments:
            assert fragment in summary["error"], summary["error"]
        tiles = storage.blob_service().get_container_client(app_env.tiles)
        assert not list(tiles.list_blobs(name_starts_with=f"tiles/{summary['job_id']}/"))
        return
    assert summary["status"] == "completed", summary
    mosaic_path = tmp_path / "mosaic.tif"
    mosaic_path.write_bytes(download_blob(storage, app_env.output, f"mosaics/{summary['job_id']}/mosaic.tif"))
    with rasterio.open(mosaic_path) as m:
        levels = len(m.overviews(1))
    check_mosaic(str(source), str(mosaic_path), levels)
    item = json.loads(download_blob(storage, app_env.output, f"mosaics/{summary['job_id']}/item.json"))
    check_stac(item, str(source))


@pytest.mark.slow
def test_the_acquisition_time_reaches_the_item_through_a_whole_job(storage, app_env, tmp_path):
    """Through the orchestration: the scene the inspection found travels as JSON in the job's
    history to the assembly that writes the item."""
    from devhost.session import process_file

    source = Path(with_acquisition_tag(tmp_path, ACQUISITION_CASES["offset-and-fraction"][0]))
    with local_host(app_env) as host:
        summary = process_file(host, source, timeout=120)
    assert summary["status"] == "completed", summary
    item = json.loads(download_blob(storage, app_env.output, f"mosaics/{summary['job_id']}/item.json"))
    check_stac(item, str(source))
    check_datetime_of_case(item, "offset-and-fraction")


def test_the_core_schema_check_refuses_an_item_stac_refuses():
    """The control for check_stac's schema check: a null datetime without an interval is refused."""
    from jsonschema import ValidationError
    from pystac.validation.local_validator import VERSION

    item = {
        "type": "Feature",
        "stac_version": VERSION,
        "id": "x",
        "geometry": None,
        "properties": {"datetime": None},
        "links": [],
        "assets": {},
    }
    with pytest.raises(ValidationError):
        validate_against_the_core_schema(item)
    item["properties"] = {"datetime": "2026-01-01T00:00:00Z"}
    validate_against_the_core_schema(item)
