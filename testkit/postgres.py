"""A real PostgreSQL with PostGIS and pgstac, started in a temporary folder on 127.0.0.1 and
stopped after: what the catalog's tests, the demo and ``devhost serve --catalog`` publish to.

Debian's packages (``postgresql``, ``postgresql-15-postgis-3``; ``make postgres`` installs them)
give the server; pypgstac (PyPI) gives pgstac's schema, installed by its own migration, as a
deployment installs it. The cluster trusts every connection, and listens on 127.0.0.1 only: the
local stand-in for the Entra-authenticated server in Azure, never reachable from elsewhere.

PostgreSQL refuses to run as root (``postgres`` exits, "root execution of the PostgreSQL server
is not permitted"), and CI runs as root: there the server's programs run as Debian's ``postgres``
user, who owns the folder.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

#: The database pgstac is installed in, and the role the tests connect as (the cluster's superuser).
DATABASE = "pgstac"
SUPERUSER = "postgres"
#: How long a start may take before it is a failure.
START_TIMEOUT_S = 60


def server_bindir() -> Path:
    """The folder of Debian's PostgreSQL programs (``initdb``, ``pg_ctl``), the newest installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise RuntimeError("PostgreSQL's server is not installed: run `make postgres` (Debian's postgresql packages)")
    return Path(found[-1]).parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalPostgres:
    """One PostgreSQL cluster: :meth:`start` makes and starts it, with PostGIS and pgstac;
    :meth:`stop_server` and :meth:`start_server` stop and start the same cluster on the same port
    (an outage); :meth:`close` stops it and removes its folder. A context manager."""

    def __init__(self, *, port: int = 0, directory: str | None = None):
        self.port = port or free_port()
        self._own_dir = directory is None
        self.root = Path(directory or tempfile.mkdtemp(prefix="tilecommit-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.bindir = server_bindir()
        self._as_postgres = os.geteuid() == 0

    @property
    def host(self) -> str:
        return "127.0.0.1"

    def dsn(self, database: str = DATABASE) -> str:
        return f"postgresql://{SUPERUSER}@{self.host}:{self.port}/{database}"

    def settings(self) -> dict[str, str]:
        """The app settings that make the app publish to this cluster (tilecommit/settings.py)."""
        from tilecommit import settings

        return {
            settings.SETTING_PGSTAC_HOST: self.host,
            settings.SETTING_PGSTAC_PORT: str(self.port),
            settings.SETTING_PGSTAC_DATABASE: DATABASE,
            settings.SETTING_PGSTAC_USER: SUPERUSER,
            settings.SETTING_PGSTAC_AUTH: settings.PGSTAC_AUTH_TRUST,
        }

    def _run(self, *args: str) -> None:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(args[:2])} failed ({done.returncode}): {done.stderr.strip()}\n{log}")

    def start(self) -> LocalPostgres:
        """A new cluster, started, with the database :data:`DATABASE` holding PostGIS and pgstac."""
        self.root.mkdir(parents=True, exist_ok=True)
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--no-sync")
        self.start_server()
        self._install_pgstac()
        return self

    def start_server(self) -> None:
        """Start the cluster's server (again), on its port, and wait until it accepts connections."""
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "-t",
            str(START_TIMEOUT_S),
            "start",
        )

    def stop_server(self) -> None:
        """Stop the server at once (``-m fast``: open sessions are ended, as in an outage)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def _install_pgstac(self) -> None:
        import psycopg
        from pypgstac.db import PgstacDB
        from pypgstac.migrate import Migrate

        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS postgis")
        Migrate(PgstacDB(dsn=self.dsn())).run_migration()

    def close(self) -> None:
        if (self.data / "postmaster.pid").exists():
            try:
                self.stop_server()
            except RuntimeError:
                pass
        if self._own_dir:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_until_accepting(dsn: str, timeout_s: float = 30.0) -> None:
    """Block until ``dsn`` accepts a connection (a server just started again)."""
    import psycopg

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            psycopg.connect(dsn, connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
