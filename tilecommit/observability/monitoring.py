"""Where this process's telemetry goes, decided once from the app settings (``function_app.py`` calls it).

- ``APPLICATIONINSIGHTS_CONNECTION_STRING`` set (in Azure): the Azure Monitor OpenTelemetry distro
  exports the app's metrics, logs and spans to Application Insights, authenticated with the app's
  managed identity: ``APPLICATIONINSIGHTS_AUTHENTICATION_STRING=Authorization=AAD;ClientId=<id>``
  becomes a ``ManagedIdentityCredential`` for that client id. No key exists: the component has
  local authentication off, and a connection string only names it.
- Else the standard ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` / ``OTEL_LOGS_EXPORTER``
  (``console`` or ``otlp``; ``OTEL_EXPORTER_OTLP_ENDPOINT`` and friends as usual): the SDK with
  those exporters, for a local run.
- Else nothing: the OpenTelemetry API stays a no-op, no exporter, no thread, no network call.

Also nothing when an SDK tracer provider is already installed (a test's in-memory reader, or a
Functions worker that configured the distro itself): a second configuration would add a second
log handler and send every record twice.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from opentelemetry import trace

from ..errors import ConfigurationError
from . import telemetry

logger = logging.getLogger(__name__)

CONNECTION_STRING = "APPLICATIONINSIGHTS_CONNECTION_STRING"
AUTHENTICATION_STRING = "APPLICATIONINSIGHTS_AUTHENTICATION_STRING"
OTEL_EXPORTER_SETTINGS = {
    "traces": "OTEL_TRACES_EXPORTER",
    "metrics": "OTEL_METRICS_EXPORTER",
    "logs": "OTEL_LOGS_EXPORTER",
}
#: The app's loggers: set to INFO (the counters' companions) and, locally, given the exporter's handler.
APP_LOGGERS = ("tilecommit", "orchestrators", "client_functions", "activities")


@dataclass(frozen=True)
class TelemetryPlan:
    """What :func:`configure_telemetry` sets up: ``azure-monitor``, ``otel`` or ``none``."""

    kind: str
    connection_string: str = ""
    managed_identity_client_id: str | None = None
    exporters: dict[str, str] = field(default_factory=dict)


def plan_telemetry(env: Mapping[str, str]) -> TelemetryPlan:
    """The plan for these settings (pure: reads nothing else, builds nothing)."""
    connection_string = env.get(CONNECTION_STRING, "").strip()
    if connection_string:
        return TelemetryPlan(
            "azure-monitor",
            connection_string=connection_string,
            managed_identity_client_id=_aad_client_id(env.get(AUTHENTICATION_STRING, "")),
        )
    exporters = {
        signal: env[name].strip().lower()
        for signal, name in OTEL_EXPORTER_SETTINGS.items()
        if env.get(name, "").strip().lower() not in ("", "none")
    }
    for signal, value in exporters.items():
        if value not in ("console", "otlp"):
            raise ConfigurationError(f"{OTEL_EXPORTER_SETTINGS[signal]}={value!r}: this app knows console, otlp, none")
    return TelemetryPlan("otel", exporters=exporters) if exporters else TelemetryPlan("none")


def _aad_client_id(authentication: str) -> str | None:
    """The client id in ``Authorization=AAD;ClientId=<id>``; None when it names no user-assigned identity."""
    fields = dict(part.split("=", 1) for part in authentication.split(";") if "=" in part)
    fields = {key.strip().lower(): value.strip() for key, value in fields.items()}
    if authentication.strip() and fields.get("authorization", "").upper() != "AAD":
        raise ConfigurationError(f"{AUTHENTICATION_STRING} must say Authorization=AAD (the component has no keys)")
    return fields.get("clientid") or None


def exporter_credential(plan: TelemetryPlan):
    """The token credential the Azure Monitor exporters authenticate with: the app's managed identity."""
    from azure.identity import ManagedIdentityCredential

    if plan.managed_identity_client_id:
        return ManagedIdentityCredential(client_id=plan.managed_identity_client_id)
    return ManagedIdentityCredential()


def azure_monitor_options(plan: TelemetryPlan) -> dict:
    """Keyword arguments for ``configure_azure_monitor`` (tests build exporters from them too)."""
    return {
        "connection_string": plan.connection_string,
        "credential": exporter_credential(plan),
        # The root logger: with PYTHON_ENABLE_OPENTELEMETRY the host no longer forwards the
        # worker's log records, so the worker exports them all itself, once.
        "logger_name": "",
        # The distro would otherwise also trace every HTTP call the storage SDK makes (thousands a
        # job): the storage gates' outcomes are counted instead.
        "instrumentation_options": {name: {"enabled": False} for name in _DISTRO_INSTRUMENTATIONS},
        "enable_live_metrics": False,
    }


_DISTRO_INSTRUMENTATIONS = (
    "azure_sdk",
    "django",
    "fastapi",
    "flask",
    "psycopg2",
    "requests",
    "urllib",
    "urllib3",
    "httpx",
)


_configured: str | None = None


def _sdk_installed_elsewhere() -> bool:
    from opentelemetry.sdk.trace import TracerProvider

    return isinstance(trace.get_tracer_provider(), TracerProvider)


