"""Output profiles: how a profile is chosen (metadata, path rule, default), what is refused and
how, and each profile through the local host on a uint8 RGB, a uint16 four-band and a float32
scene: a valid COG with every overview level, pixel for pixel the source, in the codec chosen.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import rasterio
from rasterio.io import MemoryFile
from rio_cogeo.cogeo import cog_validate

from devhost.session import process_file
from orchestrators import names
from testkit.scenes import SceneSpec, write_scene
from tilecommit import profiles
from tilecommit.errors import BadInputError, ConfigurationError
from tilecommit.jobs import job_id_for
from tilecommit.raster.tiling import encode
from tilecommit.settings import SETTING_PROFILE, Settings
from tilecommit.spec import OutputSpec

from .app_jobs import WINDOW, download, local_host, read_pixels, wait_until
from .conftest import counter_total
from .raster_jobs import assert_complete_pyramid

SCENES = {
    "uint8-rgb": SceneSpec(600, 520, 3, "uint8", blocksize=WINDOW),
    "uint16-4band": SceneSpec(600, 520, 4, "uint16", nodata=0, blocksize=WINDOW),
    "float32": SceneSpec(600, 520, 1, "float32", nodata=-9999.0, blocksize=WINDOW),
}
#: The profile as the upload's metadata names it, and the TIFF compression GDAL reports for it.
CASES = {
    "default": ({}, "deflate"),
    "zstd": ({"tilecommit_profile": "zstd", "tilecommit_level": "15"}, "zstd"),
    "lzw": ({"tilecommit_profile": "lzw"}, "lzw"),
    "raw": ({"tilecommit_profile": "raw"}, None),
}


# ------------------------------------------------------------------------------------ choosing


def test_metadata_then_path_rule_then_default() -> None:
    settings = Settings(profile="lzw", profile_rules="dem/=zstd,predictor=3;dem/raw/=raw")
    rules, default = settings.profile_rule_list(), settings.default_profile()

    def chosen(name: str, metadata: dict | None = None) -> profiles.Choice:
        return profiles.resolve(metadata or {}, name, rules=rules, default=default)

    assert chosen("scene.tif") == profiles.Choice("lzw")
    assert chosen("dem/a.tif") == profiles.Choice("zstd", (("predictor", 3),))
    assert chosen("dem/raw/a.tif") == profiles.Choice("raw")  # the longest prefix wins
    # Metadata keys are case-insensitive (storage keeps what the uploader typed).
    assert chosen("dem/a.tif", {"TileCommit_Profile": "DEFLATE"}) == profiles.Choice("default")
    # Options alone in the metadata: on the default profile, not on the rule's.
    assert chosen("dem/a.tif", {"tilecommit_level": "9"}) == profiles.Choice("default", (("level", 9),))
    assert chosen("dem/a.tif", {"other": "x"}) == profiles.Choice("zstd", (("predictor", 3),))


def test_the_default_profile_keeps_every_existing_job_id() -> None:
    """The spec a job hashes is today's three fields while the profile is the default: no job
    started before profiles existed gets another id, tiles or manifest."""
    assert OutputSpec().canonical() == '{"block_size":256,"profile":"default","window_size":1024}'
    assert OutputSpec.for_upload(Settings(), "a.tif", {"tilecommit_profile": "deflate"}) == OutputSpec()
    same = {"tilecommit_profile": "default", "tilecommit_level": "6"}  # the profile's own level, given
    assert OutputSpec.for_upload(Settings(), "a.tif", same) == OutputSpec()
    other = OutputSpec.for_upload(Settings(), "a.tif", {"tilecommit_profile": "zstd"})
    assert job_id_for("https://a/b/c.tif", "0x1", other) != job_id_for("https://a/b/c.tif", "0x1", OutputSpec())
    assert OutputSpec.from_dict(other.to_dict()) == other


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"tilecommit_profile": "packbits"}, "profile 'packbits' is refused: PackBits"),
        (
            {"tilecommit_profile": "packbits"},
            "accepted: default, zstd, lzw, raw, jpeg, webp, lerc, lerc_deflate, lerc_zstd",
        ),
        ({"tilecommit_profile": "gzip"}, "profile 'gzip' is not one of default, zstd, lzw, raw, jpeg"),
        ({"tilecommit_profile": "jpeg", "tilecommit_quality": "0"}, "quality=0 for JPEG: accepted 1..100"),
        ({"tilecommit_profile": "zstd", "tilecommit_quality": "80"}, "quality=80 for ZSTD: accepted none"),
        ({"tilecommit_profile": "jpeg", "tilecommit_predictor": "2"}, "predictor=2 for JPEG: accepted none"),
        ({"tilecommit_profile": "lerc", "tilecommit_max_z_error": "-1"}, "max_z_error=-1 for LERC: accepted a finite"),
        ({"tilecommit_profile": "lerc", "tilecommit_max_z_error": "nan"}, "accepted a finite number >= 0"),
        (
            {"tilecommit_profile": "webp", "tilecommit_max_z_error": "1"},
            "accepted for lerc, lerc_deflate and lerc_zstd",
        ),
        ({"tilecommit_profile": "lerc", "tilecommit_max_z_error": "small"}, "max_z_error='small' is not a number"),
        ({"tilecommit_profile": "zstd", "tilecommit_level": "30"}, "level=30 for ZSTD: accepted 1..22"),
        ({"tilecommit_profile": "lzw", "tilecommit_level": "3"}, "level=3 for LZW: accepted none"),
        ({"tilecommit_profile": "raw", "tilecommit_predictor": "2"}, "predictor=2 for NONE"),
        (
            {"tilecommit_tilesize": "512"},
            "option 'tilesize' is not one of level, predictor, quality, max_z_error, blocksize, resampling",
        ),
        ({"tilecommit_blocksize": "1024"}, "blocksize=1024: accepted 256 or 512"),
        ({"tilecommit_resampling": "cubic"}, "resampling=cubic is refused: its kernel reaches past the 2 x 2"),
        ({"tilecommit_resampling": "sharpest"}, "resampling='sharpest': accepted nearest, average, rms, mode"),
        ({"tilecommit_level": "high"}, "level='high' is not a whole number"),
    ],
)
def test_metadata_this_build_cannot_make_is_refused_naming_the_key_the_value_and_what_is_accepted(
    metadata, message
) -> None:
    with pytest.raises(BadInputError, match="blob metadata tilecommit_profile") as refused:
        OutputSpec.for_upload(Settings(), "a.tif", metadata)
    assert message in str(refused.value)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({SETTING_PROFILE: "packbits"}, "TILECOMMIT_PROFILE: profile 'packbits' is refused"),
        ({"TILECOMMIT_PROFILE_RULES": "dem/"}, "rule 'dem/' is not prefix=profile"),
        ({"TILECOMMIT_PROFILE_RULES": "dem/=zstd,level"}, "'level' is not key=value"),
    ],
)
def test_settings_this_build_cannot_make_stop_the_app_at_start(environ, message) -> None:
    with pytest.raises(ConfigurationError, match="TILECOMMIT_PROFILE") as refused:
        Settings.from_env(environ)
    assert message in str(refused.value)


def test_each_profile_gives_gdal_its_creation_and_overview_options() -> None:
    assert profiles.creation_options(profiles.Choice(), "uint16") == {"COMPRESS": "DEFLATE", "LEVEL": 6, "PREDICTOR": 2}
    assert profiles.creation_options(profiles.Choice(), "float32")["PREDICTOR"] == 3
    assert profiles.creation_options(profiles.Choice("raw"), "uint8") == {"COMPRESS": "NONE"}
    zstd = profiles.Choice("zstd", (("level", 15), ("predictor", 1)))
    assert profiles.creation_options(zstd, "uint8") == {"COMPRESS": "ZSTD", "LEVEL": 15, "PREDICTOR": 1}
    assert profiles.overview_options(zstd, "uint8") == {
        "COMPRESS_OVERVIEW": "ZSTD",
        "PREDICTOR_OVERVIEW": 1,
        "ZSTD_LEVEL_OVERVIEW": 15,
    }
    jpeg = profiles.Choice("jpeg", (("quality", 90),))
    assert profiles.creation_options(jpeg, "uint8") == {"COMPRESS": "JPEG", "QUALITY": 90}
    assert profiles.overview_options(jpeg, "uint8") == {
        "COMPRESS_OVERVIEW": "JPEG",
        "PREDICTOR_OVERVIEW": 1,
        "JPEG_QUALITY_OVERVIEW": 90,
    }
    # The mosaic's coarse levels as the COG driver writes the tiles' overviews: RGB JPEG as YCbCr.
    assert profiles.coarse_level_options(jpeg, "uint8", 3)["PHOTOMETRIC_OVERVIEW"] == "YCBCR"
    assert "PHOTOMETRIC_OVERVIEW" not in profiles.coarse_level_options(jpeg, "uint8", 1)
    assert profiles.creation_options(profiles.Choice("webp"), "uint8") == {"COMPRESS": "WEBP", "QUALITY": 75}
    lerc = profiles.Choice("lerc_zstd", (("max_z_error", 0.25),))
    assert profiles.creation_options(lerc, "float32") == {"COMPRESS": "LERC_ZSTD", "MAX_Z_ERROR": 0.25}
    assert profiles.overview_options(lerc, "float32")["MAX_Z_ERROR_OVERVIEW"] == 0.25
    assert profiles.creation_options(profiles.Choice("lerc"), "uint16") == {"COMPRESS": "LERC", "MAX_Z_ERROR": 0.0}


def test_a_creation_option_the_cog_driver_does_not_take_fails_the_tile_instead_of_being_dropped(tmp_path) -> None:
    """GDAL only warns of an option its driver does not know and writes the file without it; the
    encoder refuses that tile, so a profile whose option GDAL ignores cannot commit other bytes."""
    source = tmp_path / "small.tif"
    with rasterio.open(source, "w", driver="GTiff", width=64, height=64, count=1, dtype="uint8") as dst:
        dst.write(np.arange(64 * 64, dtype="uint16").reshape(1, 64, 64).astype("uint8"))
    options = encode.cog_creation_options("uint8", block_size=256, overview_count=0, resampling="average")
    with MemoryFile() as out:
        encode.write_cog(str(source), out.name, options, choice=profiles.DEFAULT_CHOICE, dtype="uint8", block_size=256)
        assert out.getbuffer().nbytes > 0
    with MemoryFile() as out, pytest.raises(ConfigurationError, match="NOT_AN_OPTION.*none is written"):
        encode.write_cog(
            str(source),
            out.name,
            {**options, "NOT_AN_OPTION": "1"},
            choice=profiles.DEFAULT_CHOICE,
            dtype="uint8",
            block_size=256,
        )


def test_the_block_size_is_the_specs_and_must_divide_the_window() -> None:
    spec = OutputSpec.for_upload(Settings(), "a.tif", {"tilecommit_profile": "zstd", "tilecommit_blocksize": "512"})
    assert (spec.block_size, spec.profile, spec.profile_options) == (512, "zstd", ())
    assert spec.canonical() == '{"block_size":512,"profile":"zstd","window_size":1024}'
    assert OutputSpec.for_upload(Settings(), "a.tif", {"tilecommit_blocksize": "256"}) == OutputSpec()
    assert OutputSpec.from_settings(Settings(profile="jpeg,blocksize=512")).block_size == 512
    with pytest.raises(BadInputError, match="blob metadata tilecommit_profile: .*multiple of 512") as refused:
        OutputSpec.for_upload(Settings(window_size=768), "a.tif", {"tilecommit_blocksize": "512"})
    assert not isinstance(refused.value, ConfigurationError)  # the upload's job fails, not the app
    # A setting or rule naming a block size the app's window size is not a multiple of stops the app at start.
    with pytest.raises(ConfigurationError, match="TILECOMMIT_PROFILE: blocksize=512 with TILECOMMIT_WINDOW_SIZE=768"):
        Settings(window_size=768, profile="default,blocksize=512")
    with pytest.raises(ConfigurationError, match="TILECOMMIT_PROFILE_RULES rule 'web/': blocksize=512"):
        Settings(window_size=768, profile_rules="web/=jpeg,blocksize=512")


def test_a_profiles_own_defaults_given_make_the_same_job_and_options_keep_their_type() -> None:
    assert OutputSpec.for_upload(Settings(), "a.tif", {"tilecommit_profile": "jpeg", "tilecommit_quality": "75"}) == (
        OutputSpec(profile="jpeg")
    )
    assert OutputSpec.for_upload(
        Settings(), "a.tif", {"tilecommit_profile": "lerc", "tilecommit_max_z_error": "0"}
    ) == (OutputSpec(profile="lerc"))
    lossy = OutputSpec.for_upload(Settings(), "a.tif", {"tilecommit_profile": "lerc", "tilecommit_max_z_error": "0.01"})
    assert lossy.profile_options == (("max_z_error", 0.01),) and lossy.choice.lossy
    assert OutputSpec.from_dict(lossy.to_dict()) == lossy
    assert lossy.canonical() == (
        '{"block_size":256,"profile":"lerc","profile_options":{"max_z_error":0.01},"window_size":1024}'
    )
    assert not OutputSpec(profile="lerc").choice.lossy and OutputSpec(profile="webp").choice.lossy


@pytest.mark.parametrize(
    ("name", "dtype", "count", "nodata", "alpha", "message"),
    [
        (
            "zstd,predictor=3",
            "uint16",
            1,
            None,
            False,
            "predictor=3 (floating point) on uint16 data: accepted for float32",
        ),
        ("jpeg", "uint16", 3, None, False, "JPEG on 3-band uint16 data: JPEG takes 8-bit data"),
        ("jpeg", "uint8", 5, None, False, "JPEG on 5-band uint8 data"),
        ("jpeg", "uint8", 4, None, True, "JPEG would blur the alpha band's edges"),
        ("webp", "uint8", 1, None, False, "WEBP on 1-band uint8 data: WEBP takes 8-bit RGB or RGBA"),
        ("webp", "float32", 3, None, False, "WEBP on 3-band float32 data"),
        ("jpeg", "uint8", 3, 0, False, "JPEG on data with a nodata value (0): a lossy codec moves pixels"),
        ("webp", "uint8", 4, 255, True, "WEBP on data with a nodata value (255)"),
        # the alpha band dropped into the mask: the grey band alone is left, which WEBP does not take
        ("webp,add_mask=true", "uint8", 2, None, True, "WEBP on 1-band uint8 data"),
        ("lerc,max_z_error=2", "uint16", 1, 0, False, "max_z_error=2.0 on uint16 data with a nodata value (0)"),
    ],
)
def test_a_profile_is_refused_on_data_it_cannot_take_or_would_damage(name, dtype, count, nodata, alpha, message):
    choice = profiles.parse(name, where="test")
    with pytest.raises(BadInputError) as refused:
        profiles.check_for(choice, dtype, count=count, nodata=nodata, alpha=alpha)
    assert message in str(refused.value)
    assert str(refused.value).startswith(f"profile {choice.name!r}")


@pytest.mark.parametrize(
    ("name", "dtype", "count", "nodata", "alpha"),
    [
        ("jpeg", "uint8", 3, None, False),
        ("jpeg", "uint8", 1, None, False),
        ("webp", "uint8", 4, None, True),
        ("jpeg,add_mask=true", "uint8", 4, None, True),  # the alpha band the mask, the RGB left JPEG's
        ("lerc,max_z_error=0.5", "float32", 1, -9999.0, False),  # LERC keeps a float nodata exactly
        ("lerc", "uint16", 4, 0, False),  # max_z_error 0: lossless
        ("lerc_deflate,max_z_error=3", "int16", 2, None, False),
    ],
)
def test_the_same_profiles_are_taken_where_they_do_no_damage(name, dtype, count, nodata, alpha):
    profiles.check_for(profiles.parse(name, where="test"), dtype, count=count, nodata=nodata, alpha=alpha)


# ------------------------------------------------------------------------ through the local host


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("profile-scenes")
    return {name: Path(write_scene(str(root / f"{name}.tif"), spec)) for name, spec in SCENES.items()}


@pytest.fixture
def host(app_env):
    with local_host(app_env) as running:
        running.ensure_storage()
        yield running


def compression(data: bytes) -> str | None:
    with MemoryFile(data) as memory, memory.open() as src:
        return src.compression.value.lower() if src.compression else None


@pytest.mark.slow
def test_each_profile_makes_a_valid_cog_of_every_scene_pixel_for_pixel(host, storage, app_env, scenes, tmp_path):
    for profile, (metadata, codec) in CASES.items():
        for scene_name, path in scenes.items():
            name = f"{profile}-{scene_name}.tif"
            summary = process_file(host, path, name=name, timeout=300, metadata=metadata)
            assert summary["status"] == "completed", (profile, scene_name, summary)
            job = summary["job_id"]
            mosaic = download(storage, app_env.output, f"mosaics/{job}/mosaic.tif")
            local = tmp_path / name
            local.write_bytes(mosaic)
            valid, errors, warnings = cog_validate(str(local))
            assert valid and not errors, (profile, scene_name, errors, warnings)
            assert_complete_pyramid(str(local))
            np.testing.assert_array_equal(read_pixels(mosaic), read_pixels(path), err_msg=f"{profile} {scene_name}")
            with rasterio.open(local) as src, rasterio.open(path) as source:
                assert src.nodata == source.nodata and src.dtypes == source.dtypes
                for level in range(len(src.overviews(1))):
                    with rasterio.open(local, overview_level=level) as overview:
                        assert overview.read().shape[0] == source.count  # every level holds every band
                        # The coarse levels the assembly computes are encoded as the tiles are.
                        found = overview.compression.value.lower() if overview.compression else None
                        assert found == codec, (profile, scene_name, level)
            assert compression(mosaic) == codec, (profile, scene_name)
            tile = download(storage, app_env.tiles, f"tiles/{job}/0000_0000.tif")
            assert compression(tile) == codec
            item = json.loads(download(storage, app_env.output, f"mosaics/{job}/item.json"))
            assert item["properties"]["tilecommit:profile"]["name"] == (profile if metadata else "default")
            assert item["properties"]["tilecommit:profile"]["compress"] == (codec or "none").upper()


@pytest.mark.slow
def test_a_profile_the_data_cannot_take_fails_the_job_at_once_with_the_reason(host, scenes):
    refused = process_file(
        host, scenes["uint16-4band"], name="jpeg.tif", timeout=120, metadata={"tilecommit_profile": "jpeg"}
    )
    # Failed while validating: no window was planned, none rendered.
    assert refused["status"] == "failed" and refused["windows"] is None, refused
    assert "profile 'jpeg': JPEG on 4-band uint16 data" in str(refused["error"])
    assert "BadInputError" in str(refused["error"])
    on_integers = process_file(
        host,
        scenes["uint16-4band"],
        name="predictor3.tif",
        timeout=120,
        metadata={"tilecommit_profile": "zstd", "tilecommit_predictor": "3"},
    )
    assert on_integers["status"] == "failed" and on_integers["windows"] is None, on_integers
    assert "predictor=3 (floating point) on uint16 data" in str(on_integers["error"])


@pytest.mark.slow
def test_one_upload_under_two_profiles_is_two_jobs_and_each_delivered_again_a_duplicate(
    host, storage, app_env, scenes, monkeypatch
):
    path = scenes["uint16-4band"]
    first = process_file(host, path, name="twice.tif", timeout=300)
    assert first["status"] == "completed"
    blob = host.blobs.get_blob_client(app_env.input, "twice.tif")
    etag = blob.get_blob_properties().etag
    zstd = job_id_for(blob.url, etag, OutputSpec(window_size=WINDOW, profile="zstd"))
    assert zstd != first["job_id"]
    monkeypatch.setenv(SETTING_PROFILE, "zstd")  # the app's default changes; the upload does not
    host.deliver_blob_created("twice.tif")
    second = host.engine.wait_for(zstd, timeout=300)
    assert second["status"] == "Completed", second
    duplicates = counter_total("StartDecisions", action="duplicate")
    host.deliver_blob_created("twice.tif")  # the zstd job's upload again
    monkeypatch.setenv(SETTING_PROFILE, "default")
    host.deliver_blob_created("twice.tif")  # and the default one's
    wait_until(lambda: counter_total("StartDecisions", action="duplicate") - duplicates == 2, timeout=30)
    for job, codec in ((first["job_id"], "deflate"), (zstd, "zstd")):
        mosaic = download(storage, app_env.output, f"mosaics/{job}/mosaic.tif")
        np.testing.assert_array_equal(read_pixels(mosaic), read_pixels(path))
        assert compression(mosaic) == codec
    jobs = [i["id"] for i in host.engine.list_instances() if i["name"] == names.TILE_SCENE]
    assert sorted(jobs) == sorted([first["job_id"], zstd])


def test_the_clis_profile_option_is_the_uploads_metadata() -> None:
    from devhost.cli_args import profile_metadata
    from devhost.session import UsageError

    assert profile_metadata(None) is None
    assert profile_metadata("zstd, Level=19") == {"tilecommit_profile": "zstd", "tilecommit_level": "19"}
    with pytest.raises(UsageError, match="'19' is not key=value"):
        profile_metadata("zstd,19")


@pytest.mark.slow
def test_a_lossy_profile_through_the_local_host_names_its_quality_in_the_item(host, storage, app_env, scenes, tmp_path):
    metadata = {"tilecommit_profile": "webp", "tilecommit_quality": "60"}
    summary = process_file(host, scenes["uint8-rgb"], name="webp.tif", timeout=300, metadata=metadata)
    assert summary["status"] == "completed", summary
    job = summary["job_id"]
    mosaic = download(storage, app_env.output, f"mosaics/{job}/mosaic.tif")
    local = tmp_path / "webp.tif"
    local.write_bytes(mosaic)
    assert cog_validate(str(local))[0]
    assert compression(mosaic) == "webp"
    item = json.loads(download(storage, app_env.output, f"mosaics/{job}/item.json"))
    assert item["properties"]["tilecommit:profile"] == {"name": "webp", "compress": "WEBP", "quality": 60}
    assert item["properties"]["tilecommit:spec"]["profile_options"] == {"quality": 60}


@pytest.mark.slow
def test_a_nodata_override_in_the_upload_metadata_reaches_the_tiles_the_mosaic_and_the_item(
    host, storage, app_env, scenes
):
    """The uint16 scene says nodata 0; ``tilecommit_nodata=7`` makes 7 its outputs' nodata (the
    pixels stay the source's). That it is another job than the same version without it:
    tests/test_nodata_override.py."""
    summary = process_file(
        host, scenes["uint16-4band"], name="nodata.tif", timeout=300, metadata={"tilecommit_nodata": "7"}
    )
    assert summary["status"] == "completed", summary
    job = summary["job_id"]
    mosaic = download(storage, app_env.output, f"mosaics/{job}/mosaic.tif")
    tile = download(storage, app_env.tiles, f"tiles/{job}/0000_0000.tif")
    for body in (mosaic, tile):
        with MemoryFile(body) as memory, memory.open() as src:
            assert src.nodata == 7
    np.testing.assert_array_equal(read_pixels(mosaic), read_pixels(scenes["uint16-4band"]))
    item = json.loads(download(storage, app_env.output, f"mosaics/{job}/item.json"))
    assert {band["nodata"] for band in item["assets"]["data"]["raster:bands"]} == {7}
    assert item["properties"]["tilecommit:spec"]["profile_options"] == {"nodata": "7.0"}
