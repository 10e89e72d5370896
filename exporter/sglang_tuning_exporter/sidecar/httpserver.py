"""The sidecar's HTTP server: the stdlib ThreadingHTTPServer with the bounds a crowd of clients needs.

* a real listen backlog (LISTEN_BACKLOG, not socketserver's 5);
* at most MAX_CONNECTIONS connections served at once: the accept loop waits for a free worker, the
  kernel backlog holds the rest (a thread per connection, but never more than the bound);
* an idle timeout (no request on a connection) and a header timeout (the request line and headers
  must arrive within HEADER_TIMEOUT_S of their first byte, whatever the pace of the bytes);
* an accept loop that pauses instead of spinning when the process is out of file descriptors, and
  that reports through the structured logger (rate-limited), never with tracebacks on stderr.

No dependency: the stdlib server does the HTTP; these are its few missing bounds (docs/sidecar.md).
"""

from __future__ import annotations

import errno
import io
import logging
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sglang_tuning_exporter.core import limits

log = logging.getLogger("sglang_tuning_exporter.http")
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_CLIENT_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)


class _DeadlineRaw(io.RawIOBase):
    """The connection's reads, each bounded by the idle timeout and, while set, by one deadline."""

    def __init__(self, sock: socket.socket, idle_s: float) -> None:
        self.sock = sock
        self.idle_s = idle_s
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        wait = self.idle_s
        if self.deadline is not None:
            wait = self.deadline - time.monotonic()
            if wait <= 0:
                raise TimeoutError("request headers not complete in time")
        self.sock.settimeout(wait)
        return self.sock.recv_into(buffer)


class TimedRequestHandler(BaseHTTPRequestHandler):
    """A request handler whose reads honour the server's idle and header timeouts."""

    server: BoundedHTTPServer

    def setup(self) -> None:
        """The usual streams, with reads through `_DeadlineRaw`."""
        super().setup()
        self.rfile.close()  # makefile's reader: replaced by one that knows the deadlines
        self._raw = _DeadlineRaw(self.connection, self.server.idle_timeout_s)
        self._reader = io.BufferedReader(self._raw, 1 << 16)
        self.rfile = self._reader

    def handle_one_request(self) -> None:
        """Wait (idle timeout) for a request's first byte, then give its head HEADER_TIMEOUT_S."""
        raw = self._raw
        raw.deadline = None
        try:
            if not self._reader.peek(1):
                self.close_connection = True
                return
        except (OSError, ValueError):  # idle past the timeout, or the peer went away
            self.close_connection = True
            return
        raw.deadline = time.monotonic() + self.server.header_timeout_s
        try:
            super().handle_one_request()
        finally:
            raw.deadline = None

    def parse_request(self) -> bool:
        """Headers read: the rest of the request is writing the answer (bounded by the write timeout)."""
        ok = super().parse_request()
        self._raw.deadline = None
        self.connection.settimeout(self.server.write_timeout_s)
        return ok


class BoundedHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with a real backlog, bounded concurrency and a well-behaved accept loop."""

    daemon_threads = True
    request_queue_size = limits.LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], *,
                 max_connections: int | None = None, idle_timeout_s: float | None = None,
                 header_timeout_s: float | None = None, write_timeout_s: float | None = None) -> None:
        self.max_connections = max_connections or limits.MAX_CONNECTIONS
        self.idle_timeout_s = idle_timeout_s or limits.IDLE_TIMEOUT_S
        self.header_timeout_s = header_timeout_s or limits.HEADER_TIMEOUT_S
        self.write_timeout_s = write_timeout_s or limits.WRITE_TIMEOUT_S
        self.accept_errors = 0
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._closing = threading.Event()
        self._warned_at = float("-inf")
        self._quiet = 0  # warnings held back since the last one logged
        super().__init__(address, handler)

    def _warn(self, msg: str, *args: Any) -> None:
        """At most one warning every 10 s (a flood must not become a flood of log lines)."""
        now = time.monotonic()
        if now - self._warned_at < 10.0:
            self._quiet += 1
            return
        held, self._quiet, self._warned_at = self._quiet, 0, now
        log.warning(msg + (f" ({held} similar in the last 10 s not logged)" if held else ""), *args)

    def get_request(self) -> tuple[Any, Any]:
        """Accept; out of file descriptors (EMFILE...), pause the loop instead of spinning on it."""
        try:
            return super().get_request()
        except OSError as exc:
            self.accept_errors += 1
            if exc.errno in _OUT_OF_RESOURCES:
                self._warn("http: cannot accept connections: %s; pausing %.1f s", exc.strerror or exc,
                           limits.ACCEPT_BACKOFF_S)
                self._closing.wait(limits.ACCEPT_BACKOFF_S)
            raise  # socketserver drops this attempt and goes back to its loop

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve in a worker thread once one of MAX_CONNECTIONS slots is free."""
        while not self._slots.acquire(timeout=0.25):
            if self._closing.is_set():
                self.shutdown_request(request)
                return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            self.shutdown_request(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """The worker: serve the connection, then give its slot back."""
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Through the structured logger: a client that went away is debug, anything else a warning."""
        exc = sys.exc_info()[1]
        if isinstance(exc, _CLIENT_GONE):
            log.debug("http: connection from %s ended: %s", client_address, exc)
            return
        log.debug("http: connection from %s failed", client_address, exc_info=True)
        self._warn("http: connection from %s failed: %s: %s", client_address, type(exc).__name__, exc)

    def shutdown(self) -> None:
        """Stop the loop (also one waiting for a free worker)."""
        self._closing.set()
        super().shutdown()
