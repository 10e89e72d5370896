"""HTTP endpoints: /metrics, the status page `/`, /api/findings, /-/healthy and /-/ready.

`WebApp.handle(path)` is a plain function of the request path (testable without sockets); the
request handler around it (httpserver.py serves it) stays thin.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

import jinja2
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.registry import CollectorRegistry

from sglang_tuning_exporter.core.durations import ago_text, duration_text
from sglang_tuning_exporter.core.model import rank_text
from sglang_tuning_exporter.guide import plan
from sglang_tuning_exporter.guide.changes import last_change, last_change_text
from sglang_tuning_exporter.sidecar.collector import TUNING_ARGS, BuildInfo, encode_text
from sglang_tuning_exporter.sidecar.freshness import freshness
from sglang_tuning_exporter.sidecar.freshness import notes as freshness_notes
from sglang_tuning_exporter.sidecar.httpserver import BoundedHTTPServer, TimedRequestHandler
from sglang_tuning_exporter.sidecar.httpstats import HttpStats
from sglang_tuning_exporter.sidecar.state import SOURCES, Snapshot
from sglang_tuning_exporter.sidecar.webconfig import (
    AuthBusy,
    BasicAuth,
    TLSHTTPServer,
    WebConfig,
    accepts_gzip,
    gzip_body,
    make_ssl_context,
    needs_auth,
)

log = logging.getLogger("sglang_tuning_exporter.sidecar.web")
_STATUS_ORDER = {"critical": 0, "warning": 1, "unknown": 2, "ok": 3}
# Shown up front; the hundreds of other server args go in a collapsed list.
_KEY_ARGS = frozenset((*TUNING_ARGS, "schedule_policy", "model_path", "served_model_name", "cuda_graph_bs_decode"))


@dataclass(frozen=True, slots=True)
class Response:
    """What one request answers."""

    status: int
    content_type: str
    body: bytes


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _when(t: float | None, now: float) -> str:
    return "-" if t is None else ago_text(t, now)


def findings_json(snap: Snapshot) -> dict[str, Any]:
    """The diagnose JSON: the advisor's document when it ran, else a minimal one from the findings."""
    if snap.document is not None:
        try:
            return dict(snap.document())
        except Exception:  # the advisor's document failed: serve the findings we have
            log.exception("findings document failed")
    doc: dict[str, Any] = {"profile": None, "workload": None,
                           "server": {"version": snap.version, "args": dict(snap.args)},
                           "window": {"start": None, "end": None}, "signals": {},
                           "findings": [f.to_json_dict() for f in snap.findings]}
    doc.update(plan.unplanned_parts(snap.findings))  # the parts every document carries, spelt once
    return doc


def blind_sources(snap: Snapshot) -> list[dict[str, str]]:
    """Enabled sources whose last read failed (or that never answered), with why: the page's top banner."""
    out = []
    for name in SOURCES:
        st = snap.sources[name]
        if st.enabled and st.up is False:
            out.append({"name": name, "detail": st.detail or "the last read failed"})
    return out


