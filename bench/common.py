"""Shared pieces of the bench suite: measured child processes, scenes, a bench Azurite, tables.

Every figure the suite prints is taken on a shared machine (2 cores, other engineers' runs on
it at the same time); the 1-minute load average is recorded around every measurement, and
ratios are always between figures measured in the same repeat of the same run.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "data"  # gitignored: cached scenes
RESULTS = ROOT / "bench" / "results"  # JSON and PNG (rasters there are gitignored, none are written)
PYTHON = sys.executable
RIO = str(Path(PYTHON).with_name("rio"))
MACHINE_NOTE = "shared 2-core machine: other engineers' runs were active"


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def load1() -> float:
    return round(os.getloadavg()[0], 2)


# --------------------------------------------------------------------------- statistics


def spread(values: Iterable[float], digits: int = 3) -> dict:
    """min / median / max / n of a list of numbers (empty -> n 0)."""
    values = [float(v) for v in values if v is not None]
    if not values:
        return {"n": 0, "min": None, "median": None, "max": None}
    return {
        "n": len(values),
        "min": round(min(values), digits),
        "median": round(statistics.median(values), digits),
        "max": round(max(values), digits),
    }


def fmt_spread(s: dict, unit: str = "", digits: int = 2) -> str:
    if not s or not s.get("n"):
        return "-"
    if s["n"] == 1:
        return f"{s['median']:.{digits}f}{unit}"
    return f"{s['median']:.{digits}f}{unit} [{s['min']:.{digits}f}-{s['max']:.{digits}f}, n={s['n']}]"


# --------------------------------------------------------------------------- child processes


@dataclass
class Measured:
    """One child process: wall time, its own peak RSS and CPU time (from wait4), its output."""

    args: list[str]
    wall_s: float
    peak_rss_mb: float
    cpu_s: float
    returncode: int
    stdout: str
    stderr: str
    load_before: float
    load_after: float

    def json(self) -> Any:
        return json.loads(self.stdout.strip().splitlines()[-1])

    def summary(self) -> dict:
        return {
            "wall_s": round(self.wall_s, 3),
            "peak_rss_mb": round(self.peak_rss_mb, 1),
            "cpu_s": round(self.cpu_s, 2),
            "load1_before": self.load_before,
            "load1_after": self.load_after,
        }


#: A minimal launcher between this process and the measured child. Linux carries the RSS
#: high-water mark of the process that forks (or vforks) into the child's ru_maxrss across
#: exec, so a child started straight from a bench process holding a few hundred MB would report
#: at least that much. This launcher (python -I -S, about 9 MB) forks the real child and reports
#: its wait4 figures, so a child's peak RSS is its own plus at most the launcher's ~9 MB.
_LAUNCHER = r"""
import os, sys, time
report, args = sys.argv[1], sys.argv[2:]
started = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execvp(args[0], args)
    finally:
        os._exit(127)
_, status, ru = os.wait4(pid, 0)
wall = time.perf_counter() - started
code = os.waitstatus_to_exitcode(status)
with open(report, "w") as f:
    f.write("%d %.6f %.6f %.6f %d" % (ru.ru_maxrss, ru.ru_utime, ru.ru_stime, wall, code))
