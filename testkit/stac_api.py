"""The STAC API over a local pgstac: stac-fastapi-pgstac (pinned in requirements-stac.txt, in the
venv ``.venv-stac`` that ``make setup`` makes), run by uvicorn on 127.0.0.1 and stopped after.

What the catalog's tests search, ``devhost serve --catalog`` prints and ``make demo`` ends with.
It reads pgstac's database as any client would (``PGHOST``..., the variables stac-fastapi-pgstac's
``PostgresSettings`` reads), in a folder of its own so that no ``.env`` file of the caller's is read.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
STAC_VENV = PROJECT_ROOT / ".venv-stac"
START_TIMEOUT_S = 60


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class StacApi:
    """stac-fastapi-pgstac on 127.0.0.1:``port`` (a free one) over the database at ``host:db_port``."""

    def __init__(self, *, db_host: str, db_port: int, database: str, user: str, port: int = 0):
        self.port = port or _free_port()
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("PG", "POSTGRES"))},
            "PGHOST": db_host,
            "PGPORT": str(db_port),
            "PGDATABASE": database,
            "PGUSER": user,
            "PGPASSWORD": "",  # the local cluster trusts 127.0.0.1
        }
        self._dir = tempfile.TemporaryDirectory(prefix="tilecommit-stac-")
        self._process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> StacApi:
        python = STAC_VENV / "bin" / "python"
        if not python.exists():
            raise RuntimeError(f"the STAC API is not installed: run `make setup` ({STAC_VENV} is missing)")
        command = [str(python), "-m", "uvicorn", "stac_fastapi.pgstac.app:create_app", "--factory"]
        command += ["--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"]
        log = open(Path(self._dir.name) / "stac-api.log", "wb")  # noqa: SIM115 - the process's own log, closed in close()
        self._log = log
        self._process = subprocess.Popen(command, env=self.env, cwd=self._dir.name, stdout=log, stderr=log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self._process.poll() is not None:
                raise RuntimeError(f"the STAC API exited ({self._process.returncode}): {self.log_text()[-2000:]}")
            try:
                if self.get("/_mgmt/ping").get("message") == "PONG":
                    return self
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the STAC API did not answer in {START_TIMEOUT_S} s: {self.log_text()[-2000:]}")
            time.sleep(0.2)

    def log_text(self) -> str:
        path = Path(self._dir.name) / "stac-api.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=10) as answer:
            return json.loads(answer.read())

    def search(self, **body: object) -> dict:
        """``POST /search`` with ``body`` (``bbox``, ``datetime``, ``collections``, ``limit``...)."""
        request = urllib.request.Request(
            self.url + "/search", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())

    def close(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if getattr(self, "_log", None) is not None:
            self._log.close()
        self._dir.cleanup()

    def __enter__(self) -> StacApi:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()
