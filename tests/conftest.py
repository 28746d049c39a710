"""Shared fixtures: a real Azurite per test session, fresh containers and tables per test,
and an in-memory OpenTelemetry reader so tests can read the gate counters back."""

from __future__ import annotations

import hashlib
import re

import pytest
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from devhost.azurite import Azurite
from tilecommit.storage import StorageConnection

# Installed before any test touches tilecommit.telemetry's counters (the API proxies them).
METRIC_READER = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[METRIC_READER]))


def counter_total(name: str, **attributes: str) -> int:
    """Sum of a counter's points whose attributes include ``attributes`` (0 when never added)."""
    data = METRIC_READER.get_metrics_data()
    total = 0
    if data is None:
        return 0
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                # The SDK stores instrument names lower-cased.
                if metric.name.lower() != name.lower():
                    continue
                for point in metric.data.data_points:
                    if all(point.attributes.get(k) == v for k, v in attributes.items()):
                        total += point.value
    return total


@pytest.fixture(scope="session")
def azurite():
    with Azurite() as emulator:
        yield emulator


@pytest.fixture(scope="session")
def storage(azurite) -> StorageConnection:
    return StorageConnection.from_connection_string(azurite.connection_string)


def _unique_name(request, prefix: str, alphabet: str) -> str:
    digest = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:12]
    stem = re.sub(alphabet, "", request.node.name.lower())[:20]
    return f"{prefix}{stem}{digest}"


@pytest.fixture
def container(storage, request):
    """A fresh blob container for this test."""
    name = _unique_name(request, "t-", r"[^a-z0-9]")
    client = storage.blob_service().get_container_client(name)
    client.create_container()
    yield client
    client.delete_container()


@pytest.fixture
def table(storage, request):
    """A fresh table for this test."""
    name = _unique_name(request, "t", r"[^a-z0-9]")
    client = storage.table_service().create_table(name)
    yield client
    client.delete_table()
