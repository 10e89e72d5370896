"""A hostile stand-in SGLang on loopback: endpoints that answer what a faulty server might.

Each route is a `Body` (answered at once), a `Drip` (the answer a few bytes at a time, slowly, framed
by Content-Length, by the connection's close or chunked), a `Stall` (headers sent, then silence), a
`Cut` (the connection closed part-way through a framed body) or a `Redirect`. It binds 127.0.0.1 only and stops when its `with` block ends
(every connection it still holds is closed then), so a test that uses it is bounded in time.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Body:
    """Answer `body` with `status` straight away."""

    body: bytes
    status: int = 200
    content_type: str = "text/plain"
    headers: tuple[tuple[str, str], ...] = ()  # e.g. (("Content-Encoding", "gzip"),)


@dataclass(frozen=True)
class Drip:
    """Answer `body`, `chunk` bytes every `every_s` seconds (headers too when `headers` is set)."""

    body: bytes
    every_s: float = 0.2
    chunk: int = 1
    headers: bool = False
    framing: str = "length"  # "length" (Content-Length), "close" (no length, Connection: close), "chunked"


@dataclass(frozen=True)
class Stall:
    """Send the status line and headers, then hold the connection without a byte of body."""

    length: int = 1000


@dataclass(frozen=True)
class Cut:
    """Promise `body` (Content-Length, or chunked), send its first `sent` bytes, then close."""

    body: bytes
    sent: int
    framing: str = "length"  # or "chunked"


@dataclass(frozen=True)
class Redirect:
    """Answer `status` with a Location header."""

    location: str
    status: int = 307


Route = Body | Drip | Stall | Cut | Redirect


class HostileSGLang:
    """`with HostileSGLang({"/metrics": Drip(b"...")}) as s: s.url` -> `http://127.0.0.1:PORT`."""

    def __init__(self, routes: dict[str, Route]) -> None:
        self.routes = dict(routes)
        self.hits: dict[str, int] = {}
        self.seen: list[tuple[str, dict[str, str]]] = []  # (path, request headers) in order
        self._stop = threading.Event()
        self._lock = threading.Lock()
        handler = self._handler()
        self._server = ThreadingHTTPServer((LOOPBACK, 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="hostile-sglang", daemon=True)

    @property
    def url(self) -> str:
        """Base URL of the stand-in."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> HostileSGLang:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                with owner._lock:
                    owner.hits[path] = owner.hits.get(path, 0) + 1
                owner.seen.append((path, dict(self.headers.items())))
                route = owner.routes.get(path)
                if route is None:
                    self._plain(Body(b"not found\n", 404))
                elif isinstance(route, Body):
                    self._plain(route)
                elif isinstance(route, Drip):
                    self._drip(route)
                elif isinstance(route, Cut):
                    self._cut(route)
                elif isinstance(route, Redirect):
                    self.send_response(route.status)
                    self.send_header("Location", route.location)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    self._stall(route)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.do_GET()

            def _plain(self, route: Body) -> None:
                self.send_response(route.status)
                self.send_header("Content-Type", route.content_type)
                self.send_header("Content-Length", str(len(route.body)))
                for name, value in route.headers:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(route.body)

            def _drip(self, route: Drip) -> None:
                framing = {"length": f"Content-Length: {len(route.body)}\r\n",
                           "close": "Connection: close\r\n",
                           "chunked": "Transfer-Encoding: chunked\r\n"}[route.framing]
                head = f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n{framing}\r\n".encode()
                body = route.body
                if route.framing == "chunked":
                    body = b"".join(b"%x\r\n%s\r\n" % (len(route.body[i:i + route.chunk]), route.body[i:i + route.chunk])
                                    for i in range(0, len(route.body), route.chunk)) + b"0\r\n\r\n"
                self.close_connection = route.framing == "close"
                data = head + body if route.headers else body
                if not route.headers:
                    self.wfile.write(head)
                try:
                    for i in range(0, len(data), route.chunk):
                        if owner._stop.wait(route.every_s):
                            return
                        self.wfile.write(data[i:i + route.chunk])
                        self.wfile.flush()
                except OSError:
                    return  # the client gave up: what a deadline does

            def _cut(self, route: Cut) -> None:
                if route.framing == "chunked":
                    head = "Transfer-Encoding: chunked"
                    body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(route.body), route.body)
                else:
                    head, body = f"Content-Length: {len(route.body)}", route.body
                self.wfile.write(f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n{head}\r\n\r\n".encode())
                self.wfile.write(body[:route.sent])
                self.wfile.flush()
                self.close_connection = True

            def _stall(self, route: Stall) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(route.length))
                self.end_headers()
                self.wfile.flush()
                owner._stop.wait(30.0)
                self.close_connection = True

        return Handler


def deep_json(depth: int) -> bytes:
    """`[[[[...]]]]`: a document nested past any recursion limit."""
    return b"[" * depth + b"]" * depth


def wait_port_closed(sock: socket.socket, timeout_s: float) -> bool:
    """True when the peer closed `sock` within `timeout_s` (recv gives b'' or an error)."""
    sock.settimeout(timeout_s)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if sock.recv(4096) == b"":
                return True
    except TimeoutError:
        return False
    except OSError:
        return True
    return False
