"""The local host: settings, the engine, the Durable HTTP API and the event watcher together."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tilecommit.settings import SETTING_EVENTS_ENDPOINT, SETTING_EVENTS_KEY, TASK_HUB, Settings
from tilecommit.storage import StorageConnection

from .engine import Engine
from .event_sink import EventSink
from .functions import FunctionIndex
from .http_routes import DEFAULT_ROUTE_PREFIX, HttpRoutes
from .limits import MemoryWatchdog, recycle
from .partitions import PROVIDER_LEASE, LeaseTimings
from .queues import queue_service
from .rpc import DurableHttpApi
from .store import DEFAULT_PARTITION_COUNT, HistoryStore, events_table_name
from .versioning import Versioning
from .watcher import BlobEventWatcher

logger = logging.getLogger(__name__)
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def load_local_settings(root: Path = PROJECT_ROOT) -> dict[str, str]:
    """App settings from ``local.settings.json``, over ``local.settings.example.json`` (Azurite on
    its default ports). :func:`apply_settings` puts them where the environment has no value, so the
    environment comes first, as with ``func start``."""
    values: dict[str, str] = {}
    for name in ("local.settings.example.json", "local.settings.json"):
        path = root / name
        if path.exists():
            values.update(json.loads(path.read_text())["Values"])
    return values


def apply_settings(values: dict[str, str]) -> None:
    """Put app settings into the environment, where the app reads them (as the host does)."""
    for key, value in values.items():
        os.environ.setdefault(key, value)


#: App settings named ``AzureFunctionsJobHost__<path>`` override host.json's value at that path
#: (``__`` between keys, any case): the Functions host reads host.json into its configuration
#: under the ``AzureFunctionsJobHost`` section (fhost ``HostJsonFileConfigurationSource``), and
#: environment variables come later in that configuration, ``__`` standing for its ``:``.
JOB_HOST_OVERRIDE = "AzureFunctionsJobHost__"


def read_host_json(root: Path = PROJECT_ROOT, environ: Mapping[str, str] | None = None) -> dict:
    """host.json with the overrides of the environment (:data:`JOB_HOST_OVERRIDE`)."""
    host_json = json.loads((root / "host.json").read_text())
    environ = os.environ if environ is None else environ
    for name, value in sorted(environ.items()):
        if name.lower().startswith(JOB_HOST_OVERRIDE.lower()):
            _override(host_json, name[len(JOB_HOST_OVERRIDE) :].split("__"), value)
    return host_json


def _override(node: dict, path: list[str], value: str) -> None:
    """Set ``value`` at ``path`` (keys matched ignoring case), as a number or a boolean where
    host.json holds one there (configuration values are text)."""
    for key in path[:-1]:
        found = next((k for k in node if k.lower() == key.lower()), key)
        if not isinstance(node.get(found), dict):
            node[found] = {}
        node = node[found]
    leaf = next((k for k in node if k.lower() == path[-1].lower()), path[-1])
    current = node.get(leaf)
    if isinstance(current, bool):
        node[leaf] = value.lower() == "true"
    elif isinstance(current, int):
        node[leaf] = int(value)
    else:
        node[leaf] = value


def parse_timespan(value: str) -> float:
    """host.json's ``functionTimeout`` ("hh:mm:ss", optionally "d.hh:mm:ss") in seconds."""
    days, _, clock = value.rpartition(".") if value.count(":") == 2 and "." in value.split(":")[0] else ("", "", value)
    hours, minutes, seconds = clock.split(":")
    return (int(days or 0) * 24 + int(hours)) * 3600 + int(minutes) * 60 + float(seconds)


