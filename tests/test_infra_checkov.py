"""checkov on infra/: every template parsed, no failure outside infra/checkov-skips.toml, and the
project's own checks (infra/checks) pass on infra/ and fail on broken templates.

checkov runs from its own virtualenv (.venv-checkov, built by `make setup`), once per template
directory per session. Nothing is skipped on the command line: the skip list is compared with
checkov's failures here, so a stale entry fails as surely as a new failure.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.bicep import BROKEN_FIXTURE, INFRA, REPO_ROOT, Bicep, bicep_files

CHECKOV = REPO_ROOT / ".venv-checkov" / "bin" / "checkov"
CUSTOM_CHECKS = INFRA / "checks"
SKIPS_FILE = INFRA / "checkov-skips.toml"
CUSTOM_IDS = [f"CKV_TILECOMMIT_{n}" for n in range(1, 7)]


def run_checkov(directory: Path, *extra: str) -> dict[str, Any]:
    if not CHECKOV.is_file():
        pytest.fail(f"checkov is not installed at {CHECKOV.relative_to(REPO_ROOT)}: run `make setup`")
    command = [
        str(CHECKOV),
        "--directory",
        str(directory),
        "--framework",
        "bicep",
        "--skip-download",
        "--external-checks-dir",
        str(CUSTOM_CHECKS),
        "--output",
        "json",
        *extra,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    # 0: no failed check, 1: some failed; anything else is checkov itself failing.
    assert result.returncode in (0, 1), f"checkov exited {result.returncode}:\n{result.stderr[-3000:]}"
    # A custom check that does not import is only logged by checkov; make it loud here.
    assert "Cannot load external check" not in result.stderr, result.stderr[-3000:]
    report = json.loads(result.stdout)
    if isinstance(report, list):  # one report per framework
        (report,) = [r for r in report if r.get("check_type") == "bicep"]
    assert report["check_type"] == "bicep"
    return report


def records(report: dict[str, Any], outcome: str) -> list[dict[str, Any]]:
    return report["results"][f"{outcome}_checks"]


def keyed(report: dict[str, Any], outcome: str) -> set[tuple[str, str, str]]:
    """(check id, file relative to the scanned directory, resource) of each passed/failed check."""
    return {(r["check_id"], r["file_path"].lstrip("/"), r["resource"]) for r in records(report, outcome)}


@pytest.fixture(scope="module")
def infra_report() -> dict[str, Any]:
    return run_checkov(INFRA)


def load_skips() -> list[dict[str, str]]:
    with SKIPS_FILE.open("rb") as handle:
        return tomllib.load(handle)["skip"]


# ------------------------------------------------------------------------------------------------
# infra/
# ------------------------------------------------------------------------------------------------


def test_checkov_parsed_every_template(infra_report: dict[str, Any]) -> None:
    # checkov exits 0 on a file it cannot parse and only counts it here.
    assert infra_report["summary"]["parsing_errors"] == 0, infra_report["results"]["parsing_errors"]
    assert infra_report["results"]["parsing_errors"] == []
    scanned = {r["file_path"].lstrip("/") for outcome in ("passed", "failed") for r in records(infra_report, outcome)}
    templates = {p.relative_to(INFRA).as_posix() for p in bicep_files(INFRA)}
    assert templates - scanned == set(), "templates checkov did not scan (no resource seen)"


def test_checkov_failures_are_exactly_the_skip_list(infra_report: dict[str, Any]) -> None:
    skips = load_skips()
    for skip in skips:
        assert skip.get("reason", "").strip(), f"{skip['check']} on {skip['resource']}: give a reason"
    expected = {(s["check"], s["file"], s["resource"]) for s in skips}
    assert len(expected) == len(skips), "duplicate entries in infra/checkov-skips.toml"
    # The skip list is the only place a check is waived: no inline `checkov:skip` or config file.
    assert records(infra_report, "skipped") == []
    failed = keyed(infra_report, "failed")
    new_failures = sorted(failed - expected)
    stale_skips = sorted(expected - failed)
    details = {
        (r["check_id"], r["file_path"].lstrip("/"), r["resource"]): r["check_name"]
        for r in records(infra_report, "failed")
    }
    problems = [
        f"not in infra/checkov-skips.toml: {c} {f} {res} ({details[(c, f, res)]})" for c, f, res in new_failures
    ] + [f"in infra/checkov-skips.toml but no longer failing (delete it): {c} {f} {res}" for c, f, res in stale_skips]
    assert problems == []


# Where each custom check must pass on infra/ (and not merely be "unknown").
EXPECTED_CUSTOM_PASSES = {
    ("CKV_TILECOMMIT_1", "modules/storage.bicep", "Microsoft.Storage/storageAccounts.storageAccount"),
    ("CKV_TILECOMMIT_2", "modules/storage.bicep", "Microsoft.Storage/storageAccounts.storageAccount"),
    (
        "CKV_TILECOMMIT_2",
        "modules/storage.bicep",
        "Microsoft.Storage/storageAccounts/blobServices/containers.containers",
    ),
    ("CKV_TILECOMMIT_3", "main.bicep", "Microsoft.Web/sites.functionApp"),
    ("CKV_TILECOMMIT_4", "main.bicep", "Microsoft.Web/sites.functionApp"),
    ("CKV_TILECOMMIT_5", "modules/monitoring.bicep", "Microsoft.Insights/components.applicationInsights"),
    ("CKV_TILECOMMIT_5", "modules/monitoring.bicep", "Microsoft.OperationalInsights/workspaces.workspace"),
}


def test_custom_checks_pass_on_infra(infra_report: dict[str, Any]) -> None:
    passed = keyed(infra_report, "passed")
    assert EXPECTED_CUSTOM_PASSES - passed == set()
    failed_custom = {key for key in keyed(infra_report, "failed") if key[0] in CUSTOM_IDS}
    assert failed_custom == set()


def test_every_resource_uses_a_stable_api_version(infra_report: dict[str, Any]) -> None:
    # CKV_TILECOMMIT_6 runs on every resource, so it also shows that checkov saw each one.
    checked = {(f, res) for c, f, res in keyed(infra_report, "passed") if c == "CKV_TILECOMMIT_6"}
    declared = {
        (path.relative_to(INFRA).as_posix(), f"{r.type_or_path.split('@')[0]}.{r.name}")
        for path in bicep_files(INFRA)
        for r in Bicep(path).resources.values()
        if not r.existing  # checkov does not check `existing` references (nothing is deployed)
    }
    assert declared - checked == set(), "resources checkov did not check"
    assert checked - declared == set(), "resources checkov saw that the reader did not"


# ------------------------------------------------------------------------------------------------
# Broken templates: the custom checks must catch them.
# ------------------------------------------------------------------------------------------------

EXPECTED_BROKEN_FAILURES = {
    ("CKV_TILECOMMIT_1", "Microsoft.Storage/storageAccounts.storageAccount"),
    ("CKV_TILECOMMIT_2", "Microsoft.Storage/storageAccounts.storageAccount"),
    ("CKV_TILECOMMIT_2", "Microsoft.Storage/storageAccounts/blobServices/containers.uploads"),
    ("CKV_TILECOMMIT_3", "Microsoft.Web/sites.functionApp"),
    ("CKV_TILECOMMIT_4", "Microsoft.Web/sites.functionApp"),
    ("CKV_TILECOMMIT_4", "Microsoft.Web/sites/config.extraSettings"),
    ("CKV_TILECOMMIT_5", "Microsoft.Insights/components.applicationInsights"),
    ("CKV_TILECOMMIT_5", "Microsoft.OperationalInsights/workspaces.workspace"),
    ("CKV_TILECOMMIT_6", "Microsoft.Web/sites/config.extraSettings"),
}


#: The broken fixture's folder inside the mutation run's directory (no mutation has this name).
BROKEN_FOLDER = "broken-fixture"


def test_custom_checks_fail_on_the_broken_fixture(mutation_report: dict[str, Any]) -> None:
    """The broken fixture is scanned in the same checkov run as the mutations (one process fewer:
    each run costs about 8 CPU-s of checkov's start-up), under its own folder of that run."""
    assert mutation_report["summary"]["parsing_errors"] == 0, mutation_report["results"]["parsing_errors"]
    failed = {(c, res) for c, f, res in keyed(mutation_report, "failed") if f.startswith(f"{BROKEN_FOLDER}/")}
    assert EXPECTED_BROKEN_FAILURES - failed == set()
    assert {c for c, _ in failed} == set(CUSTOM_IDS)


# Each mutation breaks one rule in a copy of infra/. (file, text, replacement, check, resource).
# The text must occur exactly once, so that a change to the templates cannot quietly turn a
# mutation into a no-op.
MUTATIONS = {
    "shared-key-on": (
        "modules/storage.bicep",
        "allowSharedKeyAccess: false",
        "allowSharedKeyAccess: true",
        "CKV_TILECOMMIT_1",
        "Microsoft.Storage/storageAccounts.storageAccount",
    ),
    "shared-key-default": (
        "modules/storage.bicep",
        "allowSharedKeyAccess: false\n",
        "\n",
        "CKV_TILECOMMIT_1",
        "Microsoft.Storage/storageAccounts.storageAccount",
    ),
    "public-blob-access": (
        "modules/storage.bicep",
        "allowBlobPublicAccess: false",
        "allowBlobPublicAccess: true",
        "CKV_TILECOMMIT_2",
        "Microsoft.Storage/storageAccounts.storageAccount",
    ),
    "public-container": (
        "modules/storage.bicep",
        "publicAccess: 'None'",
        "publicAccess: 'Container'",
        "CKV_TILECOMMIT_2",
        "Microsoft.Storage/storageAccounts/blobServices/containers.containers",
    ),
    "no-identity": (
        "main.bicep",
        "  identity: {\n    type: 'UserAssigned'\n",
        "  identity: {\n    type: 'None'\n",
        "CKV_TILECOMMIT_3",
        "Microsoft.Web/sites.functionApp",
    ),
    "host-storage-not-identity": (
        "main.bicep",
        "name: 'AzureWebJobsStorage__credential'\n          value: 'managedidentity'",
        "name: 'AzureWebJobsStorage__credential'\n          value: 'connectionstring'",
        "CKV_TILECOMMIT_3",
        "Microsoft.Web/sites.functionApp",
    ),
    "account-key-on-consumption": (
        "main.bicep",
        "      ] : [], isFlex ? [] : [\n",
        "      ] : [], isFlex ? [] : [\n        {\n          name: 'AzureWebJobsStorage'\n"
        "          value: 'DefaultEndpointsProtocol=https;AccountName=x;AccountKey=${storageAccountName}'\n"
        "        }\n",
        "CKV_TILECOMMIT_4",
        "Microsoft.Web/sites.functionApp",
    ),
    "scheduler-connection-without-identity": (
        "main.bicep",
        ";Authentication=ManagedIdentity;",
        ";Authentication=None;",
        "CKV_TILECOMMIT_4",
        "Microsoft.Web/sites.functionApp",
    ),
    "list-keys-value": (
        "main.bicep",
        "value: '20'",
        "value: listKeys(resourceId('Microsoft.Storage/storageAccounts', storageAccountName), '2023-05-01')"
        ".keys[0].value",
        "CKV_TILECOMMIT_4",
        "Microsoft.Web/sites.functionApp",
    ),
    "instrumentation-key": (
        "main.bicep",
        "value: monitoring.outputs.connectionString",
        "value: 'InstrumentationKey=00000000-0000-0000-0000-000000000000'",
        "CKV_TILECOMMIT_4",
        "Microsoft.Web/sites.functionApp",
    ),
    "app-insights-local-auth": (
        "modules/monitoring.bicep",
        "DisableLocalAuth: true",
        "DisableLocalAuth: false",
        "CKV_TILECOMMIT_5",
        "Microsoft.Insights/components.applicationInsights",
    ),
    "workspace-local-auth": (
        "modules/monitoring.bicep",
        "disableLocalAuth: true",
        "disableLocalAuth: false",
        "CKV_TILECOMMIT_5",
        "Microsoft.OperationalInsights/workspaces.workspace",
    ),
    "preview-api": (
        "modules/events.bicep",
        "systemTopics@2022-06-15",
        "systemTopics@2021-10-15-preview",
        "CKV_TILECOMMIT_6",
        "Microsoft.EventGrid/systemTopics.systemTopic",
    ),
}


@pytest.fixture(scope="module")
def mutation_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("infra-mutations")
    for name, (file, text, replacement, _, _) in MUTATIONS.items():
        copy = root / name
        shutil.copytree(INFRA, copy, ignore=shutil.ignore_patterns("checks", "*.sh", "*.toml", "*.json"))
        target = copy / file
        source = target.read_text()
        assert source.count(text) == 1, f"mutation {name}: {text!r} occurs {source.count(text)} times in {file}"
        target.write_text(source.replace(text, replacement))
    shutil.copytree(BROKEN_FIXTURE, root / BROKEN_FOLDER)
    return run_checkov(root, "--check", ",".join(CUSTOM_IDS))


@pytest.mark.parametrize("name", MUTATIONS)
def test_custom_check_catches_mutation(mutation_report: dict[str, Any], name: str) -> None:
    file, _, _, check, resource = MUTATIONS[name]
    assert mutation_report["summary"]["parsing_errors"] == 0, mutation_report["results"]["parsing_errors"]
    in_copy = {
        (c, f.split("/", 1)[1], res) for c, f, res in keyed(mutation_report, "failed") if f.startswith(f"{name}/")
    }
    assert (check, file, resource) in in_copy
    # Only the broken rule fails: the mutation is what the check caught, not some side effect.
    assert {c for c, _, _ in in_copy} == {check}