class WebApp:
    """Routes requests to the registry, the status page and the JSON API."""

    def __init__(self, *, snapshot: Callable[[], Snapshot], registry: CollectorRegistry, ready: Callable[[], bool],
                 build: BuildInfo, telemetry_path: str = "/metrics", refresh_s: int = 10,
                 changes: Callable[[], list[dict[str, Any]]] | None = None) -> None:
        self._snapshot = snapshot
        self._changes = changes if changes is not None else list
        self._registry = registry
        self._ready = ready
        self._build = build
        self.telemetry_path = telemetry_path
        self.http_stats: HttpStats | None = None  # the server's counts when its families are registered
        self._refresh_s = refresh_s
        env = jinja2.Environment(loader=jinja2.PackageLoader("sglang_tuning_exporter.sidecar", "templates"),
                                 autoescape=True, undefined=jinja2.StrictUndefined)
        self._template = env.get_template("status.html.j2")

    def handle(self, method: str, target: str) -> Response:
        """Answer one request."""
        path = urlsplit(target).path
        if method not in ("GET", "HEAD"):
            return Response(405, "text/plain; charset=utf-8", b"method not allowed\n")
        if path == self.telemetry_path:
            # Our own encoder over the registry's families (same text as generate_latest, faster).
            return Response(200, CONTENT_TYPE_LATEST, encode_text(self._registry.collect()))
        if path == "/":
            return Response(200, "text/html; charset=utf-8", self.status_page().encode())
        if path == "/api/findings":
            snap = self._snapshot()
            doc = findings_json(snap)
            doc["freshness"] = freshness(snap)  # additive: stale, quiet or ended sources (issue #24)
            note = last_change(self._changes())
            if note is not None:  # additive: the plan's step 0, whether the last flag change helped
                doc["last_change"] = note
            body = json.dumps(doc, indent=1, default=str)
            return Response(200, "application/json", body.encode() + b"\n")
        if path == "/api/changes":
            body = json.dumps({"changes": self._changes()}, indent=1, default=str)
            return Response(200, "application/json", body.encode() + b"\n")
        if path == "/-/healthy":
            return Response(200, "text/plain; charset=utf-8", b"OK\n")
        if path == "/-/ready":
            if self._ready():
                return Response(200, "text/plain; charset=utf-8", b"Ready\n")
            return Response(503, "text/plain; charset=utf-8", b"Not ready: first evaluation pending\n")
        return Response(404, "text/plain; charset=utf-8", b"not found\n")

    def status_page(self) -> str:
        """The status page HTML (autoescaped: label values from SGLang are untrusted)."""
        snap = self._snapshot()
        changes = self._changes()
        note = last_change(changes)
        findings = sorted(snap.findings, key=lambda f: (_STATUS_ORDER.get(f.status, 9), f.check,
                                                        sorted(f.rank.items())))
        counts = {s: sum(1 for f in findings if f.status == s) for s in ("critical", "warning", "ok", "unknown")}
        sources = [{"name": name, "enabled": st.enabled, "up": st.up, "last": _when(st.last_attempt, snap.now),
                    "duration": "-" if st.duration_s is None else duration_text(st.duration_s),
                    "detail": st.detail}
                   for name, st in ((n, snap.sources[n]) for n in SOURCES)]
        ranks = [{"rank_text": rank_text(r.rank.as_dict()), "queue": _fmt(r.gauges.get("num_queue_reqs")),
                  "running": _fmt(r.gauges.get("num_running_reqs")), "usage": _fmt(r.gauges.get("token_usage")),
                  "throughput": _fmt(r.gauges.get("gen_throughput"))} for r in snap.ranks]
        signals = [{"rank_text": rank_text(rank.as_dict()),
                    "pairs": [(k, _fmt(v)) for k, v in sorted(values.items())]} for rank, values in snap.signals]
        doc = findings_json(snap) if snap.findings else {}
        cov = doc.get("coverage") or plan.coverage(snap.findings)
        blind = blind_sources(snap)
        unknown_checks = sorted(cov.get("unknown_why", {}))
        rows = [{"status": f.status, "check": f.check, "rank_text": rank_text(f.rank), "flag": f.flag,
                 "action": f.action, "current": _fmt(f.current), "suggested": _fmt(f.suggested),
                 "summary": f.summary, "evidence": f.evidence, "guide": f.guide, "tradeoff": f.tradeoff}
                for f in findings]
        steps = [{**st, "values": plan.plan_step_values(st)} for st in doc.get("plan") or []]
        return self._template.render(
            verdict=doc.get("verdict") or (plan.verdict_line({"coverage": cov, "findings": []}) if snap.findings
                                           else ""),
            blind=blind, unknown_checks=unknown_checks, plan_steps=steps,
            freshness=freshness_notes(freshness(snap)),
            command_diff=doc.get("command_diff") or [], indications=doc.get("indications") or [],
            firing=[r for r in rows if r["status"] in ("warning", "critical")],
            unknown_rows=[r for r in rows if r["status"] == "unknown"],
            ok_rows=[r for r in rows if r["status"] == "ok"],
            refresh_s=self._refresh_s, model=snap.model_name, version=snap.version,
            refresh=duration_text(self._refresh_s), window=duration_text(snap.window_s), evaluated=_when(snap.evaluated_at, snap.now) if snap.evaluated_at else "",
            telemetry_path=self.telemetry_path, counts=counts, findings=rows,
            sources=sources, log_lines=sorted((k, int(v)) for k, v in snap.log_lines.items()),
            unparsed=int(snap.log_unparsed), rotations=int(snap.log_rotations),
            truncations=int(snap.log_truncations), restarts=int(snap.restarts), ranks=ranks, signals=signals,
            args=[(k, _fmt(v)) for k, v in sorted(snap.args.items()) if k in _KEY_ARGS],
            other_args=[(k, _fmt(v)) for k, v in sorted(snap.args.items()) if k not in _KEY_ARGS],
            build_version=self._build.version, changes=changes[::-1],
            last_change=last_change_text(note) if note is not None else "",
            last_verdict=note["verdict"] if note is not None else "")