@dataclass
class HostOptions:
    deliveries: int = 1
    duplicate_activities: bool = False
    timer_scale: float = 1.0
    watch_interval: float = 0.5
    max_activities: int | None = None
    #: Task hub name; host.json's ``hubName`` when not given.
    hub: str | None = None
    #: Seconds an activity may run; host.json's ``functionTimeout`` when not given.
    function_timeout: float | None = None
    #: Fail an orchestrator whose replayed actions differ in inputs or ids too (the real host
    #: compares only kind and name).
    strict_determinism: bool = False
    #: Recycle this process (SIGKILL) when its resident memory passes this many MB, as the
    #: platform recycles an instance over its memory. None: no limit (tests share one process).
    instance_memory_mb: float | None = None
    #: Recycle this process (SIGKILL) when a function has not ended the grace period after its
    #: timeout, as the real host kills the worker process running it (``serve``: the process is
    #: the worker). Off: the function is reported at ERROR and counted, and its thread runs on.
    recycle_stuck_worker: bool = False
    #: Seconds without progress after which a job is reported at ERROR (:mod:`devhost.durable.progress`);
    #: None: the function timeout plus the host's margins.
    stall_report_s: float | None = None
    #: This host's name in the task hub's partition table; a new one per host when not given. A
    #: restarted host given its old name renews its own leases at once instead of waiting for
    #: them to expire (the provider's default name is the machine's, the same after a restart).
    worker_id: str | None = None
    #: Partition lease timings (the provider's: 30 s lease, 10 s between rounds).
    lease: LeaseTimings = PROVIDER_LEASE
    #: Completion events (the app's Event Grid topic, played here): appended to this JSONL file
    #: and/or posted to this URL (:mod:`devhost.durable.event_sink`). Neither: the app publishes none.
    events_file: Path | None = None
    events_url: str | None = None
    #: Serve the app's HTTP functions on 127.0.0.1 at this port (0: any free one); None: not at all.
    http_port: int | None = None
    #: The key HTTP functions of auth level function need; None: keys are not enforced (as in ``func start``).
    function_key: str | None = None


def close_durable_client_session() -> None:
    """Close the Durable client's shared aiohttp session (the worker leaves it to process exit)."""
    # Private: azure-functions-durable 1.7.0 keeps one module-level aiohttp session for every
    # DurableOrchestrationClient and has no public way to close it (``_close_session`` is the SDK's
    # own, called on a request error). A local host that stops while its process goes on (tests,
    # bench) would otherwise leave the session's connections open to an API server that is gone.
    from azure.durable_functions.models.utils import http_utils

    from .functions import EventLoopThread

    EventLoopThread.shared().run(http_utils._close_session(), timeout=10)


