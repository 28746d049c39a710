"""The app as the worker indexes it, host.json, and azure-functions-doctor on the deploy package."""

from __future__ import annotations

import fnmatch
import json
import shutil
import subprocess
import sys
from pathlib import Path

import azurefunctions.extensions.bindings.blob as blob

from devhost.durable.functions import FunctionIndex
from orchestrators import names
from tilecommit import settings

ROOT = Path(__file__).resolve().parent.parent


def test_functions_and_raw_bindings_as_the_worker_sends_them():
    index = FunctionIndex.load("function_app")
    assert set(index.orchestrators) == {
        names.TILE_SCENE,
        names.RENDER_GROUP,
        names.RENDER_BATCH,
        names.VERIFY_SCENE,
        names.VERIFY_GROUP,
        names.VERIFY_BATCH,
        names.BACKFILL,
    }
    assert set(index.activities) == {
        names.VALIDATE_SOURCE,
        names.RENDER_TILE,
        names.ASSEMBLE_MOSAIC,
        names.PLAN_MOSAIC_SHARES,
        names.STAGE_MOSAIC_SHARE,
        names.REDUCE_LEVEL_NODE,
        names.ADD_TO_COLLECTION,
        names.PUBLISH_ITEM,
        names.PUBLISH_JOB_EVENT,
        names.VERIFY_WINDOW,
        names.VERIFY_OUTPUTS,
        names.REBUILD_MOSAIC,
        names.LIST_BACKFILL_PAGE,
        names.SURVEY_BACKFILL_BLOBS,
        names.START_BACKFILL_JOBS,
        names.COUNT_RUNNING_JOBS,
    }
    # The backfill's activities that start or read jobs take a Durable client, as the starter does.
    assert set(index.activity_clients) == {
        names.SURVEY_BACKFILL_BLOBS,
        names.START_BACKFILL_JOBS,
        names.COUNT_RUNNING_JOBS,
    }
    for name in index.activity_clients:
        assert sorted(index.raw_bindings[name], key=lambda b: b["type"]) == [
            {"direction": "IN", "type": "activityTrigger", "name": "payload", "activity": name},
            {"direction": "IN", "type": "durableClient", "name": "client"},
        ]
    assert set(index.blob_triggers) == {names.STARTER} == {settings.TRIGGER_FUNCTION}
    # The scrub's route: function-key auth, POST only.
    route = next(b for b in index.raw_bindings[names.VERIFY_ROUTE] if b["type"] == "httpTrigger")
    assert route == {
        "direction": "IN",
        "type": "httpTrigger",
        "name": "req",
        "methods": ["POST"],
        "authLevel": "FUNCTION",
        "route": "jobs/{job_id}/verify",
    }

    # The job API: function-key auth, each route with its one method.
    routes = {
        names.JOB_ROUTE: ("GET", "jobs/{job_id}"),
        names.JOBS_ROUTE: ("GET", "jobs"),
        names.CANCEL_ROUTE: ("POST", "jobs/{job_id}/cancel"),
        names.RETRY_ROUTE: ("POST", "jobs/{job_id}/retry"),
        names.VERIFY_ROUTE: ("POST", "jobs/{job_id}/verify"),
        names.VERIFY_STATUS_ROUTE: ("GET", "jobs/{job_id}/verify/{verify_id}"),
        names.WINDOWS_ROUTE: ("GET", "jobs/{job_id}/windows"),
        names.OUTPUT_ROUTE: ("GET", "jobs/{job_id}/outputs/{name}"),
        names.JOB_TILEJSON_ROUTE: ("GET", "tiles/jobs/{job_id}/tilejson.json"),
        names.JOB_TILE_ROUTE: ("GET", "tiles/jobs/{job_id}/{z}/{x}/{y}.png"),
        names.BACKFILL_ROUTE: ("POST", "backfill"),
        names.BACKFILL_STATUS_ROUTE: ("GET", "backfill/{backfill_id}"),
        names.BACKFILL_CANCEL_ROUTE: ("POST", "backfill/{backfill_id}/cancel"),
    }
    # What reads storage alone (no Durable client): the collections' tiles and document.
    storage_routes = {
        names.COLLECTION_TILEJSON_ROUTE: ("GET", "tiles/collections/{collection_id}/tilejson.json"),
        names.COLLECTION_TILE_ROUTE: ("GET", "tiles/collections/{collection_id}/{z}/{x}/{y}.png"),
        names.COLLECTION_ROUTE: ("GET", "collections/{collection_id}"),
    }
    # The web page's own files, which need no key.
    page_routes = {names.WEB_PAGE_ROUTE: ("GET", "ui/{*path}")}
    assert set(index.http_functions) == set(routes) | set(storage_routes) | set(page_routes)
    for name, (method, path) in (routes | storage_routes | page_routes).items():
        trigger = next(b for b in index.raw_bindings[name] if b["type"] == "httpTrigger")
        level = "ANONYMOUS" if name in page_routes else "FUNCTION"
        assert (trigger["methods"], trigger["authLevel"], trigger["route"]) == ([method], level, path)
        client = {"direction": "IN", "type": "durableClient", "name": "client"}
        assert (client in index.raw_bindings[name]) == (name in routes)

    starter = sorted(index.raw_bindings[names.STARTER], key=lambda b: b["type"])
    assert starter == [
        {
            "direction": "IN",
            "type": "blobTrigger",
            "name": "upload",
            "path": f"%{settings.SETTING_INPUT_CONTAINER}%/{{name}}",
            "connection": settings.STORAGE_CONNECTION,
            "source": "EventGrid",
        },
        {"direction": "IN", "type": "durableClient", "name": "client"},
    ]
    # The container is an app setting, resolved by the host; its default is the settings' one.
    assert settings.Settings().input_container == settings.INPUT_CONTAINER
    # The SDK-type binding: the trigger gets a BlobClient, never the blob's bytes.
    assert index.blob_triggers[names.STARTER].blob_type is blob.BlobClient

    for name in (names.TILE_SCENE, names.RENDER_GROUP, names.RENDER_BATCH):
        assert index.raw_bindings[name] == [
            {"direction": "IN", "type": "orchestrationTrigger", "name": "context", "orchestration": name}
        ]
    for name in (names.VALIDATE_SOURCE, names.RENDER_TILE, names.ASSEMBLE_MOSAIC):
        [binding] = index.raw_bindings[name]
        assert binding["type"] == "activityTrigger" and binding["activity"] == name


