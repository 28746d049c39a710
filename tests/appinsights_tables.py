"""A local run's telemetry as Application Insights tables (``customMetrics``, ``traces``,
``dependencies``) in DuckDB, so the workbook's KQL runs over it with duckdb-kql.

Each record goes through the Azure Monitor exporter's own conversion to the envelope it would
send (``_convert_point_to_envelope``, ``_convert_log_to_envelope``, ``_convert_span_to_envelope``:
private functions of azure-monitor-opentelemetry-exporter 1.0.0b58, the code that runs in Azure),
and each envelope becomes a row under the column names Application Insights gives its fields:
``valueSum``/``valueCount``/``valueMax`` for a metric, ``message``/``severityLevel`` for a log
record, ``duration`` (milliseconds) and ``success`` for a dependency, ``customDimensions`` for the
properties and ``operation_Id`` for the trace id.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta

import duckdb_kql
from azure.monitor.opentelemetry.exporter.export.logs._exporter import _convert_log_to_envelope
from azure.monitor.opentelemetry.exporter.export.metrics._exporter import _convert_point_to_envelope
from azure.monitor.opentelemetry.exporter.export.trace._exporter import _convert_span_to_envelope

TABLES = {
    "customMetrics": "timestamp TIMESTAMP, name VARCHAR, value DOUBLE, valueCount BIGINT, valueSum DOUBLE, "
    "valueMin DOUBLE, valueMax DOUBLE, customDimensions JSON, operation_Id VARCHAR",
    "traces": "timestamp TIMESTAMP, message VARCHAR, severityLevel INTEGER, customDimensions JSON, operation_Id VARCHAR",
    "dependencies": "timestamp TIMESTAMP, id VARCHAR, name VARCHAR, type VARCHAR, duration DOUBLE, success BOOLEAN, "
    "customDimensions JSON, operation_Id VARCHAR, operation_ParentId VARCHAR",
}
_DURATION = re.compile(r"^(\d+)\.(\d\d):(\d\d):(\d\d)(?:\.(\d+))?$")


def _milliseconds(duration: str) -> float:
    """An envelope's ``d.hh:mm:ss.ffffff`` as the milliseconds Application Insights stores."""
    days, hours, minutes, seconds, fraction = _DURATION.match(duration).groups()
    return timedelta(
        days=int(days),
        hours=int(hours),
        minutes=int(minutes),
        seconds=int(seconds),
        microseconds=int((fraction or "0").ljust(6, "0")[:6]),
    ) / timedelta(milliseconds=1)


def _time(envelope) -> datetime:
    moment = envelope.time
    return moment if isinstance(moment, datetime) else datetime.fromisoformat(str(moment).replace("Z", "+00:00"))


def metric_rows(metrics_data, job_ids: set[str]) -> list[tuple]:
    rows = []
    for resource_metrics in metrics_data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                for point in metric.data.data_points:
                    if (point.attributes or {}).get("job_id") not in job_ids:
                        continue
                    envelope = _convert_point_to_envelope(
                        point, metric.name, resource_metrics.resource, scope_metrics.scope
                    )
                    data = envelope.data.base_data
                    value = data.metrics[0]
                    rows.append(
                        (
                            _time(envelope).replace(tzinfo=None),
                            value.name,
                            value.value,
                            value.count or 1,
                            value.value,
                            value.min if value.min is not None else value.value,
                            value.max if value.max is not None else value.value,
                            json.dumps(data.properties or {}),
                            envelope.tags.get("ai.operation.id"),
                        )
                    )
    return rows


def trace_rows(log_records) -> list[tuple]:
    rows = []
    for record in log_records:
        envelope = _convert_log_to_envelope(record)
        if envelope.data.base_type != "MessageData":  # exceptions and events go to other tables
            continue
        data = envelope.data.base_data
        rows.append(
            (
                _time(envelope).replace(tzinfo=None),
                data.message,
                _severity(data.severity_level),
                json.dumps(data.properties or {}),
                envelope.tags.get("ai.operation.id"),
            )
        )
    return rows


def _severity(level) -> int:
    names = {"Verbose": 0, "Information": 1, "Warning": 2, "Error": 3, "Critical": 4}
    return names.get(str(getattr(level, "value", level)), 1)


def dependency_rows(spans) -> list[tuple]:
    rows = []
    for span in spans:
        envelope = _convert_span_to_envelope(span)
        if envelope.data.base_type != "RemoteDependencyData":  # server spans go to requests
            continue
        data = envelope.data.base_data
        rows.append(
            (
                _time(envelope).replace(tzinfo=None),
                data.id,
                data.name,
                data.type,
                _milliseconds(data.duration),
                data.success,
                json.dumps(data.properties or {}),
                envelope.tags.get("ai.operation.id"),
                envelope.tags.get("ai.operation.parentId"),
            )
        )
    return rows


def connect(metrics_data, log_records, spans, job_ids: set[str]):
    """A duckdb-kql connection holding the three tables for the records of ``job_ids``."""
    con = duckdb_kql.connect()
    for name, columns in TABLES.items():
        con.sql(f"CREATE TABLE {name} ({columns})")
    job_spans = [s for s in spans if (s.attributes or {}).get("job_id") in job_ids]
    job_logs = [r for r in log_records if (r.log_record.attributes or {}).get("job_id") in job_ids]
    for name, rows in (
        ("customMetrics", metric_rows(metrics_data, job_ids)),
        ("traces", trace_rows(job_logs)),
        ("dependencies", dependency_rows(job_spans)),
    ):
        if rows:
            marks = ", ".join("?" * len(rows[0]))
            con.executemany(f"INSERT INTO {name} VALUES ({marks})", rows)
    return con


def run_kql(con, query: str) -> list[dict]:
    relation = duckdb_kql.query(con, query)
    columns = relation.columns
    return [dict(zip(columns, row, strict=True)) for row in relation.fetchall()]
