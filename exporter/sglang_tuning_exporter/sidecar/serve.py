"""The `serve` subcommand: the sidecar process (flags, wiring, background loop, HTTP server)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from sglang_tuning_exporter.core import limits
from sglang_tuning_exporter.core.durations import iso_time
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.core.exit_codes import EXIT_OK, EXIT_RUNTIME, EXIT_USAGE
from sglang_tuning_exporter.core.model import Finding, Observation, Rank, Sample, ServerState
from sglang_tuning_exporter.core.redact import redact_text
from sglang_tuning_exporter.guide import settings
from sglang_tuning_exporter.guide.advisor import evaluate as evaluate_checks
from sglang_tuning_exporter.guide.advisor import findings_document, window_for
from sglang_tuning_exporter.guide.config import Config
from sglang_tuning_exporter.pipeline.observations import EventConverter
from sglang_tuning_exporter.sidecar.change_tracker import ChangeCollector, ChangeTracker
from sglang_tuning_exporter.sidecar.collector import BuildInfo, TuningCollector, current_build, make_registry
from sglang_tuning_exporter.sidecar.engine import (
    Advisor,
    LogInput,
    MetricsInput,
    Sidecar,
    ToObservations,
    ToSamples,
)
from sglang_tuning_exporter.sidecar.httpserver import BoundedHTTPServer
from sglang_tuning_exporter.sidecar.httpstats import HttpCollector, HttpStats
from sglang_tuning_exporter.sidecar.jobs import ThreadJobs
from sglang_tuning_exporter.sidecar.serveconfig import (
    ServeConfig,
    ServeConfigError,
    add_serve_flags,
    build_config,
)
from sglang_tuning_exporter.sidecar.state import LiveState
from sglang_tuning_exporter.sidecar.web import WebApp, start_http
from sglang_tuning_exporter.sources.logreader import EventReader
from sglang_tuning_exporter.sources.serverinfo import urllib_get
from sglang_tuning_exporter.sources.startup_section import WithStartup, startup_lines
from sglang_tuning_exporter.sources.tail import follow

log = logging.getLogger("sglang_tuning_exporter.sidecar.serve")
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The serve flags (see docs/sidecar.md)."""
    add_serve_flags(parser)