sys.exit(code if code >= 0 else 128 - code)
"""


def run_measured(args: Sequence[str], *, env: dict | None = None, cwd: Path = ROOT, check: bool = True) -> Measured:
    """Run ``args``; its wall time, and its own ru_maxrss and CPU seconds from ``wait4``.

    The child is started by a small launcher (see ``_LAUNCHER``) so that this process's own
    memory does not leak into the child's ru_maxrss. Output goes to temporary files (a pipe
    could fill and block the child).
    """
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.NamedTemporaryFile("r", suffix=".rusage") as report,
    ):
        before = load1()
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _LAUNCHER, report.name, *map(str, args)],
            stdout=out,
            stderr=err,
            env=env,
            cwd=cwd,
        )
        proc.wait()
        fields = report.read().split()
        if len(fields) != 5:
            raise RuntimeError(
                f"the measuring launcher failed (exit {proc.returncode}) for {' '.join(map(str, args[:4]))}"
            )
        maxrss_kib, utime, stime, wall, code = (
            int(fields[0]),
            float(fields[1]),
            float(fields[2]),
            float(fields[3]),
            int(fields[4]),
        )
        out.seek(0)
        err.seek(0)
        measured = Measured(
            args=list(map(str, args)),
            wall_s=wall,
            peak_rss_mb=maxrss_kib / 1024.0,  # Linux reports KiB
            cpu_s=utime + stime,
            returncode=code,
            stdout=out.read().decode(errors="replace"),
            stderr=err.read().decode(errors="replace"),
            load_before=before,
            load_after=load1(),
        )
    if check and measured.returncode != 0:
        raise RuntimeError(
            f"{' '.join(map(str, args[:4]))} ... exited {measured.returncode}:\n{measured.stderr[-3000:]}"
        )
    return measured


# --------------------------------------------------------------------------- scenes


def scene_path(size: int) -> Path:
    """The cached deterministic size x size x 3-band uint16 scene (nodata 0) under bench/data/.

    If another process is writing the same scene right now (its ``.partial.tif`` is growing),
    waits for it instead of writing it twice.
    """
    from testkit.scenes import SceneSpec, write_scene

    DATA.mkdir(parents=True, exist_ok=True)
    final = DATA / f"scene_{size}x{size}x3_uint16.tif"
    partial = final.with_suffix(".partial.tif")
    while not final.exists() and partial.exists() and time.time() - partial.stat().st_mtime < 120:
        say(f"  waiting for {partial.name}: another process is generating it")
        time.sleep(10)
    if not final.exists():
        started = time.perf_counter()
        write_scene(str(partial), SceneSpec(size, size, 3, "uint16", nodata=0))
        partial.rename(final)
        say(
            f"  generated {final.name} in {time.perf_counter() - started:.1f} s ({final.stat().st_size / 2**20:.0f} MiB)"
        )
    return final


def tiny_scene(path: Path, size: int) -> Path:
    """A small deterministic scene outside the cache (for smoke tests)."""
    from testkit.scenes import SceneSpec, write_scene

    return Path(write_scene(str(path), SceneSpec(size, size, 3, "uint16", nodata=0)))


# --------------------------------------------------------------------------- storage


class BenchStorage:
    """A private Azurite for the bench (on disk: large scenes would bloat an in-memory one),
    with per-run container, table and task hub names handed out by :meth:`app_env`."""

    def __init__(self, *, in_memory: bool = False, connection_string: str | None = None):
        self.in_memory = in_memory
        self._given = connection_string
        self._azurite = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self.connection_string = connection_string or ""
        self.blob_port = self.table_port = None
        self._counter = 0

    def __enter__(self) -> BenchStorage:
        if self._given is None:
            from devhost.azurite import Azurite

            if not self.in_memory:
                self._tmp = tempfile.TemporaryDirectory(prefix="tilecommit-bench-azurite-")
            self._azurite = Azurite(in_memory=self.in_memory, workdir=self._tmp.name if self._tmp else None)
            self._azurite.start(timeout=60)
            self.connection_string = self._azurite.connection_string
            self.blob_port, self.table_port = self._azurite.blob_port, self._azurite.table_port
        else:
            from tilecommit.storage import StorageConnection

            conn = StorageConnection.from_connection_string(self.connection_string)
            from urllib.parse import urlsplit

            self.blob_port = urlsplit(conn.blob_endpoint).port
            self.table_port = urlsplit(conn.table_endpoint or "").port
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._azurite is not None:
            self._azurite.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def azurite_cpu_s(self) -> float | None:
        """CPU seconds the bench Azurite (a Node process) has used so far; None when not ours."""
        if self._azurite is None or self._azurite.process is None:
            return None
        try:
            import psutil

            times = psutil.Process(self._azurite.process.pid).cpu_times()
            return times.user + times.system
        except Exception:
            return None

    @property
    def connection(self):
        from tilecommit.storage import StorageConnection

        return StorageConnection.from_connection_string(self.connection_string)

    def app_env(self, tag: str, *, window_size: int = 1024, batch_size: int = 64) -> dict:
        """App settings for one run: its own containers, tables and task hub."""
        from tilecommit import settings as names

        self._counter += 1
        suffix = hashlib.sha256(f"{tag}-{self._counter}-{time.time_ns()}".encode()).hexdigest()[:10]
        return {
            names.STORAGE_CONNECTION: self.connection_string,
            names.SETTING_INPUT_CONTAINER: f"in-{suffix}",
            names.SETTING_TILES_CONTAINER: f"tiles-{suffix}",
            names.SETTING_OUTPUT_CONTAINER: f"out-{suffix}",
            names.SETTING_MANIFEST_TABLE: f"manifest{suffix}",
            names.SETTING_WINDOW_SIZE: str(window_size),
            names.SETTING_BATCH_SIZE: str(batch_size),
            "BENCH_HUB": f"Bench{suffix}",
        }

    def ensure(self, env: dict) -> None:
        from azure.core.exceptions import ResourceExistsError

        from tilecommit import settings as names

        blobs, tables = self.connection.blob_service(), self.connection.table_service()
        for key in (names.SETTING_INPUT_CONTAINER, names.SETTING_TILES_CONTAINER, names.SETTING_OUTPUT_CONTAINER):
            with suppress(ResourceExistsError):
                blobs.create_container(env[key])
        tables.create_table_if_not_exists(env[names.SETTING_MANIFEST_TABLE])

    def drop(self, env: dict) -> None:
        """Delete one run's containers and tables (the bench Azurite lives on disk)."""
        from tilecommit import settings as names

        blobs, tables = self.connection.blob_service(), self.connection.table_service()
        for key in (names.SETTING_INPUT_CONTAINER, names.SETTING_TILES_CONTAINER, names.SETTING_OUTPUT_CONTAINER):
            with suppress(Exception):
                blobs.delete_container(env[key])
        hub = env.get("BENCH_HUB")
        if hub:
            with suppress(Exception):
                blobs.delete_container(f"{hub.lower()}-largemessages")
        for name in [env.get(names.SETTING_MANIFEST_TABLE)] + ([f"{hub}History", f"{hub}Events"] if hub else []):
            with suppress(Exception):
                tables.delete_table(name)


