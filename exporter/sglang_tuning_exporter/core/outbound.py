"""Every request the exporter sends (SGLang's /metrics and server info, the Prometheus API of `report`):
one HTTP exchange with a deadline and a byte cap that hold whatever the server does.

`http.client` bounds each socket read, not the request: a server dripping a byte a second (headers,
body, chunk sizes, a body that ends when the connection closes) holds a reader as long as it likes.
Here a timer shuts the socket down at the deadline, whichever object reads it by then (http.client
hands a will-close socket over to the response). A body is refused past `max_bytes`, inflated bytes
included (gzip is inflated incrementally, never past the cap); a body shorter than its framing
promises (Content-Length, a chunked or gzip stream cut short) is an error, not an answer. Redirects
are followed only to the same scheme, host and port: headers and credentials never go elsewhere.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urljoin, urlsplit

from sglang_tuning_exporter.core.durations import duration_text
from sglang_tuning_exporter.core.redact import redact_text

REDIRECTS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 3
_READ = 1 << 16


class OutboundError(Exception):
    """A request without a usable answer; `str(err)` is one line, `detail` the same without the request
    named, `reason` one of connection, tls, timeout, too_large, invalid (a body cut short or
    undecodable), http_status (a redirect not followed)."""

    def __init__(self, where: str, detail: str, reason: str, status: int | None = None) -> None:
        super().__init__(f"{where}: {detail}")
        self.detail = detail
        self.reason = reason
        self.status = status


@dataclass(frozen=True, slots=True)
class Answer:
    """A complete answer: status, headers (names lower-case), the whole (inflated) body."""

    status: int
    headers: Mapping[str, str]
    body: bytes


def origin(url: str) -> str:
    """`scheme://host:port` of `url`, without user info or path: what error messages name."""
    p = urlsplit(url)
    host = p.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return f"{p.scheme}://{host}" + (f":{p.port}" if p.port else "")


class _Deadline:
    """Shuts the socket it holds down when the time is up (from a timer thread)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.end = time.monotonic() + timeout_s
        self.expired = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(0.0, timeout_s), self._expire)
        self._timer.daemon = True

    def left(self) -> float:
        return max(0.001, self.end - time.monotonic())

    def hold(self, sock: socket.socket) -> None:
        sock.settimeout(self.left())  # a backstop per read; the timer bounds the whole request
        with self._lock:
            self._sock = sock
            if self.expired:
                self._shutdown()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            self._shutdown()

    def _shutdown(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                # The plain socket's shutdown: an SSLSocket's own would drop its TLS state under a reader.
                socket.socket.shutdown(self._sock, socket.SHUT_RDWR)

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        with self._lock:
            self._sock = None


class _Connection(http.client.HTTPConnection):
    """One connection whose socket (plain or TLS, handshake included) is held by the deadline."""

    def __init__(self, host: str, port: int | None, deadline: _Deadline, context: ssl.SSLContext | None) -> None:
        default = http.client.HTTPS_PORT if context is not None else http.client.HTTP_PORT
        super().__init__(host, port or default, timeout=deadline.left())
        self._deadline = deadline
        self._context = context

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self._deadline.left())
        self._deadline.hold(sock)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._context is not None:
            tls = self._context.wrap_socket(sock, server_hostname=self.host, do_handshake_on_connect=False)
            self._deadline.hold(tls)
            tls.do_handshake()
            sock = tls
        self.sock = sock


def _read_body(resp: http.client.HTTPResponse, cap: int, where: str) -> bytes:
    """The body, inflated when gzip, at most `cap` bytes; OutboundError when larger or cut short."""
    encoding = (resp.getheader("Content-Encoding") or "identity").strip().lower()
    if encoding not in ("identity", "gzip", "x-gzip", ""):
        raise OutboundError(where, f"unsupported Content-Encoding {encoding[:40]!r}", "invalid")
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if encoding in ("gzip", "x-gzip") else None
    chunks: list[bytes] = []
    size = 0

    def add(data: bytes) -> None:
        nonlocal size
        chunks.append(data)
        size += len(data)
        if size > cap:
            raise OutboundError(where, f"answer larger than {cap} bytes (the cap), not read further", "too_large")

    while True:
        # One byte past the cap says "too large": a huge body costs neither memory nor reading past it.
        raw = resp.read1(_READ if inflate is not None else min(_READ, cap + 1 - size))
        if not raw:
            break
        if inflate is None:
            add(raw)
            continue
        try:
            add(inflate.decompress(raw, cap + 1 - size))
            while inflate.unconsumed_tail:  # bounded per step: a bomb stops at the cap
                add(inflate.decompress(inflate.unconsumed_tail, cap + 1 - size))
        except zlib.error as exc:
            raise OutboundError(where, f"invalid gzip body: {exc}", "invalid") from None
    if resp.length:  # http.client counts down what Content-Length still promises
        raise OutboundError(where, f"body cut short ({resp.length} bytes of it missing)", "invalid")
    if inflate is not None and not inflate.eof:
        raise OutboundError(where, "gzip body cut short", "invalid")
    return b"".join(chunks)


