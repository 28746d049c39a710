"""The app through the Python 3.13 language worker's package, azure-functions-runtime.

Run on Python 3.13 (``make test`` runs this file on .venv313 with TILECOMMIT_DEVHOST_WORKER=runtime;
tests/conftest.py leaves it out of a 3.11 run, where the package does not install): the worker
indexes function_app.py, reports each function's raw bindings, and every function kind, blob
trigger, orchestrator, activity, HTTP and timer, is invoked through its ``invocation_request``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request

from azure.functions import TimerRequest

from devhost.durable.functions import EventLoopThread, FunctionIndex
from devhost.session import process_file
from devhost.worker.runtime import WORKER_ENV, WorkerFunctionError, function_error
from orchestrators import names
from tilecommit import settings as setting_names

from .app_jobs import local_host, make_scene

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bindings(mode: str) -> dict:
    """``python -m devhost bindings``'s output, run in a process of its own in that mode."""
    env = {**os.environ, WORKER_ENV: mode}
    out = subprocess.run(
        [sys.executable, "-m", "devhost", "bindings"], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def worker_index(monkeypatch) -> FunctionIndex:
    monkeypatch.setenv(WORKER_ENV, "runtime")
    index = FunctionIndex.load()
    assert index.worker is not None
    return index


def test_the_worker_indexes_every_function_of_the_app_without_a_validation_error(monkeypatch):
    index = worker_index(monkeypatch)
    runtime = index.worker.runtime
    in_process = bindings("in-process")
    assert in_process["indexed_by"] == "in-process"
    assert list(runtime.functions) == list(in_process["functions"])  # same functions, same order
    assert len(runtime.functions) > 20
    for loaded in runtime.functions.values():
        assert loaded.metadata.language == "python"
        assert dict(loaded.metadata.properties) == {"worker_indexed": "True"}
        assert loaded.metadata.script_file.endswith("function_app.py")
    # The worker took the Event Grid blob trigger as the SDK-type (deferred) blob binding.
    from azure_functions_runtime.handle_event import _functions

    uploaded = runtime.functions[setting_names.TRIGGER_FUNCTION]
    assert _functions.get_function(uploaded.function_id).deferred_bindings_enabled
    deferred = [
        n for n, f in runtime.functions.items() if _functions.get_function(f.function_id).deferred_bindings_enabled
    ]
    assert deferred == [setting_names.TRIGGER_FUNCTION]
    # Every other function reports the bindings the SDK builds in process.
    for name, raw in runtime.functions.items():
        if name not in deferred:
            assert raw.raw_bindings == in_process["functions"][name], name
    # Nothing in the index is the app's own function: each one calls through the worker.
    held = [*index.orchestrators.values(), *index.http_functions.values(), *index.timer_functions.values()]
    held += [f for f, _ in index.activities.values()] + [t.func for t in index.blob_triggers.values()]
    assert len(held) == len(runtime.functions)
    assert {f.__module__ for f in held} == {"devhost.worker.invoker"}


def test_the_bindings_command_prints_what_the_host_expects_of_each_trigger():
    printed = bindings("runtime")
    assert printed["indexed_by"] == "azure-functions-runtime"
    kinds: dict[str, int] = {}
    for name, raw in printed["functions"].items():
        triggers = [b for b in raw if b["type"].endswith("Trigger")]
        assert len(triggers) == 1, name  # one trigger per function
        trigger = triggers[0]
        kinds[trigger["type"]] = kinds.get(trigger["type"], 0) + 1
        for binding in raw:
            assert binding["direction"] in ("IN", "OUT"), (name, binding)
            assert binding["name"], (name, binding)
        clients = [b for b in raw if b["type"] == "durableClient"]
        assert all(b["direction"] == "IN" for b in clients)
        if trigger["type"] == "blobTrigger":
            assert trigger["source"] == "EventGrid" and trigger["connection"] == "AzureWebJobsStorage"
            assert re.fullmatch(r"%TILECOMMIT_INPUT_CONTAINER%/\{name\}", trigger["path"])
            assert trigger["properties"] == {"SupportsDeferredBinding": True}
            assert [c["properties"] for c in clients] == [{"SupportsDeferredBinding": False}]
        elif trigger["type"] == "httpTrigger":
            assert trigger["authLevel"] in ("ANONYMOUS", "FUNCTION", "ADMIN"), name
            assert trigger["methods"] and trigger["route"], name
            assert [b for b in raw if b["direction"] == "OUT"] == [
                {"direction": "OUT", "type": "http", "name": "$return"}
            ]
        elif trigger["type"] == "timerTrigger":
            assert len(trigger["schedule"].split()) == 6  # NCRONTAB with seconds
        elif trigger["type"] == "orchestrationTrigger":
            assert trigger["orchestration"] == name and len(raw) == 1
        elif trigger["type"] == "activityTrigger":
            assert trigger["activity"] == name
        else:
            raise AssertionError(f"{name}: a trigger the app does not use: {trigger['type']}")
    assert set(kinds) == {"blobTrigger", "httpTrigger", "timerTrigger", "orchestrationTrigger", "activityTrigger"}


def test_a_job_and_every_kind_of_function_run_through_the_worker(storage, app_env, tmp_path, monkeypatch):
    index = worker_index(monkeypatch)
    invocations = index.worker.runtime.invocations
    before = dict(invocations)
    scene = make_scene(tmp_path / "scene.tif", 300, 260)
    with local_host(app_env, http_port=0, function_key="k") as host:
        assert host.index is index
        summary = process_file(host, scene, timeout=120)
        assert summary["status"] == "completed"
        job_id = summary["job_id"]
        url = f"{host.http.base_url}/api/jobs/{job_id}"
        with urllib.request.urlopen(urllib.request.Request(url, headers={"x-functions-key": "k"})) as answer:
            status = json.loads(answer.read())
        assert status["job_id"] == job_id and status["state"] == "completed"
        timer = index.timer_functions[names.RETENTION_SWEEP]
        EventLoopThread.shared().run(timer(timer=TimerRequest(past_due=False), client=host.api.client_binding()))
    sent = {name: invocations[name] - before.get(name, 0) for name in invocations}
    assert sent[setting_names.TRIGGER_FUNCTION] == 1
    assert sent[names.TILE_SCENE] >= 2  # one episode per awaited step
    assert sent[names.RENDER_TILE] >= 2 and sent[names.ASSEMBLE_MOSAIC] >= 1
    assert sent["get_job"] == 1 and sent[names.RETENTION_SWEEP] == 1


def test_a_function_error_keeps_the_exceptions_type_name_and_message(monkeypatch):
    protos = worker_index(monkeypatch).worker.runtime.protos
    error = function_error(protos.RpcException(message="ValueError: not a GeoTIFF: x.tif", stack_trace="at x"))
    assert isinstance(error, WorkerFunctionError)
    assert type(error).__name__ == "ValueError" and str(error) == "not a GeoTIFF: x.tif"
    assert error.stack_trace == "at x"


def test_the_consumption_package_is_not_built_by_a_python_that_reads_the_markers_for_3_13(tmp_path):
    """pip reads requirements.txt's markers for the Python running it: a 3.13 one would pick
    azure-functions 2.x and azure-functions-runtime for Consumption's 3.11, so deploy.sh refuses."""
    result = subprocess.run(
        ["bash", os.path.join(ROOT, "infra", "deploy.sh"), "--package-only", str(tmp_path / "app.zip")],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "would read requirements.txt's markers for another Python than 3.11" in result.stderr
    assert not (tmp_path / "app.zip").exists()
