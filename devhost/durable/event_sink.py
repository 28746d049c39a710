"""The local stand-in for the Event Grid topic the completion events go to (``--events-file``,
``--events-url``).

It answers the topic's publish request as Event Grid does: ``POST <endpoint>`` with a JSON array
of CloudEvents (``Content-Type: application/cloudevents-batch+json``, what
``azure.eventgrid.EventGridPublisherClient.send`` sends), authorised by the ``aeg-sas-key``
header, answered 200 with no body once every event is kept. Each event is appended to the JSONL
file as one line and/or posted to the URL one at a time, structured (``Content-Type:
application/cloudevents+json``), as Event Grid delivers CloudEvents to a webhook. An event that
cannot be kept is answered 500, so the publishing activity retries: at least once, end to end.
Repeats keep their id (a subscriber drops them by it). Binds 127.0.0.1 only.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

logger = logging.getLogger(__name__)

#: Tries for a POST to --events-url before the publish is answered 500 (and so retried).
FORWARD_TRIES = 3


class EventSink:
    def __init__(self, *, file: Path | None = None, url: str | None = None):
        if file is None and url is None:
            raise ValueError("an event sink needs a file or a URL")
        self.file, self.url = file, url
        self.key = secrets.token_urlsafe(24)
        self.received = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, name="devhost-event-sink", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/api/events"

    def start(self) -> EventSink:
        if self.file is not None:
            self.file.parent.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def keep(self, event: dict) -> None:
        """Append ``event`` to the file and post it to the URL; raises if either fails."""
        with self._lock:
            if self.file is not None:
                with self.file.open("a", encoding="utf-8") as out:
                    out.write(json.dumps(event, sort_keys=True) + "\n")
            if self.url is not None:
                self._forward(self.url, event)
            self.received += 1

    def _forward(self, url: str, event: dict) -> None:
        body = json.dumps(event).encode()
        for attempt in range(1, FORWARD_TRIES + 1):
            request = urllib.request.Request(
                url,
                data=body,
                method="POST",
                headers={"Content-Type": "application/cloudevents+json; charset=utf-8"},
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    answer.read()
                return
            except OSError as exc:
                if attempt == FORWARD_TRIES:
                    raise
                logger.warning("event %s to %s failed (%s); trying again", event.get("id"), self.url, exc)

    def _handler(self):
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
                logger.debug("event sink: " + format, *args)

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                if self.headers.get("aeg-sas-key") != sink.key:
                    self.send_error(401, "missing or wrong aeg-sas-key")
                    return
                try:
                    events = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                    if not isinstance(events, list):
                        raise ValueError("expected a JSON array of CloudEvents")
                except ValueError as exc:
                    self.send_error(400, str(exc))
                    return
                try:
                    for event in events:
                        sink.keep(event)
                except OSError as exc:
                    logger.warning("event sink: could not keep an event (%s); the publisher will retry", exc)
                    self.send_error(500, str(exc))
                    return
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        return Handler
