"""HTTP proxies on 127.0.0.1 in front of Azurite: they see every request the SDK clients send, hold
storage to Azure's rules, and make it answer the way a real account does under load.

- :class:`RecordingProxy` forwards and records. Given :class:`~testkit.azure_rules.AzureRules`, it
  first refuses what Azure would refuse (Azurite accepts more than Azure does): the strict mode
  every test's storage runs in (:mod:`testkit.strict_storage`).
- :class:`FaultProxy` also answers some requests itself, per :class:`FaultPlan`: the answers Azure
  gives under load (503 ``ServerBusy``, 500 ``OperationTimedOut`` before or after the operation
  was carried out, 500 ``CannotVerifyCopySource`` to a Put Block From URL), a reset connection
  (before the request reaches storage, or after storage carried it out, so the answer is lost),
  an answer cut half-way through its body, or a delay; for a fraction of requests, exactly 1 in K
  (seeded), every request inside a window of time, or in episodes per operation. Its
  :class:`Gate` holds requests until the test lets them on: a job stopped part-way for as long
  as a test needs to look at it, however fast the machine.

Requests are told apart by the REST operation they are (:mod:`testkit.storage_ops`), so a plan
can break "every Insert Entity" whatever sent it. This is the one test double of storage here:
throttling, timeouts and lost answers cannot be caused in Azurite.
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
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from . import storage_ops as ops
from .azure_rules import AzureRules, Refusal

#: Hop-by-hop headers a proxy must not forward (RFC 9110, section 7.6.1).
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}
#: Seconds an idle connection to the upstream is reused for: less than Node's keep-alive timeout
#: (5 s), so Azurite never closes one under a request being sent on it.
UPSTREAM_IDLE_S = 2.0

# The answers Azure gives under load (Common REST API error codes; Put Block From URL's own).
BUSY = "busy"  # 503 ServerBusy, not carried out
TIMEOUT_BEFORE = "timeout-before"  # 500 OperationTimedOut, not carried out
TIMEOUT_AFTER = "timeout-after"  # 500 OperationTimedOut, carried out: the outcome is unknown to the sender
CANNOT_VERIFY = "cannot-verify"  # 500 CannotVerifyCopySource (Put Block From URL), not carried out
RESET_BEFORE = "reset-before"  # the connection reset before storage saw the request
RESET_AFTER = "reset-after"  # storage carried the request out, then the connection was reset: the answer is lost
CUT = "cut"  # a GET's answer cut half-way through its body
OUTAGE = "outage"
RESET_MID_UPLOAD = "reset-mid-upload"
#: Answers that leave the request carried out while the sender does not learn it.
LOST_AFTER_APPLIED = (TIMEOUT_AFTER, RESET_AFTER)
#: (status, code, message) of each refusal.
_REFUSALS = {
    BUSY: (503, "ServerBusy", "The server is currently unable to receive requests. Please retry your request."),
    OUTAGE: (503, "ServerBusy", "The server is currently unable to receive requests. Please retry your request."),
    TIMEOUT_BEFORE: (500, "OperationTimedOut", "Operation could not be completed within the specified time."),
    TIMEOUT_AFTER: (500, "OperationTimedOut", "Operation could not be completed within the specified time."),
    CANNOT_VERIFY: (500, "CannotVerifyCopySource", "Could not verify the copy source within the specified time."),
}


@dataclass
class Episode:
    """For ``seconds`` from ``start`` (``time.monotonic()``; None: from the first selected request
    of its operations), every selected request of one of ``operations`` (REST operation names,
    :mod:`testkit.storage_ops`) gets ``answer``: an account throttled for seconds to minutes,
    longer than the SDK's own retries last."""

    operations: frozenset[str]
    answer: str
    seconds: float
    start: float | None = None

    def covers(self, operation: str, now: float) -> bool:
        if operation not in self.operations:
            return False
        if self.start is None:
            self.start = now
        return self.start <= now < self.start + self.seconds


class Gate:
    """Holds the requests ``selects(method, path)`` picks once closed, until it is opened again.
    Open when made; :meth:`close` lets ``after`` more selected requests through first."""

    def __init__(self, selects: Callable[[str, str], bool]):
        self.selects = selects
        self._changed = threading.Condition()
        self._passes: int | None = None  # None: open; otherwise how many more may pass
        self._openings = 0  # a held request goes on at the next opening, even if closed again since
        self.held = 0

    def close(self, after: int = 0) -> None:
        with self._changed:
            self._passes = after

    def open(self) -> None:
        with self._changed:
            self._passes = None
            self._openings += 1
            self._changed.notify_all()

    def wait_for_held(self, count: int = 1, timeout: float = 60) -> None:
        """Return once ``count`` requests are held; TimeoutError after ``timeout`` seconds."""
        with self._changed:
            if not self._changed.wait_for(lambda: self.held >= count, timeout):
                raise TimeoutError(f"{self.held} request(s) held after {timeout} s, not {count}")

    def pass_through(self, method: str, path: str) -> None:
        """Return when a request may go on: at once unless selected while closed."""
        if not self.selects(method, path):
            return
        with self._changed:
            if self._passes is None:
                return
            if self._passes > 0:
                self._passes -= 1
                return
            self.held += 1
            self._changed.notify_all()
            opening = self._openings
            self._changed.wait_for(lambda: self._openings != opening)
            self.held -= 1


