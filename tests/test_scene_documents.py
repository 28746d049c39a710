"""Scenes made of several files: a scene document (a STAC item or a tilecommit:scene list) naming
band files beside it, stacked into one COG as ``gdalbuildvrt -separate -r <kernel>`` then
``gdal_translate -of COG`` make it, every member read at its own ETag.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import rasterio
import rasterio.shutil
from rasterio.io import MemoryFile

from devhost.session import job_summary
from testkit.band_files import TRIO, scene_list, write_band, write_trio_document
from testkit.storage_proxy import FaultPlan, RecordingProxy, TrapServer
from tilecommit.errors import BadInputError, SourceChangedError, UnsupportedRasterError
from tilecommit.jobs import Job, SceneMember, job_id_for
from tilecommit.raster import inspect_source
from tilecommit.raster.env import gdal_env
from tilecommit.raster.reading.scene_document import open_any_upload, pin_members
from tilecommit.raster.reading.source import LocalFile, PinnedBlob
from tilecommit.scene_documents import MAX_DOCUMENT_BYTES, MAX_MEMBERS, parse_document
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec
from tilecommit.storage import StorageConnection

from .app_jobs import download, local_host
from .fault_jobs import app_behind_proxy
from .test_seeded_read_faults import BAD_INPUT_TYPES, upload_gets

SETTINGS = Settings(window_size=256)
SPEC = OutputSpec.from_settings(SETTINGS)
NAMES = [name for name, _, _ in TRIO]


# -- the document ------------------------------------------------------------------------------


def test_both_forms_name_members_beside_the_document_in_order(tmp_path):
    document = write_trio_document(tmp_path, stac=True, resampling="bilinear")
    parsed = parse_document("s2/tile/scene.json", document.read_bytes())
    assert [b.blob for b in parsed.bands] == ["s2/tile/B04.tif", "s2/tile/B8A.tif", "s2/tile/B01.tif"]
    assert [b.name for b in parsed.bands] == NAMES and parsed.bands[0].description == "red, 10 m"
    assert parsed.resampling == "bilinear"  # the thumbnail's URL is no member, never read
    listed = parse_document("scene.json", scene_list(["b/B04.tif", "B01.tif"]))
    assert [(b.blob, b.name) for b in listed.bands] == [("b/B04.tif", "B04.tif"), ("B01.tif", "B01.tif")]
    assert listed.resampling == "nearest"


HOSTILE = {
    "another container": "../other-container/B04.tif",
    "a dot-dot segment": "bands/../../B04.tif",
    "an http URL": "http://127.0.0.1:1/B04.tif",
    "a vsicurl path": "/vsicurl/http://127.0.0.1:1/B04.tif",
    "an absolute path": "/etc/passwd",
    "another account": "https://other.blob.core.windows.net/c/B04.tif",
    "a file URL": "file:///etc/passwd",
    "percent-encoded dots": "%2e%2e/B04.tif",
    "a backslash": "..\\B04.tif",
    "a dot segment": "./B04.tif",
    "an empty segment": "a//B04.tif",
}


@pytest.mark.parametrize("what", sorted(HOSTILE))
def test_a_member_outside_the_documents_folder_is_refused(what):
    with pytest.raises(UnsupportedRasterError, match="accepted: a scene document") as caught:
        parse_document("scene.json", scene_list(["B01.tif", HOSTILE[what]]))
    assert repr(HOSTILE[what]) in str(caught.value)


def test_too_many_members_or_bytes_and_other_json_are_refused():
    with pytest.raises(UnsupportedRasterError, match=f"names 10000 members; accepted: .* 1 to {MAX_MEMBERS}"):
        parse_document("scene.json", scene_list([f"b{i}.tif" for i in range(10_000)]))
    with pytest.raises(UnsupportedRasterError, match=f"of {MAX_DOCUMENT_BYTES + 1} bytes"):
        parse_document("scene.json", b"{" + b" " * MAX_DOCUMENT_BYTES, MAX_DOCUMENT_BYTES + 1)
    for body in (b'{"type": "Feature", "assets": {}}', b'{"tile_matrix": "x"}', b"[" * 100_000, b"{nope"):
        with pytest.raises(UnsupportedRasterError, match="accepted: a scene document"):
            parse_document("scene.json", body)
    with pytest.raises(UnsupportedRasterError, match="resampling 'cubic'; accepted: nearest, bilinear"):
        parse_document("scene.json", scene_list(["B01.tif"], resampling="cubic"))


def test_the_job_id_covers_every_members_version_and_a_single_files_is_unchanged():
    url = "https://acct.blob.core.windows.net/raster-uploads/s/scene.json"
    single = job_id_for(url, "0x1", SPEC)
    members = [(url.replace("scene.json", "B04.tif"), "0xA"), (url.replace("scene.json", "B01.tif"), "0xB")]
    stacked = job_id_for(url, "0x1", SPEC, members)
    assert stacked != single and job_id_for(url, "0x1", SPEC, []) == single
    assert job_id_for(url, "0x1", SPEC, [members[0], (members[1][0], "0xC")]) != stacked
    assert job_id_for(url, "0x1", SPEC, [members[0], (members[1][0], None)]) not in (stacked, single)
    job = Job.for_upload("s/scene.json", url, '"0x1"', 10, SETTINGS, None, [SceneMember("s/B04.tif", url, '"0xA"')])
    assert Job.from_dict(json.loads(json.dumps(job.to_dict()))) == job and job.members[0].etag == "0xA"
    assert "members" not in Job.for_upload("a.tif", url, "0x1", 10, SETTINGS).to_dict()


# -- the stack against gdalbuildvrt ------------------------------------------------------------


def reference(folder: Path, kernel: str) -> tuple[np.ndarray, np.ndarray]:
    """The trio as ``gdalbuildvrt -separate -resolution highest -r kernel`` (Debian's gdal-bin)
    stacks it, then made a COG by ``gdal_translate -of COG`` and by rasterio's own GDAL."""
    members = [str(folder / f"{name}.tif") for name in NAMES]
    vrt, cog, ours = folder / "ref.vrt", folder / "ref.tif", folder / "ref-rasterio.tif"
    subprocess.run(["gdalbuildvrt", "-q", "-separate", "-resolution", "highest", "-r", kernel, str(vrt), *members],
                   check=True)  # fmt: skip
    subprocess.run(["gdal_translate", "-q", "-of", "COG", str(vrt), str(cog)], check=True)
    rasterio.shutil.copy(vrt, ours, driver="COG")
    with rasterio.open(cog) as a, rasterio.open(ours) as b:
        return a.read(), b.read()


def test_the_stack_is_gdalbuildvrt_separate_of_the_members_window_by_window(tmp_path):
    for kernel in ("nearest", "bilinear"):
        document = write_trio_document(tmp_path / kernel, resampling=kernel)
        scene = inspect_source(str(document), settings=SETTINGS, spec=SPEC)
        assert (scene.width, scene.height, scene.count, scene.descriptions) == (1200, 900, 3, NAMES)
        debian, own = reference(tmp_path / kernel, kernel)
        np.testing.assert_array_equal(debian, own)
        with gdal_env(SETTINGS), open_any_upload(LocalFile(document)) as stack:
            rows = []
            for row in range(0, stack.height, 256):
                cells = [stack.read(window=((row, row + 256), (col, col + 256))) for col in range(0, stack.width, 256)]
                rows.append(np.concatenate(cells, axis=2))
        np.testing.assert_array_equal(np.concatenate(rows, axis=1), debian)


def test_members_that_do_not_stack_are_refused_with_the_reason(tmp_path):
    cases = {
        "another CRS": (dict(crs="EPSG:32634"), "on another CRS"),
        "a 15 m grid": (dict(pixel=15.0), "not a whole multiple"),
        "an origin off the grid": (dict(origin=(300005.0, 5000040.0)), "not on the finest member's grid"),
    }
    for what, (change, reason) in cases.items():
        folder = tmp_path / what.replace(" ", "-")
        folder.mkdir()
        write_band(folder / "B04.tif", 300, 300, 10.0, seed=1)
        options = {"pixel": 20.0, **change}
        pixel = options.pop("pixel")
        write_band(folder / "B8A.tif", 150, 150, pixel, seed=2, **options)
        (folder / "scene.json").write_bytes(scene_list(["B04.tif", "B8A.tif"]))
        with pytest.raises(UnsupportedRasterError, match=reason):
            inspect_source(str(folder / "scene.json"), settings=SETTINGS, spec=SPEC)


# -- hostile documents on storage: nothing but the document is asked for -----------------------


def test_hostile_documents_are_refused_reading_the_document_alone(tmp_path, new_container, azurite):
    uploads, other = new_container("up-"), new_container("other-")
    write_band(tmp_path / "B04.tif", 300, 300, 10.0, seed=1)
    for container in (uploads, other):
        container.upload_blob("s/B04.tif", (tmp_path / "B04.tif").read_bytes())
    with TrapServer() as trap:
        documents = {
            "other-container.json": scene_list(["B04.tif", f"../../{other.container_name}/s/B04.tif"]),
            "url.json": scene_list(["B04.tif", f"{trap.url}/B04.tif"]),
            "dotdot.json": scene_list(["B04.tif", "../s/B04.tif"]),
            "many.json": scene_list(["B04.tif"] * 10_000),
        }
        for name, body in documents.items():
            uploads.upload_blob(f"s/{name}", body)
        with RecordingProxy(azurite.blob_endpoint.rsplit("/", 1)[0]) as proxy:
            proxied = azurite.connection_string.replace(f":{azurite.blob_port}/", f":{proxy.port}/")
            through = StorageConnection.from_connection_string(proxied).blob_service()
            for name in documents:
                del proxy.requests[:]
                blob = through.get_container_client(uploads.container_name).get_blob_client(f"s/{name}")
                started = time.perf_counter()
                with pytest.raises(BadInputError, match="accepted: a scene document"):
                    inspect_source(PinnedBlob(blob, blob.get_blob_properties().etag), settings=SETTINGS, spec=SPEC)
                assert time.perf_counter() - started < 2.0, name
                asked = {p.split("?")[0] for p in proxy.paths()}
                assert [p.split("/", 2)[2] for p in asked] == [f"{uploads.container_name}/s/{name}"], (name, asked)
        assert trap.requests == []


# -- whole jobs on the local host -------------------------------------------------------------


def upload_folder(storage, app_env, folder: Path, prefix: str, names: list[str]) -> None:
    container = storage.blob_service().get_container_client(app_env.input)
    for name in names:
        container.upload_blob(f"{prefix}/{name}", (folder / name).read_bytes(), overwrite=True)


def run_document(host, storage, app_env, folder: Path, prefix: str, timeout: float = 300) -> dict:
    """Upload ``folder``'s scene.json as ``prefix/scene.json``; the summary of the job it starts."""
    blob = storage.blob_service().get_blob_client(app_env.input, f"{prefix}/scene.json")
    before = len(host.decisions)
    blob.upload_blob((folder / "scene.json").read_bytes(), overwrite=True)
    deadline = time.monotonic() + timeout
    while True:
        job_id = next((d["job_id"] for d in host.decisions[before:] if d["blob"] == blob.blob_name), None)
        if job_id is not None and host.engine.status(job_id) is not None:
            break
        assert time.monotonic() < deadline, host.decisions
        time.sleep(0.1)
    return job_summary(host.engine.wait_for(job_id, timeout=timeout))


def check_stacked_outputs(storage, app_env, summary: dict, folder: Path, kernel: str) -> None:
    assert summary["status"] == "completed", summary
    mosaic = download(storage, app_env.output, f"mosaics/{summary['job_id']}/mosaic.tif")
    debian, _ = reference(folder, kernel)
    with MemoryFile(mosaic) as memory, memory.open() as src, rasterio.open(folder / "ref.tif") as translated:
        np.testing.assert_array_equal(src.read(), debian)
        assert list(src.descriptions) == NAMES  # where we differ: gdalbuildvrt names no band
        assert (src.crs, src.transform, src.dtypes, src.nodata) == (
            translated.crs,
            translated.transform,
            translated.dtypes,
            translated.nodata,
        )
        assert src.colorinterp == translated.colorinterp
    item = json.loads(download(storage, app_env.output, f"mosaics/{summary['job_id']}/item.json"))
    assert [b["name"] for b in item["assets"]["data"]["eo:bands"]] == NAMES
    assert [b["description"] for b in item["assets"]["data"]["eo:bands"]] == [d for _, d, _ in TRIO]


def test_a_scene_document_through_the_local_host_equals_gdalbuildvrt_then_gdal_translate(storage, app_env, tmp_path):
    document = write_trio_document(tmp_path, stac=True, resampling="bilinear")
    with local_host(app_env) as host:
        upload_folder(storage, app_env, tmp_path, "s2", [f"{n}.tif" for n in NAMES])
        summary = run_document(host, storage, app_env, document.parent, "s2")
    check_stacked_outputs(storage, app_env, summary, tmp_path, "bilinear")


def test_a_missing_member_fails_the_job_once_naming_it_and_the_documents_reupload_starts_it(storage, app_env, tmp_path):
    document = write_trio_document(tmp_path)
    with local_host(app_env) as host:
        upload_folder(storage, app_env, tmp_path, "s2", ["B04.tif", "B8A.tif"])
        failed = run_document(host, storage, app_env, document.parent, "s2")
        assert failed["status"] == "failed" and "s2/B01.tif" in failed["error"], failed
        assert "(InvalidRasterError)" in failed["error"] and "B04" not in failed["error"], failed
        tiles = storage.blob_service().get_container_client(app_env.tiles)
        assert not list(tiles.list_blobs(name_starts_with=f"tiles/{failed['job_id']}/"))
        upload_folder(storage, app_env, tmp_path, "s2", ["B01.tif"])
        summary = run_document(host, storage, app_env, document.parent, "s2")
    assert summary["job_id"] != failed["job_id"]
    check_stacked_outputs(storage, app_env, summary, tmp_path, "nearest")


@pytest.mark.parametrize("k", [10])
def test_seeded_read_faults_on_members_make_no_wrong_pixel_nor_bad_input(storage, app_env, azurite, monkeypatch,
                                                                         tmp_path, k):  # fmt: skip
    document = write_trio_document(tmp_path, seed=7, width=768, height=768)
    plan = FaultPlan(every=k, applies=upload_gets(app_env), seed=k)
    with app_behind_proxy(azurite, monkeypatch, plan) as (blobs, _), local_host(app_env) as host:
        upload_folder(storage, app_env, tmp_path, "s2", [f"{n}.tif" for n in NAMES])
        summary = run_document(host, storage, app_env, document.parent, "s2")
        for _ in range(5):
            if summary["status"] == "completed":
                break
            error = summary.get("error", "")
            assert not any(f"({t})" in error for t in BAD_INPUT_TYPES), f"a storage fault called bad input: {error}"
            host.deliver_blob_created("s2/scene.json")
            summary = job_summary(host.engine.wait_for(summary["job_id"], timeout=300))
    print(f"\n1 in {k}: {summary['status']}, injected {dict(blobs.injected)}")
    assert sum(blobs.injected.values()) > 0
    check_stacked_outputs(storage, app_env, summary, tmp_path, "nearest")


def test_a_member_overwritten_after_the_job_started_is_source_changed(tmp_path, new_container):
    """Every member is read at the ETag the job was started with, as the upload is."""
    uploads = new_container("up-")
    document = write_trio_document(tmp_path)
    members = []
    for name in [*NAMES, "scene"]:
        path = tmp_path / (f"{name}.tif" if name != "scene" else "scene.json")
        etag = uploads.upload_blob(f"s/{path.name}", path.read_bytes())
        blob = uploads.get_blob_client(f"s/{path.name}")
        members.append(SceneMember(blob.blob_name, blob.url, etag.get_blob_properties().etag))
    *bands, scene = members
    upload = PinnedBlob(uploads.get_blob_client(scene.blob), scene.etag)
    pin_members(upload, bands, uploads.get_blob_client)
    assert inspect_source(upload, settings=SETTINGS, spec=SPEC).count == 3
    write_band(tmp_path / "other.tif", 200, 150, 60.0, seed=99)
    uploads.upload_blob("s/B01.tif", (tmp_path / "other.tif").read_bytes(), overwrite=True)
    upload = PinnedBlob(uploads.get_blob_client(scene.blob), scene.etag)
    pin_members(upload, bands, uploads.get_blob_client)
    with pytest.raises(SourceChangedError, match="s/B01.tif' was overwritten"):
        inspect_source(upload, settings=SETTINGS, spec=SPEC)
    assert document.exists()


def test_hostile_documents_fail_their_jobs_with_no_tile_and_no_request_but_the_document(
    storage, app_env, azurite, monkeypatch
):
    documents = {
        "h/other-container.json": scene_list(["B04.tif", "../../other/B04.tif"]),
        "h/url.json": scene_list(["B04.tif", "http://127.0.0.1:9/B04.tif"]),
        "h/dotdot.json": scene_list(["../B04.tif"]),
        "h/many.json": scene_list(["B04.tif"] * 10_000),
    }
    plan = FaultPlan(every=0, applies=upload_gets(app_env), seed=0)
    uploads = storage.blob_service().get_container_client(app_env.input)
    with app_behind_proxy(azurite, monkeypatch, plan) as (blobs, _), local_host(app_env) as host:
        for name, body in documents.items():
            uploads.upload_blob(name, body)
        summaries = {}
        for name in documents:
            while not [d for d in host.decisions if d["blob"] == name and d.get("job_id")]:
                time.sleep(0.1)
            job_id = next(d["job_id"] for d in host.decisions if d["blob"] == name)
            summaries[name] = job_summary(host.engine.wait_for(job_id, timeout=120))
    for name, summary in summaries.items():
        assert summary["status"] == "failed" and "(UnsupportedRasterError)" in summary["error"], (name, summary)
        assert "accepted: a scene document" in summary["error"]
    tiles = storage.blob_service().get_container_client(app_env.tiles)
    assert not list(tiles.list_blobs(name_starts_with="tiles/"))
    asked = {path.split("?")[0].split("/", 3)[3] for method, path in blobs.requests if f"/{app_env.input}/" in path}
    assert asked == set(documents), asked
