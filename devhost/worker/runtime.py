"""The Python language worker of Python 3.13, azure-functions-runtime, driven as the host drives it.

On Python 3.13 the Functions host starts a worker whose gRPC side (``proxy_worker``, shipped with
the host) hands each message from the host to azure-functions-runtime's handlers
(azure_functions_runtime/handle_event.py): ``worker_init_request`` (which indexes the app),
``functions_metadata_request``, ``function_load_request`` for each function, then
``invocation_request`` for every call. Each takes a request with ``.request`` (a
``StreamingMessage``) and ``.properties`` (``protos``: the message classes; ``host``: the host's
address, used only for HTTP streaming, which this app does not enable). This module plays that
side: the same messages, in the same order, with no gRPC in between.

One runtime per process: the package keeps its registry of functions in module globals.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..durable.functions import EventLoopThread
from .messages import protos

#: ``TILECOMMIT_DEVHOST_WORKER=runtime`` makes the local host call every function through the
#: worker package; unset (or ``in-process``), it calls them itself, as on Python 3.11.
WORKER_ENV = "TILECOMMIT_DEVHOST_WORKER"
#: The host's version the init request names (azure-functions-host 4.x); the package only logs it.
HOST_VERSION = "4.1040.0"


class WorkerError(RuntimeError):
    """A handler answered with a failed ``StatusResult``."""


class WorkerFunctionError(Exception):
    """A function raised in the worker; subclasses take the exception's own type name, so the
    host's wording (``TypeName: message``) reads as for a function called in process."""

    stack_trace = ""


def worker_mode() -> str:
    mode = os.environ.get(WORKER_ENV, "in-process") or "in-process"
    if mode not in ("in-process", "runtime"):
        raise ValueError(f"{WORKER_ENV} is {mode!r}: say 'runtime' or 'in-process'")
    return mode


@dataclass
class WorkerRequest:
    """What ``proxy_worker`` passes to each handler."""

    name: str
    request: Any
    properties: dict = field(default_factory=dict)


@dataclass
class LoadedFunction:
    name: str
    function_id: str
    raw_bindings: list[dict]
    metadata: Any


class WorkerRuntime:
    """azure-functions-runtime after init, indexing and load: ``invoke`` sends an InvocationRequest."""

    _shared: WorkerRuntime | None = None
    _lock = threading.Lock()

    def __init__(self, app_directory: Path):
        import azure_functions_runtime as runtime  # Python 3.13 only (requirements.txt)

        self.runtime = runtime
        self.protos = protos()
        self.app_directory = app_directory
        self.functions: dict[str, LoadedFunction] = {}
        self.capabilities: dict[str, str] = {}
        #: InvocationRequests sent, by function name (what the tests read to see the worker used).
        self.invocations: Counter[str] = Counter()
        self.loop = EventLoopThread.shared()
        if not logging.getLogger().isEnabledFor(logging.DEBUG):
            # One INFO line per invocation ("Function name: ..."), as the worker logs to the host.
            logging.getLogger("azure.functions").setLevel(logging.WARNING)

    @classmethod
    def shared(cls, app_directory: Path) -> WorkerRuntime:
        with cls._lock:
            if cls._shared is None:
                runtime = cls(app_directory)
                runtime.start()
                cls._shared = runtime
            elif cls._shared.app_directory != app_directory:
                raise WorkerError(
                    f"this process's worker indexed {cls._shared.app_directory}, not {app_directory}: one app per worker"
                )
            return cls._shared

    def _request(self, name: str, **content: Any) -> Any:
        """The handler's coroutine for one StreamingMessage."""
        message = self.protos.StreamingMessage(request_id=uuid.uuid4().hex, **content)
        request = WorkerRequest(name, message, {"protos": self.protos, "host": "127.0.0.1"})
        return getattr(self.runtime, name)(request)

    def _send(self, name: str, **content: Any) -> Any:
        """From any thread but the loop's: the handler run on the one event loop, as the worker runs it."""
        return self.loop.run(self._request(name, **content))

    @staticmethod
    def _check(step: str, result: Any) -> None:
        if result.status != result.Success:
            raise WorkerError(f"{step} failed in the worker: {result.exception.message}")

    def start(self) -> None:
        """Init (which indexes ``function_app.py``), metadata, then one load per function."""
        self.runtime.start_threadpool_executor()
        init = self._send(
            "worker_init_request",
            worker_init_request=self.protos.WorkerInitRequest(
                host_version=HOST_VERSION,
                function_app_directory=str(self.app_directory),
                worker_directory=str(Path(self.runtime.__file__).parent),
            ),
        )
        self._check("WorkerInitRequest (indexing)", init.result)
        self.capabilities = dict(init.capabilities)
        metadata = self._send(
            "functions_metadata_request",
            functions_metadata_request=self.protos.FunctionsMetadataRequest(
                function_app_directory=str(self.app_directory)
            ),
        )
        self._check("FunctionsMetadataRequest", metadata.result)
        for entry in metadata.function_metadata_results:
            loaded = self._send(
                "function_load_request",
                function_load_request=self.protos.FunctionLoadRequest(function_id=entry.function_id, metadata=entry),
            )
            self._check(f"FunctionLoadRequest of {entry.name}", loaded.result)
            self.functions[entry.name] = LoadedFunction(
                entry.name, entry.function_id, [json.loads(raw) for raw in entry.raw_bindings], entry
            )

    def invoke(self, name: str, input_data: list, trigger_metadata: dict | None = None) -> Any:
        """One InvocationRequest; the InvocationResponse, or the function's exception raised."""
        # No timeout here: the host's function timeout is the engine's (devhost/durable/work.py).
        return self.loop.run(self.invoke_async(name, input_data, trigger_metadata), timeout=None)

    async def invoke_async(self, name: str, input_data: list, trigger_metadata: dict | None = None) -> Any:
        """``invoke`` on the loop itself (an async caller, as the HTTP routes' are)."""
        function = self.functions[name]
        self.invocations[name] += 1
        request = self.protos.InvocationRequest(
            invocation_id=str(uuid.uuid4()),
            function_id=function.function_id,
            input_data=input_data,
            trigger_metadata=trigger_metadata or {},
        )
        response = await self._request("invocation_request", invocation_request=request)
        if response.result.status != response.result.Success:
            raise function_error(response.result.exception)
        return response


def function_error(exception: Any) -> WorkerFunctionError:
    """The worker's RpcException (``TypeName: message``, azure_functions_runtime/utils/tracing.py,
    ``serialize_exception``) as an exception of that type name."""
    type_name, sep, message = exception.message.partition(": ")
    if not sep or not type_name.isidentifier():
        type_name, message = "WorkerFunctionError", exception.message
    error_type = type(type_name, (WorkerFunctionError,), {})
    error = error_type(message)
    error.stack_trace = exception.stack_trace
    return error
