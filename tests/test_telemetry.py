"""What an operator sees: the counters, spans and logs of real jobs on the local host, read back
through in-memory OpenTelemetry readers, compared with what storage and the host saw, and the
workbook's KQL run over them shaped as Application Insights tables.

One module-wide run: a 3 x 3-window scene delivered 3 times with every activity run twice, then a
file that is not a TIFF. Storage is reached through recording proxies, so the refusals storage
actually answered (409/412) are the truth the refusal counters are compared with.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from opentelemetry.instrumentation.logging.handler import LoggingHandler
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor

from devhost.session import process_file
from testkit.storage_proxy import RecordingProxy
from tilecommit import settings as names
from tilecommit.errors import BadInputError
from tilecommit.manifest import count_manifest
from tilecommit.observability import telemetry
from tilecommit.raster import inspect_source
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec

from . import appinsights_tables
from .app_jobs import ROOT, AppEnv, local_host, make_scene
from .conftest import METRIC_READER, SPANS, app_env_for

pytestmark = pytest.mark.slow

WORKBOOK = Path(__file__).resolve().parent.parent / "infra" / "workbook"
REFUSED = (409, 412)


@dataclass
class LocalRun:
    app_env: AppEnv
    good: dict
    bad: dict
    decisions: list[dict]
    good_executions: int
    table_answers: list[tuple[str, str, int]]
    logs: list
    bad_error_type: str
    account: str


@pytest.fixture(scope="module")
def local_run(azurite, storage, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("telemetry")
    scene = make_scene(tmp / "scene.tif", 600, 520)  # 3 x 3 windows of 256 px
    not_a_tiff = tmp / "notes.tif"
    not_a_tiff.write_bytes(b"these are notes, not a raster\n" * 10)
    try:
        inspect_source(str(not_a_tiff), settings=Settings(), spec=OutputSpec())
    except BadInputError as exc:
        bad_error_type = type(exc).__name__
    logs = InMemoryLogRecordExporter()
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    handler = LoggingHandler(level=logging.INFO, logger_provider=provider)
    handler.addFilter(telemetry.JobIdFilter())
    app_logger = logging.getLogger("tilecommit")
    level = app_logger.level
    with (
        pytest.MonkeyPatch.context() as monkeypatch,
        RecordingProxy(f"http://127.0.0.1:{azurite.table_port}") as table_proxy,
    ):
        app_env = app_env_for(azurite, monkeypatch, __name__)
        # Tables only: GDAL reads blobs too, and its reads through this proxy have hung.
        proxied = azurite.connection_string.replace(f":{azurite.table_port}/", f":{table_proxy.port}/")
        monkeypatch.setenv(names.STORAGE_CONNECTION, proxied)
        logging.getLogger().addHandler(handler)
        app_logger.setLevel(logging.INFO)
        try:
            with local_host(app_env, deliveries=3, duplicate_activities=True) as host:
                good = process_file(host, scene, timeout=180)
                decisions = list(host.decisions)
                assert host.engine.activities.drain(timeout=60)  # the second copies may still run
                good_executions = host.engine.stats.activity_executions
            with local_host(app_env) as host:
                bad = process_file(host, not_a_tiff, timeout=60)
                decisions += host.decisions
        finally:
            logging.getLogger().removeHandler(handler)
            app_logger.setLevel(level)
        provider.force_flush()
        yield LocalRun(
            app_env,
            good,
            bad,
            decisions,
            good_executions,
            list(table_proxy.carried_out),
            list(logs.get_finished_logs()),
            bad_error_type,
            azurite.account,
        )


def job_points(job_id: str) -> dict[tuple, float]:
    """This job's points: (metric name, sorted attributes without job_id) -> value."""
    points = {}
    for resource_metrics in METRIC_READER.get_metrics_data().resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                for point in metric.data.data_points:
                    attributes = dict(point.attributes)
                    if attributes.pop("job_id", None) == job_id:
                        value = point.value if hasattr(point, "value") else point.count
                        points[(metric.name, tuple(sorted(attributes.items())))] = value
    return points


