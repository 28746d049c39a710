"""NetCDF and HDF5 uploads (tilecommit/raster/reading/netcdf.py): the mosaic is the COG GDAL makes
of the same variable, pixel for pixel, with its metadata; a file that names another file is
refused before GDAL opens it; read faults during the copy are faults, never bad input.

The files are made by the tests (testkit/netcdf_scenes.py): by the app's GDAL (its netCDF driver,
the three kinds of file) and by h5py (the hostile additions)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
import rasterio
import rasterio.shutil
from rio_cogeo.cogeo import cog_validate

from testkit import netcdf_scenes
from testkit.netcdf_scenes import SECRET_VALUE, write_netcdf, write_secret_hdf5
from testkit.storage_proxy import RecordingProxy
from tilecommit import profiles
from tilecommit.errors import BadInputError, InvalidRasterError, UnsupportedRasterError
from tilecommit.grid import plan_windows
from tilecommit.jobs import job_id_for
from tilecommit.raster import PinnedBlob, assemble_mosaic, inspect_source, render_tile
from tilecommit.raster.reading import netcdf
from tilecommit.raster.reading.metadata import said
from tilecommit.raster.reading.source import open_upload
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec
from tilecommit.storage import StorageConnection

from .app_jobs import download as download_blob
from .app_jobs import local_host
from .raster_jobs import blob_names, download, job_of, job_stores, manifest_rows

WIDTH, HEIGHT = 520, 300
SETTINGS = Settings(window_size=256)


def spec_naming(variable: str | None) -> OutputSpec:
    options = {"variable": variable} if variable else {}
    return OutputSpec.with_choice(SETTINGS.window_size, profiles.choose("default", options, where="test"))


def gdal_translate_cog(source: str, out: Path) -> Path:
    """``gdal_translate -of COG`` (Debian's gdal-bin, `make setup`): the reference tool itself."""
    program = shutil.which("gdal_translate")
    assert program, "gdal_translate is not installed: `make setup` installs it (Debian's gdal-bin)"
    done = subprocess.run([program, "-q", "-of", "COG", source, str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(autouse=True)
def own_temporary_directory(tmp_path, monkeypatch):
    """Each test's copies in a temporary directory of its own, so "no copy is left" counts this
    test's copies, not those of a job another worker (or process) runs meanwhile in the machine's /tmp."""
    own = tmp_path / "tmp"
    own.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(own))


def run_library_job(source, spec: OutputSpec, stores, tmp_path: Path) -> tuple[str, dict]:
    """inspect, render every window, assemble, as the job's activities call them; the mosaic's path and the item."""
    scene = inspect_source(source, settings=SETTINGS, spec=spec)
    job, job_stores_ = job_of(SETTINGS, spec=spec, source_name="scene.nc"), job_stores(stores, SETTINGS)
    windows = plan_windows(scene.width, scene.height, spec.window_size)
    results = [render_tile(job, job_stores_, source, window) for window in windows]
    assert [r.outcome for r in results] == ["written"] * len(windows)
    result = assemble_mosaic(job, job_stores_, scene)
    tmp_path.mkdir(exist_ok=True)
    mosaic = download(stores["output"], result.mosaic, tmp_path / "mosaic.tif")
    return mosaic, json.loads(stores["output"].download_blob(result.stac).readall())


def assert_same_as_reference(mosaic: str, reference: str, *, descriptions: list[str]) -> None:
    """Pixels, grid, nodata and everything the reference says, but the band descriptions, which
    GDAL's COG leaves empty and the mosaic fills with the time steps."""
    with rasterio.open(mosaic) as m, rasterio.open(reference) as ref:
        assert (m.width, m.height, m.count, m.dtypes) == (ref.width, ref.height, ref.count, ref.dtypes)
        assert m.transform == ref.transform and m.crs == ref.crs
        assert np.array_equal(m.read(), ref.read())
        assert m.nodata == ref.nodata == -999
        assert m.scales == ref.scales == (0.01,) * m.count
        assert m.offsets == ref.offsets == (273.15,) * m.count
        assert m.units == ref.units == ("K",) * m.count
        ours, theirs = said(m), said(ref)
        assert ours.pop("descriptions") == descriptions
        assert theirs.pop("descriptions") == [None] * ref.count  # GDAL's COG leaves them empty
        assert [d for d in m.descriptions] == descriptions
        assert ours == theirs


STEPS = ["time=0 days since 2000-01-01", "time=31 days since 2000-01-01", "time=59 days since 2000-01-01"]


@pytest.mark.parametrize("kind", ["classic", "64bit", "netcdf4"])
def test_each_kind_of_netcdf_becomes_the_cog_gdal_makes_of_it(kind, stores, tmp_path):
    source = write_netcdf(tmp_path / f"{kind}.nc", width=WIDTH, height=HEIGHT, kind=kind)
    mosaic, item = run_library_job(str(source), spec_naming(None), stores, tmp_path)
    valid, errors, _ = cog_validate(mosaic, quiet=True)
    assert valid, errors
    # The app's own GDAL (rasterio's), and Debian's gdal_translate (GDAL 3.6): the same pixels and tags.
    ours = tmp_path / "rasterio-cog.tif"
    rasterio.shutil.copy(f'NETCDF:"{source}":tas', ours, driver="COG")
    assert_same_as_reference(mosaic, str(ours), descriptions=STEPS)
    tool = gdal_translate_cog(f'NETCDF:"{source}":tas', tmp_path / "gdal-translate-cog.tif")
    with rasterio.open(mosaic) as m, rasterio.open(tool) as ref:
        assert np.array_equal(m.read(), ref.read()) and m.transform == ref.transform and m.crs == ref.crs
        assert [m.tags(b) for b in m.indexes] == [ref.tags(b) for b in ref.indexes]
        assert (m.scales, m.offsets, m.units, m.nodata) == (ref.scales, ref.offsets, ref.units, ref.nodata)
    bands = item["assets"]["data"]
    assert [band["name"] for band in bands["eo:bands"]] == STEPS
    assert [(b["scale"], b["offset"], b["unit"], b["nodata"]) for b in bands["raster:bands"]] == [
        (0.01, 273.15, "K", -999.0)
    ] * 3
    assert blob_names(stores["tiles"])  # tiles were written ...
    assert not list(Path(netcdf.tempfile.gettempdir()).glob(f"{netcdf.COPY_PREFIX}*"))  # ... and no copy is left


def test_a_file_of_several_variables_is_refused_naming_them_unless_the_job_names_one(stores, tmp_path):
    source = str(write_netcdf(tmp_path / "two.nc", width=WIDTH, height=HEIGHT, variables=("tas", "pr")))
    with pytest.raises(UnsupportedRasterError, match=r"several data variables \(tas, pr\).*tilecommit_variable"):
        inspect_source(source, settings=SETTINGS, spec=spec_naming(None))
    with pytest.raises(UnsupportedRasterError, match=r"no data variable 'rain'.*it holds tas, pr"):
        inspect_source(source, settings=SETTINGS, spec=spec_naming("rain"))
    assert blob_names(stores["tiles"]) == [] and manifest_rows(stores["manifest"]) == []
    # Named, each variable is its own output, and so its own job.
    scene = inspect_source(source, settings=SETTINGS, spec=spec_naming("pr"))
    assert (scene.width, scene.height, scene.count, scene.descriptions) == (WIDTH, HEIGHT, 3, STEPS)
    url, etag = "https://acct.blob.core.windows.net/in/two.nc", "0x1"
    ids = {job_id_for(url, etag, spec_naming(v)) for v in (None, "tas", "pr")}
    assert len(ids) == 3


def test_a_variable_option_is_refused_on_a_tiff_and_where_it_could_leave_the_gdal_name(tmp_path):
    for bad in ('tas":/etc/passwd', "../x", "1abc", "a b", ""):
        with pytest.raises(BadInputError, match="variable="):
            profiles.resolve({"tilecommit_variable": bad}, "x.nc", rules=[], default=profiles.DEFAULT_CHOICE)
    assert profiles.resolve({"tilecommit_variable": "/grp/tas"}, "x.nc", rules=[], default=profiles.DEFAULT_CHOICE)
    tiff = tmp_path / "plain.tif"
    with rasterio.open(
        tiff,
        "w",
        driver="GTiff",
        width=8,
        height=8,
        count=1,
        dtype="uint8",
        crs="EPSG:4326",
        transform=(1, 0, 0, 0, -1, 8),
    ) as dst:
        dst.write(np.zeros((1, 8, 8), "uint8"))
    with pytest.raises(UnsupportedRasterError, match="which has no variables"):
        inspect_source(str(tiff), settings=SETTINGS, spec=spec_naming("tas"))


HOSTILE = {
    "external link": (netcdf_scenes.add_external_link, "'elsewhere' is an external link to '/secret'"),
    "virtual dataset": (netcdf_scenes.add_virtual_dataset, "'stolen' is a virtual dataset whose sources are in"),
    "external storage": (netcdf_scenes.add_external_storage, "'outside' keeps its bytes in external storage"),
}


def hostile_file(kind: str, tmp_path: Path) -> tuple[Path, Path]:
    secret = write_secret_hdf5(tmp_path / "instance-secret.h5", width=WIDTH, height=HEIGHT)
    add, _ = HOSTILE[kind]
    source = write_netcdf(tmp_path / f"{kind.replace(' ', '-')}.nc", width=WIDTH, height=HEIGHT)
    if kind == "external link":
        return add(source, secret), secret
    return add(source, secret, width=WIDTH, height=HEIGHT), secret


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_netcdf4_naming_another_file_is_refused_before_gdal_opens_it(
    kind, tmp_path, new_container, azurite, monkeypatch
):
    source, secret = hostile_file(kind, tmp_path)
    # The control: GDAL left alone lists the member as a variable, read from the other file.
    member = {"external link": "elsewhere", "virtual dataset": "stolen", "external storage": "outside"}[kind]
    with rasterio.open(source) as whole:
        assert any(name.endswith(f":{member}") for name in whole.tags(ns="SUBDATASETS").values())
    if kind != "external storage":  # external storage holds raw bytes: the HDF5 file's, not its pixels
        with rasterio.open(f'NETCDF:"{source}":{member}') as stolen:
            assert (stolen.read(1) == SECRET_VALUE).all()

    uploads = new_container("up-")
    with source.open("rb") as data:
        uploads.upload_blob("scenes/hostile.nc", data)
    opened: list[str] = []
    real_open = netcdf.rasterio.open
    monkeypatch.setattr(
        netcdf.rasterio, "open", lambda path, *a, **k: opened.append(str(path)) or real_open(path, *a, **k)
    )
    with RecordingProxy(azurite.blob_endpoint.rsplit("/", 1)[0]) as proxy:
        proxied = azurite.connection_string.replace(f":{azurite.blob_port}/", f":{proxy.port}/")
        container = (
            StorageConnection.from_connection_string(proxied)
            .blob_service()
            .get_container_client(uploads.container_name)
        )
        blob = container.get_blob_client("scenes/hostile.nc")
        upload = PinnedBlob(blob, blob.get_blob_properties().etag)
        with pytest.raises(UnsupportedRasterError) as refused:
            inspect_source(upload, settings=SETTINGS, spec=spec_naming("tas"))
        asked = proxy.paths()
    assert HOSTILE[kind][1] in str(refused.value) and "names another file" in str(refused.value)
    assert opened == []  # GDAL never opened the copy
    assert asked and all(p.split("?")[0].endswith("/scenes/hostile.nc") for p in asked), asked
    assert not list(Path(netcdf.tempfile.gettempdir()).glob(f"{netcdf.COPY_PREFIX}*"))


def test_a_netcdf_whole_job_on_the_local_host_is_the_gdal_translate_cog_of_its_variable(storage, app_env, tmp_path):
    from devhost.session import process_file

    source = write_netcdf(tmp_path / "climate.nc", width=WIDTH, height=HEIGHT, variables=("tas", "pr"))
    with local_host(app_env) as host:
        summary = process_file(host, source, timeout=120, metadata={"tilecommit_variable": "pr"})
        refused = process_file(host, source, name="no-variable.nc", timeout=120)
        (tmp_path / "hostile").mkdir()
        hostile = process_file(
            host,
            hostile_file("virtual dataset", tmp_path / "hostile")[0],
            timeout=120,
            metadata={"tilecommit_variable": "tas"},
        )
    assert summary["status"] == "completed", summary
    mosaic = tmp_path / "mosaic.tif"
    mosaic.write_bytes(download_blob(storage, app_env.output, f"mosaics/{summary['job_id']}/mosaic.tif"))
    reference = gdal_translate_cog(f'NETCDF:"{source}":pr', tmp_path / "reference.tif")
    with rasterio.open(mosaic) as m, rasterio.open(reference) as ref:
        assert np.array_equal(m.read(), ref.read()) and m.transform == ref.transform and m.crs == ref.crs
        assert [m.tags(b) for b in m.indexes] == [ref.tags(b) for b in ref.indexes]
        assert (m.scales, m.offsets, m.units, m.nodata) == (ref.scales, ref.offsets, ref.units, ref.nodata)
        assert list(m.descriptions) == STEPS
    item = json.loads(download_blob(storage, app_env.output, f"mosaics/{summary['job_id']}/item.json"))
    assert [band["name"] for band in item["assets"]["data"]["eo:bands"]] == STEPS
    # The same file with no variable named fails once, as bad input naming the variables, with no tile.
    assert refused["status"] == "failed" and refused["windows"] is None, refused
    assert "several data variables (tas, pr)" in refused["error"]
    # A file naming another fails once, as bad input naming the member, with no tile.
    assert hostile["status"] == "failed" and hostile["windows"] is None, hostile
    assert "'stolen' is a virtual dataset" in hostile["error"]
    tiles = storage.blob_service().get_container_client(app_env.tiles)
    for job in (refused, hostile):
        assert not list(tiles.list_blobs(name_starts_with=f"tiles/{job['job_id']}/"))


@pytest.mark.slow
@pytest.mark.parametrize("k", [3, 10])
def test_seeded_read_faults_on_netcdf_copies_make_no_wrong_pixel_nor_bad_input(
    storage, app_env, azurite, monkeypatch, tmp_path, k
):
    """1 in ``k`` of the upload's GETs refused, reset or cut (tests/test_seeded_read_faults.py's
    proxy and seed), on jobs of netCDF-4 and classic files: a job fails only as a storage fault,
    and completes when its upload is delivered again; every tile is its window of the variable."""
    from devhost.session import job_summary, process_file
    from testkit.storage_proxy import FaultPlan

    from .fault_jobs import app_behind_proxy
    from .test_seeded_read_faults import BAD_INPUT_TYPES, upload_gets

    sources = [
        write_netcdf(tmp_path / f"{kind}.nc", width=WIDTH, height=HEIGHT, kind=kind) for kind in ("netcdf4", "classic")
    ]
    plan = FaultPlan(every=k, applies=upload_gets(app_env), seed=k)
    wrong, injected, failed_first = [], 0, 0
    with app_behind_proxy(azurite, monkeypatch, plan) as (blobs, _), local_host(app_env) as host:
        for source in sources:
            summary = process_file(host, source, name=f"k{k}/{source.name}", timeout=300)
            if summary["status"] != "completed":
                error = summary.get("error", "")
                assert not any(f"({t})" in error for t in BAD_INPUT_TYPES), f"a storage fault called bad input: {error}"
                failed_first += 1
                host.deliver_blob_created(f"k{k}/{source.name}")
                summary = job_summary(host.engine.wait_for(summary["job_id"], timeout=300))
            assert summary["status"] == "completed", summary
            with rasterio.open(f'NETCDF:"{source}":tas') as src:
                for window in plan_windows(src.width, src.height, SETTINGS.window_size):
                    tile = download_blob(storage, app_env.tiles, f"tiles/{summary['job_id']}/{window.id}.tif")
                    with rasterio.MemoryFile(tile) as memory, memory.open() as decoded:
                        want = src.read(
                            window=rasterio.windows.Window(window.col_off, window.row_off, window.width, window.height)
                        )
                        if not np.array_equal(decoded.read(), want):
                            wrong.append((source.name, window.id))
        injected = sum(blobs.injected.values())
    print(f"\n1 in {k}: injected {dict(blobs.injected)}, jobs failed first {failed_first}, wrong tiles {wrong}")
    assert injected > 0 and wrong == []


def test_a_web_optimized_netcdf_job_warps_the_variable_as_the_same_job_of_its_geotiff(
    new_container, new_table, tmp_path
):
    """The warp opens its source again by name (reading/warp.py), after the copy's path is gone:
    the job's mosaic is the one the same job makes of the variable saved as a GeoTIFF."""
    source = write_netcdf(tmp_path / "warped.nc", width=WIDTH, height=HEIGHT)
    geotiff = tmp_path / "warped.tif"
    rasterio.shutil.copy(f'NETCDF:"{source}":tas', geotiff, driver="GTiff", TILED="YES")
    spec = OutputSpec.with_choice(
        SETTINGS.window_size, profiles.choose("default", {"web_optimized": "true"}, where="t")
    )
    mosaics = []
    for path in (source, geotiff):
        kind = path.suffix[1:]
        stores = {
            "tiles": new_container(f"tiles{kind}-"),
            "output": new_container(f"out{kind}-"),
            "manifest": new_table(f"manifest{kind}"),
        }
        mosaic, _ = run_library_job(str(path), spec, stores, tmp_path / kind)
        with rasterio.open(mosaic) as m:
            mosaics.append((m.read(), m.transform, m.crs))
    assert np.array_equal(mosaics[0][0], mosaics[1][0]) and mosaics[0][1:] == mosaics[1][1:]
    assert mosaics[0][2].to_epsg() == 3857


def test_a_plain_hdf5_file_following_cf_becomes_the_cog_gdal_makes_of_it(stores, tmp_path):
    """No netCDF-4 bookkeeping, no GDAL attribute: the CRS and grid come from CF's grid_mapping
    variable and the coordinate variables, as GDAL's netCDF driver reads them."""
    source = netcdf_scenes.write_cf_hdf5(tmp_path / "sst.h5", width=WIDTH, height=HEIGHT)
    mosaic, item = run_library_job(str(source), spec_naming(None), stores, tmp_path)
    reference = gdal_translate_cog(f'NETCDF:"{source}":sst', tmp_path / "reference.tif")
    with rasterio.open(mosaic) as m, rasterio.open(reference) as ref:
        assert np.array_equal(m.read(), ref.read()) and m.transform == ref.transform and m.crs == ref.crs
        assert m.transform.c == 500000 and m.transform.f == 4000000 and m.crs.to_epsg() in (None, 32633)
        assert [m.tags(b) for b in m.indexes] == [ref.tags(b) for b in ref.indexes]
        assert (m.scales, m.offsets, m.units, m.nodata) == (ref.scales, ref.offsets, ref.units, ref.nodata)
        assert (m.scales, m.units, m.nodata) == ((0.01,), ("degC",), -1.0)
    assert [band["name"] for band in item["assets"]["data"]["eo:bands"]] == ["sst"]  # named by its variable
    raster_bands = item["assets"]["data"]["raster:bands"]
    assert [(b["scale"], b["unit"], b["nodata"]) for b in raster_bands] == [(0.01, "degC", -1.0)]


def test_a_copy_larger_than_its_budget_is_refused_before_its_download(new_container, monkeypatch, tmp_path):
    source = write_netcdf(tmp_path / "big.nc", width=WIDTH, height=HEIGHT)
    uploads = new_container("up-")
    with source.open("rb") as data:
        uploads.upload_blob("big.nc", data)
    blob = uploads.get_blob_client("big.nc")
    monkeypatch.setattr(
        netcdf, "MAX_LOCAL_COPY_BYTES", source.stat().st_size - 1
    )  # the limit, lowered for a small file
    upload = PinnedBlob(blob, blob.get_blob_properties().etag)
    with pytest.raises(
        UnsupportedRasterError, match=f"of {source.stat().st_size} bytes.*at most {source.stat().st_size - 1}"
    ):
        inspect_source(upload, settings=SETTINGS, spec=spec_naming(None))
    assert upload.requests == 1  # the pinned GET of the first 64 KiB, which gave the size: nothing more
    monkeypatch.setattr(netcdf, "MAX_LOCAL_COPY_BYTES", source.stat().st_size)
    upload = PinnedBlob(blob, blob.get_blob_properties().etag)
    assert inspect_source(upload, settings=SETTINGS, spec=spec_naming(None)).count == 3


def test_a_dataset_needing_an_hdf5_filter_plugin_is_refused_before_gdal_opens_it(tmp_path):
    source = netcdf_scenes.add_plugin_filtered_dataset(write_netcdf(tmp_path / "plugin.nc", width=WIDTH, height=HEIGHT))
    with pytest.raises(
        UnsupportedRasterError, match=f"'squeezed' is compressed with HDF5 filter {netcdf_scenes.PLUGIN_FILTER}"
    ):
        inspect_source(str(source), settings=SETTINGS, spec=spec_naming("tas"))


def test_the_copy_budget_lets_host_json_s_activities_copy_at_once_within_the_temporary_disk():
    from tilecommit.raster.reading.budgets import TEMPORARY_DISK_BYTES

    host = json.loads((Path(__file__).resolve().parent.parent / "host.json").read_text())
    slots = host["extensions"]["durableTask"]["maxConcurrentActivityFunctions"]
    assert netcdf.MAX_LOCAL_COPY_BYTES * slots <= TEMPORARY_DISK_BYTES < netcdf.MAX_LOCAL_COPY_BYTES * (slots + 1)


def test_an_hdf5_file_of_more_objects_than_the_walk_allows_is_refused_not_walked(tmp_path, monkeypatch):
    source = write_netcdf(tmp_path / "many.nc", width=WIDTH, height=HEIGHT)  # 5 members: tas, time, x, y, the CRS
    monkeypatch.setattr(netcdf, "MAX_HDF5_OBJECTS", 4)  # the limit, lowered for a small file
    with pytest.raises(UnsupportedRasterError, match="more than 4 HDF5 objects and links"):
        inspect_source(str(source), settings=SETTINGS, spec=spec_naming(None))
    monkeypatch.setattr(netcdf, "MAX_HDF5_OBJECTS", 5)
    assert inspect_source(str(source), settings=SETTINGS, spec=spec_naming(None)).count == 3


@pytest.mark.parametrize("kind", ["classic", "64bit", "netcdf4"])
def test_a_truncated_netcdf_is_refused_as_corrupt_before_any_tile(kind, stores, tmp_path):
    """The netCDF library reads a classic file cut short as if the rest were unwritten (fill
    values): its length is checked against what its header declares, which is the whole file."""
    whole = write_netcdf(tmp_path / f"{kind}.nc", width=WIDTH, height=HEIGHT, kind=kind).read_bytes()
    if kind != "netcdf4":
        assert netcdf.classic_data_end(whole, "whole") == len(whole)
    cut = tmp_path / f"cut-{kind}.nc"
    cut.write_bytes(whole[: len(whole) * 2 // 3])
    with pytest.raises(InvalidRasterError, match="is truncated|structure cannot be read"):
        inspect_source(str(cut), settings=SETTINGS, spec=spec_naming(None))
    assert blob_names(stores["tiles"]) == []


def test_a_scrub_of_a_netcdf_job_reads_the_job_s_own_variable(stores, tmp_path):
    """The scrub opens the upload as the render did (the spec's variable): no difference; the same
    tiles checked against the file's other variable all differ (the control)."""
    from tilecommit.raster.scrub import check_window

    source = str(write_netcdf(tmp_path / "two.nc", width=WIDTH, height=HEIGHT, variables=("tas", "pr")))
    run_library_job(source, spec_naming("pr"), stores, tmp_path)
    windows = plan_windows(WIDTH, HEIGHT, SETTINGS.window_size)
    for variable, differs in (("pr", False), ("tas", True)):
        job = job_of(SETTINGS, spec=spec_naming(variable))
        reports = [check_window(job, job_stores(stores, SETTINGS), source, window) for window in windows]
        assert [bool(report.differences) for report in reports] == [differs] * len(windows), reports


def test_opens_of_one_version_at_once_in_a_process_read_one_copy(new_container, tmp_path):
    """A window opened while another of the same version is open reads that copy (no download);
    once none is open, the next open downloads its own."""
    import gc

    source = write_netcdf(tmp_path / "shared.nc", width=WIDTH, height=HEIGHT)
    uploads = new_container("up-")
    with source.open("rb") as data:
        uploads.upload_blob("shared.nc", data)
    blob = uploads.get_blob_client("shared.nc")
    etag = blob.get_blob_properties().etag

    def opened() -> tuple:
        upload = PinnedBlob(blob, etag)
        return open_upload(upload, variable="tas"), upload

    (first, first_reader), (second, second_reader) = opened(), opened()
    assert (first_reader.requests, second_reader.requests) == (2, 1)  # the size, then the copy; the size alone
    assert np.array_equal(first.read(), second.read())
    first.close()
    del first
    gc.collect()
    third, third_reader = opened()  # the second still reads the copy
    assert third_reader.requests == 1 and np.array_equal(second.read(), third.read())
    second.close()
    third.close()
    closed_but_alive, closed_reader = opened()  # closed datasets whose objects live on hold nothing open
    assert closed_reader.requests == 2
    closed_but_alive.close()
    del second, third, closed_but_alive
    gc.collect()
    assert netcdf._LIVE == {}
    fourth, fourth_reader = opened()
    assert fourth_reader.requests == 2
    fourth.close()
