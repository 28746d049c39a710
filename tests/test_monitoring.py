"""Where telemetry goes: Application Insights with the app's managed identity, or nothing at all."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from azure.identity import ManagedIdentityCredential
from azure.monitor.opentelemetry.exporter import AzureMonitorTraceExporter

from tilecommit.errors import ConfigurationError
from tilecommit.observability import monitoring

from .app_jobs import ROOT

# The connection string only names the component (its instrumentation key is an id, not a secret).
CONNECTION = (
    "InstrumentationKey=00000000-0000-0000-0000-000000000001;"
    "IngestionEndpoint=https://example.invalid/;LiveEndpoint=https://example.invalid/"
)
IDENTITY = "11111111-2222-3333-4444-555555555555"


def test_with_a_connection_string_and_an_identity_the_exporter_uses_a_token_credential():
    env = {
        monitoring.CONNECTION_STRING: CONNECTION,
        monitoring.AUTHENTICATION_STRING: f"Authorization=AAD;ClientId={IDENTITY}",
    }
    plan = monitoring.plan_telemetry(env)
    assert plan.kind == "azure-monitor" and plan.managed_identity_client_id == IDENTITY
    options = monitoring.azure_monitor_options(plan)
    credential = options["credential"]
    assert isinstance(credential, ManagedIdentityCredential)
    # The exporter the distro builds from these options authenticates with that credential.
    exporter = AzureMonitorTraceExporter(connection_string=options["connection_string"], credential=credential)
    assert exporter._credential is credential  # private: the exporter keeps no public handle on it
    assert "key" not in options and "Key=" not in CONNECTION.replace("InstrumentationKey=", "")


def test_an_authentication_string_other_than_aad_is_refused():
    with pytest.raises(ConfigurationError, match="AAD"):
        monitoring.plan_telemetry({monitoring.CONNECTION_STRING: CONNECTION, monitoring.AUTHENTICATION_STRING: "x=y"})


def test_otel_exporter_variables_choose_console_or_otlp():
    assert monitoring.plan_telemetry({"OTEL_TRACES_EXPORTER": "console", "OTEL_LOGS_EXPORTER": "none"}).exporters == {
        "traces": "console"
    }
    with pytest.raises(ConfigurationError, match="zipkin"):
        monitoring.plan_telemetry({"OTEL_TRACES_EXPORTER": "zipkin"})


PROBE = """
import json, socket, sys
connects = []
sys.addaudithook(lambda event, args: connects.append(str(args[1])) if event == "socket.connect" else None)
import function_app  # configures telemetry at import, as in the worker
from opentelemetry import metrics, trace
from tilecommit.observability import telemetry
telemetry.tiles_written.add(1, {"job_id": "0123456789abcdef"})
with telemetry.tracer.start_as_current_span("probe"):
    pass
print(json.dumps({"connects": connects,
                  "tracer": type(trace.get_tracer_provider()).__name__,
                  "meter": type(metrics.get_meter_provider()).__name__}))
"""


def test_without_a_connection_string_nothing_is_configured_and_nothing_connects():
    env = {
        key: value
        for key, value in __import__("os").environ.items()
        if not key.startswith(("APPLICATIONINSIGHTS_", "OTEL_"))
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"connects": [], "tracer": "ProxyTracerProvider", "meter": "_ProxyMeterProvider"}
