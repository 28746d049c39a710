"""The app's HTTP-triggered functions, served on 127.0.0.1 as the Functions host serves them.

What is modelled, each as the host does it:
- the URL is ``/{routePrefix}/{route}`` (host.json ``extensions.http.routePrefix``, ``api`` by
  default), a ``{name}`` segment of the route template is a route parameter, and a last
  ``{*name}`` one a catch-all (ASP.NET's routing): the rest of the path, slashes included, and
  optional, so ``ui/{*path}`` matches ``/api/ui`` with an empty ``path``;
- only the methods a function lists reach it; a request no function's route and method match
  is answered 404;
- a function of auth level ``function`` or ``admin`` needs a key, in the ``x-functions-key``
  header or the ``code`` query parameter, else 401 with an empty body. The real host keeps its
  keys in the ``azure-webjobs-secrets`` container; here one key is given to the host
  (``--function-key``), and with none given keys are not enforced, as ``func start`` does not
  enforce them either;
- the ``durableClient`` binding gets the same JSON the blob trigger's does.
"""

from __future__ import annotations

import errno
import hmac
import inspect
import json
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import azure.functions as func

from .functions import EventLoopThread, FunctionIndex, durable_client_binding
from .rpc import QuietHandler

logger = logging.getLogger(__name__)

DEFAULT_ROUTE_PREFIX = "api"
#: ``func start``'s port.
DEFAULT_HTTP_PORT = 7071
#: Where ``serve`` takes its function key from when ``--function-key`` is not given.
FUNCTION_KEY_ENV = "DEVHOST_FUNCTION_KEY"
KEY_HEADER = "x-functions-key"
_PARAMETER = re.compile(r"\{(\*?)([A-Za-z_][A-Za-z0-9_]*)(?::[^}]*)?\??\}")


class PortTaken(OSError):
    """The HTTP port is in use (``func start`` refuses to start then too)."""


@dataclass(frozen=True)
class HttpRoute:
    name: str
    func: Callable
    pattern: re.Pattern
    methods: frozenset[str]
    auth_level: str
    request_param: str
    client_param: str | None

    @classmethod
    def of(cls, name: str, func: Callable, bindings: list[dict], prefix: str) -> HttpRoute:
        trigger = next(b for b in bindings if b["type"] == "httpTrigger")
        client = durable_client_binding(bindings)
        template = "/".join(p for p in (prefix, trigger.get("route") or name) if p)
        regex, last = "", 0
        for match in _PARAMETER.finditer(template):
            before = template[last : match.start()]
            if match.group(1) and match.end() == len(template) and before.endswith("/"):
                regex += re.escape(before[:-1]) + f"(?:/(?P<{match.group(2)}>.*))?"
            else:
                regex += re.escape(before) + f"(?P<{match.group(2)}>[^/]+)"
            last = match.end()
        regex += re.escape(template[last:])
        return cls(
            name=name,
            func=func,
            pattern=re.compile(f"^/{regex}/?$", re.IGNORECASE),
            methods=frozenset(m.upper() for m in trigger.get("methods") or ("GET", "POST")),
            auth_level=str(trigger.get("authLevel", "FUNCTION")).upper(),
            request_param=trigger["name"],
            client_param=client["name"] if client else None,
        )


class HttpRoutes:
    """A server for the app's HTTP functions; ``client_binding()`` gives the durableClient JSON."""

    def __init__(
        self,
        index: FunctionIndex,
        client_binding: Callable[[], str],
        *,
        function_key: str | None = None,
        route_prefix: str = DEFAULT_ROUTE_PREFIX,
        port: int = 0,
    ):
        self.routes = [
            HttpRoute.of(name, fn, index.raw_bindings[name], route_prefix.strip("/"))
            for name, fn in index.http_functions.items()
        ]
        self.client_binding = client_binding
        self.function_key = function_key
        routes = self

        class Handler(QuietHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                self.answer(*routes.handle(self.command, self.path, dict(self.headers.items()), body))

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve

        try:
            self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            raise PortTaken(
                f"port {port} on 127.0.0.1 is taken: choose another with --http-port (0: any free one)"
            ) from None
        self.thread = threading.Thread(target=self.server.serve_forever, name="devhost-http-routes", daemon=True)

    @property
    def base_url(self) -> str:
        # The bound socket's own address (what server_address holds): a str host for AF_INET,
        # where the server's declared address type also allows bytes.
        host, port = self.server.socket.getsockname()[:2]
        return f"http://{host}:{port}"

    def _authorised(self, route: HttpRoute, headers: dict, query: dict) -> bool:
        if route.auth_level == "ANONYMOUS" or self.function_key is None:
            return True
        given = next((v for k, v in headers.items() if k.lower() == KEY_HEADER), None) or query.get("code") or ""
        return hmac.compare_digest(given.encode(), self.function_key.encode())

    def handle(self, method: str, path: str, headers: dict, body: bytes) -> tuple[int, dict, bytes]:
        url = urlsplit(path)
        query = dict(parse_qsl(url.query))
        for route in self.routes:
            match = route.pattern.match(url.path)
            if match is None or method.upper() not in route.methods:
                continue
            if not self._authorised(route, headers, query):
                return 401, {}, b""
            request = func.HttpRequest(
                method=method.upper(),
                url=f"{self.base_url}{path}",
                headers=headers,
                params=query,
                route_params={k: v or "" for k, v in match.groupdict().items()},
                body=body,
            )
            return self._invoke(route, request)
        return 404, {}, b""

    def _invoke(self, route: HttpRoute, request: func.HttpRequest) -> tuple[int, dict, bytes]:
        kwargs: dict[str, Any] = {route.request_param: request}
        if route.client_param:
            kwargs[route.client_param] = self.client_binding()
        try:
            result = route.func(**kwargs)
            if inspect.iscoroutine(result):
                result = EventLoopThread.shared().run(result)
        except Exception:  # the host answers 500 for a function that raised, and logs it
            logger.exception("HTTP function %s failed", route.name)
            return 500, {}, b""
        if isinstance(result, func.HttpResponse):
            headers = dict(result.headers)
            headers.setdefault("Content-Type", result.mimetype or "text/plain")
            return result.status_code, headers, result.get_body()
        return 200, {"Content-Type": "application/json"}, json.dumps(result).encode()

    def start(self) -> HttpRoutes:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
