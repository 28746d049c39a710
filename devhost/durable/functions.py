"""The app's registered functions, found and invoked the way the Python worker does it.

Nothing here knows the app's function names: they come from ``app.get_functions()`` and each
function's raw binding JSON, exactly what the worker sends to the host at indexing time.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import json
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from azurefunctions.extensions.base import Datum
from azurefunctions.extensions.bindings.blob.blobClientConverter import BlobClientConverter


class FunctionNotFound(LookupError):
    pass


_INDEXED: dict[int, tuple[Any, FunctionIndex]] = {}
_SETTING_EXPRESSION = re.compile(r"%([^%]+)%")


def resolve_app_settings(value: str) -> str:
    """Replace ``%NAME%`` binding expressions with app settings (environment variables)."""

    def setting(match: re.Match) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise LookupError(f"binding expression %{name}% does not resolve: app setting {name} is not set")
        return os.environ[name]

    return _SETTING_EXPRESSION.sub(setting, value)


@dataclass
class BlobTriggerFunction:
    name: str
    func: Callable
    blob_param: str
    blob_type: Any
    client_param: str | None
    path: str
    connection: str
    source: str

    @property
    def container(self) -> str:
        """The container part of the path, with ``%AppSetting%`` resolved as the host does."""
        return resolve_app_settings(self.path.split("/", 1)[0])


@dataclass
class FunctionIndex:
    """What the worker would report: orchestrators, activities and blob triggers by name."""

    orchestrators: dict[str, Callable] = field(default_factory=dict)
    activities: dict[str, tuple[Callable, str]] = field(default_factory=dict)
    #: The activities that also take a ``durableClient`` binding: the parameter's name.
    activity_clients: dict[str, str] = field(default_factory=dict)
    blob_triggers: dict[str, BlobTriggerFunction] = field(default_factory=dict)
    #: HTTP-triggered functions, indexed as the worker reports them; the local host serves no
    #: HTTP routes, so only a caller (a test) invokes them, with a request it builds.
    http_functions: dict[str, Callable] = field(default_factory=dict)
    #: Timer-triggered functions, indexed likewise; the local host does not schedule them (the
    #: CLI's ``purge`` runs the retention sweep's function body; tests invoke them).
    timer_functions: dict[str, Callable] = field(default_factory=dict)
    raw_bindings: dict[str, list[dict]] = field(default_factory=dict)
    #: With ``TILECOMMIT_DEVHOST_WORKER=runtime``: the worker's invoker (devhost/worker/invoker.py),
    #: through which every invocation goes.
    worker: Any = None

    @classmethod
    def load(cls, module_name: str = "function_app", app_attr: str = "app") -> FunctionIndex:
        """The app's index; with ``TILECOMMIT_DEVHOST_WORKER=runtime``, as the Python 3.13 worker
        (azure-functions-runtime) indexes it, every function then called through that worker."""
        from ..worker.runtime import worker_mode

        if worker_mode() == "runtime":
            from ..worker.invoker import index_through_worker

            return index_through_worker(cls, module_name)
        module = importlib.import_module(module_name)
        return cls.from_app(getattr(module, app_attr))

    @classmethod
    def from_app(cls, app: Any) -> FunctionIndex:
        """Index an app once: ``get_functions()`` validates names and raises on a second call."""
        cached = _INDEXED.get(id(app))
        if cached is not None and cached[0] is app:
            return cached[1]
        index = cls()
        for function in app.get_functions():
            func = function.get_user_function()
            bindings = [json.loads(raw) for raw in function.get_raw_bindings()]
            index.add(function.get_function_name(), bindings, func, functools.partial(_annotation, func))
        _INDEXED[id(app)] = (app, index)
        return index

    def add(self, name: str, bindings: list[dict], func: Callable, blob_type: Callable[[str], Any]) -> None:
        """One function by its trigger; ``blob_type(param)`` gives a blob trigger parameter's type."""
        self.raw_bindings[name] = bindings
        trigger = next((b for b in bindings if b["type"].endswith("Trigger")), None)
        if trigger is None:
            return
        client = durable_client_binding(bindings)
        if trigger["type"] == "orchestrationTrigger":
            self.orchestrators[name] = func
        elif trigger["type"] == "activityTrigger":
            self.activities[name] = (func, trigger["name"])
            if client is not None:
                self.activity_clients[name] = client["name"]
        elif trigger["type"] == "httpTrigger":
            self.http_functions[name] = func
        elif trigger["type"] == "timerTrigger":
            self.timer_functions[name] = func
        elif trigger["type"] == "blobTrigger":
            self.blob_triggers[name] = BlobTriggerFunction(
                name=name,
                func=func,
                blob_param=trigger["name"],
                blob_type=blob_type(trigger["name"]),
                client_param=client["name"] if client else None,
                path=trigger["path"],
                connection=trigger["connection"],
                source=trigger.get("source", "LogsAndContainerScan"),
            )

    # ------------------------------------------------------------------ invocation

    def orchestrator(self, name: str) -> Callable[[str], str]:
        try:
            return self.orchestrators[name]
        except KeyError:
            raise FunctionNotFound(f"no orchestrator function named {name!r}") from None

    def invoke_activity(
        self, name: str, input_json: str | None, client_binding: Callable[[], str] | None = None
    ) -> str:
        """Run an activity as the worker does: JSON in, the user function, JSON out. An activity
        with a ``durableClient`` binding gets the client's JSON from ``client_binding``, as an
        HTTP function or the blob trigger does: the host resolves a function's input bindings
        whatever its trigger."""
        try:
            func, param = self.activities[name]
        except KeyError:
            raise FunctionNotFound(f"no activity function named {name!r}") from None
        client_json = None
        if name in self.activity_clients:
            if client_binding is None:
                raise FunctionNotFound(f"activity {name!r} takes a durable client and this host offers none")
            client_json = client_binding()
        if self.worker is not None:
            return self.worker.activity(name, input_json, client_json)
        kwargs = {param: json.loads(input_json) if input_json else None}
        if client_json is not None:
            kwargs[self.activity_clients[name]] = client_json
        result = func(**kwargs)
        if inspect.iscoroutine(result):
            result = EventLoopThread.shared().run(result)
        return json.dumps(result)

    def invoke_blob_trigger(self, name: str, blob_name: str, client_json: str | None) -> Any:
        """Deliver one blob event: the SDK-type binding data, converted by the extension."""
        trigger = self.blob_triggers[name]
        reference = {"Connection": trigger.connection, "ContainerName": trigger.container, "BlobName": blob_name}
        if self.worker is not None:
            return self.worker.blob_trigger(name, reference, client_json)
        content = json.dumps(reference)
        datum = Datum(
            value=ModelBindingData(
                version="1.0", source="AzureStorageBlobs", content_type="application/json", content=content
            ),
            type="model_binding_data",
        )
        upload = BlobClientConverter.decode(datum, trigger_metadata={}, pytype=trigger.blob_type)
        kwargs = {trigger.blob_param: upload}
        if trigger.client_param:
            kwargs[trigger.client_param] = client_json
        result = trigger.func(**kwargs)
        if inspect.iscoroutine(result):
            result = EventLoopThread.shared().run(result)
        return result


def durable_client_binding(bindings: list[dict]) -> dict | None:
    """A function's ``durableClient`` input binding, if it has one."""
    return next((b for b in bindings if b["type"] == "durableClient"), None)


def _annotation(func: Callable, param: str) -> Any:
    original = getattr(func, "client_function", func)
    return inspect.signature(original).parameters[param].annotation


@dataclass
class ModelBindingData:
    """The shape of the worker's ``model_binding_data`` message (protobuf in the real worker)."""

    version: str
    source: str
    content_type: str
    content: str


class EventLoopThread:
    """One long-lived event loop for async functions, as in the worker.

    The Durable client keeps one aiohttp session per process, bound to the loop that made it,
    so every invocation must run on the same loop.
    """

    _shared: EventLoopThread | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="devhost-asyncio", daemon=True)
        self.thread.start()

    @classmethod
    def shared(cls) -> EventLoopThread:
        with cls._lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def run(self, coroutine: Any, timeout: float | None = 300) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)
