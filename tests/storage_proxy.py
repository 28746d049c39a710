"""HTTP proxies on 127.0.0.1 in front of Azurite, so a test can see every request the SDK clients
and GDAL's ``/vsiaz/`` send (which neither exposes on its own), and make storage misbehave the way
a real account does (which Azurite never does).

:class:`RecordingProxy` forwards and records; :class:`FaultProxy` also answers some requests
itself: 503 ``ServerBusy`` with ``Retry-After`` (a throttled account), a reset connection (before
the request reaches storage, or after storage has done it, so the answer is lost) or a delay.
Faults apply to a fraction of requests, to every request inside a window of time, or to the
first request of each upload, and only to requests a predicate selects (the app's containers and
tables, not the local host's own store). This is the one test double of storage here: throttling
and outages cannot be caused in Azurite.
"""

from __future__ import annotations

import http.client
import http.server
import random
import socket
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

#: Hop-by-hop headers a proxy must not forward (RFC 9110, section 7.6.1).
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}

#: The bodies Azure Storage sends with 503 ServerBusy: XML from the blob service, JSON from tables.
_BUSY_XML = (
    b'<?xml version="1.0" encoding="utf-8"?><Error><Code>ServerBusy</Code>'
    b"<Message>The server is currently unable to receive requests. Please retry your request.</Message></Error>"
)
_BUSY_JSON = (
    b'{"odata.error":{"code":"ServerBusy","message":{"lang":"en-US",'
    b'"value":"The server is currently unable to receive requests. Please retry your request."}}}'
)


@dataclass
class FaultPlan:
    """What a :class:`FaultProxy` does to the requests ``applies(method, path)`` selects.

    ``busy``: fraction answered 503 ServerBusy with ``Retry-After: retry_after`` seconds (or
    another refusal: ``status`` and ``code``, e.g. 403 AuthorizationPermissionMismatch).
    ``reset``: fraction whose connection is reset, half of them before storage sees the request
    and half after storage has carried it out (the answer is lost); ``reset_when`` "before" or
    "after" makes it all one kind.
    ``cut``: fraction whose answer is cut half-way through its body (storage carried the request
    out; the status line and headers, with the full Content-Length, arrive, then half the bytes,
    then a reset), as a connection lost mid-transfer looks.
    ``every``: exactly 1 in ``every`` selected requests (from a seeded offset) is broken, its
    fault drawn (seeded) among a 503, a reset and, for a GET, an answer cut half-way.
    ``reset_uploads``: the first PUT of each path is reset half-way through its body.
    ``delay``: seconds added before forwarding each selected request.
    ``outage``: (start, end) in ``time.monotonic()`` seconds: every selected request inside it
    is answered 503 ServerBusy.
    """

    busy: float = 0.0
    reset: float = 0.0
    reset_when: str = "either"
    cut: float = 0.0
    every: int = 0
    reset_uploads: bool = False
    delay: float = 0.0
    retry_after: int = 1
    status: int = 503
    code: str = "ServerBusy"
    outage: tuple[float, float] | None = None
    applies: Callable[[str, str], bool] = lambda method, path: True
    seed: int = 13


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    #: The listen backlog: socketserver's default of 5 is less than the connections a job opens
    #: at once (8 copies in flight per share, several shares, GDAL's reads), and a connection
    #: refused there reaches GDAL as "HTTP error code: 0", a fault of the proxy, not of storage.
    request_queue_size = 128

    def handle_error(self, request, client_address) -> None:
        # A client closing its keep-alive connection (or one this proxy reset) is no error.
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class RecordingProxy:
    """Forwards every request to ``target`` (``http://127.0.0.1:PORT``) and records it."""

    def __init__(self, target: str):
        parts = urlsplit(target)
        self.target_host, self.target_port = parts.hostname, parts.port
        self.requests: list[tuple[str, str]] = []
        #: (method, path, headers) of every request, for tests that check what a request carried.
        self.sent: list[tuple[str, str, dict[str, str]]] = []
        #: (method, path, status) of every request storage carried out, whether or not its answer
        #: reached the client.
        self.carried_out: list[tuple[str, str, int]] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                with proxy._lock:
                    proxy.requests.append((self.command, self.path))
                    proxy.sent.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
                proxy.handle(self)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = do_PATCH = do_MERGE = _handle

            def log_message(self, *args) -> None:  # quiet
                pass

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def handle(self, request: http.server.BaseHTTPRequestHandler) -> None:
        self.forward(request, self.read_body(request))

    @staticmethod
    def read_body(request: http.server.BaseHTTPRequestHandler) -> bytes | None:
        length = int(request.headers.get("Content-Length") or 0)
        return request.rfile.read(length) if length else None

    def send_upstream(self, request: http.server.BaseHTTPRequestHandler, body: bytes | None):
        """Carry the request out in storage; (status, reason, headers, payload)."""
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        upstream = http.client.HTTPConnection(self.target_host, self.target_port, timeout=30)
        try:
            upstream.request(request.command, request.path, body=body, headers=headers)
            response = upstream.getresponse()
            payload = response.read()
            with self._lock:
                self.carried_out.append((request.command, request.path, response.status))
            return response.status, response.reason, response.getheaders(), payload
        finally:
            upstream.close()

    def forward(self, request: http.server.BaseHTTPRequestHandler, body: bytes | None) -> None:
        status, reason, headers, payload = self.send_upstream(request, body)
        request.send_response(status, reason)
        length = None
        for key, value in headers:
            if key.lower() == "content-length":
                length = value
            elif key.lower() not in _HOP_BY_HOP:
                request.send_header(key, value)
        # A HEAD answer has no body but says how long the GET's would be.
        request.send_header("Content-Length", (length if request.command == "HEAD" else None) or str(len(payload)))
        request.end_headers()
        if request.command != "HEAD":
            request.wfile.write(payload)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def paths(self) -> list[str]:
        with self._lock:
            return [path for _, path in self.requests]

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


