"""Whole jobs whose mosaic is staged in shares (TILECOMMIT_ASSEMBLY_SHARE_MB=1 makes the 1100 x 800
test scene, about 3.6 MB of tiles, several shares), on the local host through the real Durable
SDK, Azurite 3.37 and real GeoTIFFs. The app's blob traffic goes through a recording proxy
(testkit/storage_proxy.py), so what each request carried is read from the wire."""

from __future__ import annotations

import base64
import time
from collections import Counter
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from devhost.session import process_file
from orchestrators import names
from testkit.storage_proxy import RecordingProxy
from tilecommit import conditional, jobs
from tilecommit import settings as setting_names
from tilecommit.manifest import count_manifest
from tilecommit.raster import SceneInfo, assemble_mosaic
from tilecommit.raster.assembly import attempt
from tilecommit.raster.assembly.coarse_levels import level_rows
from tilecommit.settings import Settings
from tilecommit.stores import JobStores

from .app_jobs import check_outputs, local_host, make_scene, serve, stop_host, upload_until_killed, wait_for_state

pytestmark = pytest.mark.slow

SHARE_MB = "1"
#: The window whose tile is replaced in the middle of an assembly.
REPLACED = "0001_0002"


class HookedProxy(RecordingProxy):
    """Records every request; after storage carried out the first one ``when(method, path)``
    selects, runs ``then()`` before the client gets its answer."""

    def __init__(self, target: str, when=None, then=None):
        super().__init__(target)
        self.when, self.then, self.fired = when, then, False

    def send_upstream(self, request, body):
        answer = super().send_upstream(request, body)
        if self.when is not None and not self.fired and self.when(request.command, request.path):
            self.fired = True
            self.then()
        return answer


def run_job(app_env, azurite, monkeypatch, scene: Path, proxy: HookedProxy, **host_options):
    """One job on an in-process host whose blob requests go through ``proxy``; (summary, executions)."""
    monkeypatch.setenv(setting_names.SETTING_ASSEMBLY_SHARE, SHARE_MB)
    connection = azurite.connection_string.replace(f":{azurite.blob_port}/", f":{proxy.port}/")
    monkeypatch.setenv(setting_names.STORAGE_CONNECTION, connection)
    host = local_host(app_env, **host_options)
    host.start()
    try:
        summary = process_file(host, scene, timeout=300)
    finally:
        host.stop()
        monkeypatch.setenv(setting_names.STORAGE_CONNECTION, azurite.connection_string)
    executions = [e for e in host.engine.executions if e.instance_id.startswith(summary["job_id"])]
    return summary, executions


def mosaic_requests(proxy: RecordingProxy, job_id: str, comp: str) -> list[tuple[str, str, dict]]:
    name = jobs.mosaic_blob_name(job_id)
    return [r for r in proxy.sent if r[0] == "PUT" and f"/{name}?" in r[1] and f"comp={comp}" in r[1]]


def block_id(path: str) -> str:
    """The block id a Put Block request names (base64 in its query)."""
    return base64.b64decode(parse_qs(urlsplit(path).query)["blockid"][0]).decode()


def commits_carried_out(proxy: RecordingProxy, job_id: str) -> list[int]:
    name = jobs.mosaic_blob_name(job_id)
    return [s for m, p, s in proxy.carried_out if m == "PUT" and f"/{name}?" in p and "comp=blocklist" in p]


@pytest.mark.parametrize("duplicates", [False, True], ids=["once", "every-activity-twice-at-once"])
def test_a_large_mosaic_is_staged_in_shares_committed_once_and_equals_the_one_activity_mosaic(
    storage, azurite, app_env, monkeypatch, tmp_path, duplicates
):
    scene = make_scene(tmp_path / "scene.tif", 1100, 800)
    with HookedProxy(f"http://127.0.0.1:{azurite.blob_port}") as proxy:
        summary, executions = run_job(app_env, azurite, monkeypatch, scene, proxy, duplicate_activities=duplicates)
    check_outputs(storage, app_env, summary, scene)  # pixel-exact against the source
    job_id = summary["job_id"]
    runs = Counter(e.name for e in executions)
    tasks = Counter(name for name, _ in {(e.name, e.task_id) for e in executions})
    planned = next(e.result["shares"] for e in executions if e.name == names.PLAN_MOSAIC_SHARES)
    assert planned["shares"] >= 3
    assert (tasks[names.PLAN_MOSAIC_SHARES], tasks[names.ASSEMBLE_MOSAIC]) == (1, 1)
    assert tasks[names.STAGE_MOSAIC_SHARE] == planned["shares"]
    per_task = 2 if duplicates else 1  # executions of each task, at least (a retry adds one)
    assert all(runs[name] >= tasks[name] * per_task for name in tasks)
    print(f"\n{planned['shares']} shares of {planned['ranges']} ranges, {planned['copied_bytes']} bytes; runs {runs}")

    # Every range request on the wire carries the source If-Match of its tile's manifest row, or
    # of its intermediate's: the service copies the reduction tree's blocks too.
    manifest = storage.table_service().get_table_client(app_env.manifest)
    rows = {r.uri: r.etag for r in count_manifest(manifest, job_id).entries.values()}
    levels = {r.uri: r.etag for r in level_rows(manifest, job_id).values()}
    assert len(levels) == tasks[names.REDUCE_LEVEL_NODE] and not rows.keys() & levels.keys()
    rows.update(levels)
    copies = [r for r in mosaic_requests(proxy, job_id, "block") if "x-ms-copy-source" in r[2]]
    assert len(copies) >= planned["ranges"] * per_task
    assert {block_id(r[1]) for r in copies} == {attempt.block_id(planned["tag"], i) for i in range(planned["ranges"])}
    sources = set()
    for _, _, headers in copies:
        tile = headers["x-ms-copy-source"].split("?", 1)[0].split(f"/{app_env.tiles}/", 1)[1]
        assert headers["x-ms-source-if-match"] == rows[tile], tile
        sources.add(tile)
    assert levels.keys() <= sources  # every intermediate was copied from
    # One commit created the mosaic; a duplicate's, if it got that far, was refused.
    statuses = commits_carried_out(proxy, job_id)
    assert statuses.count(201) == 1 and all(s == 409 for s in statuses if s != 201), statuses

    # The same tiles assembled by the one activity: the same bytes, the same metadata.
    output = storage.blob_service().get_container_client(app_env.output)
    mosaic = output.get_blob_client(jobs.mosaic_blob_name(job_id))
    split_bytes, split_metadata = mosaic.download_blob().readall(), mosaic.get_blob_properties().metadata
    for name in (jobs.mosaic_blob_name(job_id), jobs.stac_blob_name(job_id), jobs.quicklook_blob_name(job_id)):
        output.delete_blob(name)
    payload = next(e.input for e in executions if e.name == names.PLAN_MOSAIC_SHARES)
    job = payload["job"]
    stores = JobStores(
        tiles=storage.blob_service().get_container_client(app_env.tiles),
        output=output,
        manifest=storage.table_service().get_table_client(app_env.manifest),
        settings=Settings.from_env(),
    )
    single = assemble_mosaic(jobs.Job.from_dict(job), stores, SceneInfo.from_dict(payload["scene"]), method="server")
    assert (single.outcome, single.transfer["shares"]) == ("written", 1)
    assert mosaic.download_blob().readall() == split_bytes
    # The same metadata, but for each commit's own write id.
    written_by = conditional.WRITE_ID_KEY
    assert {k: v for k, v in mosaic.get_blob_properties().metadata.items() if k != written_by} == {
        k: v for k, v in split_metadata.items() if k != written_by
    }


