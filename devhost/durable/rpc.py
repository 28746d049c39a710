"""The Durable extension's HTTP API, as much of it as the Durable client uses here.

``DurableOrchestrationClient`` talks to the host over HTTP (``rpcBaseUrl``); serving the same
routes on 127.0.0.1 lets the app's starter run unchanged, with the real client.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from .engine import Engine
from .functions import FunctionNotFound
from .history import (
    FAILED,
    PENDING,
    RUNNING,
    InstanceAlreadyExists,
    InstanceFinished,
    InstanceNotFound,
    InvalidInstanceId,
    iso,
    parse_iso,
)

_START = re.compile(r"^/runtime/webhooks/durabletask/orchestrators/([^/]+)(?:/([^/]+))?$")
_STATUS = re.compile(r"^/runtime/webhooks/durabletask/instances/([^/]+)$")
_LIST = re.compile(r"^/runtime/webhooks/durabletask/instances/?$")
_TERMINATE = re.compile(r"^/runtime/webhooks/durabletask/instances/([^/]+)/terminate$")
#: OrchestrationStatusQueryCondition.PageSize: a list answers at most this many unless ``top`` says.
DEFAULT_PAGE_SIZE = 100
CONTINUATION_HEADER = "x-ms-continuation-token"


class DurableHttpApi:
    """The extension's HTTP API for one engine, on 127.0.0.1 at a free port."""

    def __init__(self, engine: Engine, hub: str):
        self.engine = engine
        self.hub = hub
        self.server = _ApiServer(self)
        self.thread = threading.Thread(target=self.server.serve_forever, name="devhost-http", daemon=True)

    @property
    def base_url(self) -> str:
        # The bound socket's own address (what server_address holds): a str host for AF_INET,
        # where the server's declared address type also allows bytes.
        host, port = self.server.socket.getsockname()[:2]
        return f"http://{host}:{port}/runtime/webhooks/durabletask/"

    def management_urls(self, instance_id: str) -> dict:
        return {"statusQueryGetUri": f"{self.base_url}instances/{instance_id}"}

    @staticmethod
    def status_json(state: dict, show_input: bool = True) -> dict:
        return {
            "name": state["name"],
            "instanceId": state["id"],
            "createdTime": state["created"],
            "lastUpdatedTime": state["updated"],
            "input": json.loads(state["input"]) if show_input and state.get("input") else None,
            "output": state["error"] if state["status"] == FAILED else state.get("output"),
            "runtimeStatus": state["status"],
            "customStatus": state.get("custom_status"),
        }

    def client_binding(self) -> str:
        """The JSON the host hands a ``durableClient`` binding."""
        return json.dumps(
            {
                "taskHubName": self.hub,
                "creationUrls": {},
                "managementUrls": {},
                "baseUrl": self.base_url,
                "requiredQueryStringParameters": "",
                "rpcBaseUrl": self.base_url,
                "httpBaseUrl": "",
                "maxGrpcMessageSizeInBytes": 0,
                "grpcHttpClientTimeout": "00:01:40",
            }
        )

    def start(self) -> DurableHttpApi:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _iso_param(query: dict, name: str) -> str | None:
    """A date query parameter as the instance rows hold it (``iso``), for string comparison."""
    value = (query.get(name) or [None])[0]
    return iso(parse_iso(value)) if value else None


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing (the tests' output stays theirs) and answers in one call."""

    def log_message(self, *args):
        pass

    def answer(self, status: int, headers: dict, data: bytes) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _ApiServer(ThreadingHTTPServer):
    """The server of one :class:`DurableHttpApi`; its requests reach the API through it."""

    def __init__(self, api: DurableHttpApi):
        self.api = api
        super().__init__(("127.0.0.1", 0), _ApiHandler)


class _ApiHandler(QuietHandler):
    """One request to the extension's HTTP API: start, status, list, terminate, purge."""

    server: _ApiServer

    def _reply(self, status: int, body: object | None, headers: dict | None = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.answer(status, {"Content-Type": "application/json", **(headers or {})}, data)

    def do_POST(self):
        url = urlsplit(self.path)
        terminate = _TERMINATE.match(url.path)
        if terminate:
            return self._terminate(unquote(terminate.group(1)), parse_qs(url.query))
        match = _START.match(url.path)
        if not match:
            return self._reply(404, None)
        name, instance_id = unquote(match.group(1)), unquote(match.group(2) or "")
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        # The client posts the input already serialised (df_dumps), as a JSON string.
        input_json = body if isinstance(body, str) or body is None else json.dumps(body)
        # The SDK's start_new(version=...) asks for a version in the query; without one the
        # instance gets the host's default version.
        version = parse_qs(url.query).get("version", [None])[0]
        try:
            self.server.api.engine.start_new(name, instance_id, input_json=input_json, version=version)
        except (FunctionNotFound, InvalidInstanceId) as exc:
            return self._reply(400, {"Message": "Bad request", "ExceptionMessage": str(exc)})
        except InstanceAlreadyExists as exc:
            return self._reply(500, {"Message": "An error has occurred.", "ExceptionMessage": str(exc)})
        return self._reply(202, {"id": instance_id, **self.server.api.management_urls(instance_id)})

    def _terminate(self, instance_id: str, query: dict) -> None:
        """HandleTerminateInstanceRequestAsync: 404 unknown, 410 finished, else 202."""
        try:
            self.server.api.engine.terminate(instance_id, (query.get("reason") or [""])[0])
        except InstanceNotFound:
            return self._reply(404, None)
        except InstanceFinished:
            return self._reply(410, None)
        return self._reply(202, None)

    def _list(self, query: dict) -> None:
        """HandleGetStatusRequestAsync without an id: one page, oldest first, and the
        continuation token of the next page in a header (absent on the last page)."""
        statuses = tuple(s for v in query.get("runtimeStatus", []) for s in v.split(",") if s)
        states = self.server.api.engine.list_instances(
            created_from=_iso_param(query, "createdTimeFrom"),
            created_to=_iso_param(query, "createdTimeTo"),
            statuses=statuses,
            prefix=(query.get("instanceIdPrefix") or [None])[0],
        )
        top = int((query.get("top") or [DEFAULT_PAGE_SIZE])[0])
        start = int(self.headers.get(CONTINUATION_HEADER) or 0)
        page = states[start : start + top]
        headers = {CONTINUATION_HEADER: str(start + top)} if start + top < len(states) else {}
        show_input = (query.get("showInput") or ["true"])[0].lower() == "true"
        return self._reply(200, [self.server.api.status_json(s, show_input) for s in page], headers)

    def do_DELETE(self):
        """HandleDeleteHistoryByIdRequestAsync: 404 unknown, else 200 with the purge result."""
        match = _STATUS.match(urlsplit(self.path).path)
        if not match:
            return self._reply(404, None)
        deleted = self.server.api.engine.purge(unquote(match.group(1)))
        if not deleted:
            return self._reply(404, None)
        return self._reply(200, {"instancesDeleted": deleted})

    def do_GET(self):
        url = urlsplit(self.path)
        if _LIST.match(url.path):
            return self._list(parse_qs(url.query))
        match = _STATUS.match(url.path)
        if not match:
            return self._reply(404, None)
        state = self.server.api.engine.status(unquote(match.group(1)))
        if state is None:
            return self._reply(404, None)  # the real extension answers 404 with no body
        show_input = (parse_qs(url.query).get("showInput") or ["true"])[0].lower() == "true"
        # HttpApiHandler: 202 while it runs; a finished one 200, also Failed unless the
        # caller asked for returnInternalServerErrorOnFailure=true.
        failure_is_500 = "returninternalservererroronfailure=true" in url.query.lower()
        code = 202 if state["status"] in (PENDING, RUNNING) else 200
        if state["status"] == FAILED and failure_is_500:
            code = 500
        return self._reply(code, self.server.api.status_json(state, show_input))
