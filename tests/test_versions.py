"""Orchestration versions: each instance keeps the version it was stamped with at creation, a host
runs only its own version and older ones, and a job goes on with the steps of its version after
a deploy that changes the orchestration.

The local host's part is traced to the Durable Task Framework's source in docs/local-host.md
(row 50); the upgrade procedure it makes possible is in docs/deployment.md.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from devhost.durable.history import EXECUTION_STARTED
from devhost.durable.host import read_host_json
from devhost.durable.versioning import VERSION_MISMATCH, Versioning, compare_versions
from orchestrators import versions
from tests.app_jobs import (
    AppEnv,
    check_outputs,
    make_scene,
    serve,
    upload,
    upload_until_killed,
    wait_for_state,
    wait_until,
)
from tests.test_devhost_engine import hub_store, make_engine

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def store(storage, request):
    return hub_store(storage, request)


@pytest.mark.parametrize(
    ("source", "other", "expected"),
    [
        ("", None, 0),  # empty and null are the same: unversioned
        ("", "1.0", -1),  # unversioned is older than any version
        ("1.0", "  ", 1),
        ("1.0", "1.0", 0),
        ("2.0", "10.0", -1),  # both System.Version: by their numbers
        ("1.0", "1.0.0", -1),  # an absent build number counts as -1
        ("1.2.3.4", "1.2.3.5", -1),
        ("9", "10", 1),  # one number alone is no System.Version: compared as text
        ("v2", "V2", 0),  # text, ignoring case
        ("2.0", "2.0-beta", -1),  # one side text: the two compared as text
    ],
)
def test_versions_compare_as_the_durable_task_framework_compares_them(source, other, expected):
    assert compare_versions(source, other) == expected


def test_each_strategy_runs_what_the_durable_task_framework_runs():
    current = Versioning("2.0", "CurrentOrOlder", "Reject")
    assert [current.may_run(v) for v in ("", None, "1.0", "2.0", "2.1", "10.0")] == [True] * 4 + [False] * 2
    assert current.rejects("3.0") and not current.fails("3.0")
    strict = Versioning("2.0", "Strict", "Fail")
    assert [strict.may_run(v) for v in ("", "1.0", "2.0", "3.0")] == [False, False, True, False]
    assert strict.fails("1.0") and not strict.rejects("1.0")
    assert all(Versioning("2.0", "None", "Fail").may_run(v) for v in ("", "1.0", "3.0"))


def test_host_json_settings_and_their_app_setting_overrides_are_read_as_the_host_reads_them(tmp_path):
    (tmp_path / "host.json").write_text(
        json.dumps({"extensions": {"durableTask": {"hubName": "H", "maxConcurrentActivityFunctions": 4}}})
    )
    durable = read_host_json(tmp_path, environ={})["extensions"]["durableTask"]
    assert Versioning.from_durable_task(durable) == Versioning("", "CurrentOrOlder", "Reject")  # the defaults
    environ = {
        "AzureFunctionsJobHost__extensions__durableTask__defaultVersion": "3.0",
        "AZUREFUNCTIONSJOBHOST__Extensions__DurableTask__versionMatchStrategy": "strict",
        "AzureFunctionsJobHost__extensions__durableTask__maxConcurrentActivityFunctions": "2",
    }
    durable = read_host_json(tmp_path, environ=environ)["extensions"]["durableTask"]
    assert Versioning.from_durable_task(durable) == Versioning("3.0", "Strict", "Reject")
    assert durable["maxConcurrentActivityFunctions"] == 2 and durable["hubName"] == "H"
    with pytest.raises(ValueError, match="versionMatchStrategy"):
        Versioning.from_durable_task({"versionMatchStrategy": "Newest"})


def test_the_app_s_host_json_stamps_this_release_s_version_and_refuses_newer_ones():
    durable = json.loads((ROOT / "host.json").read_text())["extensions"]["durableTask"]
    assert Versioning.from_durable_task(durable) == Versioning(versions.CURRENT, "CurrentOrOlder", "Reject")
    assert list(versions.VERSIONS)[-1] == versions.CURRENT


def test_which_steps_a_version_runs_is_said_in_one_place():
    """Versions 1 (unversioned) and 2.0 list a job in its collection when its payload names one: a
    payload made before collections, started again as a new 2.0 instance, still has no such step."""
    named, before_collections = {"collection": "scenes"}, {"job_id": "x"}
    assert [versions.runs_collection_step(v, named) for v in ("", None, "1", "1.0", "2.0")] == [True] * 5
    assert not any(versions.runs_collection_step(v, before_collections) for v in ("", "2.0"))
    assert versions.status_fields("") == {} and versions.status_fields("2.0") == {"version": "2.0"}
    assert versions.child_version(None) is None and versions.child_version("2.0") == "2.0"
    with pytest.raises(LookupError, match="CurrentOrOlder"):
        versions.steps_for("9.0")  # a newer release's: this code never meets one unless misconfigured


def test_a_new_instance_is_stamped_with_the_given_version_else_the_hosts_and_keeps_it(store):
    """start_new's version, else host.json's defaultVersion; a child given no version gets the
    default of the host that starts it, not its parent's (ExecutionStarted's Version, which the
    SDK hands the orchestrator as ``context.version``)."""
    with make_engine(store, versioning=Versioning("2.0")) as engine:
        engine.start_new("versions_seen", "stamped", {"child_version": "1.5"})
        engine.start_new("versions_seen", "asked", {"child_version": None}, version="1.0")
        stamped, asked = engine.wait_for("stamped", timeout=30), engine.wait_for("asked", timeout=30)
        started = next(e for e in engine.instances.get("asked").history if e["EventType"] == EXECUTION_STARTED)
    assert stamped["output"] == {"own": "2.0", "asked": "1.5", "default": "2.0"}
    assert asked["output"] == {"own": "1.0", "asked": "2.0", "default": "2.0"}
    assert started["Version"] == "1.0" and asked["version"] == "1.0"


def test_an_execution_continue_as_new_begins_keeps_the_instances_version(store):
    """DTFx's ContinueAsNewOrchestratorAction keeps the version unless it names one (the Python
    SDK's ``continue_as_new`` names none): every execution of ``countdown`` runs on 1.5."""
    with make_engine(store, versioning=Versioning("2.0")) as engine:
        engine.start_new("countdown", "counted", {"left": 3, "done": []}, version="1.5")
        first = engine.status("counted")["execution_id"]
        state = engine.wait_for("counted", timeout=60)
        started = next(e for e in engine.instances.get("counted").history if e["EventType"] == EXECUTION_STARTED)
    assert state["status"] == "Completed" and state["execution_id"] != first
    assert state["version"] == "1.5" and started["Version"] == "1.5"


