"""A recording HTTP proxy on 127.0.0.1 in front of Azurite, so a test can see every request the
SDK clients and GDAL's ``/vsiaz/`` send (method and path), which neither exposes on its own."""

from __future__ import annotations

import http.client
import http.server
import threading
from urllib.parse import urlsplit

#: Hop-by-hop headers a proxy must not forward (RFC 9110, section 7.6.1).
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


class RecordingProxy:
    """Forwards every request to ``target`` (``http://127.0.0.1:PORT``) and records it."""

    def __init__(self, target: str):
        parts = urlsplit(target)
        self.target_host, self.target_port = parts.hostname, parts.port
        self.requests: list[tuple[str, str]] = []
        #: (method, path, status) of every answer passed back.
        self.answers: list[tuple[str, str, int]] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                with proxy._lock:
                    proxy.requests.append((self.command, self.path))
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                upstream = http.client.HTTPConnection(proxy.target_host, proxy.target_port, timeout=30)
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    response = upstream.getresponse()
                    payload = response.read()
                    with proxy._lock:
                        proxy.answers.append((self.command, self.path, response.status))
                    self.send_response(response.status, response.reason)
                    for key, value in response.getheaders():
                        if key.lower() not in _HOP_BY_HOP and key.lower() != "content-length":
                            self.send_header(key, value)
                    # A HEAD answer has no body but says how long the GET's would be.
                    length = response.getheader("Content-Length") if self.command == "HEAD" else None
                    self.send_header("Content-Length", length or str(len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                finally:
                    upstream.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = do_PATCH = do_MERGE = _forward

            def log_message(self, *args) -> None:  # quiet
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def paths(self) -> list[str]:
        with self._lock:
            return [path for _, path in self.requests]

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


class TrapServer:
    """An HTTP server on 127.0.0.1 that answers 404 to everything and counts what it was asked:
    the address a hostile upload names, to show the app never sends it a request."""

    def __init__(self):
        trap = self
        self.requests: list[tuple[str, str]] = []

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
