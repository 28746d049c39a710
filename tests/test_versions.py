"""Orchestration versions: each instance keeps the version it was stamped with at creation, a host
runs only its own version and older ones, and a job goes on with the steps of its version after
a deploy that changes the orchestration.

The local host's part is traced to the Durable Task Framework's source in docs/local-host.md
(row 48); the upgrade procedure it makes possible is in docs/deployment.md.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from devhost.durable.history import EXECUTION_STARTED
from devhost.durable.host import read_host_json
from devhost.durable.versioning import VERSION_MISMATCH, Versioning, compare_versions
from orchestrators import versions
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


def test_an_older_host_never_runs_a_newer_instance_and_a_host_of_its_version_does(store):
    """CurrentOrOlder + Reject: the work item is abandoned, not failed; the instance stays as it
    is until a host whose defaultVersion is the same or newer owns its partition."""
    with make_engine(store, versioning=Versioning("1.0")) as old:
        old.start_new("versions_seen", "newer", {"child_version": None}, version="2.0")
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            state = old.status("newer")
            assert state["status"] == "Pending" and state["episodes"] == 0, state
            time.sleep(0.1)
        assert old.stats.version_rejections >= 2 and old.stats.episodes == 0
    with make_engine(store, versioning=Versioning("2.0")) as new:
        state = new.wait_for("newer", timeout=30)
    assert state["status"] == "Completed", state
    assert state["output"] == {"own": "2.0", "asked": "2.0", "default": "2.0"}


def test_with_the_fail_strategy_an_older_host_fails_a_newer_instance_without_running_it(store):
    with make_engine(store, versioning=Versioning("1.0", failure_strategy="Fail")) as old:
        old.start_new("versions_seen", "failed", {"child_version": None}, version="2.0")
        state = old.wait_for("failed", timeout=30)
    assert state["status"] == "Failed" and state["error"] == VERSION_MISMATCH
    assert old.stats.version_rejections == 0
    assert not [s for s in store.instances() if s["id"].startswith("failed-")]  # no child was started