def test_the_real_client_s_start_new_version_reaches_the_instance(store):
    """azure-functions-durable's ``start_new(..., version=)`` asks for it in the start URL's query."""
    import azure.durable_functions as df

    from devhost.durable.functions import EventLoopThread
    from devhost.durable.rpc import DurableHttpApi

    with make_engine(store, versioning=Versioning("2.0")) as engine:
        api = DurableHttpApi(engine, store.hub).start()
        try:
            client = df.DurableOrchestrationClient(api.client_binding())
            loop = EventLoopThread.shared()
            loop.run(client.start_new("own_version", "given", None, version="1.5"))
            loop.run(client.start_new("own_version", "default", None))
            given, default = engine.wait_for("given", timeout=30), engine.wait_for("default", timeout=30)
        finally:
            api.stop()
    assert (given["output"], default["output"]) == ("1.5", "2.0")


def test_an_older_host_never_runs_a_newer_instance_and_a_host_of_its_version_does(store):
    """CurrentOrOlder + Reject: the work item is abandoned, not failed; the instance stays as it
    is until a host whose defaultVersion is the same or newer owns its partition."""
    with make_engine(store, versioning=Versioning("1.0")) as old:
        old.start_new("versions_seen", "newer", {"child_version": None}, version="2.0")
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            state = old.status("newer")
            assert state["status"] == "Pending" and state["episodes"] == 0, state
            time.sleep(0.1)
        assert old.stats.version_rejections >= 2 and old.stats.episodes == 0
    # The old host hands its partitions on as it stops; should that not land, the new host
    # claims them once their leases expire (30 s), hence the patience.
    with make_engine(store, versioning=Versioning("2.0")) as new:
        state = new.wait_for("newer", timeout=90)
    assert state["status"] == "Completed", state
    assert state["output"] == {"own": "2.0", "asked": "2.0", "default": "2.0"}


def test_a_terminate_of_a_newer_instance_waits_with_it_for_a_host_of_its_version(store):
    """The version is checked before any of the instance's messages is processed, ExecutionTerminated
    included: an older host leaves the terminate with the instance; the newer host carries it out."""
    with make_engine(store, versioning=Versioning("1.0")) as old:
        old.start_new("versions_seen", "cancelled", {"child_version": None}, version="2.0")
        old.terminate("cancelled", "rolled back")
        time.sleep(1.5)
        assert old.status("cancelled")["status"] == "Pending" and old.stats.episodes == 0
    with make_engine(store, versioning=Versioning("2.0")) as new:
        state = new.wait_for("cancelled", timeout=90)
    assert state["status"] == "Terminated" and state["output"] == "rolled back"