@dataclass
class FaultPlan:
    """What a :class:`FaultProxy` does to the requests ``applies(method, path)`` selects (and, when
    ``operations`` is given, only to those REST operations).

    ``busy``: fraction answered 503 ServerBusy with ``Retry-After: retry_after`` seconds (or
    another refusal: ``status`` and ``code``, e.g. 403 AuthorizationPermissionMismatch).
    ``reset``: fraction whose connection is reset, half of them before storage sees the request
    and half after storage has carried it out (the answer is lost); ``reset_when`` "before" or
    "after" makes it all one kind.
    ``cut``: fraction whose answer is cut half-way through its body (storage carried the request
    out; the status line and headers, with the full Content-Length, arrive, then half the bytes,
    then a reset), as a connection lost mid-transfer looks.
    ``every``: exactly 1 in ``every`` selected requests (from a seeded offset) is broken, counted
    for each REST operation on its own when ``operations`` is given, its answer drawn (seeded) among ``answers`` (by default a 503, a reset either side and, for a
    GET, an answer cut half-way; an answer that does not fit the request, a cut PUT or a
    CannotVerifyCopySource to anything but a Put Block From URL, is drawn again).
    ``episodes``: :class:`Episode` windows in which every request of their operations gets their answer.
    ``limit``: at most this many faults in all (``every=1, limit=1``: only the first selected request).
    ``reset_uploads``: the first PUT of each path is reset half-way through its body.
    ``delay``: seconds added before forwarding each selected request.
    ``gate``: a :class:`Gate` every request passes before it is forwarded or answered.
    ``outage``: (start, end) in ``time.monotonic()`` seconds: every selected request inside it
    is answered 503 ServerBusy.
    """

    busy: float = 0.0
    reset: float = 0.0
    reset_when: str = "either"
    cut: float = 0.0
    every: int = 0
    answers: tuple[str, ...] = (BUSY, RESET_BEFORE, RESET_AFTER, CUT)
    operations: frozenset[str] | None = None
    episodes: list[Episode] = field(default_factory=list)
    limit: int | None = None
    reset_uploads: bool = False
    delay: float = 0.0
    retry_after: int | None = 1
    status: int = 503
    code: str = "ServerBusy"
    outage: tuple[float, float] | None = None
    gate: Gate | None = None
    applies: Callable[[str, str], bool] = lambda method, path: True
    seed: int = 13


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    #: The listen backlog: socketserver's default of 5 is less than the connections a job opens
    #: at once (8 copies in flight per share, several shares, the reader's GETs), and a connection
    #: refused there would be a fault of the proxy, not of storage.
    request_queue_size = 128

    def handle_error(self, request, client_address) -> None:
        # A client closing its keep-alive connection (or one this proxy reset) is no error.
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


def service_of(headers) -> str:
    """ "table" for a request of the Table service (its SDK always sends ``DataServiceVersion``), else "blob"."""
    return "table" if any(k.lower() in ("dataserviceversion", "maxdataserviceversion") for k in headers) else "blob"


def parsed(request: http.server.BaseHTTPRequestHandler) -> ops.Request:
    return ops.parse(service_of(request.headers.keys()), request.command, request.path, dict(request.headers.items()))


