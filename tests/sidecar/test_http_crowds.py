"""A crowd of clients must not freeze or bloat the sidecar's HTTP server (issues 17 and 23).

Connection floods on 127.0.0.1 only, bounded in count (at most 200 sockets per test) and time (every
socket has a timeout, every test a few seconds), against the real server.
"""

from __future__ import annotations

import errno
import logging
import shutil
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers.hostile_sglang import wait_port_closed
from helpers.tlscerts import self_signed
from sglang_tuning_exporter.core import limits
from sglang_tuning_exporter.sidecar.collector import BuildInfo, TuningCollector, make_registry
from sglang_tuning_exporter.sidecar.httpserver import BoundedHTTPServer
from sglang_tuning_exporter.sidecar.state import LiveState
from sglang_tuning_exporter.sidecar.web import WebApp, make_handler, start_http
from sglang_tuning_exporter.sidecar.webconfig import TLSConfig, WebConfig

LOOPBACK = "127.0.0.1"


def _app() -> WebApp:
    state = LiveState(window_s=60, max_ranks=8, expire_after_s=60, enabled={"metrics": True})
    build = BuildInfo("0.0.0-test", "3.11")
    registry = make_registry(TuningCollector(lambda: state.snapshot(0.0), build))
    return WebApp(snapshot=lambda: state.snapshot(0.0), registry=registry, ready=lambda: True, build=build)


