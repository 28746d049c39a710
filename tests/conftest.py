"""Shared fixtures: a real Azurite per test session, fresh containers and tables per test,
and in-memory OpenTelemetry readers so tests can read the counters and spans back."""

from __future__ import annotations

import hashlib
import re
import sys

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from devhost.azurite import Azurite
from testkit.postgres import LocalPostgres
from testkit.scenes import SceneSpec, write_scene
from testkit.strict_storage import StrictStorage
from tilecommit import settings as names
from tilecommit.raster import inspect_source
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec
from tilecommit.storage import StorageConnection

from .app_jobs import WINDOW, AppEnv
from .raster_jobs import render_all

# The Python 3.13 worker's own tests: azure-functions-runtime installs only on 3.13, so `make test`
# runs this file on .venv313 (with TILECOMMIT_DEVHOST_WORKER=runtime), after the 3.11 suite.
collect_ignore = ["test_worker_runtime.py"] if sys.version_info < (3, 13) else []

# Installed before any test touches tilecommit.observability.telemetry's counters (the API proxies them).
METRIC_READER = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[METRIC_READER]))
#: Every span the app makes in this test process (the activity spans of tilecommit.observability.observed).
SPANS = InMemorySpanExporter()
_tracer_provider = TracerProvider()
_tracer_provider.add_span_processor(SimpleSpanProcessor(SPANS))
trace.set_tracer_provider(_tracer_provider)


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
    """The session's storage: an Azurite held to Azure's rules (testkit/strict_storage.py), so
    every test meets the refusals Azure answers where Azurite alone would accept."""
    with Azurite() as emulator, StrictStorage(emulator) as strict:
        yield strict


@pytest.fixture(scope="session")
def pgstac():
    """The session's catalog database: a real PostgreSQL with PostGIS and pgstac on 127.0.0.1
    (testkit/postgres.py), one per pytest worker, started when a test first asks for it."""
    with LocalPostgres() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def storage(azurite) -> StorageConnection:
    return StorageConnection.from_connection_string(azurite.connection_string)


def _unique_name(request, prefix: str) -> str:
    """A storage name unique to this test: the prefix, the test's name, a hash of its node id."""
    digest = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:12]
    stem = re.sub(r"[^a-z0-9]", "", request.node.name.lower())[:20]
    return f"{prefix}{stem}{digest}"


def _made_then_deleted(request, create, delete, default_prefix: str):
    """A factory fixture's body: ``make(prefix)`` creates under a name unique to the test; every
    made one is deleted after it."""
    made = []

    def make(prefix: str = default_prefix):
        client = create(_unique_name(request, prefix))
        made.append(client)
        return client

    yield make
    for client in made:
        delete(client)


@pytest.fixture
def new_container(storage, request):
    """Factory: ``new_container(prefix)`` makes a fresh blob container, deleted after the test."""

    def create(name: str):
        client = storage.blob_service().get_container_client(name)
        client.create_container()
        return client

    yield from _made_then_deleted(request, create, lambda client: client.delete_container(), "t-")


@pytest.fixture
def new_table(storage, request):
    """Factory: ``new_table(prefix)`` makes a fresh table, deleted after the test."""

    def create(name: str):
        return storage.table_service().create_table(name)

    yield from _made_then_deleted(request, create, lambda client: client.delete_table(), "t")


@pytest.fixture
def container(new_container):
    """A fresh blob container for this test."""
    return new_container()


@pytest.fixture
def table(new_table):
    """A fresh table for this test."""
    return new_table()


# The stores of one job, each fresh: what the raster functions take as ``tiles=``, ``output=``, ...


@pytest.fixture
def tiles(new_container):
    return new_container("tiles-")


@pytest.fixture
def output(new_container):
    return new_container("out-")


@pytest.fixture
def manifest(new_table):
    return new_table("manifest")


@pytest.fixture
def stores(tiles, output, manifest):
    return {"tiles": tiles, "output": output, "manifest": manifest}


@pytest.fixture
def app_env(storage, azurite, monkeypatch, request) -> AppEnv:
    return app_env_for(azurite, monkeypatch, request.node.nodeid)


def app_env_for(azurite, monkeypatch, node_id: str) -> AppEnv:
    """App settings of one test (or module): its own containers, tables and task hub, set in the environment."""
    suffix = hashlib.sha256(node_id.encode()).hexdigest()[:10]
    env = {
        names.STORAGE_CONNECTION: azurite.connection_string,
        names.SETTING_INPUT_CONTAINER: f"in-{suffix}",
        names.SETTING_TILES_CONTAINER: f"tiles-{suffix}",
        names.SETTING_OUTPUT_CONTAINER: f"out-{suffix}",
        names.SETTING_MANIFEST_TABLE: f"manifest{suffix}",
        names.SETTING_WINDOW_SIZE: str(WINDOW),
        names.SETTING_BATCH_SIZE: "4",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return AppEnv(
        f"Hub{suffix}",
        env[names.SETTING_INPUT_CONTAINER],
        env[names.SETTING_TILES_CONTAINER],
        env[names.SETTING_OUTPUT_CONTAINER],
        env[names.SETTING_MANIFEST_TABLE],
        env,
    )


@pytest.fixture
def small_scene(tmp_path):
    spec = SceneSpec(600, 520, 3, "uint16", nodata=0)
    return spec, write_scene(str(tmp_path / "small.tif"), spec)


@pytest.fixture
def rendered(small_scene, stores):
    spec, path = small_scene
    settings = Settings(window_size=256)
    scene = inspect_source(path, settings=settings, spec=OutputSpec.from_settings(settings))
    results = render_all(path, scene, settings, stores)
    return spec, path, scene, settings, results
