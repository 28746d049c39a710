"""The local host's invocations as the InvocationRequest messages the Functions host sends.

Each input binding becomes a ``ParameterBinding`` whose ``TypedData`` has the case the host's
``ToRpc`` picks for the value the binding extension hands it (Azure/azure-functions-host,
src/WebJobs.Script.Grpc/MessageExtensions/GrpcMessageConversionExtensions.cs):

- the orchestration trigger: the context JSON as a string (the Durable extension binds an
  out-of-proc orchestrator's context to ``string``: Azure/azure-functions-durable-extension,
  src/WebJobs.Extensions.DurableTask/Bindings/OrchestrationTriggerAttributeBindingProvider.cs,
  ``OrchestrationContextToString``); the answer comes back as the return value's ``json``;
- the activity trigger: the serialized input as a string, the result back as ``json``
  (azure/functions/durable_functions.py, ``ActivityTriggerConverter``, reads either);
- the durable client: its JSON as a string;
- the SDK-type blob trigger: ``model_binding_data`` (the extension's ``ParameterBindingData``:
  ``ToModelBindingData``), content ``{"Connection", "ContainerName", "BlobName"}`` as
  azurefunctions-extensions-bindings-blob's ``BlobClientConverter`` reads it;
- HTTP: ``RpcHttp`` with lower-cased headers, the query, the route's parameters and the body
  as bytes (the worker asks for ``RawHttpBodyBytes`` and ``RpcHttpBodyOnly``: ``PopulateBody``);
  the response back as the return value's ``http``;
- the timer: a ``TimerInfo`` serialized as JSON (``ToRpcDefault``); what its ``Schedule``
  serializes to depends on the schedule's class and cannot be read from one source: the
  worker's ``TimerRequestConverter`` reads only ``IsPastDue``, ``ScheduleStatus`` and ``Schedule``.
"""

from __future__ import annotations

import importlib.util
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import azure.functions as func

from ..durable.functions import durable_client_binding
from .runtime import WorkerRuntime


class Invoker:
    """Calls through ``WorkerRuntime`` with each function's raw bindings naming its parameters."""

    def __init__(self, runtime: WorkerRuntime):
        self.runtime = runtime
        self.p = runtime.protos

    def _binding(self, name: str, data: Any) -> Any:
        return self.p.ParameterBinding(name=name, data=data)

    def _string(self, name: str, text: str) -> Any:
        return self._binding(name, self.p.TypedData(string=text))

    def _bindings(self, function: str) -> list[dict]:
        return self.runtime.functions[function].raw_bindings

    def _trigger(self, function: str) -> dict:
        return next(b for b in self._bindings(function) if b["type"].endswith("Trigger"))

    def callable(self, name: str) -> Callable[..., Any]:
        """What the index holds for a function: the orchestrator's ``(context JSON) -> JSON``, an
        async callable for HTTP and timer functions (their callers await it), and for activities
        and blob triggers a refusal: the index calls those through ``activity`` and ``blob_trigger``."""
        kind = self._trigger(name)["type"]
        if kind == "orchestrationTrigger":
            return self.orchestrator(name)
        if kind == "httpTrigger":
            return self.http(name)
        if kind == "timerTrigger":
            return self.timer(name)

        def through_the_index(**kwargs: Any) -> Any:
            raise TypeError(f"{name} runs in the worker: call it through FunctionIndex's invoke methods")

        return through_the_index

    # ---------------------------------------------------------------- durable

    def orchestrator(self, name: str) -> Callable[[str], str]:
        trigger = self._trigger(name)["name"]

        def orchestrate(context_json: str) -> str:
            response = self.runtime.invoke(name, [self._string(trigger, context_json)])
            return return_text(response.return_value)

        return orchestrate

    def activity(self, name: str, input_json: str | None, client_json: str | None) -> str:
        inputs = [self._string(self._trigger(name)["name"], input_json if input_json is not None else "null")]
        inputs += self._client(name, client_json)
        return return_text(self.runtime.invoke(name, inputs).return_value)

    def _client(self, name: str, client_json: str | None) -> list:
        client = durable_client_binding(self._bindings(name))
        if client is None:
            return []
        if client_json is None:
            raise LookupError(f"function {name!r} takes a durable client and this host offers none")
        return [self._string(client["name"], client_json)]

    # ---------------------------------------------------------------- blob, HTTP, timer

    def blob_trigger(self, name: str, content: dict, client_json: str | None) -> None:
        data = self.p.TypedData(
            model_binding_data=self.p.ModelBindingData(
                version="1.0",
                source="AzureStorageBlobs",
                content_type="application/json",
                content=json.dumps(content).encode(),
            )
        )
        inputs = [self._binding(self._trigger(name)["name"], data), *self._client(name, client_json)]
        self.runtime.invoke(name, inputs)

    def http(self, name: str) -> Callable[..., Any]:
        """An async callable taking the function's own parameters, as the user function does."""
        trigger = self._trigger(name)["name"]

        async def call(**kwargs: Any) -> func.HttpResponse:
            inputs = [self._binding(trigger, self.rpc_http(kwargs.pop(trigger)))]
            inputs += [self._string(k, v) for k, v in kwargs.items()]  # the durableClient JSON
            return http_response(await self.runtime.invoke_async(name, inputs))

        return call

    def timer(self, name: str) -> Callable[..., Any]:
        trigger = self._trigger(name)["name"]

        async def call(**kwargs: Any) -> None:
            timer = kwargs.pop(trigger)
            info = {"Schedule": {"AdjustForDST": True}, "ScheduleStatus": None, "IsPastDue": timer.past_due}
            inputs = [self._binding(trigger, self.p.TypedData(json=json.dumps(info)))]
            inputs += [self._string(k, v) for k, v in kwargs.items()]
            await self.runtime.invoke_async(name, inputs)

        return call

    def rpc_http(self, request: func.HttpRequest) -> Any:
        body = request.get_body()
        http = self.p.RpcHttp(
            method=request.method,
            url=request.url,
            headers={k.lower(): v for k, v in request.headers.items()},
            query={k: v for k, v in request.params.items() if v},
            params=dict(request.route_params),
        )
        if body:
            http.body.CopyFrom(self.p.TypedData(bytes=body))
        return self.p.TypedData(http=http)


