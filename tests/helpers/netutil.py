"""Loopback helpers shared by the tests that start real processes (tests/helpers)."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import requests

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it; nothing listens there after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes] | subprocess.Popen[str], timeout_s: float = 10.0) -> None:
    """SIGTERM, wait; SIGKILL when it does not stop in time (its exit code stays in proc.returncode)."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s / 2)


def announced_port(stream: IO[str], *, lines: int = 50, suffix: str = "") -> int | None:
    """The port `serve` says it listens on (`listening on 127.0.0.1:PORT<suffix>` on its stderr), read
    from at most `lines` lines; None when it never says so."""
    pattern = re.compile(r"listening on 127\.0\.0\.1:(\d+)" + re.escape(suffix))
    for _ in range(lines):
        found = pattern.search(stream.readline())
        if found:
            return int(found.group(1))
    return None


def wait_ready(proc: subprocess.Popen[bytes], url: str, log_file: Path, *, name: str, timeout_s: float = 60.0) -> None:
    """Poll `url` until it answers 200 (a real server coming up); raise with the tail of its log when the
    process exits or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}: {log_file.read_text(errors='replace')[-800:]}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(url, timeout=1).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not become ready in time")
        time.sleep(0.1)  # waiting for a real process to come up (integration harness, not a unit test)


@contextlib.contextmanager
def oversized_body_server(body: bytes, monkeypatch: Any) -> Iterator[tuple[str, list[int]]]:
    """A loopback HTTP server answering every GET with `body`; yields its base URL and a one-item list
    counting the response bytes this process's http.client read (through HTTPResponse.read1)."""
    import http.client
    import http.server
    import threading

    class Big(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(OSError):  # the client stops reading
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer((LOOPBACK, 0), Big)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    read = [0]
    real = http.client.HTTPResponse.read1

    def counting(self: http.client.HTTPResponse, n: int = -1) -> bytes:
        data = real(self, n)
        read[0] += len(data)
        return data

    monkeypatch.setattr(http.client.HTTPResponse, "read1", counting)
    try:
        yield f"http://{LOOPBACK}:{srv.server_address[1]}", read
    finally:
        srv.shutdown()
        srv.server_close()
