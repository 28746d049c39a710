"""``python -m devhost`` run as a user runs it: a subprocess, its exit code, stdout and stderr.

The embedded-Azurite tests point its data folder at the test's tmp_path (``DEVHOST_STATE_DIR``)
and leave ``AzureWebJobsStorage`` unset; the others configure the session's Azurite, or an
address where storage is down.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import psutil
import pytest

from devhost.local_storage import STATE_DIR_VARIABLE, account_key
from tilecommit.settings import SETTING_WINDOW_SIZE, STORAGE_CONNECTION

from .app_jobs import ROOT, WINDOW, AppEnv, download, make_scene

pytestmark = pytest.mark.slow


def user_env(**extra: str) -> dict[str, str]:
    """The environment of a user who configured no storage, plus ``extra``."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(STORAGE_CONNECTION) and not k.startswith("TILECOMMIT")
    }
    return {**env, **extra}


def run_cli(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "devhost", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def azurites_using(folder: Path) -> list[psutil.Process]:
    """Every live process whose command line names ``folder`` (an embedded Azurite's --location)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any(str(folder) in part for part in process.info["cmdline"] or ()):
            found.append(process)
    return found


@pytest.fixture
def no_storage_configured(tmp_path) -> tuple[dict[str, str], Path]:
    # The embedded default needs a checkout without local.settings.json naming storage.
    local = ROOT / "local.settings.json"
    assert not local.exists() or STORAGE_CONNECTION not in local.read_text(), f"{local} configures storage"
    state = tmp_path / "state"
    return user_env(**{STATE_DIR_VARIABLE: str(state), SETTING_WINDOW_SIZE: str(WINDOW)}), state


def test_no_storage_configured_runs_the_embedded_azurite_keeps_its_jobs_and_stops_it(no_storage_configured, tmp_path):
    env, state = no_storage_configured
    first = run_cli(env, "process", str(make_scene(tmp_path / "first.tif", 300, 260)))
    assert first.returncode == 0, first.stderr
    assert first.stderr == ""  # quiet: no warning that is not about the job
    first_job = json.loads(first.stdout)
    assert first_job["status"] == "completed" and first_job["written"] == 4
    assert (state / "azurite" / "data").is_dir() and (state / "azurite" / "account-key").stat().st_mode & 0o077 == 0
    assert azurites_using(state) == []

    second = run_cli(
        env, "process", str(make_scene(tmp_path / "second.tif", 260, 300)), "--output", str(tmp_path / "o")
    )
    assert second.returncode == 0, second.stderr
    second_job = json.loads(second.stdout)
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["item.json", "mosaic.tif", "quicklook.png"]
    assert second_job["saved"]["mosaic.tif"] == str(tmp_path / "o" / "mosaic.tif")

    listed = run_cli(env, "status")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["JOB", "STATE", "PROGRESS", "AGE", "UPLOAD"]
    assert [line.split()[0] for line in lines[1:]] == [second_job["job_id"], first_job["job_id"]]  # newest first
    assert all("completed" in line and "4/4 windows" in line for line in lines[1:])
    assert azurites_using(state) == []


def test_serve_on_the_embedded_azurite_shares_it_and_stops_it_on_ctrl_c(no_storage_configured):
    env, state = no_storage_configured
    serve = subprocess.Popen(
        [sys.executable, "-m", "devhost", "serve", "--http-port", "0"],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        banner = serve.stderr.readline()
        assert "watching container" in banner and "embedded Azurite" in banner, banner
        started = [p for p in psutil.Process(serve.pid).children(recursive=True) if p in azurites_using(state)]
        assert started, "serve started no Azurite in its folder"
        # A second command while serve runs uses the same emulator and starts none of its own.
        listed = run_cli(env, "status")
        assert listed.returncode == 0 and "no jobs" in listed.stderr, listed.stderr
        assert set(azurites_using(state)) == set(started)
    finally:
        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=60) == 0
    assert azurites_using(state) == []


def test_an_azurite_left_by_a_killed_command_is_stopped_by_the_next(no_storage_configured, tmp_path):
    env, state = no_storage_configured
    scene = make_scene(tmp_path / "scene.tif", 300, 260)
    # The memory watchdog recycles the process with SIGKILL, as the platform does: no cleanup runs.
    killed = run_cli(env, "process", str(scene), "--instance-memory-mb", "1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = azurites_using(state)
    try:
        assert left, "the killed command's Azurite is not running: nothing to show"
        listed = run_cli(env, "status")
        assert listed.returncode == 0, listed.stderr
        assert azurites_using(state) == []
    finally:
        for process in azurites_using(state):  # only when the test failed: leave no process behind
            process.kill()


def test_commands_started_at_once_all_read_the_one_account_key_the_first_made(tmp_path):
    """The embedded account's key is made by whichever command comes first; the others, racing
    it, find the file (perhaps still empty) and read the same key: none fails."""
    from concurrent.futures import ThreadPoolExecutor

    for round_ in range(20):
        folder = tmp_path / f"round-{round_}"
        folder.mkdir()
        with ThreadPoolExecutor(8) as pool:
            keys = list(pool.map(account_key, [folder] * 8))
        assert len(set(keys)) == 1 and keys[0], keys


def test_a_missing_file_is_one_line_and_exit_2_before_any_connection(no_storage_configured, tmp_path):
    env, state = no_storage_configured
    missing = run_cli(env, "process", str(tmp_path / "nonexistent.tif"), timeout=30)
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.splitlines() == [f"python -m devhost process: {tmp_path / 'nonexistent.tif'}: no such file"]
    # The evidence that nothing was connected to: no embedded Azurite was started for it (it
    # leaves its state folder). A bound on the wall time was here; under load the interpreter's
    # start alone passed it, and speed is the benches' to show.
    assert not state.exists()
    # With storage configured at an address that accepts and never answers, nothing connects to it.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        silent.setblocking(False)
        port = silent.getsockname()[1]
        configured = user_env(**{STORAGE_CONNECTION: connection_string_at(port)})
        also_missing = run_cli(configured, "process", str(tmp_path / "nonexistent.tif"), timeout=30)
        assert also_missing.returncode == 2 and len(also_missing.stderr.splitlines()) == 1
        with pytest.raises(BlockingIOError):
            silent.accept()


def connection_string_at(port: int) -> str:
    endpoint = f"http://127.0.0.1:{port}/devstoreaccount1"
    return (
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
        f"BlobEndpoint={endpoint};QueueEndpoint={endpoint};TableEndpoint={endpoint};"
    )


def test_storage_configured_but_down_is_one_line_naming_the_endpoint_and_exit_2(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = user_env(**{STORAGE_CONNECTION: connection_string_at(port)})
    scene = make_scene(tmp_path / "scene.tif", 300, 260)
    for args in (("process", str(scene)), ("status",), ("serve",)):
        began = time.monotonic()
        down = run_cli(env, *args, timeout=60)
        elapsed = time.monotonic() - began
        assert down.returncode == 2 and down.stdout == "", down.stderr
        (line,) = down.stderr.splitlines()
        assert f"http://127.0.0.1:{port}/devstoreaccount1" in line and "Connection refused" in line, line
        assert "AzureWebJobsStorage from the environment" in line and "Traceback" not in line
        # The probe answers at once; the SDK clients would retry a refused connection for minutes.
        # 20 s tells the two apart with room for a loaded machine's interpreter start (over 5 s seen).
        assert elapsed < 20.0, f"{args[0]}: {elapsed:.2f} s"


def test_three_files_at_once_save_outputs_equal_to_the_committed_blobs(storage, app_env: AppEnv, tmp_path):
    scenes = [make_scene(tmp_path / f"scene{i}.tif", 300 + 40 * i, 260) for i in range(3)]
    out = tmp_path / "out"
    env = {**os.environ, **app_env.env}
    args = ("process", *map(str, scenes), "--hub", app_env.hub, "--output", str(out), "--progress", "always")
    done = run_cli(env, *args)
    assert done.returncode == 0, done.stderr
    summaries = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(summaries) == 3 and all(s["status"] == "completed" for s in summaries)
    assert len({s["job_id"] for s in summaries}) == 3
    for summary in summaries:
        assert summary["job_id"] in done.stderr  # its progress line
        folder = Path(summary["saved"]["mosaic.tif"]).parent
        assert folder.parent == out and folder.name in {s.stem for s in scenes}
        for key, filename in (
            ("mosaic_url", "mosaic.tif"),
            ("stac_url", "item.json"),
            ("quicklook_url", "quicklook.png"),
        ):
            blob_name = summary[key].split(f"/{app_env.output}/", 1)[1]
            assert (folder / filename).read_bytes() == download(storage, app_env.output, blob_name)


def test_process_status_and_exit_codes_on_configured_storage(storage, app_env, tmp_path):
    env = {**os.environ, **app_env.env}
    scene = make_scene(tmp_path / "cli.tif", 300, 260)
    done = run_cli(env, "process", str(scene), "--hub", app_env.hub, "--deliveries", "2")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["status"] == "completed" and summary["windows"] == 4 and summary["written"] == 4
    assert set(summary) >= {
        "job_id",
        "status",
        "windows",
        "written",
        "already_present",
        "mosaic_url",
        "stac_url",
        "elapsed_s",
        "upload_cpu_s",
    }
    assert 0 < summary["upload_cpu_s"] < 60
    starts = summary["host"]["starts"]  # racing starters: both may succeed, as on Azure Storage
    assert len(starts) == 2 and "started" in starts and set(starts) <= {"started", "duplicate"}

    status = run_cli(env, "status", summary["job_id"], "--hub", app_env.hub)
    assert status.returncode == 0, status.stderr
    reported = json.loads(status.stdout)  # what GET /api/jobs/{id} answers: the same function
    assert reported["state"] == "completed" and reported["summary"]["windows"] == 4
    assert reported["progress"]["windows_done"] == 4 and reported["outputs"]["mosaic"] == summary["mosaic_url"]
    unknown = run_cli(env, "status", "0000000000000000", "--hub", app_env.hub)
    assert unknown.returncode == 1 and json.loads(unknown.stdout)["error"]["code"] == "job-not-found"
    corrupt = tmp_path / "corrupt.tif"
    corrupt.write_bytes(b"II*\x00" + b"\x00" * 100)
    failed = run_cli(env, "process", str(corrupt), "--hub", app_env.hub)
    assert failed.returncode == 1
    assert json.loads(failed.stdout)["status"] == "failed" and "corrupt.tif" in json.loads(failed.stdout)["error"]
    usage = run_cli(env, "process", str(tmp_path / "missing.tif"), "--hub", app_env.hub)
    assert usage.returncode == 2 and "no such file" in usage.stderr
    assert run_cli(env, "frobnicate").returncode == 2


def _unicode_twins(folder: Path) -> list[Path]:
    """Two files whose names are the same text in NFC and in NFD: two uploads, two jobs."""
    names = [unicodedata.normalize(form, "café.tif") for form in ("NFC", "NFD")]
    assert names[0] != names[1] and names[0].encode() != names[1].encode()
    return [make_scene(folder / name, 300 + 40 * n, 260) for n, name in enumerate(names)]


@pytest.mark.parametrize("commands", [2, 5])
def test_process_commands_started_at_once_on_the_embedded_storage_all_complete(
    no_storage_configured, tmp_path, commands
):
    """Each command is a host on the same task hub: whichever host runs a job, every command gets
    its own job's summary, and the embedded Azurite outlives every command that uses it."""
    env, state = no_storage_configured
    folder = tmp_path / "uploads"
    folder.mkdir()
    paths = (
        _unicode_twins(folder)
        if commands == 2
        else [make_scene(folder / f"plain-{n}.tif", 300 + 20 * n, 260) for n in range(commands)]
    )
    running = [
        subprocess.Popen(
            [sys.executable, "-m", "devhost", "process", str(path)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for path in paths
    ]
    finished = [process.communicate(timeout=300) for process in running]
    for process, (out, err) in zip(running, finished, strict=True):
        assert process.returncode == 0, err
        (summary,) = [json.loads(line) for line in out.splitlines()]
        assert summary["status"] == "completed" and summary["windows"] == 4, summary
    job_ids = {json.loads(out)["job_id"] for out, _ in finished}
    assert len(job_ids) == commands
    assert azurites_using(state) == []  # stopped by its last user, not before


def test_the_progress_board_writes_to_the_stderr_of_its_call_not_of_the_modules_import(monkeypatch):
    """A default stream bound when devhost.session was first imported was, in the suite, another
    test's captured stream, closed since: the board then failed every job it was given."""
    from devhost.session import ProgressBoard

    now = io.StringIO()
    monkeypatch.setattr(sys, "stderr", now)
    board = ProgressBoard(True)
    board.update(0, {"id": "job", "status": "Running", "custom_status": {"windows_done": 3, "windows_total": 10}})
    assert now.getvalue() == "job: [#########.....................] 3/10 windows, running\n"


def test_a_serve_command_still_stopping_after_a_while_writes_every_threads_stack(storage, app_env: AppEnv):
    """A stop that does not end (a drain waiting on something that never comes) says where each
    thread waits, in the log, without anyone asking: a slow stop is a double here (the host's own
    stop sleeps), the serve command, its signal handling and faulthandler are the real ones."""
    script = (
        "import sys, time\n"
        "import devhost.cli as cli\n"
        "from devhost.durable.host import LocalHost\n"
        "cli.SLOW_STOP_S = 1\n"
        "stop = LocalHost.stop\n"
        "def slow_stop(self):\n"
        "    time.sleep(4)\n"
        "    stop(self)\n"
        "LocalHost.stop = slow_stop\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    host = subprocess.Popen(
        [sys.executable, "-c", script, "serve", "--hub", app_env.hub, "--http-port", "0"],
        cwd=ROOT,
        env={**os.environ, **app_env.env},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "devhost: watching" in host.stderr.readline()
        host.send_signal(signal.SIGTERM)
        assert host.wait(timeout=60) == 0
        log = host.stderr.read()
    finally:
        if host.poll() is None:
            host.kill()
    assert "Thread 0x" in log and "in slow_stop" in log, log
    assert log.rstrip().splitlines()[-1].startswith("devhost: host ")
