"""A crowd of clients must not freeze or bloat the sidecar's HTTP server (issue 17).

Connection floods on 127.0.0.1 only, bounded in count (at most 200 sockets) and time (every socket has
a timeout, every test a few seconds), against the real server with short timeouts.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers.hostile_sglang import wait_port_closed
from sglang_tuning_exporter.core import limits
from sglang_tuning_exporter.sidecar.collector import BuildInfo, TuningCollector, make_registry
from sglang_tuning_exporter.sidecar.httpserver import BoundedHTTPServer
from sglang_tuning_exporter.sidecar.state import LiveState
from sglang_tuning_exporter.sidecar.web import WebApp, make_handler

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