def request(url: str, *, timeout_s: float, max_bytes: int, method: str = "GET",
            headers: Mapping[str, str] | None = None, body: bytes | None = None,
            context: ssl.SSLContext | None = None, accept_gzip: bool = False) -> Answer:
    """One HTTP(S) exchange that ends within `timeout_s` (connect, TLS, headers, body, redirects);
    the answer whatever its status, or OutboundError. `context` is the TLS context of https URLs
    (default: the system's). User info in the URL becomes basic auth unless `headers` authorise."""
    sent = {"User-Agent": "sglang-tuning-exporter", "Accept-Encoding": "gzip" if accept_gzip else "identity",
            **(headers or {})}
    parts = urlsplit(url)
    if parts.username is not None and not any(k.lower() == "authorization" for k in sent):
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        sent["Authorization"] = "Basic " + base64.b64encode(pair).decode()
    if body is not None:
        sent.setdefault("Content-Type", "application/x-www-form-urlencoded")
    with _Deadline(timeout_s) as deadline:
        for _ in range(MAX_REDIRECTS + 1):
            answer = _exchange(url, method, sent, body, deadline, context, max_bytes)
            location = answer.headers.get("location")
            if answer.status not in REDIRECTS or not location:
                return answer
            target = urljoin(url, location)
            if origin(target) != origin(url):
                raise OutboundError(origin(url), f"redirected (HTTP {answer.status}) to another host, "
                                    f"{origin(target)[:200]}: not followed (headers and credentials stay with "
                                    "the configured URL; point it at the new place)", "http_status", answer.status)
            if answer.status == 303 or (answer.status in (301, 302) and method == "POST"):
                method, body = "GET", None
                sent.pop("Content-Type", None)
            url = target
    raise OutboundError(origin(url), f"more than {MAX_REDIRECTS} redirects", "http_status")


def _exchange(url: str, method: str, headers: Mapping[str, str], body: bytes | None, deadline: _Deadline,
              context: ssl.SSLContext | None, cap: int) -> Answer:
    parts = urlsplit(url)
    where = f"{method} {origin(url)}{parts.path or '/'}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OutboundError(f"{method} {redact_text(url.rpartition('@')[2])[:200]}", "not an http(s) URL",
                            "connection")
    try:
        port = parts.port
    except ValueError:
        raise OutboundError(origin(url), "invalid port", "connection") from None
    tls = (context or ssl.create_default_context()) if parts.scheme == "https" else None
    conn = _Connection(parts.hostname, port, deadline, tls)
    try:
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request(method, path, body=body, headers=dict(headers))
        resp = conn.getresponse()
        data = _read_body(resp, cap, where)
        if deadline.expired:  # the shutdown may read as the end of a close-delimited body
            raise TimeoutError
        return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
    except OutboundError:
        if deadline.expired:
            raise _late(where, deadline) from None
        raise
    except ssl.SSLError as exc:
        if deadline.expired:
            raise _late(where, deadline) from None
        raise OutboundError(where, f"TLS error: {exc.reason or exc}", "tls") from None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if deadline.expired or isinstance(exc, TimeoutError):
            raise _late(where, deadline) from None
        if isinstance(exc, http.client.IncompleteRead):
            raise OutboundError(where, "body cut short (chunked answer ended early)", "invalid") from None
        detail = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise OutboundError(where, f"failed: {detail}", "connection") from None
    finally:
        conn.close()


def _late(where: str, deadline: _Deadline) -> OutboundError:
    return OutboundError(where, f"no complete answer within the {duration_text(deadline.timeout_s)} deadline", "timeout")