@contextmanager
def environment(values: dict) -> Iterator[None]:
    """Set environment variables for an in-process run, restoring them afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# --------------------------------------------------------------------------- request counting


class RequestCounter:
    """Counts the HTTP requests the Python storage SDKs send (azure-core's requests transport),
    by service (Azurite's blob / table port) and method. GDAL's own /vsiaz/ reads go through
    libcurl and are not seen here."""

    def __init__(self, ports: dict[int, str] | None = None):
        self.ports = ports or {}
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._original: Callable | None = None

    def __enter__(self) -> RequestCounter:
        from urllib.parse import urlsplit

        import requests.adapters

        original = requests.adapters.HTTPAdapter.send
        counter = self

        def send(adapter, request, *args, **kwargs):
            port = urlsplit(request.url).port
            key = f"{counter.ports.get(port, 'other')} {request.method}"
            with counter._lock:
                counter.counts[key] = counter.counts.get(key, 0) + 1
            return original(adapter, request, *args, **kwargs)

        self._original = original
        requests.adapters.HTTPAdapter.send = send
        return self

    def __exit__(self, *exc: Any) -> None:
        import requests.adapters

        requests.adapters.HTTPAdapter.send = self._original

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

    @staticmethod
    def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
        keys = set(after) | set(before)
        diff = {k: after.get(k, 0) - before.get(k, 0) for k in sorted(keys)}
        return {k: v for k, v in diff.items() if v}


# --------------------------------------------------------------------------- machine and output


def machine_info() -> dict:
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "note": MACHINE_NOTE,
        "load1_at_start": load1(),
    }
    from importlib.metadata import version

    import azure.storage.blob
    import psutil
    import rasterio
    import rio_cogeo

    info["memory_gb"] = round(psutil.virtual_memory().total / 2**30, 1)
    info.update(rasterio=rasterio.__version__, gdal=rasterio.__gdal_version__, rio_cogeo=rio_cogeo.__version__)
    info["azure_functions_durable"] = version("azure-functions-durable")
    info["azure_storage_blob"] = azure.storage.blob.__version__
    return info


def pyplot():
    """matplotlib's pyplot on the Agg backend (charts are files; there is no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """A plain-text table (also valid GitHub Markdown)."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("| " + " | ".join(c.ljust(widths[i]) for i, c in enumerate(row)) + " |")
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


@dataclass
class Target:
    """One benchmark target (docs/benchmarks.md), judged on figures from this run."""

    name: str
    goal: str
    measured: str
    passed: bool | None  # None: not measured in this run
    why: str = ""

    @property
    def verdict(self) -> str:
        return "n/a" if self.passed is None else ("PASS" if self.passed else "MISS")


def dump(obj: Any) -> Any:
    """JSON-ready copy of dataclasses and tuples."""
    if hasattr(obj, "__dataclass_fields__"):
        return dump(asdict(obj))
    if isinstance(obj, dict):
        return {str(k): dump(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [dump(v) for v in obj]
    return obj


@dataclass
class Context:
    """What every bench module gets: the bench Azurite and the run's mode."""

    storage: BenchStorage
    quick: bool
    results: dict = field(default_factory=dict)