def _reset(request: http.server.BaseHTTPRequestHandler) -> None:
    """Close the client's connection with a TCP reset (SO_LINGER 0), as a dropped connection looks."""
    request.close_connection = True
    request.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    request.connection.close()


class FaultProxy(RecordingProxy):
    """A :class:`RecordingProxy` that injects the faults of its :attr:`plan` and counts them."""

    def __init__(self, target: str, plan: FaultPlan | None = None):
        super().__init__(target)
        self.plan = plan or FaultPlan()
        self.injected: Counter[str] = Counter()
        self._random = random.Random(self.plan.seed)
        self._selected = 0
        self._offset = self._random.randrange(self.plan.every) if self.plan.every else 0
        self._uploads_reset: set[str] = set()

    def start_outage(self, seconds: float) -> None:
        """Answer every selected request 503 from now for ``seconds``."""
        now = time.monotonic()
        self.plan.outage = (now, now + seconds)

    def _first_upload_of(self, request: http.server.BaseHTTPRequestHandler) -> bool:
        """A Put Blob with a body (not a block or block list) to a path not yet reset."""
        return (
            self.plan.reset_uploads
            and request.command == "PUT"
            and request.path not in self._uploads_reset
            and int(request.headers.get("Content-Length") or 0) > 0
            and "comp=" not in request.path
        )

    def _choose(self, request: http.server.BaseHTTPRequestHandler) -> str | None:
        plan = self.plan
        if not plan.applies(request.command, request.path):
            return None
        with self._lock:
            if plan.outage and plan.outage[0] <= time.monotonic() < plan.outage[1]:
                return "outage"
            if self._first_upload_of(request):
                self._uploads_reset.add(request.path)
                return "reset-mid-upload"
            if plan.every:
                self._selected += 1
                if (self._selected + self._offset) % plan.every:
                    return None
                kinds = ["busy", "reset-before", "reset-after"] + (["cut"] if request.command == "GET" else [])
                return self._random.choice(kinds)
            draw = self._random.random()
            if draw < plan.busy:
                return "busy"
            if draw < plan.busy + plan.reset:
                if plan.reset_when == "either":
                    return "reset-before" if self._random.random() < 0.5 else "reset-after"
                return f"reset-{plan.reset_when}"
            if draw < plan.busy + plan.reset + plan.cut and request.command == "GET":
                return "cut"
        return None

    def _busy(self, request: http.server.BaseHTTPRequestHandler) -> None:
        body = _BUSY_JSON if "json" in (request.headers.get("Accept") or "") else _BUSY_XML
        body = body.replace(b"ServerBusy", self.plan.code.encode())
        request.send_response(self.plan.status)
        request.send_header("x-ms-error-code", self.plan.code)
        request.send_header("Retry-After", str(self.plan.retry_after))
        request.send_header("Content-Type", "application/json" if body is _BUSY_JSON else "application/xml")
        request.send_header("Content-Length", "0" if request.command == "HEAD" else str(len(body)))
        request.end_headers()
        if request.command != "HEAD":
            request.wfile.write(body)

    def _cut(self, request: http.server.BaseHTTPRequestHandler, body: bytes | None) -> None:
        status, reason, headers, payload = self.send_upstream(request, body)
        request.send_response(status, reason)
        for key, value in headers:
            if key.lower() not in _HOP_BY_HOP and key.lower() != "content-length":
                request.send_header(key, value)
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        request.wfile.write(payload[: len(payload) // 2])
        request.wfile.flush()
        _reset(request)

    def handle(self, request: http.server.BaseHTTPRequestHandler) -> None:
        fault = self._choose(request)
        if fault is not None:
            with self._lock:
                self.injected[fault] += 1
        if fault == "reset-mid-upload":
            length = int(request.headers.get("Content-Length") or 0)
            request.rfile.read(length // 2)
            _reset(request)
            return
        body = self.read_body(request)
        if self.plan.delay and self.plan.applies(request.command, request.path):
            time.sleep(self.plan.delay)
        if fault in ("busy", "outage"):
            self._busy(request)
        elif fault == "reset-before":
            _reset(request)
        elif fault == "reset-after":
            self.send_upstream(request, body)
            _reset(request)
        elif fault == "cut":
            self._cut(request, body)
        else:
            self.forward(request, body)


class TrapServer:
    """An HTTP server on 127.0.0.1 that answers 404 to everything and counts what it was asked:
    the address a hostile upload names, to show the app never sends it a request."""

    def __init__(self):
        trap = self
        self.requests: list[tuple[str, str]] = []
        #: (method, path, headers) of every request, for tests that check what a request carried.
        self.sent: list[tuple[str, str, dict[str, str]]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _refuse(self) -> None:
                trap.requests.append((self.command, self.path))
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_HEAD = do_POST = do_PUT = _refuse

            def log_message(self, *args) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> TrapServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