def return_text(value: Any) -> str:
    """An InvocationResponse's ``json`` or ``string`` return value; JSON ``null`` for none."""
    case = value.WhichOneof("data") if value is not None else None
    if case in ("json", "string"):
        return getattr(value, case)
    if case is None:
        return "null"
    raise TypeError(f"the worker returned {case} where JSON was expected")


def http_response(response: Any) -> func.HttpResponse:
    value = response.return_value
    if value.WhichOneof("data") != "http":
        raise TypeError(f"the HTTP function returned {value.WhichOneof('data')}, not http")
    http = value.http
    case = http.body.WhichOneof("data")
    body = b"" if case is None else getattr(http.body, case)
    headers = dict(http.headers)
    mimetype = next((v for k, v in headers.items() if k.lower() == "content-type"), None)
    return func.HttpResponse(
        body=body.encode() if isinstance(body, str) else body,
        status_code=int(http.status_code or 200),
        headers=headers,
        mimetype=mimetype,
    )


def index_through_worker(index_type: Any, module_name: str) -> Any:
    """A ``FunctionIndex`` of the functions the worker indexed, each calling through it.

    The worker imports the app itself, as ``PYTHON_SCRIPT_FILE_NAME`` (``function_app.py``) in the
    function app's directory (azure_functions_runtime/handle_event.py, ``load_function_metadata``),
    so the module must be that file; the raw bindings are the ones its FunctionMetadataResponse
    carries, which are what the host reads."""
    global _index
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None or Path(spec.origin).name != "function_app.py":
        raise LookupError(f"the worker indexes function_app.py; {module_name!r} is not that file")
    directory = Path(spec.origin).resolve().parent
    with _index_lock:
        if _index is None:
            invoker = Invoker(WorkerRuntime.shared(directory))
            index = index_type(worker=invoker)
            for name, loaded in invoker.runtime.functions.items():
                index.add(name, loaded.raw_bindings, invoker.callable(name), lambda param: None)
            _index = index
        return _index


_index: Any = None
_index_lock = threading.Lock()
