"""The Durable extension's HTTP API, as much of it as the Durable client uses here.

``DurableOrchestrationClient`` talks to the host over HTTP (``rpcBaseUrl``); serving the same
routes on 127.0.0.1 lets the app's starter run unchanged, with the real client.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from .engine import FAILED, PENDING, RUNNING, Engine, InstanceAlreadyExists, InvalidInstanceId
from .functions import FunctionNotFound

_START = re.compile(r"^/runtime/webhooks/durabletask/orchestrators/([^/]+)(?:/([^/]+))?$")
_STATUS = re.compile(r"^/runtime/webhooks/durabletask/instances/([^/]+)$")


class DurableHttpApi:
    def __init__(self, engine: Engine, hub: str):
        self.engine = engine
        self.hub = hub
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the test output quiet
                pass

            def _reply(self, status: int, body: object | None) -> None:
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                match = _START.match(urlsplit(self.path).path)
                if not match:
                    return self._reply(404, None)
                name, instance_id = unquote(match.group(1)), unquote(match.group(2) or "")
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                # The client posts the input already serialised (df_dumps), as a JSON string.
                input_json = body if isinstance(body, str) or body is None else json.dumps(body)
                try:
                    api.engine.start_new(name, instance_id, input_json=input_json)
                except (FunctionNotFound, InvalidInstanceId) as exc:
                    return self._reply(400, {"Message": "Bad request", "ExceptionMessage": str(exc)})
                except InstanceAlreadyExists as exc:
                    return self._reply(500, {"Message": "An error has occurred.", "ExceptionMessage": str(exc)})
                return self._reply(202, {"id": instance_id, **api.management_urls(instance_id)})

            def do_GET(self):
                url = urlsplit(self.path)
                match = _STATUS.match(url.path)
                if not match:
                    return self._reply(404, None)
                state = api.engine.status(unquote(match.group(1)))
                if state is None:
                    return self._reply(404, None)  # the real extension answers 404 with no body
                # HttpApiHandler: 202 while it runs; a finished one 200, also Failed unless the
                # caller asked for returnInternalServerErrorOnFailure=true.
                failure_is_500 = "returninternalservererroronfailure=true" in url.query.lower()
                code = 202 if state["status"] in (PENDING, RUNNING) else 200
                if state["status"] == FAILED and failure_is_500:
                    code = 500
                return self._reply(code, api.status_json(state))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="devhost-http", daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/runtime/webhooks/durabletask/"

    def management_urls(self, instance_id: str) -> dict:
        return {"statusQueryGetUri": f"{self.base_url}instances/{instance_id}"}

    @staticmethod
    def status_json(state: dict) -> dict:
        return {
            "name": state["name"],
            "instanceId": state["id"],
            "createdTime": state["created"],
            "lastUpdatedTime": state["updated"],
            "input": json.loads(state["input"]) if state.get("input") else None,
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