def test_a_tile_replaced_mid_assembly_fails_the_job_naming_the_window_and_commits_nothing(
    storage, azurite, app_env, monkeypatch, tmp_path
):
    """The tile is overwritten with its own bytes (new ETag) the moment the plan is stored, before
    any share starts: its share's pinned copy is refused and the job fails naming the window."""
    scene = make_scene(tmp_path / "scene.tif", 1100, 800)
    tiles = storage.blob_service().get_container_client(app_env.tiles)

    def replace_tile() -> None:
        (tile,) = [b.name for b in tiles.list_blobs(name_starts_with="tiles/") if b.name.endswith(f"/{REPLACED}.tif")]
        blob = tiles.get_blob_client(tile)
        blob.upload_blob(blob.download_blob().readall(), overwrite=True)

    with HookedProxy(
        f"http://127.0.0.1:{azurite.blob_port}",
        when=lambda method, path: method == "PUT" and "/plans/" in path,
        then=replace_tile,
    ) as proxy:
        summary, executions = run_job(app_env, azurite, monkeypatch, scene, proxy)
    assert proxy.fired
    assert summary["status"] == "failed", summary
    assert f"window {REPLACED}" in summary["error"] and "changed after its manifest row" in summary["error"]
    assert "nothing was committed" in summary["error"]
    job_id = summary["job_id"]
    assert commits_carried_out(proxy, job_id) == []
    assert not storage.blob_service().get_blob_client(app_env.output, jobs.mosaic_blob_name(job_id)).exists()
    assert not any(e.name == names.ASSEMBLE_MOSAIC for e in executions)


def test_a_host_killed_while_staging_shares_completes_the_job_on_a_restarted_host(
    storage, app_env, monkeypatch, tmp_path
):
    """SIGKILL of the host process at its 6th staged range (in the shares, before any commit); a
    fresh host on the same storage re-runs the open shares of the same attempt and commits."""
    monkeypatch.setenv(setting_names.SETTING_ASSEMBLY_SHARE, SHARE_MB)
    scene = make_scene(tmp_path / "scene.tif", 1100, 800)
    log = tmp_path / "serve.log"
    job_id = upload_until_killed(storage, app_env, scene, log, module=("tests.crash_host", "block:6", "--"))
    assert "crash_host: SIGKILL" in log.read_text()
    tiles = storage.blob_service().get_container_client(app_env.tiles)
    (plan,) = [b.name for b in tiles.list_blobs(name_starts_with=f"plans/{job_id}/")]
    tag = plan.rsplit("/", 1)[1].removesuffix(".json")
    blob = storage.blob_service().get_blob_client(app_env.output, jobs.mosaic_blob_name(job_id))
    assert not blob.exists()
    staged_at_crash = [b.id for b in blob.get_block_list("uncommitted")[1]]
    assert staged_at_crash and all(b.startswith(tag) for b in staged_at_crash)

    restarted = time.monotonic()
    host = serve(app_env, log)
    try:
        state = wait_for_state(storage, app_env, job_id, lambda s: s["status"] in ("Completed", "Failed"), timeout=240)
    finally:
        stop_host(host, log)
    print(
        f"\nkilled with {len(staged_at_crash)} ranges staged; restart -> completed {time.monotonic() - restarted:.1f} s"
    )
    assert state["status"] == "Completed", state
    check_outputs(storage, app_env, {"status": "completed", "job_id": job_id, "windows": 20}, scene)
    # The same attempt went on (one plan); its range ids are the committed ones, nothing is left.
    assert [b.name for b in tiles.list_blobs(name_starts_with=f"plans/{job_id}/")] == [plan]
    committed = [b.id for b in blob.get_block_list("committed")[0]]
    assert set(staged_at_crash) <= set(committed)
    assert blob.get_block_list("uncommitted")[1] == []