@pytest.fixture
def server() -> Iterator[BoundedHTTPServer]:
    srv = BoundedHTTPServer((LOOPBACK, 0), make_handler(_app()), max_connections=8, idle_timeout_s=0.5,
                            header_timeout_s=0.5)
    thread = threading.Thread(target=srv.serve_forever, name="http-under-test", daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


def _get(port: int, path: str = "/-/healthy", timeout: float = 5.0) -> bytes:
    with socket.create_connection((LOOPBACK, port), timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        chunks = []
        while data := s.recv(65536):
            chunks.append(data)
    return b"".join(chunks)


def test_backlog_is_real() -> None:
    """The listen backlog is LISTEN_BACKLOG, not socketserver's 5."""
    assert BoundedHTTPServer.request_queue_size == limits.LISTEN_BACKLOG >= 128


def test_200_simultaneous_connections_are_all_answered(server: BoundedHTTPServer) -> None:
    """200 clients at once against 8 workers: every one answered, none refused."""
    port = server.server_address[1]
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=50) as pool:
        answers = list(pool.map(lambda _: _get(port), range(200)))
    assert all(a.startswith(b"HTTP/1.1 200") for a in answers)
    assert time.monotonic() - start < 20


def test_idle_connections_are_closed_and_threads_stay_bounded(server: BoundedHTTPServer) -> None:
    """60 connections that never send a byte: at most max_connections worker threads exist, each idle
    connection is closed after the idle timeout, and a real request is answered meanwhile."""
    port = server.server_address[1]
    before = threading.active_count()
    idle = [socket.create_connection((LOOPBACK, port), timeout=5) for _ in range(60)]
    try:
        time.sleep(0.2)  # the accept loop takes the first max_connections
        assert threading.active_count() - before <= server.max_connections
        answer = _get(port, timeout=10)
        assert answer.startswith(b"HTTP/1.1 200")
        closed = sum(wait_port_closed(s, 10.0) for s in idle)
        assert closed == len(idle)
    finally:
        for s in idle:
            s.close()


def test_a_dripping_request_head_is_cut_off(server: BoundedHTTPServer) -> None:
    """Request line and headers a byte every 100 ms: closed at the header timeout, not held for ever."""
    port = server.server_address[1]
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
    with socket.create_connection((LOOPBACK, port), timeout=5) as s:
        start = time.monotonic()
        cut = False
        for b in head:
            try:
                s.sendall(bytes([b]))
            except OSError:
                cut = True
                break
            if wait_port_closed(s, 0.1):
                cut = True
                break
        took = time.monotonic() - start
    assert cut and took < 3.0, took


def test_keep_alive_then_idle_is_closed(server: BoundedHTTPServer) -> None:
    """A kept-alive connection is closed once idle past the timeout (a slot is not held for ever)."""
    port = server.server_address[1]
    with socket.create_connection((LOOPBACK, port), timeout=5) as s:
        s.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        assert wait_port_closed(s, 5.0)


def test_out_of_file_descriptors_pauses_the_accept_loop(caplog: pytest.LogCaptureFixture,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """accept() failing with EMFILE: the loop pauses ACCEPT_BACKOFF_S between tries (no busy spin),
    and says so through our logger, rate-limited, without tracebacks."""
    monkeypatch.setattr(logging.getLogger("sglang_tuning_exporter"), "propagate", True)
    monkeypatch.setattr(limits, "ACCEPT_BACKOFF_S", 0.2)
    srv = BoundedHTTPServer((LOOPBACK, 0), make_handler(_app()))
    calls = [0]
    real = srv.socket

    class Exhausted:
        """The listening socket of a process out of file descriptors: readable, but accept() fails."""

        def fileno(self) -> int:
            return real.fileno()

        def accept(self) -> tuple[socket.socket, object]:
            calls[0] += 1
            raise OSError(errno.EMFILE, "Too many open files")

    srv.socket = Exhausted()  # type: ignore[assignment]
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    with caplog.at_level(logging.WARNING, logger="sglang_tuning_exporter"):
        thread.start()
        pending = socket.create_connection((LOOPBACK, srv.server_address[1]), timeout=5)  # makes it readable
        time.sleep(1.0)
        srv.shutdown()
        thread.join(timeout=5)
    pending.close()
    srv.socket = real
    srv.server_close()
    assert 1 <= calls[0] <= 8, calls[0]  # ~5 tries a second, not tens of thousands
    msgs = [r.getMessage() for r in caplog.records if r.name == "sglang_tuning_exporter.http"]
    assert len(msgs) == 1 and "Too many open files" in msgs[0]
    assert all(r.exc_info is None for r in caplog.records)


# --- issue 23: idle sockets and stalled handshakes must not take /metrics offline ---------------------
def _serve(web: WebConfig | None = None) -> Iterator[BoundedHTTPServer]:
    """The sidecar's own server as `serve` starts it (start_http, default bounds)."""
    srv, thread = start_http(_app(), LOOPBACK, 0, web)
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


@pytest.fixture
def real_server() -> Iterator[BoundedHTTPServer]:
    yield from _serve()


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: cannot make a test certificate")
    return self_signed(tmp_path_factory.mktemp("certs"), "server")


@pytest.fixture
def tls_server(tls_files: tuple[Path, Path]) -> Iterator[BoundedHTTPServer]:
    yield from _serve(WebConfig(tls=TLSConfig(cert_file=tls_files[0], key_file=tls_files[1])))


def _open_idle(port: int, count: int, first_bytes: bytes = b"") -> list[socket.socket]:
    socks = []
    for _ in range(count):
        s = socket.create_connection((LOOPBACK, port), timeout=5)
        if first_bytes:
            s.sendall(first_bytes)
        socks.append(s)
    return socks


def test_200_idle_connections_leave_metrics_answering(real_server: BoundedHTTPServer) -> None:
    """200 connections that never send a byte (the default server, 64 threads before): /metrics and
    /-/healthy still answer, each in under a second."""
    port = real_server.server_address[1]
    idle = _open_idle(port, 200)
    try:
        for path in ("/metrics", "/-/healthy", "/metrics"):
            start = time.monotonic()
            assert _get(port, path, timeout=1.0).startswith(b"HTTP/1.1 200"), path
            assert time.monotonic() - start < 1.0
    finally:
        for s in idle:
            s.close()


def test_200_stalled_tls_handshakes_leave_metrics_answering(tls_server: BoundedHTTPServer,
                                                            tls_files: tuple[Path, Path]) -> None:
    """200 TLS clients that stall in the handshake (half silent, half after the first 5 bytes of a
    ClientHello): an HTTPS /metrics still answers in under a second."""
    port = tls_server.server_address[1]
    stalled = _open_idle(port, 100) + _open_idle(port, 100, b"\x16\x03\x01\x02\x00")
    ctx = ssl.create_default_context(cafile=str(tls_files[0]))
    try:
        for path in ("/metrics", "/-/healthy"):
            start = time.monotonic()
            with socket.create_connection((LOOPBACK, port), timeout=1.0) as raw, \
                    ctx.wrap_socket(raw, server_hostname="localhost") as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                answer = b""
                while data := s.recv(65536):
                    answer += data
            assert answer.startswith(b"HTTP/1.1 200"), path
            assert time.monotonic() - start < 1.0
    finally:
        for s in stalled:
            s.close()


def test_a_stalled_handshake_is_closed_at_the_header_timeout(tls_files: tuple[Path, Path]) -> None:
    """A client that never finishes its handshake is closed after the header timeout."""
    srv = BoundedHTTPServer((LOOPBACK, 0), make_handler(_app()), header_timeout_s=0.3,
                            ssl_context=_server_context(tls_files))
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        with socket.create_connection((LOOPBACK, srv.server_address[1]), timeout=5) as s:
            s.sendall(b"\x16\x03\x01\x02\x00")
            start = time.monotonic()
            assert wait_port_closed(s, 5.0)
            assert time.monotonic() - start < 2.0
    finally:
        srv.shutdown()
        srv.server_close()


def _server_context(files: tuple[Path, Path]) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(files[0]), str(files[1]))
    return ctx


def test_at_the_bound_the_longest_idle_connection_makes_room(monkeypatch: pytest.MonkeyPatch) -> None:
    """max_connections idle sockets held open (timeouts far away): a new client is still answered,
    because the connection idle longest is closed for it."""
    monkeypatch.setattr(limits, "EVICT_IDLE_AFTER_S", 0.0)
    srv = BoundedHTTPServer((LOOPBACK, 0), make_handler(_app()), max_connections=16, header_timeout_s=60,
                            idle_timeout_s=60)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    port = srv.server_address[1]
    idle = _open_idle(port, 40)
    try:
        start = time.monotonic()
        assert _get(port, "/-/healthy", timeout=2.0).startswith(b"HTTP/1.1 200")
        assert time.monotonic() - start < 1.0
        assert srv.evictions >= 1
        assert wait_port_closed(idle[0], 2.0)  # the oldest went first
    finally:
        for s in idle:
            s.close()
        srv.shutdown()
        srv.server_close()


# --- request bodies and heads ------------------------------------------------------------------
def _exchange(port: int, data: bytes) -> bytes:
    """Send `data` on one connection and read until the server closes it."""
    with socket.create_connection((LOOPBACK, port), timeout=5) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


SMUGGLED = b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize("method", ["POST", "GET"])
def test_a_request_body_is_never_read_as_the_next_request(server: BoundedHTTPServer, method: str) -> None:
    """A body holding a valid request, on a kept-alive connection: skipped, not answered; the
    next real request gets the next answer."""
    data = (f"{method} /nope HTTP/1.1\r\nHost: x\r\nContent-Length: {len(SMUGGLED)}\r\n\r\n".encode()
            + SMUGGLED + b"GET /-/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    out = _exchange(server.server_address[1], data)
    assert out.count(b"HTTP/1.1 ") == 2, out
    first = b"HTTP/1.1 405" if method == "POST" else b"HTTP/1.1 404"
    assert out.startswith(first) and b"\r\n\r\nOK\n" not in out and out.endswith(b"Ready\n"), out


@pytest.mark.parametrize("framing", [b"Transfer-Encoding: chunked\r\n", b"Content-Length: 999999999\r\n",
                                     b"Content-Length: 5\r\nContent-Length: 6\r\n", b"Content-Length: -1\r\n",
                                     b"Expect: 100-continue\r\nContent-Length: 5\r\n"])
def test_a_body_we_would_not_skip_closes_the_connection(server: BoundedHTTPServer, framing: bytes) -> None:
    """Chunked, oversized, ambiguous or 100-continue bodies: one answer, then the connection closes (its
    bytes are never parsed as a request)."""
    body = b"5\r\n" + SMUGGLED if b"chunked" in framing else SMUGGLED
    out = _exchange(server.server_address[1], b"POST / HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\n" + body)
    assert out.count(b"HTTP/1.1 ") == 1 and b"Connection: close" in out, out


def test_pipelined_requests_are_answered_in_order(server: BoundedHTTPServer) -> None:
    """Two requests in one packet: two answers, in order."""
    out = _exchange(server.server_address[1], b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n"
                    b"GET /-/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert out.count(b"HTTP/1.1 200") == 2 and out.index(b"OK\n") < out.index(b"Ready\n"), out


def test_an_oversized_request_head_is_refused(server: BoundedHTTPServer) -> None:
    """A head past MAX_REQUEST_HEAD_BYTES without its blank line: 431, closed."""
    head = b"GET / HTTP/1.1\r\nX-Big: " + b"a" * (limits.MAX_REQUEST_HEAD_BYTES + 10)
    out = _exchange(server.server_address[1], head)
    assert out.startswith(b"HTTP/1.1 431"), out[:100]


def test_a_client_that_half_closes_after_its_request_is_answered(server: BoundedHTTPServer) -> None:
    """`printf 'GET ...' | nc -N`: the request, then FIN; the answer still comes."""
    with socket.create_connection((LOOPBACK, server.server_address[1]), timeout=5) as s:
        s.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    assert out.startswith(b"HTTP/1.1 200") and out.endswith(b"OK\n"), out


# --- the server's own metrics ------------------------------------------------------------------
def test_the_servers_own_counts_reach_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    """Connections closed for room, at the header and idle timeouts, answers by code (431 included)
    and the open connections, read from /metrics (catalog families sglang_tuning_http_*)."""
    from sglang_tuning_exporter.sidecar.httpstats import HttpCollector, HttpStats

    monkeypatch.setattr(limits, "EVICT_IDLE_AFTER_S", 0.0)
    stats = HttpStats()
    state = LiveState(window_s=60, max_ranks=8, expire_after_s=60, enabled={"metrics": True})
    build = BuildInfo("0.0.0-test", "3.11")
    registry = make_registry(TuningCollector(lambda: state.snapshot(0.0), build), HttpCollector(stats), process=False)
    app = WebApp(snapshot=lambda: state.snapshot(0.0), registry=registry, ready=lambda: True, build=build)
    srv = BoundedHTTPServer((LOOPBACK, 0), make_handler(app), max_connections=4, header_timeout_s=0.4,
                            idle_timeout_s=0.4, stats=stats)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    port = srv.server_address[1]
    try:
        silent = socket.create_connection((LOOPBACK, port), timeout=5)  # never sends: header timeout
        with socket.create_connection((LOOPBACK, port), timeout=5) as kept:  # answered, then idles
            kept.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
            assert kept.recv(65536).startswith(b"HTTP/1.1 200")
            assert wait_port_closed(silent, 3.0) and wait_port_closed(kept, 3.0)
        silent.close()
        assert _exchange(port, b"GET /" + b"a" * (limits.MAX_REQUEST_HEAD_BYTES + 10) + b" HTTP/1.1\r\n\r\n"
                         ).startswith(b"HTTP/1.1 431")
        crowd = _open_idle(port, 6)  # more than the bound: the longest idle ones make room
        try:
            assert _get(port, "/-/healthy").startswith(b"HTTP/1.1 200")
            assert wait_port_closed(crowd[0], 3.0)
            body = _get(port, "/metrics").split(b"\r\n\r\n", 1)[1].decode()
        finally:
            for s in crowd:
                s.close()
    finally:
        srv.shutdown()
        srv.server_close()
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
              if line.startswith("sglang_tuning_http_")}
    closed = "sglang_tuning_http_connections_closed_total"
    # The crowd may reach its header timeout too on a slow machine: at least, not exactly.
    assert values[f'{closed}{{reason="header_timeout"}}'] >= 1
    assert values[f'{closed}{{reason="idle_timeout"}}'] == 1
    assert values[f'{closed}{{reason="room"}}'] >= 2
    assert values['sglang_tuning_http_requests_total{code="200"}'] == 2  # /metrics counts itself
    assert values['sglang_tuning_http_requests_total{code="431"}'] == 1
    assert 1 <= values["sglang_tuning_http_open_connections"] <= 4
