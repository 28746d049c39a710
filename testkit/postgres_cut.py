"""A TCP proxy on 127.0.0.1 in front of PostgreSQL that cuts a connection at its ``COMMIT``, or
holds the ``COMMIT`` back: what the server alone cannot be made to do at a chosen moment.

It forwards bytes both ways untouched until it is armed (:meth:`CommitCutProxy.cut_next_commit`).
Then the next ``COMMIT`` a client sends (psycopg sends it as a simple Query message, ``Q``, length
11, ``COMMIT\\0``: PostgreSQL's "Frontend/Backend Protocol", "Message Formats") ends that
connection, both sides closed and the server's answer never delivered:

- ``after``: the ``COMMIT`` reaches the server first (which commits), then the connection is cut:
  the client cannot know that its transaction committed.
- ``before``: the ``COMMIT`` is dropped and the connection cut: the server, finding its client
  gone inside a transaction, rolls it back; the client cannot know that either.
- ``hold``: the ``COMMIT`` waits in the proxy until :meth:`CommitCutProxy.release`, then goes on:
  the transaction stays open, with every lock it took, while the test starts others.
"""

from __future__ import annotations

import socket
import threading
import time

COMMIT_MESSAGE = b"Q\x00\x00\x00\x0bCOMMIT\x00"
AFTER, BEFORE, HOLD = "after", "before", "hold"
#: How long the cut waits after forwarding a ``COMMIT`` (``after``), so the server has read it.
SETTLE_S = 0.3


class CommitCutProxy:
    """Listens on 127.0.0.1:``port`` (a free one), forwards to 127.0.0.1:``upstream_port``."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._armed: str | None = None
        self._lock = threading.Lock()
        self.cuts: list[str] = []
        self.held = threading.Event()  # set once a held COMMIT has arrived
        self._released = threading.Event()
        self._stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut_next_commit(self, mode: str) -> None:
        if mode not in (AFTER, BEFORE, HOLD):
            raise ValueError(f"mode {mode!r}: expected {AFTER!r}, {BEFORE!r} or {HOLD!r}")
        with self._lock:
            self._armed = mode

    def release(self) -> None:
        """Let a held ``COMMIT`` (``hold``) go on to the server."""
        self._released.set()

    def _take(self) -> str | None:
        with self._lock:
            mode, self._armed = self._armed, None
            return mode

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        try:
            while chunk := source.recv(65536):
                mode = self._take() if from_client and COMMIT_MESSAGE in chunk else None
                if mode is None:
                    sink.sendall(chunk)
                    continue
                self.cuts.append(mode)
                if mode == HOLD:
                    self.held.set()
                    self._released.wait()
                    sink.sendall(chunk)
                    continue
                # The client's side goes first, so no answer the server sends from now reaches it.
                _close(source)
                if mode == AFTER:
                    sink.sendall(chunk)
                    time.sleep(SETTLE_S)
                break
        except OSError:
            pass
        _close(source)
        _close(sink)

    def close(self) -> None:
        self._stopped.set()
        self._released.set()
        self._listener.close()

    def __enter__(self) -> CommitCutProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
