"""A stand-in SGLang server: the recorded 0.5.23 /metrics and /server_info, values moved per scenario.

Run: `python -m integration.standin_sglang --port 30000 --scenario retraction_storm --log-file x.log`
(with `tests/` on PYTHONPATH). It serves the real 0.5.23 exposition (or its underscore spelling),
lets the scenario set gauges and grow counters in real time, writes the scenario's log like SGLang
does, and can be switched to another scenario with `POST /_standin/scenario` (body: the name).
Killing it is the "SGLang went down" case.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from helpers.paths import FIXTURES
from integration.scenario_log import DATA, MODEL, SCENARIOS, LogWriter, Scenario

METRICS_FILE = FIXTURES / "metrics" / "sglang-0.5.23-metrics.txt"
SERVER_INFO_FILE = DATA / "sglang-0.5.23-server_info.json"
SPELLINGS = ("colon", "underscore")

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?P<labels>\{[^}]*\})?\s+(?P<value>\S+)(?P<rest>.*)$")
_META = re.compile(r"^# (?P<kind>HELP|TYPE) (?P<name>\S+)(?P<rest>.*)$")


@dataclass(frozen=True)
class Selector:
    """`name` or `name{label="value",...}`: which samples of the exposition a scenario moves."""

    name: str
    labels: tuple[str, ...]  # `label="value"` pieces that must all appear in the sample's labels

    @classmethod
    def parse(cls, text: str) -> Selector:
        """Parse `name{a="b"}`."""
        name, _, rest = text.partition("{")
        pieces = tuple(p.strip() for p in rest.rstrip("}").split(",") if p.strip())
        return cls(name, pieces)

    def matches(self, name: str, labels: str) -> bool:
        """True when the sample `name{labels}` is selected."""
        return name == self.name and all(p in labels for p in self.labels)


def spell(name: str, spelling: str) -> str:
    """SGLang's colon name, or the underscore-escaped one Prometheus 3 and some gateways store."""
    return name.replace("sglang:", "sglang_", 1) if spelling == "underscore" else name


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    return repr(float(v))


class MetricsState:
    """The exposition as a scenario moves it: gauge overrides, counters grown since start."""

    def __init__(self, recorded: str, scenario: Scenario, *, spelling: str = "colon",
                 clock: Callable[[], float] = time.monotonic) -> None:
        if spelling not in SPELLINGS:
            raise ValueError(f"spelling must be one of {SPELLINGS}, not {spelling!r}")
        self.recorded = recorded
        self.spelling = spelling
        self._clock = clock
        self._lock = threading.Lock()
        self._grown: dict[str, float] = {}  # selector text -> continuous growth so far
        self._steps: dict[str, float] = {}  # selector text -> step it grows by (kept after a switch)
        self._last = clock()
        self.scenario = scenario

    def _advance(self) -> None:
        now = self._clock()
        dt = max(0.0, now - self._last)
        self._last = now
        for key, rate in self.scenario.counters.items():
            self._grown[key] = self._grown.get(key, 0.0) + rate.per_second * dt
            self._steps[key] = rate.step

    def switch(self, scenario: Scenario) -> None:
        """Move to `scenario` from now on; counters keep what they grew (they never go back)."""
        with self._lock:
            self._advance()
            self.scenario = scenario

    def render(self) -> str:
        """The current exposition text."""
        with self._lock:
            self._advance()
            gauges = [(Selector.parse(k), v) for k, v in self.scenario.gauges.items()]
            grown = dict(self._grown)
            steps = dict(self._steps)
        counters = [(Selector.parse(k), k) for k in grown]
        out: list[str] = []
        for line in self.recorded.splitlines():
            meta = _META.match(line)
            if meta:
                out.append(f"# {meta['kind']} {spell(meta['name'], self.spelling)}{meta['rest']}")
                continue
            m = _SAMPLE.match(line)
            if not m:
                out.append(line)
                continue
            name, labels, value = m["name"], m["labels"] or "", float(m["value"])
            for sel, v in gauges:
                if sel.matches(name, labels):
                    value = v
            for sel, key in counters:
                if sel.matches(name, labels):
                    step = steps[key]
                    value += step * math.floor(grown.get(key, 0.0) / step)
            out.append(f"{spell(name, self.spelling)}{labels} {_fmt(value)}{m['rest']}")
        return "\n".join(out) + "\n"


def server_info(recorded: dict[str, Any], scenario: Scenario) -> dict[str, Any]:
    """The recorded `/server_info` document with the scenario's server arguments."""
    info = dict(recorded)
    info.update(scenario.server_args)
    return info