def total(points: dict, name: str, **attributes: str) -> float:
    # The SDK lower-cases instrument names, so Application Insights' customMetrics has them so too.
    return sum(v for (n, attrs), v in points.items() if n == name.lower() and attributes.items() <= dict(attrs).items())


def manifest_refused_by_storage(run: LocalRun) -> int:
    """The 409 answers storage gave to manifest inserts (a POST to the table; all this run's rows)."""
    prefix = f"/{run.account}/{run.app_env.manifest}"
    return sum(
        1
        for method, path, status in run.table_answers
        if method == "POST" and path.startswith(prefix) and status in REFUSED
    )


def test_the_counters_equal_what_the_job_did_and_storage_answered(local_run, storage):
    good = local_run.good
    job_id = good["job_id"]
    assert good["status"] == "completed", good
    windows = good["windows"]
    assert windows == 9  # the summary's "written" counts the result each window delivered first, not executions
    rows = count_manifest(storage.table_service().get_table_client(local_run.app_env.manifest), job_id).rows
    points = job_points(job_id)

    # Every window written exactly once; every other tile execution found its window present.
    assert total(points, "TilesWritten") == windows == rows
    executions = [s for s in SPANS.get_finished_spans() if s.attributes.get("job_id") == job_id]
    assert len(executions) == local_run.good_executions  # one span per execution the host ran
    tile_runs = sum(1 for s in executions if s.name == "render_tile")
    assert tile_runs == 2 * windows  # --duplicate-activities: each window's activity twice
    assert total(points, "TilesAlreadyPresent") == tile_runs - windows
    assert total(points, "TileBytes") == good["bytes"]

    # Manifest refusals are the 409s storage answered, no more and no fewer.
    counted = {
        dict(attrs)["gate"]: v
        for (name, attrs), v in points.items()
        if name == "ConditionalWritePreconditionFailed".lower() and v
    }
    assert counted.get("manifest", 0) == manifest_refused_by_storage(local_run)
    # (the collection's documents are read-modify-writes: a duplicate activity's write meets a 412)
    assert set(counted) <= {"tile", "manifest", "mosaic", "stac", "quicklook", "collection", "collection-index"}
    # An already-present tile was either skipped (manifest row found) or refused at the tile gate.
    assert total(points, "TilesAlreadyPresent") - total(points, "TilesSkipped") == counted.get("tile", 0)
    assert total(points, "ConditionalWrites", gate="tile", outcome="written") == windows
    assert total(points, "ConditionalWrites", gate="manifest", outcome="written") == windows

    # The starter's decisions, as counted: three deliveries, at least one start (concurrent starters
    # of one new job may all "start" on the Azure Storage provider, which drops the later ones).
    decided = collections.Counter(d["action"] for d in local_run.decisions if d["job_id"] == job_id)
    assert decided["started"] >= 1 and decided["started"] + decided["duplicate"] == 3
    assert total(points, "StartDecisions", action="started") == decided["started"]
    assert total(points, "StartDecisions", action="duplicate") == decided["duplicate"]
    assert total(points, "JobsFinished", status="completed") == 1
    assert total(points, "ActivityDuration", activity="render_tile") == tile_runs


def test_every_data_point_span_and_job_log_carries_the_job_id(local_run):
    good, bad = local_run.good["job_id"], local_run.bad["job_id"]
    for resource_metrics in METRIC_READER.get_metrics_data().resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            if scope_metrics.scope.name != "tilecommit":
                continue
            for metric in scope_metrics.metrics:
                for point in metric.data.data_points:
                    assert point.attributes.get("job_id"), (metric.name, point.attributes)
    for job_id in (good, bad):
        spans = [s for s in SPANS.get_finished_spans() if s.attributes.get("job_id") == job_id]
        assert spans
        # All of a job's spans share its trace (Application Insights' operation_Id).
        assert {s.context.trace_id for s in spans} == {telemetry.job_span_context(job_id).trace_id}
    about_a_job = [r for r in local_run.logs if good in str(r.log_record.body) or bad in str(r.log_record.body)]
    assert len(about_a_job) >= 4  # decisions, refusals, job ends
    for record in about_a_job:
        assert record.log_record.attributes.get("job_id") in (good, bad), record.log_record.body


