"""An Alertmanager webhook receiver that records every notification (in a thread, or standalone).

Alertmanager POSTs `{"receiver": ..., "status": ..., "alerts": [{"labels": ..., "annotations": ...}]}`
(webhook payload version 4). The path is kept too: the suite points each receiver at its own path.
Standalone (`python -m integration.webhook --port 9095 [--out FILE]`) it prints one JSON line each.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TextIO


@dataclass(frozen=True)
class Notification:
    """One webhook POST."""

    path: str
    payload: dict[str, Any]

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts it carries."""
        return list(self.payload.get("alerts") or [])


class WebhookReceiver:
    """Records notifications; `serve_in_thread()` for tests, `serve_forever()` standalone."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, echo: TextIO | None = None) -> None:
        self._lock = threading.Lock()
        self._notifications: list[Notification] = []
        self._echo = echo
        self.httpd = ThreadingHTTPServer((host, port), self._handler())
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL."""
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def _record(self, n: Notification) -> None:
        with self._lock:
            self._notifications.append(n)
            if self._echo is not None:
                self._echo.write(json.dumps({"path": n.path, **n.payload}) + "\n")
                self._echo.flush()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    payload = json.loads(body)
                except ValueError:
                    self.send_response(400)
                    self.end_headers()
                    return
                receiver._record(Notification(self.path, payload if isinstance(payload, dict) else {}))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        return Handler

    def notifications(self) -> list[Notification]:
        """Everything received so far."""
        with self._lock:
            return list(self._notifications)

    def firing(self) -> list[tuple[str, dict[str, Any]]]:
        """(path, alert) for every firing alert received so far."""
        return [(n.path, a) for n in self.notifications() for a in n.alerts() if a.get("status") == "firing"]

    def resolved(self) -> list[tuple[str, dict[str, Any]]]:
        """(path, alert) for every resolved alert received so far."""
        return [(n.path, a) for n in self.notifications() for a in n.alerts() if a.get("status") == "resolved"]

    def serve_in_thread(self) -> WebhookReceiver:
        """Serve from a daemon thread."""
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="webhook", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and release the port."""
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(timeout=5)
        self.httpd.server_close()


def main(argv: list[str] | None = None) -> int:
    """Standalone receiver: one JSON line per notification on stdout (and in --out)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9095)
    p.add_argument("--out", type=Path, default=None, help="also append JSON lines here")
    args = p.parse_args(argv)
    out: TextIO = args.out.open("a", encoding="utf-8") if args.out else sys.stdout
    receiver = WebhookReceiver(args.host, args.port, echo=out)
    print(f"webhook receiver on {receiver.url}", file=sys.stderr, flush=True)
    try:
        receiver.httpd.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        receiver.httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