def test_what_importing_the_app_made_is_left_out_of_every_later_collection():
    """The worker's process, fresh: after the app's import, its modules and functions are frozen
    (gc.freeze), so no full collection while jobs run walks them; later objects are collected."""
    probe = (
        "import gc, function_app\n"
        "frozen = gc.get_freeze_count()\n"
        "import weakref\n"
        "class Node: pass\n"
        "node = Node(); node.self = node; alive = weakref.ref(node); del node\n"
        "gc.collect()\n"
        "print(frozen, gc.get_freeze_count(), alive() is None)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    frozen, frozen_after, collected = done.stdout.split()
    assert int(frozen) > 50_000 and int(frozen_after) == int(frozen) and collected == "True"


def test_the_apps_import_leaves_the_tile_maker_and_the_database_driver_to_their_first_use():
    """rio-tiler (the tile routes) and psycopg (publication to pgstac) are imported when first
    used: a worker that never makes a tile nor publishes does not pay for them at start."""
    probe = "import sys, function_app\nprint(sorted(m for m in ('psycopg', 'rio_tiler') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_host_json_fits_the_consumption_plan():
    host = json.loads((ROOT / "host.json").read_text())
    assert host["version"] == "2.0"
    assert host["functionTimeout"] == "00:10:00"
    # 4.32.0: the first bundle with the Durable Task Scheduler provider (azureManaged), which
    # main.bicep's durableBackend can switch to; the Azure Storage provider is in every 4.x.
    assert host["extensionBundle"] == {"id": "Microsoft.Azure.Functions.ExtensionBundle", "version": "[4.32.0, 5.0.0)"}
    durable = host["extensions"]["durableTask"]
    assert durable["hubName"] == settings.TASK_HUB
    # The sizing (docs/design.md, "Sizing for the Consumption plan"): 4 activities x <= 300 MB tile worker
    # (or one 1 GB assembly) < 1.5 GB.
    assert 1 <= durable["maxConcurrentActivityFunctions"] <= 4
    assert host["extensions"]["blobs"]["poisonBlobThreshold"] >= 1


def deploy_package(destination: Path) -> Path:
    """What a deployment would upload: the tracked files that .funcignore does not exclude."""
    patterns = [
        line.strip()
        for line in (ROOT / ".funcignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()

    def ignored(path: str) -> bool:
        for pattern in patterns:
            if pattern.endswith("/"):
                if path.startswith(pattern) or f"/{pattern}" in f"/{path}":
                    return True
            elif fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(Path(path).name, pattern):
                return True
        return False

    for path in files:
        if not ignored(path) and (ROOT / path).is_file():
            target = destination / path
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / path, target)
    return destination


def test_deploy_package_holds_the_app_and_nothing_else(tmp_path):
    package = deploy_package(tmp_path / "package")
    top = {p.name for p in package.iterdir()}
    assert {
        "function_app.py",
        "host.json",
        "requirements.txt",
        "orchestrators",
        "client_functions",
        "activities",
        "tilecommit",
    } <= top
    assert not top & {
        "tests",
        "devhost",
        "testkit",
        "infra",
        "bench",
        "node_modules",
        ".venv",
        "local.settings.example.json",
    }


def test_azure_functions_doctor_finds_no_failure(tmp_path):
    package = deploy_package(tmp_path / "package")
    summary = tmp_path / "summary.json"
    report = tmp_path / "report.json"
    doctor = Path(sys.executable).with_name("azure-functions-doctor")
    result = subprocess.run(
        [
            str(doctor),
            "doctor",
            "--path",
            str(package),
            "--profile",
            "full",
            "--format",
            "json",
            "--output",
            str(report),
            "--summary-json",
            str(summary),
            "--hosting-plan",
            "flex-consumption",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    counts = json.loads(summary.read_text())
    failures = [
        f"{item['rule_id']}: {item.get('value')}"
        for group in json.loads(report.read_text())["results"]
        for item in group["items"]
        if item["status"] == "fail"
    ]
    assert counts["failed"] == 0 and not failures, failures
    assert counts["passed"] > 10  # it really looked at the app
    assert result.returncode == 0, result.stdout[-2000:]