def configure_telemetry(env: Mapping[str, str] | None = None, *, metric_readers: Sequence = ()) -> str:
    """Set up exporting for this process as the module docstring says; returns what it did.

    ``metric_readers`` are added to whatever the settings ask for (the local host reads the job's
    counters back through one). Only the first call that configures anything counts.
    """
    global _configured
    if _configured:
        return "already-configured"
    plan = plan_telemetry(os.environ if env is None else env)
    if plan.kind == "none" and not metric_readers:
        return "none"
    if _sdk_installed_elsewhere():
        logger.info("telemetry: an OpenTelemetry SDK is already configured in this process; leaving it")
        return "already-configured"
    if plan.kind == "azure-monitor":
        from azure.monitor.opentelemetry import configure_azure_monitor

        configure_azure_monitor(**azure_monitor_options(plan), metric_readers=list(metric_readers))
    else:
        _configure_sdk(plan.exporters, list(metric_readers))
    _add_job_ids(logging.getLogger())
    _route_app_loggers()
    _configured = plan.kind if plan.kind != "none" else "readers-only"
    return _configured


def _add_job_ids(root: logging.Logger) -> None:
    """Every exporting handler gives records logged inside an activity that activity's job id."""
    exporting = [
        handler
        for handler in root.handlers
        if type(handler).__name__ == "LoggingHandler" and type(handler).__module__.startswith("opentelemetry")
    ]
    for handler in exporting:
        if not any(isinstance(f, telemetry.JobIdFilter) for f in handler.filters):
            handler.addFilter(telemetry.JobIdFilter())


def _route_app_loggers() -> None:
    """The app's loggers at INFO: the counters' companions (refusals, start decisions, job ends)."""
    for name in APP_LOGGERS:
        if logging.getLogger(name).getEffectiveLevel() > logging.INFO:
            logging.getLogger(name).setLevel(logging.INFO)


def _configure_sdk(exporters: dict[str, str], metric_readers: list) -> None:
    """The SDK with console (on stderr) or OTLP exporters, per signal (the OTEL_*_EXPORTER values)."""
    from opentelemetry import _logs, metrics
    from opentelemetry.instrumentation.logging.handler import LoggingHandler
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, ConsoleLogExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "tilecommit")})

    def otlp(signal: str):
        try:
            from opentelemetry.exporter.otlp.proto.http import _log_exporter, metric_exporter, trace_exporter
        except ImportError as exc:  # a development dependency (requirements-dev.txt)
            raise ConfigurationError(
                f"{OTEL_EXPORTER_SETTINGS[signal]}=otlp needs opentelemetry-exporter-otlp-proto-http"
            ) from exc
        return {
            "traces": trace_exporter.OTLPSpanExporter,
            "metrics": metric_exporter.OTLPMetricExporter,
            "logs": _log_exporter.OTLPLogExporter,
        }[signal]()

    # Console output goes to stderr: stdout carries the local host's JSON summary.
    if "traces" in exporters:
        provider = TracerProvider(resource=resource)
        exporter = ConsoleSpanExporter(out=sys.stderr) if exporters["traces"] == "console" else otlp("traces")
        provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    if "metrics" in exporters:
        exporter = ConsoleMetricExporter(out=sys.stderr) if exporters["metrics"] == "console" else otlp("metrics")
        metric_readers = [*metric_readers, PeriodicExportingMetricReader(exporter)]
    if metric_readers:
        metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=metric_readers))
    if "logs" in exporters:
        logger_provider = LoggerProvider(resource=resource)
        exporter = ConsoleLogExporter(out=sys.stderr) if exporters["logs"] == "console" else otlp("logs")
        logger_provider.add_log_record_processor(BatchLogRecordProcessor(exporter))
        _logs.set_logger_provider(logger_provider)
        logging.getLogger().addHandler(LoggingHandler(level=logging.INFO, logger_provider=logger_provider))


def job_counters(metrics_data, job_id: str) -> dict:
    """The job's counters from one collection of an SDK metric reader, for a summary.

    Sums by the attribute that says what was counted (``gate``/``outcome``, ``action``,
    ``status``); histograms as count and sum by activity.
    """
    counters: dict = {}
    for resource_metrics in getattr(metrics_data, "resource_metrics", None) or ():
        for scope_metrics in resource_metrics.scope_metrics:
            if scope_metrics.scope.name != "tilecommit":
                continue
            for metric in scope_metrics.metrics:
                for point in metric.data.data_points:
                    attributes = dict(point.attributes or {})
                    if attributes.get("job_id") != job_id:
                        continue
                    _add_point(counters, metric.name, attributes, point)
    return counters


def _add_point(counters: dict, name: str, attributes: dict, point) -> None:
    if hasattr(point, "bucket_counts"):  # a histogram: durations by activity / by job status
        key = attributes.get("activity") or attributes.get("status", "job")
        entry = counters.setdefault(name, {}).setdefault(key, {"count": 0, "sum_s": 0.0})
        entry["count"] += point.count
        entry["sum_s"] = round(entry["sum_s"] + point.sum, 3)
        return
    label = "/".join(attributes[k] for k in ("gate", "outcome", "action", "status") if attributes.get(k))
    if not label:
        counters[name] = counters.get(name, 0) + point.value
        return
    counters.setdefault(name, {})
    counters[name][label] = counters[name].get(label, 0) + point.value
