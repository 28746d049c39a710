"""Which storage a ``python -m devhost`` command uses, made sure of before the command starts.

- **Configured** (``AzureWebJobsStorage`` or its ``__blobServiceUri`` form in the environment or in
  ``local.settings.json``): used as it is, nothing is started. Its endpoints are probed with one
  short TCP connect each first, because the SDK clients retry a refused connection for minutes.
- **Not configured** (the local default): the embedded Azurite, the project's pinned one, on free
  127.0.0.1 ports with its data and its account key under ``.devhost/azurite/`` (git-ignored), so
  jobs outlive the command. A command that finds another one already running it shares it; the
  command that started it stops it when it ends and no other command uses it any more.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from tilecommit.settings import STORAGE_CONNECTION

from .azurite import ACCOUNT_NAME, Azurite, new_account_key
from .durable.host import PROJECT_ROOT, load_local_settings

#: Where the embedded Azurite keeps its data, key and log (the tests point it elsewhere).
STATE_DIR_VARIABLE = "DEVHOST_STATE_DIR"
PROBE_TIMEOUT_S = 2.0


class StorageUnavailable(Exception):
    """Storage cannot be used; the message is one line saying what was tried and how to fix it."""


@dataclass(frozen=True)
class StorageChoice:
    #: Where the connection comes from, as the user would look for it.
    source: str
    #: The blob endpoint, for messages.
    blob_endpoint: str


def configured_source(root: Path = PROJECT_ROOT) -> str | None:
    """Where the storage setting comes from, or None when nothing configures it (the local default)."""

    from tilecommit.storage import configures

    if configures({k: v for k, v in os.environ.items() if v.strip()}, STORAGE_CONNECTION):
        return f"{STORAGE_CONNECTION} from the environment"
    local = root / "local.settings.json"
    try:
        values = json.loads(local.read_text()).get("Values", {}) if local.exists() else {}
    except ValueError as exc:
        raise StorageUnavailable(f"{local}: not valid JSON ({exc}); fix it or remove it") from None
    if configures(values, STORAGE_CONNECTION):
        return f"{STORAGE_CONNECTION} from {local.name}"
    return None


def probe_endpoints(source: str) -> StorageChoice:
    """One short connect to each endpoint of the configured storage; StorageUnavailable if one fails."""
    from tilecommit.storage import StorageConnection

    from .durable.host import apply_settings

    apply_settings(load_local_settings())
    connection = StorageConnection.from_env()
    for service, url in (
        ("blob", connection.blob_endpoint),
        ("table", connection.table_endpoint),
        ("queue", connection.queue_endpoint),
    ):
        if not url:
            continue
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
        try:
            with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
                pass
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__  # a timeout has no strerror
            raise StorageUnavailable(
                f"{service} storage at {url} ({source}) is not reachable: connecting to {host}:{port} "
                f"failed ({reason}); start it (Azurite: node_modules/.bin/node node_modules/.bin/azurite --skipApiVersionCheck --loose), fix "
                f"{STORAGE_CONNECTION}, or unset it and remove local.settings.json to use the embedded Azurite"
            ) from None
    assert connection.blob_endpoint is not None  # from_env raises when no blob endpoint is configured
    return StorageChoice(source, connection.blob_endpoint)


def state_dir() -> Path:
    return Path(os.environ.get(STATE_DIR_VARIABLE) or PROJECT_ROOT / ".devhost") / "azurite"


def account_key(folder: Path) -> str:
    """The embedded account's key, made once: the data in the folder is only readable with it.

    Commands started at once race to make it: one creates the file (``O_EXCL``), the others find
    it there, possibly before its writer wrote the key, and wait for the key to appear."""
    path = folder / "account-key"
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(new_account_key())
    deadline = time.monotonic() + 10
    while not (key := path.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not key:
        raise RuntimeError(f"{path} stayed empty: delete it and run the command again")
    return key


def _connection_string(key: str, ports: dict[str, int]) -> str:
    endpoint = lambda service: f"http://127.0.0.1:{ports[service]}/{ACCOUNT_NAME}"  # noqa: E731
    return (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT_NAME};AccountKey={key};"
        f"BlobEndpoint={endpoint('blob')};QueueEndpoint={endpoint('queue')};TableEndpoint={endpoint('table')};"
    )


@contextlib.contextmanager
def embedded_azurite(start_timeout: float = 30.0) -> Iterator[StorageChoice]:
    """The embedded Azurite's connection in ``AzureWebJobsStorage`` for the block: started here and
    stopped at its end, or shared with the command that holds it (a ``flock`` on its folder)."""
    folder = state_dir()
    folder.mkdir(parents=True, exist_ok=True)
    key = account_key(folder)
    running = folder / "running.json"
    # Every command using the embedded Azurite holds a shared lock on ``users`` while it runs; the one
    # that started it waits for an exclusive lock there before stopping it, so it never stops the
    # storage under a command still using it (a killed command's lock goes with its process).
    with open(folder / "users", "w") as users, open(folder / "lock", "w") as lock:
        fcntl.flock(users, fcntl.LOCK_SH)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            ports = _wait_for_running(running, start_timeout)
            os.environ[STORAGE_CONNECTION] = _connection_string(key, ports)
            yield StorageChoice(f"the embedded Azurite another devhost command runs ({folder})", _blob(ports))
            return
        data = folder / "data"
        _stop_leftover(running, data)
        running.unlink(missing_ok=True)
        data.mkdir(exist_ok=True)
        azurite = Azurite(in_memory=False, workdir=str(data), log_path=str(folder / "azurite.log"), key=key)
        try:
            azurite.start(timeout=start_timeout)
        except RuntimeError as exc:
            raise StorageUnavailable(
                f"the embedded Azurite ({folder}) did not start: {exc}; see {folder / 'azurite.log'}"
            ) from None
        try:
            ports = {"blob": azurite.blob_port, "queue": azurite.queue_port, "table": azurite.table_port}
            assert azurite.process is not None  # started above
            running.write_text(json.dumps({"pid": os.getpid(), "azurite_pid": azurite.process.pid, **ports}))
            os.environ[STORAGE_CONNECTION] = azurite.connection_string
            yield StorageChoice(f"the embedded Azurite ({folder})", azurite.blob_endpoint)
        finally:
            _wait_for_other_users(users)
            running.unlink(missing_ok=True)
            azurite.stop()


def _wait_for_other_users(users) -> None:
    """Block until no other command holds its shared lock on ``users`` (they use this Azurite)."""
    fcntl.flock(users, fcntl.LOCK_UN)
    try:
        fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.stderr.write("devhost: waiting for the other devhost commands using the embedded Azurite to end\n")
        sys.stderr.flush()
        fcntl.flock(users, fcntl.LOCK_EX)


def _stop_leftover(running: Path, data: Path, timeout: float = 10.0) -> None:
    """Stop an Azurite that a killed command left running on ``data`` (SIGKILL skips the command's
    cleanup; the memory watchdog recycles with SIGKILL): two on the same files would corrupt them."""
    try:
        pid = int(json.loads(running.read_text())["azurite_pid"])
    except (OSError, ValueError, KeyError):
        return
    if not _runs_on(pid, data):  # gone, or the pid reused by something else
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)  # Azurite runs in a session of its own: its pid is its group
    deadline = time.monotonic() + timeout
    while _runs_on(pid, data) and time.monotonic() < deadline:
        time.sleep(0.1)


def _runs_on(pid: int, data: Path) -> bool:
    """Whether process ``pid`` is alive with ``data`` on its command line (a zombie has none)."""
    try:
        return str(data).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _blob(ports: dict[str, int]) -> str:
    return f"http://127.0.0.1:{ports['blob']}/{ACCOUNT_NAME}"


def _wait_for_running(running: Path, timeout: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError, ValueError):
            ports = json.loads(running.read_text())
            if all(Azurite._answers(ports[service]) for service in ("blob", "queue", "table")):
                return ports
        time.sleep(0.1)
    raise StorageUnavailable(
        f"another devhost command holds the embedded Azurite ({running.parent}) but it did not answer "
        f"within {timeout:.0f} s; wait for that command to end, or stop it"
    )


@contextlib.contextmanager
def storage_for_command() -> Iterator[StorageChoice]:
    """The storage a command uses, for the length of the block (see the module's docstring)."""
    source = configured_source()
    if source is not None:
        yield probe_endpoints(source)
        return
    with embedded_azurite() as choice:
        yield choice