class RecordingProxy:
    """Forwards every request to ``target`` (``http://127.0.0.1:PORT``) and records it; with
    ``rules``, refuses first what Azure would refuse (:class:`~testkit.azure_rules.AzureRules`);
    with ``blob_exists``, answers a conditional read of a missing blob as Azure does."""

    def __init__(
        self, target: str, rules: AzureRules | None = None, blob_exists: Callable[[str, str], bool] | None = None
    ):
        parts = urlsplit(target)
        self.target_host, self.target_port = parts.hostname, parts.port
        self.rules = rules
        #: (container, blob) -> whether the blob exists, asked of storage directly: given, a read
        #: refused on ``If-Match`` for a blob that does not exist is answered as Azure answers it.
        self.blob_exists = blob_exists
        self.requests: list[tuple[str, str]] = []
        #: (method, path, headers) of every request, for tests that check what a request carried.
        self.sent: list[tuple[str, str, dict[str, str]]] = []
        #: (method, path, status) of every request storage carried out, whether or not its answer
        #: reached the client.
        self.carried_out: list[tuple[str, str, int]] = []
        #: (operation, path, code) of every request refused under :attr:`rules`.
        self.refused: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()
        self._upstream = threading.local()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # An answer goes out as its head, then its body: with Nagle's algorithm on, the body
            # waited for the client's delayed ACK of the head (up to 40 ms a request).
            disable_nagle_algorithm = True

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
        body = self.read_body(request)
        if not self.refuse_by_rule(request, body):
            self.forward(request, body)

    @staticmethod
    def read_body(request: http.server.BaseHTTPRequestHandler) -> bytes | None:
        length = int(request.headers.get("Content-Length") or 0)
        return request.rfile.read(length) if length else None

    def refuse_by_rule(self, request: http.server.BaseHTTPRequestHandler, body: bytes | None) -> bool:
        """Answer Azure's refusal when the request breaks one of :attr:`rules`; whether it did."""
        if self.rules is None:
            return False
        found: Refusal | None = self.rules.check(parsed(request), body)
        if found is None:
            return False
        with self._lock:
            self.refused.append((ops.operation(parsed(request)), request.path, found.code))
        answer_error(request, found.status, found.code, found.message)
        return True

    def _connection(self) -> http.client.HTTPConnection:
        """This handler thread's connection to the upstream, reused while it is fresh."""
        held = getattr(self._upstream, "held", None)
        if held is not None and time.monotonic() - held[1] < UPSTREAM_IDLE_S:
            return held[0]
        if held is not None:
            held[0].close()
        connection = http.client.HTTPConnection(self.target_host, self.target_port, timeout=60)
        connection.connect()
        connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as the handler's
        self._upstream.held = (connection, time.monotonic())
        return connection

    def send_upstream(self, request: http.server.BaseHTTPRequestHandler, body: bytes | None):
        """Carry the request out in storage; (status, reason, headers, payload)."""
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        upstream = self._connection()
        try:
            upstream.request(request.command, request.path, body=body, headers=headers)
            response = upstream.getresponse()
            payload = response.read()
        except BaseException:
            upstream.close()
            self._upstream.held = None
            raise
        if response.will_close:
            upstream.close()
            self._upstream.held = None
        else:
            self._upstream.held = (upstream, time.monotonic())
        with self._lock:
            self.carried_out.append((request.command, request.path, response.status))
        if self.rules is not None and 200 <= response.status < 300:
            self.rules.carried_out(parsed(request), body)
        return response.status, response.reason, response.getheaders(), payload

    def forward(self, request: http.server.BaseHTTPRequestHandler, body: bytes | None) -> None:
        try:
            status, reason, headers, payload = self.send_upstream(request, body)
        except ConnectionRefusedError:
            # Storage is down (an outage test stopped the emulator): nothing was carried out, and
            # the account's front end answers busy, as Azure's does while a partition is unavailable.
            answer_error(request, *_REFUSALS[OUTAGE], retry_after=1)
            return
        if status == 412 and self._read_of_a_missing_blob(request):
            answer_error(request, 404, "BlobNotFound", "The specified blob does not exist.")
            return
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

    def _read_of_a_missing_blob(self, request: http.server.BaseHTTPRequestHandler) -> bool:
        """Whether a read Azurite refused on its ``If-Match`` is of a blob that does not exist, which
        Azure answers 404 ``BlobNotFound`` and Azurite 3.37 412 ``ConditionNotMet``. Asked of
        :attr:`blob_exists` (the proxy cannot sign a request of its own), when it is given."""
        if self.blob_exists is None or request.command not in ("GET", "HEAD"):
            return False
        read = parsed(request)
        if ops.operation(read) not in (ops.GET_BLOB, ops.GET_BLOB_PROPERTIES):
            return False
        if read.headers.get("if-match", "*").strip() == "*":
            return False
        return not self.blob_exists(read.container, read.blob.split("/", 1)[1])

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def paths(self) -> list[str]:
        with self._lock:
            return [path for _, path in self.requests]

    def start(self):
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def answer_error(
    request: http.server.BaseHTTPRequestHandler, status: int, code: str, message: str, retry_after: int | None = None
) -> None:
    """Answer as the service does when it refuses: ``x-ms-error-code`` and a body in the service's
    format (XML from the blob service, JSON from tables), none for a HEAD."""
    if service_of(request.headers.keys()) == "table":
        body = (
            '{"odata.error":{"code":"%s","message":{"lang":"en-US","value":"%s"}}}' % (code, message)  # noqa: UP031
        ).encode()
        content_type = "application/json;odata=minimalmetadata;streaming=true;charset=utf-8"
    else:
        body = (
            f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code><Message>{message}</Message></Error>'
        ).encode()
        content_type = "application/xml"
    request.send_response(status)
    request.send_header("x-ms-error-code", code)
    if retry_after is not None:
        request.send_header("Retry-After", str(retry_after))
    request.send_header("Content-Type", content_type)
    request.send_header("Content-Length", "0" if request.command == "HEAD" else str(len(body)))
    request.end_headers()
    if request.command != "HEAD":
        request.wfile.write(body)


