"""The sidecar's HTTP server: one event loop holds the connections, a few workers answer requests.

The stdlib's ThreadingHTTPServer spends a thread on every connection for as long as it stays
open, so a few dozen idle sockets (or stalled TLS handshakes) used to take /metrics and the
probes offline. Here:

* one loop thread (`serve_forever`) accepts, does TLS handshakes without blocking, reads each
  request head until its blank line, and writes each answer, all non-blocking; an idle connection
  costs a few hundred bytes, not a thread;
* a complete request head goes to one of `workers` threads, which parse it with the stdlib's
  BaseHTTPRequestHandler and render the answer into memory: no worker ever waits on a client;
* bounds (docs/sidecar.md, "Limits"): at most `max_connections` connections (at the bound, the one
  idle longest, and idle at least EVICT_IDLE_AFTER_S, is closed for a new one, else the kernel
  backlog holds it); a new connection's TLS handshake and first request head must complete
  within `header_timeout_s`, a later head within it of its first byte, a kept-alive connection
  may idle `idle_timeout_s`, an answer must be taken within `write_timeout_s`; a request head is
  at most MAX_REQUEST_HEAD_BYTES, a body (never used: we serve GET/HEAD) is skipped up to
  MAX_REQUEST_BODY_BYTES, else the connection closes after the answer;
* an accept loop that pauses listening instead of spinning when out of file descriptors, and that
  reports through the structured logger (rate-limited), never with tracebacks on stderr.

No dependency: the stdlib does the HTTP parsing; this is the connection handling around it.
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import queue
import re
import selectors
import socket
import ssl
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from sglang_tuning_exporter.core import limits
from sglang_tuning_exporter.sidecar.httpstats import HttpStats

log = logging.getLogger("sglang_tuning_exporter.http")
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_CLIENT_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_READ_CHUNK = 65536
_HEAD_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain\r\n"
                   b"Content-Length: 26\r\nConnection: close\r\n\r\nrequest head is too large\n")
# Phases of a connection; the loop owns it in every phase but BUSY (a worker has it).
HANDSHAKE, FIRST, IDLE, HEAD, BODY, BUSY, WRITE = "handshake", "first", "idle", "head", "body", "busy", "write"
_TIMEOUT_REASON = {IDLE: "idle_timeout", WRITE: "write_timeout"}  # any other phase: header_timeout


class _Conn:
    """One client connection and what the loop knows of it."""

    __slots__ = ("addr", "buf", "close_after", "deadline", "discard", "eof", "out", "phase", "since", "sock",
                 "want")

    def __init__(self, sock: socket.socket, addr: Any, phase: str, deadline: float, now: float) -> None:
        self.sock = sock
        self.addr = addr
        self.phase = phase
        self.deadline = deadline
        self.since = now  # when the current phase began (the eviction order)
        self.buf = bytearray()  # bytes read and not yet handed to a worker
        self.discard = 0  # bytes of a request body still to skip
        self.out = memoryview(b"")  # the answer still to write
        self.close_after = False
        self.eof = False  # the client sent FIN: answer what it asked, then close
        self.want = 0  # the selector events registered for it

    def enter(self, phase: str, deadline: float, now: float) -> None:
        self.phase, self.deadline, self.since = phase, deadline, now


class TimedRequestHandler(BaseHTTPRequestHandler):
    """Answers one request whose head the loop read: reads from that head, writes into memory."""

    server: BoundedHTTPServer
    request: Any  # the _Conn

    def setup(self) -> None:
        """The head as `rfile`, a buffer as `wfile`: a worker never touches the socket."""
        conn: _Conn = self.request
        self.conn = conn
        self.connection = conn.sock
        head, length, _ = _split_head(conn.buf)
        assert head is not None  # the loop dispatches complete heads only
        del conn.buf[:length]  # what follows is a body, or the next request
        self.rfile = io.BytesIO(head)
        self._out = io.BytesIO()
        self.wfile = self._out

    def handle(self) -> None:
        """One request (the loop brings the next one)."""
        self.close_connection = True
        self.handle_one_request()

    def finish(self) -> None:
        """Hand the answer and what to skip back to the connection."""
        self.conn.out = memoryview(self._out.getvalue())
        self.conn.close_after = self.close_connection
        super().finish()

    def parse_request(self) -> bool:
        """The stdlib's parsing, then the body: skipped when small, else the connection closes after
        the answer (never read as the next request)."""
        ok = super().parse_request()
        if ok:
            self._plan_body()
        return ok

    def send_response(self, code: int, message: str | None = None) -> None:
        """Every answer (errors the stdlib sends too) is counted by its status code."""
        self.server.stats.answered(code)
        super().send_response(code, message)

    def handle_expect_100(self) -> bool:
        """No `100 Continue`: we never want a body (see _plan_body)."""
        return True

    def _plan_body(self) -> None:
        conn = self.conn
        lengths = self.headers.get_all("Content-Length") or []
        if self.headers.get("Transfer-Encoding") is not None or "100-continue" in \
                str(self.headers.get("Expect", "")).lower():
            self.close_connection = True  # a chunked body, or one the client may or may not send
            return
        if not lengths:
            return
        text = lengths[0].strip()
        if len(set(lengths)) > 1 or not text.isdigit() or int(text) > limits.MAX_REQUEST_BODY_BYTES:
            self.close_connection = True
            return
        take = min(int(text), len(conn.buf))
        del conn.buf[:take]
        conn.discard = int(text) - take

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: " + format, *args)


def _split_head(buf: bytearray) -> tuple[bytes | None, int, bool]:
    """(the first request head in `buf` or None, its length, whether `buf` has outgrown the head cap);
    blank lines before a request are dropped from `buf`."""
    while buf[:2] == b"\r\n" or buf[:1] == b"\n":
        del buf[: 2 if buf[:1] == b"\r" else 1]
    m = _HEAD_END.search(buf, 0, limits.MAX_REQUEST_HEAD_BYTES)
    if m is None:
        return None, 0, len(buf) >= limits.MAX_REQUEST_HEAD_BYTES
    return bytes(buf[: m.end()]), m.end(), False


class BoundedHTTPServer(HTTPServer):
    """An HTTP server that serves under load: bounded connections, timeouts, workers that never wait on
    a client (module docstring). `ssl_context`: HTTPS, handshakes done by the loop."""

    request_queue_size = limits.LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], *,
                 max_connections: int | None = None, idle_timeout_s: float | None = None,
                 header_timeout_s: float | None = None, write_timeout_s: float | None = None,
                 workers: int | None = None, ssl_context: ssl.SSLContext | None = None,
                 stats: HttpStats | None = None) -> None:
        self.max_connections = max_connections or limits.MAX_CONNECTIONS
        self.idle_timeout_s = idle_timeout_s or limits.IDLE_TIMEOUT_S
        self.header_timeout_s = header_timeout_s or limits.HEADER_TIMEOUT_S
        self.write_timeout_s = write_timeout_s or limits.WRITE_TIMEOUT_S
        self.workers = workers or limits.HTTP_WORKERS
        self.ssl_context = ssl_context
        self.accept_errors = 0
        self.evictions = 0  # idle connections closed to make room for a new one
        self.stats = stats or HttpStats()  # exported as sglang_tuning_http_* (httpstats.py)
        self._conns: set[_Conn] = set()
        self._done: deque[_Conn] = deque()  # answered by a worker, back to the loop
        self._jobs: queue.SimpleQueue[_Conn | None] = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel: selectors.BaseSelector | None = None
        self._stop = threading.Event()
        self._state_lock = threading.Lock()  # serve_forever starting vs shutdown
        self.running = threading.Event()  # the loop serves (start_http waits for it)
        self._stopped = threading.Event()
        self._listening = False
        self._paused_until = 0.0
        self._next_scan = 0.0
        self._warned_at = float("-inf")
        self._quiet = 0  # warnings held back since the last one logged
        super().__init__(address, handler)
        # A client that resets between readiness and accept() must not leave the loop blocked in accept().
        self.socket.setblocking(False)

    # --- logging ---------------------------------------------------------------------------------
    def _warn(self, msg: str, *args: Any) -> None:
        """At most one warning every 10 s (a flood must not become a flood of log lines)."""
        now = time.monotonic()
        if now - self._warned_at < 10.0:
            self._quiet += 1
            return
        held, self._quiet, self._warned_at = self._quiet, 0, now
        log.warning(msg + (f" ({held} similar in the last 10 s not logged)" if held else ""), *args)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Through the structured logger: a client that went away is debug, anything else a warning."""
        exc = sys.exc_info()[1]
        if isinstance(exc, _CLIENT_GONE):
            log.debug("http: connection from %s ended: %s", client_address, exc)
            return
        log.debug("http: connection from %s failed", client_address, exc_info=True)
        self._warn("http: connection from %s failed: %s: %s", client_address, type(exc).__name__, exc)

    # --- the loop --------------------------------------------------------------------------------
    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Run the loop (and the workers) until `shutdown()`."""
        with self._state_lock:
            if self._stop.is_set():  # shut down before the loop got going: nothing to run
                return
            self._stopped.clear()
            sel = self._sel = selectors.DefaultSelector()
            sel.register(self._wake_r, selectors.EVENT_READ, None)
        self.running.set()
        threads = [threading.Thread(target=self._work, name=f"http-worker-{i}", daemon=True)
                   for i in range(self.workers)]
        for t in threads:
            t.start()
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                self._update_listening(now)
                timeout = max(0.0, min(self._next_scan, now + poll_interval) - now)
                for key, mask in sel.select(timeout):
                    if key.data is None:
                        self._drain_wake()
                    elif key.data == "listen":
                        self._accept()
                    else:
                        self._step(self._on_ready, key.data, mask)
                while self._done:
                    self._step(self._answered, self._done.popleft())
                if time.monotonic() >= self._next_scan:
                    self._scan(time.monotonic())
        finally:
            for _ in threads:
                self._jobs.put(None)
            for conn in list(self._conns):
                if conn.phase != BUSY:
                    self._close(conn)
            sel.close()
            self._sel = None
            self._listening = False
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop the loop and wait for it to end (a loop that never started: nothing to wait for)."""
        with self._state_lock:
            self._stop.set()
            started = self._sel is not None
        self._wake()
        if started:
            self._stopped.wait(10)

    def server_close(self) -> None:
        """Close the listening socket and the loop's wake-up pair."""
        super().server_close()
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full (the loop is waking anyway) or closed
            self._wake_w.send(b"\0")

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    def _step(self, step: Any, conn: _Conn, *args: Any) -> None:
        """One step of one connection; a bug of ours there closes that connection, not the server."""
        try:
            step(conn, *args)
        except Exception:
            self.handle_error(conn.sock, conn.addr)
            if conn.phase != BUSY:
                self._close(conn)

    def _update_listening(self, now: float) -> None:
        """Listen unless paused (out of file descriptors) or full with no connection to evict."""
        want = now >= self._paused_until and (len(self._conns) < self.max_connections
                                              or self._evictable(now) is not None)
        if want != self._listening and self._sel is not None:
            if want:
                self._sel.register(self.socket, selectors.EVENT_READ, "listen")
            else:
                self._sel.unregister(self.socket)
            self._listening = want

    def get_request(self) -> tuple[Any, Any]:
        """Accept; out of file descriptors (EMFILE...), stop listening ACCEPT_BACKOFF_S instead of spinning."""
        try:
            return super().get_request()
        except BlockingIOError:  # the connection went away before we took it
            raise
        except OSError as exc:
            self.accept_errors += 1
            if exc.errno in _OUT_OF_RESOURCES:
                self._warn("http: cannot accept connections: %s; pausing %.1f s", exc.strerror or exc,
                           limits.ACCEPT_BACKOFF_S)
                self._paused_until = time.monotonic() + limits.ACCEPT_BACKOFF_S
                self._next_scan = min(self._next_scan, self._paused_until)
            raise

    def _accept(self) -> None:
        try:
            sock, addr = self.get_request()
        except OSError:
            return
        now = time.monotonic()
        if len(self._conns) >= self.max_connections:
            victim = self._evictable(now)
            if victim is not None:
                self.evictions += 1
                log.debug("http: closing idle connection from %s for a new one", victim.addr)
                self._close(victim, "room")
        try:
            sock.setblocking(False)
            if self.ssl_context is not None:
                sock = self.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        except (OSError, ValueError) as exc:
            log.debug("http: cannot set up connection from %s: %s", addr, exc)
            sock.close()
            return
        conn = _Conn(sock, addr, HANDSHAKE if self.ssl_context is not None else FIRST,
                     now + self.header_timeout_s, now)
        self._conns.add(conn)
        self.stats.open_connections = len(self._conns)
        self._next_scan = min(self._next_scan, conn.deadline)
        self._on_ready(conn, selectors.EVENT_READ)

    def _evictable(self, now: float) -> _Conn | None:
        """The connection waiting longest for its client, when it has waited EVICT_IDLE_AFTER_S."""
        best: _Conn | None = None
        for conn in self._conns:
            if conn.phase != BUSY and (best is None or conn.since < best.since):
                best = conn
        return best if best is not None and now - best.since >= limits.EVICT_IDLE_AFTER_S else None

    def _scan(self, now: float) -> None:
        """Close connections past their deadline; note when the next one falls due."""
        nearest = now + 1.0
        full = len(self._conns) >= self.max_connections
        for conn in list(self._conns):
            if conn.phase == BUSY:
                continue
            if now >= conn.deadline:
                log.debug("http: connection from %s timed out (%s)", conn.addr, conn.phase)
                self._close(conn, _TIMEOUT_REASON.get(conn.phase, "header_timeout"))
                continue
            nearest = min(nearest, conn.deadline)
            if full and conn.since + limits.EVICT_IDLE_AFTER_S > now:  # when it may make room
                nearest = min(nearest, conn.since + limits.EVICT_IDLE_AFTER_S)
        if self._paused_until > now:
            nearest = min(nearest, self._paused_until)
        self._next_scan = nearest

    def _register(self, conn: _Conn, events: int) -> None:
        assert self._sel is not None
        if events == conn.want:
            return
        if conn.want and events:
            self._sel.modify(conn.sock, events, conn)
        elif events:
            self._sel.register(conn.sock, events, conn)
        else:
            self._sel.unregister(conn.sock)
        conn.want = events

    def _close(self, conn: _Conn, reason: str | None = None) -> None:
        """Close `conn`; `reason` (httpstats.CLOSE_REASONS) when the server closes it of its own accord."""
        if conn.want and self._sel is not None:
            self._sel.unregister(conn.sock)
        conn.want = 0
        if conn in self._conns and reason is not None:
            self.stats.closed(reason)
        self._conns.discard(conn)
        self.stats.open_connections = len(self._conns)
        with contextlib.suppress(OSError):
            conn.sock.close()

    # --- one connection's steps ------------------------------------------------------------------
    def _on_ready(self, conn: _Conn, mask: int) -> None:
        if conn.phase == HANDSHAKE:
            self._handshake(conn)
        elif conn.phase == WRITE:
            self._write(conn)
        elif conn.phase != BUSY:
            self._read(conn)

    def _handshake(self, conn: _Conn) -> None:
        sock = conn.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._register(conn, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._register(conn, selectors.EVENT_WRITE)
            return
        except (OSError, ValueError) as exc:  # plain HTTP on the TLS port, a bad client certificate...
            log.debug("http: TLS handshake with %s failed: %s", conn.addr, exc)
            self._close(conn)
            return
        now = time.monotonic()
        conn.enter(FIRST, now + self.header_timeout_s, now)
        self._read(conn)

    def _read(self, conn: _Conn) -> None:
        """Take what the client sent; a complete head goes to a worker."""
        got = 0
        while got < 4 * _READ_CHUNK:
            try:
                data = conn.sock.recv(_READ_CHUNK)
            except (BlockingIOError, ssl.SSLWantReadError):
                break
            except ssl.SSLWantWriteError:
                self._register(conn, selectors.EVENT_WRITE)
                return
            except OSError as exc:
                log.debug("http: reading from %s failed: %s", conn.addr, exc)
                self._close(conn)
                return
            if not data:  # the client closed its side: answer a complete request, then close
                conn.eof = True
                self._register(conn, 0)
                break
            got += len(data)
            conn.buf += data
        self._advance(conn)

    def _advance(self, conn: _Conn) -> None:
        """Skip a body, start the head's deadline at its first byte, dispatch a complete head."""
        now = time.monotonic()
        if conn.discard:
            take = min(conn.discard, len(conn.buf))
            del conn.buf[:take]
            conn.discard -= take
            if conn.discard and conn.eof:
                self._close(conn)
                return
            if conn.discard:
                self._register(conn, selectors.EVENT_READ)
                return
            conn.enter(IDLE, now + self.idle_timeout_s, now)
        head, _, too_large = _split_head(conn.buf)
        if too_large:
            conn.out, conn.close_after = memoryview(_HEAD_TOO_LARGE), True
            self.stats.answered(431)
            conn.buf.clear()
            conn.enter(WRITE, now + self.write_timeout_s, now)
            self._write(conn)
            return
        if head is None:
            if conn.eof:
                self._close(conn)
                return
            if conn.buf and conn.phase == IDLE:
                conn.enter(HEAD, now + self.header_timeout_s, now)
            self._register(conn, selectors.EVENT_READ)
            return
        self._register(conn, 0)
        conn.enter(BUSY, float("inf"), now)
        self._jobs.put(conn)

    def _work(self) -> None:
        """A worker: answer the requests the loop hands over, give each connection back."""
        while (conn := self._jobs.get()) is not None:
            try:
                self.finish_request(conn, conn.addr)  # the handler's setup/handle/finish
            except Exception:
                self.handle_error(conn.sock, conn.addr)
                conn.out, conn.close_after = memoryview(b""), True
            if self._stop.is_set():  # the loop is gone
                conn.sock.close()
                continue
            self._done.append(conn)
            self._wake()

    def finish_request(self, request: Any, client_address: Any) -> None:
        """Answer one request: `request` is the connection (_Conn) whose head the loop read."""
        super().finish_request(request, client_address)

    def _answered(self, conn: _Conn) -> None:
        now = time.monotonic()
        if self._stop.is_set():
            self._close(conn)
            return
        conn.enter(WRITE, now + self.write_timeout_s, now)
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        while conn.out:
            try:
                sent = conn.sock.send(conn.out[: 4 * _READ_CHUNK])
            except (BlockingIOError, ssl.SSLWantWriteError):
                self._register(conn, selectors.EVENT_WRITE)
                return
            except ssl.SSLWantReadError:
                self._register(conn, selectors.EVENT_READ)
                return
            except OSError as exc:
                log.debug("http: writing to %s failed: %s", conn.addr, exc)
                self._close(conn)
                return
            conn.out = conn.out[sent:]
        if conn.close_after or (conn.eof and _split_head(conn.buf)[0] is None):
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_WR)
            self._close(conn)
            return
        now = time.monotonic()
        if conn.discard:
            conn.enter(BODY, now + self.header_timeout_s, now)
        elif conn.buf:
            conn.enter(HEAD, now + self.header_timeout_s, now)
        else:
            conn.enter(IDLE, now + self.idle_timeout_s, now)
        self._next_scan = min(self._next_scan, conn.deadline)
        # Bytes already here (pipelined, or held inside TLS) raise no readiness event: look now.
        if conn.eof:
            self._advance(conn)
        else:
            self._read(conn)