class _DecisionLog(logging.Handler):
    """Collects the starter's structured ``start_*`` log fields (what App Insights would show)."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.decisions: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = vars(record)  # the starter's ``extra`` fields are attributes of the record
        action = fields.get("start_action")
        if action is not None:
            job_id = fields["job_id"] if fields["job_id"] != "none" else None
            self.decisions.append(
                {"action": action, "blob": fields["start_blob"], "job_id": job_id, "reason": fields["start_reason"]}
            )


class LocalHost:
    """Runs the app in ``function_app.py`` against the storage in ``AzureWebJobsStorage``."""

    def __init__(self, options: HostOptions | None = None, *, module: str = "function_app", root: Path = PROJECT_ROOT):
        self.options = options or HostOptions()
        apply_settings(load_local_settings(root))
        host_json = read_host_json(root)
        durable = host_json.get("extensions", {}).get("durableTask", {})
        self.hub = self.options.hub or durable.get("hubName", TASK_HUB)
        max_activities = self.options.max_activities or durable.get("maxConcurrentActivityFunctions", 10)
        function_timeout = self.options.function_timeout
        if function_timeout is None and host_json.get("functionTimeout"):
            function_timeout = parse_timespan(host_json["functionTimeout"])
        self.poison_threshold = host_json.get("extensions", {}).get("blobs", {}).get("poisonBlobThreshold", 5)
        self.settings = Settings.from_env()
        self.connection = StorageConnection.from_env()
        blobs = self.connection.blob_service()
        tables = self.connection.table_service()
        self.index = FunctionIndex.load(module)
        partitions = durable.get("storageProvider", {}).get("partitionCount", DEFAULT_PARTITION_COUNT)
        self.store = HistoryStore(blobs, tables, self.hub, queue_service(self.connection), partitions)
        self.engine = Engine(
            self.index,
            self.store,
            max_activities=max_activities,
            duplicate_activities=self.options.duplicate_activities,
            timer_scale=self.options.timer_scale,
            function_timeout=function_timeout,
            strict_determinism=self.options.strict_determinism,
            max_orchestrators=durable.get("maxConcurrentOrchestratorFunctions", 10),
            worker_id=self.options.worker_id,
            lease=self.options.lease,
            stall_report_s=self.options.stall_report_s,
            on_stuck_function=recycle if self.options.recycle_stuck_worker else None,
            versioning=Versioning.from_durable_task(durable),
        )
        self.blobs, self.tables = blobs, tables
        self.api = DurableHttpApi(self.engine, self.hub)
        self.engine.client_binding = self.api.client_binding
        self.http: HttpRoutes | None = None
        if self.options.http_port is not None:
            self.http = HttpRoutes(
                self.index,
                self.api.client_binding,
                function_key=self.options.function_key,
                route_prefix=host_json.get("extensions", {}).get("http", {}).get("routePrefix", DEFAULT_ROUTE_PREFIX),
                port=self.options.http_port,
            )
        self.watcher = BlobEventWatcher(
            blobs.get_container_client(self.settings.input_container),
            tables.get_table_client(events_table_name(self.hub)),
            self.deliver_blob_created,
            deliveries=self.options.deliveries,
            interval=self.options.watch_interval,
            poison_threshold=self.poison_threshold,
            delivers=self.engine.partitions.owns_instance,
            decision=self.start_decision,
        )
        self._decision_log = _DecisionLog()
        self.memory: MemoryWatchdog | None = None
        self.events: EventSink | None = None
        if self.options.events_file is not None or self.options.events_url is not None:
            self.events = EventSink(file=self.options.events_file, url=self.options.events_url)
        self._saved_env: dict[str, str | None] = {}

    def ensure_storage(self) -> None:
        """Create the containers and tables the app and the host use (infra does this in Azure)."""
        from azure.core.exceptions import ResourceExistsError

        for name in (self.settings.input_container, self.settings.tiles_container, self.settings.output_container):
            try:
                self.blobs.create_container(name)
            except ResourceExistsError:
                pass
        self.tables.create_table_if_not_exists(self.settings.manifest_table)

    def start_decision(self, blob_name: str) -> dict:
        """The starter's last decision on ``blob_name`` in this host, as acknowledgement fields."""
        mine = [d for d in self.decisions if d["blob"] == blob_name]
        if not mine:
            return {}
        last = mine[-1]
        return {"start_action": last["action"], "start_reason": last["reason"] or "", "job_id": last["job_id"] or ""}

    @property
    def decisions(self) -> list[dict]:
        """Every start decision (started / duplicate / ignored) the starter logged in this host."""
        return self._decision_log.decisions

    def start(self, watch: bool = True) -> LocalHost:
        logging.getLogger().addHandler(self._decision_log)
        if logging.getLogger().getEffectiveLevel() > logging.INFO:
            logging.getLogger("client_functions").setLevel(logging.INFO)
        self.ensure_storage()
        if self.events is not None:
            self.events.start()
            # The app's setting for its topic, as the deployment sets it; the key only here.
            for name, value in ((SETTING_EVENTS_ENDPOINT, self.events.endpoint), (SETTING_EVENTS_KEY, self.events.key)):
                self._saved_env[name] = os.environ.get(name)
                os.environ[name] = value
        self.api.start()
        self.engine.start()
        if self.http is not None:
            self.http.start()
        if self.options.instance_memory_mb:
            self.memory = MemoryWatchdog(self.options.instance_memory_mb).start()
        if watch:
            self.watcher.start()
        return self

    def stop(self) -> None:
        if self.memory is not None:
            self.memory.stop()
        self.watcher.stop()
        if self.http is not None:
            self.http.stop()
        self.engine.stop()
        self.api.stop()
        if self.events is not None:
            self.events.stop()
            for name, value in self._saved_env.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        close_durable_client_session()
        logging.getLogger().removeHandler(self._decision_log)

    def __enter__(self) -> LocalHost:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def deliver_blob_created(self, blob_name: str) -> int:
        """One BlobCreated delivery to every blob trigger watching the input container."""
        delivered = 0
        for trigger in self.index.blob_triggers.values():
            if trigger.container == self.settings.input_container:
                self.index.invoke_blob_trigger(trigger.name, blob_name, self.api.client_binding())
                delivered += 1
        return delivered