def test_with_the_fail_strategy_an_older_host_fails_a_newer_instance_without_running_it(store):
    with make_engine(store, versioning=Versioning("1.0", failure_strategy="Fail")) as old:
        old.start_new("versions_seen", "failed", {"child_version": None}, version="2.0")
        state = old.wait_for("failed", timeout=30)
    assert state["status"] == "Failed" and state["error"] == VERSION_MISMATCH
    assert old.stats.version_rejections == 0
    assert not [s for s in store.instances() if s["id"].startswith("failed-")]  # no child was started


# ---------------------------------------------------------------------- a deploy while jobs run


def release(*options: str) -> tuple[str, ...]:
    """``serve``'s ``module`` for :mod:`tests.release_host` with these options."""
    return ("tests.release_host", *options, "--")


NEXT_RELEASE = ("--release", "tests.apps.next_release")


def finished(storage, app_env: AppEnv, job_id: str) -> dict:
    return wait_for_state(storage, app_env, job_id, lambda s: s["status"] in ("Completed", "Failed"), timeout=120)


def stop(host) -> None:
    os.killpg(host.pid, signal.SIGTERM)
    host.wait(timeout=60)


def test_a_job_keeps_its_version_across_a_deploy_and_a_new_upload_runs_the_new_one(storage, app_env, tmp_path):
    """Started on this release (version 4.0), its host killed mid-tiling; the next release
    (version 5.0: no collection step) finishes it with version 4.0's steps, pixel-exact, and
    runs a new upload with version 5.0's."""
    log = tmp_path / "host.log"
    first, second = make_scene(tmp_path / "first.tif", 1024, 512), make_scene(tmp_path / "second.tif", 768, 512)
    started = upload_until_killed(storage, app_env, first, log, module=release("--crash-at-row", "3"))
    mid_way = wait_for_state(storage, app_env, started, lambda s: s["status"] == "Running")
    assert mid_way["version"] == versions.CURRENT
    host = serve(app_env, log, module=release(*NEXT_RELEASE))
    try:
        resumed = finished(storage, app_env, started)
        fresh_id = upload(storage, app_env, second)
        fresh = finished(storage, app_env, fresh_id)
    finally:
        stop(host)
    assert resumed["version"] == "4.0" and resumed["custom_status"]["version"] == "4.0"
    assert "collection" in resumed["output"]  # version 4.0's step, run by the next release
    check_outputs(storage, app_env, {"status": "completed", **resumed["output"]}, first)
    assert fresh["version"] == "5.0" and fresh["custom_status"]["version"] == "5.0"
    assert "collection" not in fresh["output"]  # version 5.0 has no collection step
    check_outputs(storage, app_env, {"status": "completed", **fresh["output"]}, second)


def test_a_host_of_an_older_version_never_runs_a_newer_job_and_one_of_its_version_finishes_it(
    storage, app_env, tmp_path
):
    """A job of the next release (5.0), its host killed mid-tiling, meets a host of this release
    (4.0), which leaves it as it is; a host of the next release finishes it."""
    log, old_log = tmp_path / "host.log", tmp_path / "old-host.log"
    scene = make_scene(tmp_path / "scene.tif", 1024, 512)
    job_id = upload_until_killed(storage, app_env, scene, log, module=release(*NEXT_RELEASE, "--crash-at-row", "3"))
    old = serve(app_env, old_log)
    try:
        # The job waits for its batches, which its host had started: their episodes are refused.
        wait_until(lambda: "is orchestration version '5.0'" in old_log.read_text(), timeout=60)
        before = wait_for_state(storage, app_env, job_id, lambda s: True)
        time.sleep(2)
        after = wait_for_state(storage, app_env, job_id, lambda s: True)
    finally:
        stop(old)
    assert before["status"] == after["status"] == "Running" and before["version"] == "5.0"
    assert after["episodes"] == before["episodes"] and after["updated"] == before["updated"]
    # The host's counters as it stopped: it ran activities (DTFx checks versions only before an
    # orchestration's episode), but not one episode of any instance.
    stats = json.loads(old_log.read_text().split(" stopped: ", 1)[1].splitlines()[0])
    assert stats["episodes"] == 0 and stats["version_rejections"] > 0, stats
    host = serve(app_env, log, module=release(*NEXT_RELEASE))
    try:
        done = finished(storage, app_env, job_id)
    finally:
        stop(host)
    assert done["status"] == "Completed" and "collection" not in done["output"]
    check_outputs(storage, app_env, {"status": "completed", **done["output"]}, scene)