def test_the_workbook_queries_give_the_jobs_true_figures(local_run):
    good, bad = local_run.good, local_run.bad
    assert bad["status"] == "failed", bad
    con = appinsights_tables.connect(
        METRIC_READER.get_metrics_data(), local_run.logs, SPANS.get_finished_spans(), {good["job_id"], bad["job_id"]}
    )

    def query(name: str) -> list[dict]:
        return appinsights_tables.run_kql(con, (WORKBOOK / f"{name}.kql").read_text())

    refused = {(r["gate"], r["job_id"]): r["refused"] for r in query("refused-duplicates-by-gate") if r["refused"]}
    points = job_points(good["job_id"])
    tile_refusals = total(points, "TilesAlreadyPresent") - total(points, "TilesSkipped")
    assert refused.get(("tile", good["job_id"]), 0) == tile_refusals
    assert refused.get(("manifest", good["job_id"]), 0) == manifest_refused_by_storage(local_run)
    assert {job for _, job in refused} <= {good["job_id"]}

    jobs = collections.Counter()
    for row in query("jobs-over-time"):
        jobs[row["event"]] += row["jobs"]
    assert jobs == {"started": 2, "completed": 1, "failed": 1}

    windows = collections.Counter()
    for row in query("windows-per-minute"):
        windows[row["name"]] += row["windows"]
    assert windows == {"tileswritten": good["windows"], "tilesalreadypresent": good["windows"]}

    slowest = query("slowest-jobs")
    assert {(r["job_id"], r["status"]) for r in slowest} == {(good["job_id"], "completed"), (bad["job_id"], "failed")}
    assert all(0 < r["seconds"] <= local_run.good["elapsed_s"] + local_run.bad["elapsed_s"] for r in slowest)

    time_went = {(r["job_id"], r["activity"]): r for r in query("where-time-went")}
    assert time_went[(good["job_id"], "render_tile")]["executions"] == 2 * good["windows"]
    assert sum(r["executions"] for (job, _), r in time_went.items() if job == good["job_id"]) == (
        local_run.good_executions
    )
    assert 0 < time_went[(good["job_id"], "render_tile")]["total_s"] < good["elapsed_s"] * 4  # 4 activity slots

    errors = {(r["source"], r["error_type"]): r["errors"] for r in query("errors-by-type")}
    assert errors == {("job", "BadInputFailure"): 1, ("activity", local_run.bad_error_type): 1}

    decisions = {(r["action"], r["reason"], r["job_id"]): r["decisions"] for r in query("start-decisions")}
    truth = collections.Counter((d["action"], d["reason"], d["job_id"] or "none") for d in local_run.decisions)
    assert decisions == {key: n for key, n in truth.items() if key[2] in (good["job_id"], bad["job_id"])}


def test_devhost_process_prints_the_jobs_counters_and_a_console_exporter_writes_to_stderr(app_env, tmp_path):
    scene = make_scene(tmp_path / "cli.tif", 300, 260)  # 2 x 2 windows
    env = {**os.environ, **app_env.env, "OTEL_TRACES_EXPORTER": "console"}
    done = subprocess.run(
        [sys.executable, "-m", "devhost", "process", str(scene), "--hub", app_env.hub],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)  # stdout is the summary alone: the spans went to stderr
    counters = summary["counters"]
    assert counters["tileswritten"] == summary["windows"] == 4
    # One delivery (start races and their counting are the in-process run's test above).
    assert counters["startdecisions"] == {"started": 1}
    assert counters["jobsfinished"] == {"completed": 1}
    assert counters["activityduration"]["render_tile"]["count"] == 4
    assert f'"job_id": "{summary["job_id"]}"' in done.stderr and '"name": "render_tile"' in done.stderr
