"""Damaged GeoTIFFs (a seeded corpus of 340, tests/tiff_fuzz.py) each end as a clear bad-input
refusal or a correct result, in bounded time and memory, and never crash or hang the process.

The files are validated in a worker process, as the job validates an upload (inspect, then every
window encoded as a tile and compared with the source's pixels); a worker that dies or stops
answering is recorded against the file it was on and replaced, so one bad file cannot hide the
rest.
"""

from __future__ import annotations

import json
import queue
import resource
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from devhost.session import process_file
from tilecommit.manifest import count_manifest
from tilecommit.raster.reading.scene import MAX_WINDOW_BYTES

from .app_jobs import WINDOW, local_host
from .tiff_fuzz import make_corpus, write_window_budget_files

ROOT = Path(__file__).resolve().parent.parent
#: A file must be decided within this many seconds...
MAX_SECONDS = 5.0
#: ...and the worker's peak resident memory stay under the Consumption plan's instance limit.
MAX_RSS_BYTES = int(1.5 * 1024**3)
#: How long the runner waits for a worker's answer before it calls the file a hang.
HANG_SECONDS = 30.0


def _cap_address_space() -> None:
    """Address space capped well above the 1.5 GB goal: a runaway allocation fails in the worker
    (and is reported against its file) instead of swapping the machine."""
    resource.setrlimit(resource.RLIMIT_AS, (6 * 1024**3, 6 * 1024**3))


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def run_worker(directory: Path) -> tuple[dict[str, dict], dict[str, str]]:
    """Results by file name; and files that crashed or hung a worker, with what happened."""
    results: dict[str, dict] = {}
    broken: dict[str, str] = {}
    start_after = ""
    while True:
        worker = subprocess.Popen(
            [sys.executable, "-m", "tests.tiff_fuzz", str(directory), start_after],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            preexec_fn=_cap_address_space,
        )
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_pump, args=(worker.stdout, lines), daemon=True).start()
        current = None
        while True:
            try:
                line = lines.get(timeout=HANG_SECONDS)
            except queue.Empty:
                worker.kill()
                broken[current or "?"] = f"no answer within {HANG_SECONDS:.0f} s"
                break
            if line is None:
                worker.wait()
                if current is not None:
                    broken[current] = f"worker died with exit code {worker.returncode}"
                break
            record = json.loads(line)
            if record["event"] == "start":
                current = record["file"]
            else:
                results[record["file"]] = record
                current = None
        if current is None:
            return results, broken
        start_after = current


@pytest.mark.slow
def test_damaged_geotiffs_are_refused_or_processed_never_crash_or_hang(tmp_path, capsys):
    corpus = make_corpus(tmp_path / "corpus")
    assert len(corpus) >= 300
    started = time.perf_counter()
    results, broken = run_worker(tmp_path / "corpus")
    elapsed = time.perf_counter() - started

    outcomes = Counter(r["outcome"] for r in results.values())
    by_family: dict[str, Counter] = {}
    for path, family in corpus:
        if path.name in results:
            by_family.setdefault(family, Counter())[results[path.name]["outcome"]] += 1
    slowest = max(results.values(), key=lambda r: r["seconds"])
    peak = max(r["peak_rss"] for r in results.values())
    with capsys.disabled():  # the figures belong in the CI log
        print(
            f"\nfuzz corpus: {len(corpus)} files in {elapsed:.1f} s; {dict(outcomes)}; crashed or hung: {len(broken)}"
        )
        for family, counts in sorted(by_family.items()):
            print(f"  {family:20s} {dict(counts)}")
        print(f"  slowest: {slowest['file']} {slowest['seconds']:.2f} s; worker peak RSS {peak / 2**20:.0f} MiB")

    assert broken == {}, broken
    assert len(results) == len(corpus)
    unexpected = {name: r for name, r in results.items() if r["outcome"] not in ("refused", "processed")}
    assert unexpected == {}, "\n".join(f"{n}: {r}" for n, r in unexpected.items())
    assert all(results[p.name]["outcome"] == "processed" for p, family in corpus if family == "intact")
    over_budget = [results[p.name] for p, family in corpus if family == "window-budget"]
    assert len(over_budget) == 2
    for result in over_budget:
        assert result["error_type"] == "UnsupportedRasterError", result
        assert f"more than the {MAX_WINDOW_BYTES} bytes" in result["message"], result
    refusals = [r for r in results.values() if r["outcome"] == "refused"]
    assert all(r["error_type"] in ("InvalidRasterError", "UnsupportedRasterError") for r in refusals)
    assert all(r["message"].startswith(str(tmp_path)) for r in refusals), "a refusal names the upload"
    assert slowest["seconds"] < MAX_SECONDS, slowest
    assert peak < MAX_RSS_BYTES, peak


#: Decoded bytes of one window of each window-budget file at the end-to-end tests' window size.
OVER_BUDGET = {
    "window-budget-65535-bands-uint8.tif": 65535 * 64 * 64 * 1,  # the 64 x 64 scene is one window
    "window-budget-200-bands-float64.tif": 200 * WINDOW * WINDOW * 8,
}


@pytest.mark.slow
def test_files_over_the_window_budget_fail_their_job_at_validation_with_no_tile(storage, app_env, tmp_path, capsys):
    """Each job runs its validation once on Azurite (a BadInputError is never retried) and fails
    naming the bytes one window needs, the budget and what to do; nothing is written."""
    files = write_window_budget_files(tmp_path)
    with local_host(app_env) as host:
        summaries = {path.name: process_file(host, path, timeout=120) for path in files}
        validations = [e for e in host.engine.executions if e.name == "validate_source"]
        others = [e.name for e in host.engine.executions if e.name != "validate_source"]
    tiles = storage.blob_service().get_container_client(app_env.tiles)
    table = storage.table_service().get_table_client(app_env.manifest)
    for name, summary in summaries.items():
        assert summary["status"] == "failed", (name, summary)
        error = summary["error"]
        assert f"bad input {name!r}" in error and "(UnsupportedRasterError)" in error, error
        assert f"needs {OVER_BUDGET[name]} bytes" in error, error
        assert f"more than the {MAX_WINDOW_BYTES} bytes" in error, error
        assert "split the bands into several files" in error, error
        assert list(tiles.list_blobs(name_starts_with=f"tiles/{summary['job_id']}/")) == []
        assert count_manifest(table, summary["job_id"]).rows == 0
    # Nothing ran but the validations and each job's failed event: no window was read or rendered.
    assert len(validations) == len(files) and others == ["publish_job_event"] * len(files)
    with capsys.disabled():
        for execution in validations:
            print(f"\nwindow budget: {execution.input['blob']} refused by validate_source in {execution.seconds:.3f} s")