# --- own logging -------------------------------------------------------------------------------
class LogfmtFormatter(logging.Formatter):
    """`ts=... level=info logger=... msg="..."` lines."""

    def format(self, record: logging.LogRecord) -> str:
        """One logfmt line."""
        msg = record.getMessage()
        if record.exc_info:
            msg += " " + self.formatException(record.exc_info).replace("\n", " | ")
        ts = iso_time(record.created, millis=True)
        quoted = msg.replace("\\", "\\\\").replace('"', '\\"')
        return f'ts={ts} level={record.levelname.lower()} logger={record.name} msg="{quoted}"'


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        """One JSON line."""
        doc = {"ts": iso_time(record.created, millis=True),
               "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def configure_logging(level: str, fmt: str) -> None:
    """Structured logs of our own on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger("sglang_tuning_exporter")
    root.handlers[:] = [handler]
    root.setLevel({"warn": "WARNING"}.get(level, level.upper()))
    root.propagate = False


# --- wiring to the parser and advisor layers ---------------------------------------------------
def build_advisor(cfg: ServeConfig) -> Advisor:
    """Bind the guide layer (checks table, --config, window, evaluate) for this sidecar.

    Precedence: the --config file's window/rank/profile/workload settings when it sets them, else
    the flags. The table and the config come from build_config, which loaded and checked them.
    """
    table, config = cfg.table, cfg.guide_config
    to_obs, to_samples, version_floor, log_now, implausible, example = _converters()
    defaults = Config()
    changes: dict[str, Any] = {}
    if config.window_s == defaults.window_s:
        changes["window_s"] = cfg.window_s
    if config.max_ranks == defaults.max_ranks:
        changes["max_ranks"] = cfg.ranks_max
    if config.expire_s is None:
        changes["expire_s"] = cfg.ranks_expire_after_s
    config = dataclasses.replace(config, **changes)
    profile, workload = settings.resolve(table, config, profile=cfg.guide_profile, workload=cfg.workload)
    window = window_for(table, profile, config)
    window_s = float(config.window_s)

    def evaluate(signals: Mapping[Rank, Mapping[str, float | None]], server: ServerState) -> list[Finding]:
        return list(evaluate_checks(table, signals, server, profile=profile, workload=workload, config=config))

    def document(findings: list[Finding], signals: Mapping[Rank, Mapping[str, float | None]],
                 server: ServerState, now: float) -> Mapping[str, Any]:
        return dict(findings_document(findings=findings, signals=signals, server=server, profile=profile,
                                                  workload=workload, window=(now - window_s, now), table=table,
                                      config=config))

    return Advisor(window=window, evaluate=evaluate, document=document, to_observations=to_obs,
                   window_s=window_s, to_samples=to_samples, version_floor=version_floor,
                   log_now=log_now, implausible_times=implausible, implausible_example=example)


def _converters() -> tuple[ToObservations, ToSamples, Callable[[], str | None], Callable[[float], float],
                         Callable[[], int], Callable[[], str | None]]:
    """Events -> observations, the same with a Sample per Decode/Prefill line (the sidecar's path; the
    other is the per-observation reference the intake tests compare it with), one converter, and the
    release floor its line formats revealed (`>=X.Y.Z`, or a version line's release, or None), and the
    current log time (lines are timed by their own stamps; the wall clock only ages them)."""
    clock_now = [0.0]
    # One converter for the life of the process: it pairs startup lines across ticks, and keeps the
    # floor on a server state of its own (the sidecar's own state learns releases from elsewhere too).
    seen = ServerState()
    converter = EventConverter(clock=lambda: clock_now[0], server=seen)

    def to_obs(events: list[Event], now: float) -> list[Observation]:
        clock_now[0] = now
        return list(converter.convert_all(events))

    def to_samples(events: list[Event], now: float) -> list[Observation | Sample]:
        clock_now[0] = now
        return list(converter.convert_batch(events))

    return (to_obs, to_samples, lambda: seen.version, converter.log_now, lambda: converter.implausible_times,
            lambda: converter.log_clock.example)


def build_log_input(cfg: ServeConfig) -> LogInput | None:
    """Follower + event reader for --sglang.log-file."""
    if cfg.log_file is None:
        return None
    # `-`: standard input (e.g. `kubectl logs -f POD | ... --sglang.log-file -`); the log source goes
    # down when the writer closes it.
    path = str(cfg.log_file)
    follower: Any = follow(path, from_start=cfg.from_start)
    if not cfg.from_start and path != "-" and os.path.isfile(path):
        # Following from the end: the running server's startup facts come from its last startup
        # section (docs/signals.md, "Sticky facts"); its traffic is judged from now on.
        follower = WithStartup(follower, startup_lines(path))
    src = log_input_for(follower, EventReader())
    src.replay = cfg.from_start and path != "-"
    return src


def log_input_for(follower: Any, reader: Any) -> LogInput:
    """Adapt a tail.Follower-like and a logreader.EventReader-like object to the sidecar."""
    def unparsed() -> int:
        stats = getattr(reader, "stats", None)
        value = getattr(stats, "unparsed", 0) if stats is not None else 0
        return int(value) if isinstance(value, (int, float)) else 0

    def oversized() -> int:
        value = getattr(follower, "truncated_lines", 0)
        return int(value) if isinstance(value, (int, float)) else 0

    return LogInput(follower=follower, reader=reader, exists=lambda: bool(getattr(follower, "exists", True)),
                    unparsed=unparsed, oversized=oversized)


def build_sidecar(cfg: ServeConfig, *, timer: Callable[[], float] = time.perf_counter, http_get: Any = urllib_get,
                  advisor: Advisor | None = None, log_input: LogInput | None = None) -> Sidecar:
    """The sidecar for `cfg` (tests pass fakes for timer, HTTP, advisor and log input; time comes via tick)."""
    adv = advisor if advisor is not None else build_advisor(cfg)
    state = LiveState(window_s=adv.window_s or cfg.window_s, max_ranks=cfg.ranks_max,
                      expire_after_s=cfg.ranks_expire_after_s,
                      enabled={"log": cfg.log_file is not None, "metrics": cfg.sglang_url is not None,
                               "server_info": cfg.sglang_url is not None})
    metrics = None
    if cfg.sglang_url is not None:
        info_get = None
        if http_get is urllib_get:
            # Server info is read no further than its own cap (a document, far smaller than /metrics).
            info_get = functools.partial(urllib_get, api_key=cfg.sglang_api_key,
                                         max_bytes=limits.MAX_SERVER_INFO_BYTES)
            if cfg.sglang_api_key:
                http_get = functools.partial(urllib_get, api_key=cfg.sglang_api_key)
        metrics = MetricsInput(cfg.sglang_url, cfg.scrape_timeout_s, cfg.scrape_interval_s, http_get,
                               server_info_interval=max(60.0, 10 * cfg.scrape_interval_s), info_get=info_get)
    return Sidecar(state=state, advisor=adv,
                   log_input=log_input if log_input is not None else build_log_input(cfg),
                   metrics=metrics, timer=timer, server_overrides=dict(cfg.server_args),
                   evaluate_every_s=cfg.evaluation_interval_s,
                   changes=ChangeTracker(cfg.table, adv.window_s or cfg.window_s))


class Loop:
    """Runs `sidecar.tick(clock(), mono())` every `period` seconds in a background thread, and at once
    when a source's job ends (`wake`). `mono` schedules: a wall clock stepped back stops nothing."""

    def __init__(self, sidecar: Sidecar, clock: Callable[[], float], period: float,
                 mono: Callable[[], float] = time.monotonic) -> None:
        self.sidecar = sidecar
        self.clock = clock
        self.mono = mono
        self.period = period
        self.stop_event = threading.Event()
        self.wake = threading.Event()
        self.thread = threading.Thread(target=self._run, name="sidecar-loop", daemon=True)

    def _run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.sidecar.tick(self.clock(), self.mono())
            except Exception:  # keep serving whatever we have
                log.exception("sidecar tick failed")
            self.wake.wait(self.period)
            self.wake.clear()

    def start(self) -> None:
        """Start the background thread."""
        self.thread.start()

    def stop(self) -> None:
        """Ask the thread to stop and wait for it."""
        self.stop_event.set()
        self.wake.set()
        self.thread.join(timeout=10)


def make_web(cfg: ServeConfig, sidecar: Sidecar, clock: Callable[[], float],
             build: BuildInfo | None = None, *, process_metrics: bool = True) -> WebApp:
    """The HTTP application over the sidecar's state (`process_metrics=False`: no machine-dependent
    `process_*`/`python_info` families, for golden files)."""
    b = build or current_build()

    def snapshot() -> Any:
        return sidecar.state.snapshot(clock())

    collector = TuningCollector(snapshot, b)
    sidecar.on_evaluated = collector.warm  # render verdicts in the loop thread, not in the scrape
    tracker = sidecar.changes
    changes = (ChangeCollector(tracker),) if tracker is not None else ()
    http_stats = HttpStats()  # the server's own counts (serve_http hands it to the server)
    registry = make_registry(collector, *changes, HttpCollector(http_stats), process=process_metrics)
    app = WebApp(snapshot=snapshot, registry=registry, ready=lambda: sidecar.ready, build=b,
                 telemetry_path=cfg.telemetry_path, changes=tracker.changes if tracker is not None else None)
    app.http_stats = http_stats
    return app


def serve_http(cfg: ServeConfig, app: WebApp) -> tuple[BoundedHTTPServer, threading.Thread]:
    """Listen on `cfg`'s address with its web config and bounds (--web.*); raises OSError."""
    return start_http(app, cfg.listen_host, cfg.listen_port, cfg.web_config,
                      max_connections=cfg.web_max_connections, idle_timeout_s=cfg.web_idle_timeout_s,
                      header_timeout_s=cfg.web_header_timeout_s, write_timeout_s=cfg.web_write_timeout_s,
                      stats=app.http_stats)


def run(args: argparse.Namespace) -> int:
    """Entry point of `serve`."""
    try:
        cfg = build_config(args)
    except ServeConfigError as exc:
        for p in exc.problems:
            print(f"serve: {p}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(cfg.log_level, cfg.log_format)
    sidecar = build_sidecar(cfg)
    app = make_web(cfg, sidecar, time.time)
    period = min(1.0, cfg.scrape_interval_s)
    loop = Loop(sidecar, time.time, period)
    # SGLang's requests and their parsing run in threads of their own: a slow source never holds the
    # loop (the log keeps being read); the loop applies each outcome as soon as it is woken.
    sidecar.jobs = ThreadJobs(notify=loop.wake.set)
    try:
        server, _ = serve_http(cfg, app)
    except OSError as exc:
        print(f"serve: cannot listen on {cfg.listen_host}:{cfg.listen_port}: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    loop.start()
    host, port = server.server_address[:2]
    web = cfg.web_config
    log.info("listening on %s:%s (metrics %s, %s%s); log=%s sglang=%s", host or "*", port, cfg.telemetry_path,
             "https" if web is not None and web.tls else "http",
             ", basic auth" if web is not None and web.users else "", cfg.log_file or "-", redact_text(cfg.sglang_url or "-"))
    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    done.wait()
    log.info("shutting down")
    loop.stop()
    server.shutdown()
    server.server_close()
    if sidecar.log_input is not None:
        close = getattr(sidecar.log_input.follower, "close", None)
        if callable(close):
            close()  # e.g. gives standard input its blocking mode back
    return EXIT_OK