def rename_model(recorded: str, info: dict[str, Any], scenario: Scenario,
                 name: str) -> tuple[str, dict[str, Any], Scenario]:
    """The same server serving model `name`: in the metric labels, the server info and the log."""
    renamed = recorded.replace(f'model_name="{MODEL}"', f'model_name="{name}"')
    args = {**scenario.server_args, "model_path": name, "served_model_name": name}
    return renamed, {**info, "model_path": name, "served_model_name": name}, replace(scenario, server_args=args)


class StandIn:
    """The HTTP server and the log writer of one stand-in SGLang."""

    def __init__(self, state: MetricsState, info: dict[str, Any], host: str, port: int,
                 log: LogWriter | None = None, *, hold_log: bool = False) -> None:
        self.state = state
        self.info = info
        self.log = log
        self.hold_log = hold_log
        self._log_started = threading.Lock()
        self._log_running = False
        self.httpd = ThreadingHTTPServer((host, port), self._handler())
        self.httpd.daemon_threads = True

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass  # the harness captures stderr; per-request lines would drown real errors

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, standin.state.render().encode(), "text/plain; version=0.0.4; charset=utf-8")
                elif path in ("/server_info", "/get_server_info"):
                    doc = server_info(standin.info, standin.state.scenario)
                    self._send(200, json.dumps(doc).encode(), "application/json")
                elif path in ("/health", "/health_generate"):
                    self._send(200, b"", "text/plain")
                elif path == "/_standin/log":
                    self._send(200, str(standin.log.ticks if standin.log else -1).encode(), "text/plain")
                elif path == "/_standin/scenario":
                    self._send(200, standin.state.scenario.name.encode(), "text/plain")
                else:
                    self._send(404, b"not found\n", "text/plain")

            def do_POST(self) -> None:
                if self.path == "/_standin/log" and standin.log is not None:
                    standin.start_log()
                    self._send(200, b"ok\n", "text/plain")
                    return
                if self.path not in ("/_standin/scenario", "/_standin/restart"):
                    self._send(404, b"not found\n", "text/plain")
                    return
                name = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode().strip()
                if name not in SCENARIOS:
                    self._send(400, f"unknown scenario {name!r}\n".encode(), "text/plain")
                    return
                standin.state.switch(SCENARIOS[name])
                if standin.log is not None and self.path == "/_standin/restart":
                    standin.log.restart(SCENARIOS[name])  # a new startup section: other server_args
                elif standin.log is not None:
                    standin.log.scenario = SCENARIOS[name]
                self._send(200, b"ok\n", "text/plain")

        return Handler

    def start_log(self) -> None:
        """Start writing the log (once)."""
        with self._log_started:
            if self.log is not None and not self._log_running:
                self._log_running = True
                self.log.start()

    def serve(self) -> None:
        """Serve until SIGTERM/SIGINT; the log starts now, or on `POST /_standin/log` with hold_log."""
        if not self.hold_log:
            self.start_log()
        try:
            self.httpd.serve_forever(poll_interval=0.2)
        finally:
            if self.log is not None:
                self.log.stop()
            self.httpd.server_close()


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--scenario", default="healthy", choices=sorted(SCENARIOS))
    p.add_argument("--spelling", default="colon", choices=SPELLINGS)
    p.add_argument("--metrics", type=Path, default=METRICS_FILE, help="recorded exposition")
    p.add_argument("--server-info", type=Path, default=SERVER_INFO_FILE, help="recorded /server_info JSON")
    p.add_argument("--log-file", type=Path, default=None, help="append the scenario's log here")
    p.add_argument("--log-interval", type=float, default=0.5, help="seconds between Decode lines")
    p.add_argument("--hold-log", action="store_true",
                   help="serve HTTP at once but start the log only on POST /_standin/log")
    p.add_argument("--model-name", default=None, help=f"serve another model name than the recorded {MODEL}")
    args = p.parse_args(argv)
    try:
        recorded = args.metrics.read_text(encoding="utf-8")
        info = json.loads(args.server_info.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"standin_sglang: {exc}", file=sys.stderr)
        return 2
    scenario = SCENARIOS[args.scenario]
    if args.model_name:
        recorded, info, scenario = rename_model(recorded, info, scenario, args.model_name)
    state = MetricsState(recorded, scenario, spelling=args.spelling)
    log = LogWriter(args.log_file, scenario, interval_s=args.log_interval) if args.log_file else None
    standin = StandIn(state, info, args.host, args.port, log, hold_log=args.hold_log)
    # SIGTERM from the harness: stop serving cleanly (serve_forever must be stopped from another thread).
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=standin.httpd.shutdown).start())
    print(f"stand-in SGLang ({scenario.name}, {args.spelling}) on http://{args.host}:{args.port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        standin.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