def _reset(request: http.server.BaseHTTPRequestHandler) -> None:
    """Close the client's connection with a TCP reset (SO_LINGER 0), as a dropped connection looks."""
    request.close_connection = True
    request.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    request.connection.close()


def _fits(answer: str, request: http.server.BaseHTTPRequestHandler, operation: str) -> bool:
    if answer == CUT:
        return request.command == "GET"
    if answer == CANNOT_VERIFY:
        return operation == ops.PUT_BLOCK_FROM_URL
    return True


class FaultProxy(RecordingProxy):
    """A :class:`RecordingProxy` that injects the faults of its :attr:`plan` and counts them
    (:attr:`injected`: answer -> count; :attr:`injected_by_operation`: (operation, answer) -> count)."""

    def __init__(self, target: str, plan: FaultPlan | None = None, rules: AzureRules | None = None):
        super().__init__(target, rules)
        self.plan = plan or FaultPlan()
        self.injected: Counter[str] = Counter()
        self.injected_by_operation: Counter[tuple[str, str]] = Counter()
        self._random = random.Random(self.plan.seed)
        self._selected: Counter[str] = Counter()
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

    def _choose(self, request: http.server.BaseHTTPRequestHandler, operation: str) -> str | None:
        plan = self.plan
        if not plan.applies(request.command, request.path):
            return None
        if plan.operations is not None and operation not in plan.operations:
            return None
        now = time.monotonic()
        with self._lock:
            if plan.outage and plan.outage[0] <= now < plan.outage[1]:
                return OUTAGE
            for episode in plan.episodes:
                if episode.covers(operation, now):
                    return episode.answer
            if self._first_upload_of(request):
                self._uploads_reset.add(request.path)
                return RESET_MID_UPLOAD
            if plan.every:
                counted = operation if plan.operations is not None else "all"
                self._selected[counted] += 1
                if (self._selected[counted] + self._offset) % plan.every:
                    return None
                fitting = [a for a in plan.answers if _fits(a, request, operation)]
                return self._random.choice(fitting) if fitting else None
            draw = self._random.random()
            if draw < plan.busy:
                return BUSY
            if draw < plan.busy + plan.reset:
                if plan.reset_when == "either":
                    return RESET_BEFORE if self._random.random() < 0.5 else RESET_AFTER
                return f"reset-{plan.reset_when}"
            if draw < plan.busy + plan.reset + plan.cut and request.command == "GET":
                return CUT
        return None

    def _refuse(self, request: http.server.BaseHTTPRequestHandler, answer: str) -> None:
        status, code, message = _REFUSALS[answer]
        if answer in (BUSY, OUTAGE):
            status, code = self.plan.status, self.plan.code
        answer_error(request, status, code, message, self.plan.retry_after if status == 503 else None)

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
        operation = ops.operation(parsed(request))
        fault = self._choose(request, operation)
        if fault is not None:
            with self._lock:
                if self.plan.limit is not None and self.injected.total() >= self.plan.limit:
                    fault = None
                else:
                    self.injected[fault] += 1
                    self.injected_by_operation[(operation, fault)] += 1
        if fault == RESET_MID_UPLOAD:
            length = int(request.headers.get("Content-Length") or 0)
            request.rfile.read(length // 2)
            _reset(request)
            return
        body = self.read_body(request)
        if self.plan.delay and self.plan.applies(request.command, request.path):
            time.sleep(self.plan.delay)
        if self.plan.gate is not None:
            self.plan.gate.pass_through(request.command, request.path)
        if fault is None:
            if not self.refuse_by_rule(request, body):
                self.forward(request, body)
        elif fault in (BUSY, OUTAGE, TIMEOUT_BEFORE, CANNOT_VERIFY):
            self._refuse(request, fault)
        elif fault == RESET_BEFORE:
            _reset(request)
        elif fault in LOST_AFTER_APPLIED:
            if not self.refuse_by_rule(request, body):
                self.send_upstream(request, body)
            if fault == TIMEOUT_AFTER:
                self._refuse(request, fault)
            else:
                _reset(request)
        elif fault == CUT:
            self._cut(request, body)


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