def make_handler(app: WebApp, web: WebConfig | None = None) -> type[BaseHTTPRequestHandler]:
    """A request handler class bound to `app` (basic auth and extra headers from `web`)."""
    web = web or WebConfig()
    auth = BasicAuth(web.users)
    extra_headers = web.headers

    class Handler(TimedRequestHandler):
        server_version = "sglang-tuning-exporter"
        protocol_version = "HTTP/1.1"

        def _answer(self, method: str) -> None:
            try:
                if needs_auth(urlsplit(self.path).path) and not auth.check(self.headers.get("Authorization")):
                    resp = Response(401, "text/plain; charset=utf-8", b"Unauthorized\n")
                else:
                    resp = app.handle(method, self.path)
            except AuthBusy:  # bcrypt busy with other new credentials (a flood?): try again shortly
                resp = Response(429, "text/plain; charset=utf-8", b"Too many authentication attempts\n")
            except Exception:  # never let one bad request kill the serving thread silently
                log.exception("request %s failed", self.path)
                resp = Response(500, "text/plain; charset=utf-8", b"internal error\n")
            body = resp.body
            self.send_response(resp.status)
            self.send_header("Content-Type", resp.content_type)
            if resp.status == 401:
                self.send_header("WWW-Authenticate", 'Basic realm="sglang-tuning-exporter"')
            if resp.status == 429:
                self.send_header("Retry-After", "1")
            if resp.status == 200 and urlsplit(self.path).path == app.telemetry_path:
                self.send_header("Vary", "Accept-Encoding")
                if accepts_gzip(self.headers.get("Accept-Encoding")):
                    body = gzip_body(body)
                    self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            if self.close_connection:  # e.g. a body we do not skip: the client must not reuse the connection
                self.send_header("Connection", "close")
            for name, value in extra_headers:
                self.send_header(name, value)
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:
            self._answer("GET")

        def do_HEAD(self) -> None:
            self._answer("HEAD")

        def do_POST(self) -> None:
            self._answer("POST")

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http: " + format, *args)

    return Handler


def start_http(app: WebApp, host: str, port: int, web: WebConfig | None = None,
               **bounds: Any) -> tuple[BoundedHTTPServer, threading.Thread]:
    """Bind and serve in a daemon thread (HTTPS when `web` has TLS); the server's `server_address` has the port.

    The server is bounded (httpserver.py: connections, timeouts; `bounds` are BoundedHTTPServer's)."""
    handler = make_handler(app, web)
    server = (TLSHTTPServer((host, port), handler, make_ssl_context(web.tls), **bounds)
              if web is not None and web.tls else BoundedHTTPServer((host, port), handler, **bounds))
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    server.running.wait(10)
    return server, thread
