"""Tests for the serve command: flag validation, the tick engine with fakes, the loop and logging."""

from __future__ import annotations

import argparse
import json
import logging
import re
import resource
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from helpers.netutil import oversized_body_server
from helpers.paths import FIXTURES
from sglang_tuning_exporter import cli
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.core.flags import duration_flag as parse_duration
from sglang_tuning_exporter.core.model import Finding, Observation, Rank, ServerState
from sglang_tuning_exporter.sidecar.engine import Advisor, LogInput
from sglang_tuning_exporter.sidecar.serve import (
    JsonFormatter,
    LogfmtFormatter,
    Loop,
    build_sidecar,
    make_web,
    serve_http,
)
from sglang_tuning_exporter.sidecar.serveconfig import (
    ServeConfigError,
    add_serve_flags,
    build_config,
    parse_listen_address,
)
from sglang_tuning_exporter.sources.serverinfo import HttpError

FIX = FIXTURES


@pytest.fixture(autouse=True)
def _restore_exporter_logger() -> Iterator[None]:
    """`serve` configures its own logging; undo it so other tests' log capture is unaffected."""
    logger = logging.getLogger("sglang_tuning_exporter")
    saved = (list(logger.handlers), logger.propagate, logger.level)
    yield
    logger.handlers[:], logger.propagate, logger.level = saved[0], saved[1], saved[2]


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_serve_flags(p)
    return p.parse_args(list(argv))


class FakeFollower:
    """Hands out queued lines on poll, like tail.Follower."""

    def __init__(self) -> None:
        self.pending: list[str] = []
        self.rotations = 0
        self.truncations = 0

    def poll(self) -> list[str]:
        out, self.pending = self.pending, []
        return out


class FakeReader:
    """`decode <bs> <graph>` and `retract <n>` lines become events; anything else is not an event."""

    def feed(self, line: str) -> list[Event]:
        parts = line.split()
        if parts and parts[0] == "decode":
            return [Event(1, "decode", rank={"tp": 0},
                          fields={"num_running_reqs": int(parts[1]), "cuda_graph": parts[2] == "True",
                                  "num_queue_reqs": 0})]
        if parts and parts[0] == "retract":
            return [Event(1, "retract", rank={"tp": 0}, fields={"num_retracted_reqs": int(parts[1])})]
        if parts and parts[0] == "args":
            return [Event(1, "server_args", fields={"served_model_name": "m", "schedule_conservativeness": 1.0})]
        return []


class FakeWindow:
    """Counts what it is given; one signal: the number of observations."""

    def __init__(self) -> None:
        self.obs: list[Observation] = []

    def add(self, obs: Observation) -> None:
        self.obs.append(obs)

    def prune(self, now: float) -> None:
        self.obs = [o for o in self.obs if now - o.time <= 60]

    def signals(self, now: float) -> Mapping[Rank, Mapping[str, float | None]]:
        return {Rank(): {"observations": float(len(self.obs)), "unknown": None}}

    def set_server_facts(self, by_dp: Sequence[Mapping[str, float]]) -> None:
        self.server_facts = list(by_dp)


def _fake_advisor(window: FakeWindow, ticked: threading.Event | None = None) -> Advisor:
    def evaluate(signals: Mapping[Rank, Mapping[str, float | None]], server: ServerState) -> list[Finding]:
        if ticked is not None:
            ticked.set()
        n = signals[Rank()]["observations"] or 0
        return [Finding("queue_empty", "warning" if n else "unknown", {}, None, "client", None, None,
                        "queue empty", f"{n} observations")]

    def to_obs(events: list[Event], now: float) -> list[Observation]:
        # The fake lines carry no stamp: the converter times them by arrival (docs/signals.md, "Clocks").
        return [Observation(now, "num_queue_reqs", 0.0, Rank.from_dict(e.rank), "log")
                for e in events if e.kind == "decode"]

    return Advisor(window=window, evaluate=evaluate, document=None, to_observations=to_obs)


def _log_sidecar(tmp_path: Path, window: FakeWindow, follower: FakeFollower):  # type: ignore[no-untyped-def]
    cfg = build_config(_args("--sglang.log-file", str(tmp_path / "x.log"), "--window", "60s"))
    log_input = LogInput(follower=follower, reader=FakeReader(), exists=lambda: True)
    return build_sidecar(cfg, timer=lambda: 0.0, advisor=_fake_advisor(window),
                         log_input=log_input)


def test_durations_and_listen_addresses() -> None:
    """Prometheus-style durations and [host]:port addresses."""
    assert [parse_duration(d) for d in ("30s", "10m", "1h", "500ms", "2")] == [30, 600, 3600, 0.5, 2]
    assert parse_listen_address(":9470") == ("", 9470)
    assert parse_listen_address("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen_address("[::1]:9470") == ("::1", 9470)
    with pytest.raises(ValueError):
        parse_duration("soon")
    with pytest.raises(ValueError):
        parse_listen_address("9470x")


def test_defaults() -> None:
    """Default port 9470, /metrics, 10 min window and rank expiry."""
    cfg = build_config(_args("--sglang.url", "http://127.0.0.1:30000"))
    assert (cfg.listen_port, cfg.telemetry_path, cfg.window_s, cfg.ranks_expire_after_s) == (9470, "/metrics", 600, 600)
    assert cfg.log_file is None and cfg.sglang_url == "http://127.0.0.1:30000"


def test_server_args_are_typed_as_diagnose_types_them() -> None:
    """`--server-arg` goes through config.parse_server_arg_overrides: the same typed values as
    diagnose and report (a bool is a bool), and a malformed one is listed with the other problems."""
    cfg = build_config(_args("--sglang.url", "http://127.0.0.1:30000", "--server-arg", "disable_cuda_graph=True",
                             "--server-arg=--mem-fraction-static=0.85", "--server-arg", "x="))
    assert dict(cfg.server_args) == {"disable_cuda_graph": True, "mem_fraction_static": 0.85, "x": None}
    with pytest.raises(ServeConfigError) as err:
        build_config(_args("--sglang.url", "http://127.0.0.1:30000", "--server-arg", "novalue"))
    assert err.value.problems == ["--server-arg 'novalue': expected KEY=VALUE"]


def test_guide_profile_is_checked_with_the_flags() -> None:
    """An unknown --guide-profile is listed with the other flag problems (the table is loaded once, there)."""
    with pytest.raises(ServeConfigError) as err:
        build_config(_args("--sglang.url", "ftp://x", "--guide-profile", "nope"))
    assert any(p.startswith("--guide-profile: unknown profile 'nope'") for p in err.value.problems)
    assert any(p.startswith("--sglang.url") for p in err.value.problems)
    cfg = build_config(_args("--sglang.url", "http://127.0.0.1:30000"))
    assert cfg.table is not None and cfg.guide_config is not None


def test_every_problem_is_listed() -> None:
    """Bad flags: one error listing each problem."""
    with pytest.raises(ServeConfigError) as err:
        build_config(_args("--sglang.url", "ftp://x", "--ranks.max", "0", "--window", "soon",
                           "--web.listen-address", "nope", "--web.telemetry-path", "/", "--config", "/no/such.yaml"))
    text = "\n".join(err.value.problems)
    for flag in ("--sglang.url", "--ranks.max", "--window", "--web.listen-address", "--web.telemetry-path", "--config"):
        assert flag in text
    assert len(err.value.problems) == 6


def test_cli_exits_2_with_problems_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    """`serve` with no source and a bad interval exits 2 and says why, without a traceback."""
    assert cli.main(["serve", "--sglang.scrape-interval", "0s"]) == 2
    err = capsys.readouterr().err
    assert "nothing to watch" in err and "--sglang.scrape-interval" in err and "Traceback" not in err


def test_env_mirror(monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLANG_TUNING_SGLANG_URL provides --sglang.url."""
    monkeypatch.setenv("SGLANG_TUNING_SGLANG_URL", "http://10.0.0.1:30000")
    monkeypatch.setenv("SGLANG_TUNING_RANKS_MAX", "7")
    cfg = build_config(_args())
    assert cfg.sglang_url == "http://10.0.0.1:30000" and cfg.ranks_max == 7


def test_tick_reads_log_counts_and_evaluates(tmp_path: Path) -> None:
    """One tick: lines counted by kind, events into state, observations into the window, evaluation."""
    window, follower = FakeWindow(), FakeFollower()
    sc = _log_sidecar(tmp_path, window, follower)
    assert not sc.ready
    follower.pending = ["args", "decode 300 False", "decode 8 True", "retract 2", "noise"]
    sc.tick(100.0)
    assert sc.ready
    snap = sc.state.snapshot(100.0)
    assert dict(snap.log_lines) == {"server_args": 1, "decode": 2, "retract": 1, "other": 1}
    assert snap.model_name == "m" and snap.args["schedule_conservativeness"] == 1.0
    r = snap.ranks[0]
    assert r.counters[("decode_samples", "false")] == 1 and r.counters[("retracted_requests", "")] == 2
    assert all(o.time == 100.0 for o in window.obs)  # arrival time, not the line's own
    assert snap.findings[0].status == "warning"
    assert dict(snap.signals[0][1]) == {"observations": 2.0}
    assert snap.sources["log"].up is True and snap.sources["metrics"].enabled is False


def test_counters_survive_quiet_ticks(tmp_path: Path) -> None:
    """Counters never go down across ticks with no new lines."""
    window, follower = FakeWindow(), FakeFollower()
    sc = _log_sidecar(tmp_path, window, follower)
    follower.pending = ["retract 3"]
    sc.tick(1.0)
    sc.tick(2.0)
    sc.tick(3.0)
    assert sc.state.snapshot(3.0).ranks[0].counters[("retracted_requests", "")] == 3


def test_server_restart_detected_from_server_info(tmp_path: Path) -> None:
    """A new version (or start time) in server info counts a restart; args are refreshed."""
    docs = [{"version": "0.5.22", "schedule_conservativeness": 1.0, "startup_time": {"t": 1}},
            {"version": "0.5.23", "schedule_conservativeness": 0.3, "startup_time": {"t": 2}}]

    def http(url: str, timeout: float) -> bytes:
        if url.endswith("/metrics"):
            return b'sglang:num_queue_reqs{tp_rank="0"} 5\n'
        return json.dumps(docs[0]).encode()

    cfg = build_config(_args("--sglang.url", "http://sglang:30000", "--sglang.scrape-interval", "1s"))
    sc = build_sidecar(cfg, timer=lambda: 0.0, http_get=http, advisor=_fake_advisor(FakeWindow()))
    sc.tick(0.0)
    assert sc.state.snapshot(0.0).version == "0.5.22"
    docs.pop(0)
    sc.tick(1000.0)  # past the periodic refresh
    snap = sc.state.snapshot(1000.0)
    assert (snap.version, snap.restarts, snap.args["schedule_conservativeness"]) == ("0.5.23", 1, 0.3)
    assert snap.server_info_endpoint == "/server_info"


def test_server_arg_overrides_win(tmp_path: Path) -> None:
    """--server-arg values override what the server reports (advice is computed from them)."""
    def http(url: str, timeout: float) -> bytes:
        if url.endswith("/metrics"):
            raise HttpError("down")
        return json.dumps({"version": "0.5.23", "mem_fraction_static": 0.8}).encode()

    cfg = build_config(_args("--sglang.url", "http://s:1", "--server-arg", "mem_fraction_static=0.9"))
    sc = build_sidecar(cfg, timer=lambda: 0.0, http_get=http, advisor=_fake_advisor(FakeWindow()))
    sc.tick(0.0)
    assert sc.state.server_state().args["mem_fraction_static"] == 0.9


def test_loop_thread_ticks_and_web_serves(tmp_path: Path) -> None:
    """The background loop calls tick; the web app sees the result; stop() joins the thread."""
    ticked = threading.Event()
    follower = FakeFollower()
    follower.pending = ["decode 4 True"]
    cfg = build_config(_args("--sglang.log-file", str(tmp_path / "x.log")))
    sc = build_sidecar(cfg, advisor=_fake_advisor(FakeWindow(), ticked),
                       log_input=LogInput(follower=follower, reader=FakeReader(), exists=lambda: True))
    loop = Loop(sc, clock=lambda: 50.0, period=0.01)
    loop.start()
    try:
        assert ticked.wait(timeout=10)
    finally:
        loop.stop()
    assert not loop.thread.is_alive()
    app = make_web(cfg, sc, clock=lambda: 50.0)
    assert app.handle("GET", "/-/ready").status == 200
    body = app.handle("GET", "/metrics").body.decode()
    assert re.search(r'^sglang_tuning_decode_samples_total\{[^}]*cuda_graph="true"[^}]*\} 1\.0$', body, re.M)


def test_own_log_formats() -> None:
    """logfmt and json formatters produce one parseable line each."""
    rec = logging.LogRecord("sglang_tuning_exporter.x", logging.WARNING, __file__, 1, 'say "hi"', None, None)
    line = LogfmtFormatter().format(rec)
    assert line.startswith("ts=") and 'level=warning' in line and 'msg="say \\"hi\\""' in line
    doc = json.loads(JsonFormatter().format(rec))
    assert doc["level"] == "warning" and doc["msg"] == 'say "hi"'


def test_bad_config_file_lists_every_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A --config file with several mistakes: exit 2, each mistake on stderr, no traceback."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("window_s: -5\nno_such_key: 1\nchecks:\n  not_a_check: {enabled: false}\n")
    code = cli.main(["serve", "--sglang.log-file", str(tmp_path / "x.log"), "--config", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "window_s" in err and "no_such_key" in err and "not_a_check" in err


def test_flag_and_config_file_problems_are_listed_together(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Bad flags and a bad --config file in one start: every problem of both is listed at once."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("window_s: -5\nno_such_key: 1\n")
    code = cli.main(["serve", "--sglang.log-file", str(tmp_path / "x.log"), "--config", str(bad),
                     "--ranks.max", "zero", "--sglang.url", "ftp://nowhere"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    for needle in ("--ranks.max", "--sglang.url", "window_s", "no_such_key"):
        assert needle in err, needle


def test_config_file_sets_the_window(tmp_path: Path) -> None:
    """A --config window_s wins over --window (how tests get short windows)."""
    good = tmp_path / "good.yaml"
    good.write_text("window_s: 30\n")
    cfg = build_config(_args("--sglang.log-file", str(tmp_path / "x.log"), "--config", str(good)))
    sc = build_sidecar(cfg, log_input=LogInput(follower=FakeFollower(), reader=FakeReader(), exists=lambda: True))
    assert sc.advisor.window_s == 30.0 and sc.state.window_s == 30.0
    # Every declared signal goes to /metrics (pipeline.signals.SIGNAL_NAMES): no second list picks them.
    assert sc.advisor.exported_signals is None


def test_log_read_error_is_reported_and_scrape_goes_on(tmp_path: Path) -> None:
    """A follower that raises: source_up{log} 0 with the reason; the SGLang scrape still runs."""
    class Broken(FakeFollower):
        def poll(self) -> list[str]:
            raise PermissionError("permission denied: sglang.log")

    def http(url: str, timeout: float) -> bytes:
        return b'sglang:num_queue_reqs{tp_rank="0"} 5\n' if url.endswith("/metrics") else b"{}"

    cfg = build_config(_args("--sglang.log-file", str(tmp_path / "x.log"), "--sglang.url", "http://s:1"))
    sc = build_sidecar(cfg, timer=lambda: 0.0, http_get=http, advisor=_fake_advisor(FakeWindow()),
                       log_input=LogInput(follower=Broken(), reader=FakeReader(), exists=lambda: True))
    sc.tick(0.0)
    snap = sc.state.snapshot(0.0)
    assert snap.sources["log"].up is False and "permission denied" in snap.sources["log"].detail
    assert snap.sources["metrics"].up is True and snap.ranks[0].gauges["num_queue_reqs"] == 5


def test_source_health_changes_are_logged_once(caplog: pytest.LogCaptureFixture,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang going down is logged once (not every tick), and its recovery once."""
    # serve.run() (run by other tests) stops propagation to the root logger caplog listens on.
    monkeypatch.setattr(logging.getLogger("sglang_tuning_exporter"), "propagate", True)
    answers = [HttpError("GET failed: refused")] * 3 + [b'sglang:num_queue_reqs{tp_rank="0"} 1\n']

    def http(url: str, timeout: float) -> bytes:
        if url.endswith("/metrics"):
            a = answers.pop(0) if len(answers) > 1 else answers[0]
            if isinstance(a, Exception):
                raise a
            return a
        raise HttpError("HTTP 404", 404)

    cfg = build_config(_args("--sglang.url", "http://s:1", "--sglang.scrape-interval", "1s"))
    sc = build_sidecar(cfg, timer=lambda: 0.0, http_get=http, advisor=_fake_advisor(FakeWindow()))
    with caplog.at_level(logging.INFO, logger="sglang_tuning_exporter"):
        for t in range(5):
            sc.tick(float(t))
    metrics_msgs = [r.getMessage() for r in caplog.records if "source metrics" in r.getMessage()]
    assert metrics_msgs == ["source metrics down: GET failed: refused", "source metrics recovered"]


def _metrics_only(dp_size: int) -> tuple[object, float]:
    """A sidecar without a log on a server exporting only running/queue gauges (no fact gauges, as
    before 0.5.6), whose server info carries one internal state per DP rank."""
    states = [{"memory_usage": {"startup_available": 6.5 - dp}, "decode_cuda_graph_bs": [1, 2, 4, 8 * (dp + 1)],
               "effective_max_running_requests_per_dp": 64 * (dp + 1)} for dp in range(dp_size)]
    doc = {"version": "0.5.23", "served_model_name": "m", "max_total_num_tokens": 421888, "dp_size": dp_size,
           "internal_states": states}
    tick = {"n": 0}

    def http(url: str, timeout: float) -> bytes:
        if url.endswith("/metrics"):
            tick["n"] += 1
            dp_label = (lambda dp: f'dp_rank="{dp}",') if dp_size > 1 else (lambda dp: "")
            return "".join(
                f'sglang:num_running_reqs{{{dp_label(dp)}pp_rank="0",tp_rank="{dp}"}} {60 + tick["n"] % 5}\n'
                f'sglang:num_queue_reqs{{{dp_label(dp)}pp_rank="0",tp_rank="{dp}"}} 10\n'
                f'sglang:token_usage{{{dp_label(dp)}pp_rank="0",tp_rank="{dp}"}} 0.5\n'
                for dp in range(dp_size)).encode()
        return json.dumps(doc).encode()

    cfg = build_config(_args("--sglang.url", "http://sglang:30000", "--sglang.scrape-interval", "1s",
                             "--evaluation-interval", "1s"))
    sc = build_sidecar(cfg, timer=lambda: 0.0, http_get=http)
    t = 0.0
    for t in range(30):
        sc.tick(float(t))
    return sc, float(t)


@pytest.mark.parametrize("dp_size", [1, 2])
def test_server_info_facts_reach_every_rank_without_a_log(dp_size: int) -> None:
    """Without a log, the server-info facts (startup headroom, captured graph ceiling, effective max
    running requests per DP rank, token capacity) are each scraped rank's facts: its signals and its
    fact gauges; no extra rank appears for them."""
    from sglang_tuning_exporter.sidecar.collector import BuildInfo, build_families

    sc, t = _metrics_only(dp_size)
    signals = sc.advisor.window.signals(t)  # type: ignore[attr-defined]
    ranks = sorted(signals)
    # No sizes in this server info: a dimension at 0 on every series (pp here; tp at TP=1) is not named
    # (docs/sidecar.md, "One server, one rank").
    assert ranks == [Rank(dp=dp if dp_size > 1 else None) for dp in range(dp_size)]
    for i, rank in enumerate(ranks):
        sig = signals[rank]
        assert sig["max_running_requests"] == 64 * (i + 1) and sig["cuda_graph_max_bs_captured"] == 8 * (i + 1)
        assert sig["available_gpu_mem_gb"] == 6.5 - i and sig["max_total_num_tokens"] == 421888
        assert sig["running_capped_ratio"] is not None and sig["cuda_graph_ceiling_ratio"] is not None
    snap = sc.state.snapshot(t)  # type: ignore[attr-defined]
    fams = {f.name: f for f in build_families(snap, BuildInfo("0.0.0-test", "3.11"))}
    for name in ("sglang_tuning_available_gpu_memory_bytes", "sglang_tuning_max_total_tokens",
                 "sglang_tuning_max_running_requests", "sglang_tuning_cuda_graph_max_batch_size"):
        assert name in fams, name
        assert len(fams[name].samples) == dp_size, name
    by_tp = {s.labels["tp_rank"]: s.value for s in fams["sglang_tuning_max_running_requests"].samples}
    assert by_tp == ({"": 64.0} if dp_size == 1 else {str(dp): 64.0 * (dp + 1) for dp in range(dp_size)})


def test_following_a_closed_standard_input_is_a_listed_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--sglang.log-file -` with standard input closed (`0<&-`) fails at start with the other problems."""
    import sys

    monkeypatch.setattr(sys, "stdin", None)
    with pytest.raises(ServeConfigError) as exc:
        build_config(_args("--sglang.log-file", "-", "--sglang.scrape-interval", "soon"))
    assert any("standard input is closed" in p for p in exc.value.problems) and len(exc.value.problems) == 2


@pytest.mark.integration
def test_serve_follows_standard_input() -> None:
    """`--sglang.log-file -` follows a pipe (e.g. `kubectl logs -f`): its lines are read as they come, and
    the log source is down once the writer closes it."""
    import subprocess
    import sys
    import time
    import urllib.request

    from helpers.netutil import announced_port, stop_process

    cmd = [sys.executable, "-m", "sglang_tuning_exporter", "serve", "--web.listen-address", "127.0.0.1:0",
           "--sglang.log-file", "-"]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stderr is not None

    def metrics(port: int) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            return str(r.read().decode())

    def wait_for(port: int, text: str) -> str:
        body = ""
        for _ in range(100):
            body = metrics(port)
            if text in body:
                return body
            time.sleep(0.1)
        raise AssertionError(f"{text!r} never in /metrics:\n{body[:2000]}")

    try:
        port = announced_port(proc.stderr)
        assert port, "serve did not report its port"
        proc.stdin.write("".join(f"[2026-11-22 10:00:0{i}] Decode batch, #running-req: 12, #token: 900, token usage: "
                                 f"0.40, cuda graph: True, gen throughput (token/s): 300.00, #queue-req: 0\n"
                                 for i in range(3)))
        proc.stdin.flush()
        wait_for(port, 'sglang_tuning_log_lines_total{kind="decode"} 3.0')
        assert 'sglang_tuning_source_up{source="log"} 1.0' in metrics(port)
        proc.stdin.close()
        wait_for(port, 'sglang_tuning_source_up{source="log"} 0.0')
    finally:
        stop_process(proc)
    assert proc.returncode == 0


def test_log_only_sidecar_names_flags_by_the_release_its_lines_reveal(tmp_path: Path) -> None:
    """Tailing a log from its end (no startup lines, no server info), the release floor the line formats
    reveal (`#new_tokens_gained`: >= 0.5.7) decides flag names and defaults live as in diagnose; the
    findings document keeps `version` a release or null; a version line wins over any floor."""
    from sglang_tuning_exporter.sidecar.serve import log_input_for
    from sglang_tuning_exporter.sources.logreader import EventReader

    follower = FakeFollower()
    cfg = build_config(_args("--sglang.log-file", str(tmp_path / "x.log"), "--evaluation-interval", "1s"))
    sc = build_sidecar(cfg, timer=lambda: 0.0, log_input=log_input_for(follower, EventReader()))
    decode = ("[2026-11-22 10:00:00] Decode batch, #running-req: 12, #token: 900, token usage: 0.40, "
              "cuda graph: True, gen throughput (token/s): 300.00, #queue-req: 0")
    follower.pending = [decode]
    sc.tick(1.0)
    assert sc.state.server_version() == ">=0.4.7"
    follower.pending = ["[2026-11-22 10:00:01] KV cache pool is full. Retract requests. #retracted_reqs: 1, "
                        "#new_tokens_gained: 4608, #new_token_ratio: 0.3811 -> 0.5127", decode]
    sc.tick(2.0)
    assert sc.state.server_version() == ">=0.5.7"
    from sglang_tuning_exporter.sidecar.collector import BuildInfo, build_families

    info = next(f for f in build_families(sc.state.snapshot(2.0), BuildInfo("0.0.0-test", "3.11"))
                if f.name == "sglang_tuning_server")  # an info family: `_info` is the sample suffix
    assert [(x.labels["version"], x.labels["schedule_policy"]) for x in info.samples] == [(">=0.5.7", "fcfs")]
    sc.tick(10.0)  # an evaluation
    build = sc.state.snapshot(10.0).document
    assert build is not None
    doc = build()
    assert doc["server"]["version"] is None and doc["server"]["version_floor"] == "0.5.7"
    follower.pending = ["[2026-11-22 10:00:02] sglang version: 0.5.9", decode]
    sc.tick(11.0)
    assert sc.state.server_version() == "0.5.9"
    follower.pending = [decode]
    sc.tick(12.0)
    assert sc.state.server_version() == "0.5.9"


def test_server_info_is_read_no_further_than_its_own_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real getter reads server info up to MAX_SERVER_INFO_BYTES (+1 byte that says "too large"),
    not up to the far larger /metrics cap: an oversized document costs 4 MiB of reading, not 16."""
    from sglang_tuning_exporter.core import limits

    body = b"{" + b" " * (limits.MAX_SERVER_INFO_BYTES + (1 << 20)) + b"}"
    with oversized_body_server(body, monkeypatch) as (url, read):
        res = build_sidecar(build_config(_args("--sglang.url", url)))._info.fetch()
    assert res.info is None and res.reason == "too_large", res
    assert limits.MAX_SERVER_INFO_BYTES < read[0] <= limits.MAX_SERVER_INFO_BYTES + 1 < len(body)


@pytest.mark.parametrize("name, text, needles", [
    ("deep", "checks: " + "[" * 100_000 + "]" * 100_000 + "\n", ("nested deeper than",)),
    ("nonfinite", "window_s: .inf\nexpire_s: .nan\nmax_ranks: -3\nsignals: {usage_good: .nan}\n",
     ("window_s", "expire_s", "max_ranks", "signals.usage_good")),
], ids=["deep", "nonfinite"])
def test_hostile_config_file_exits_2_with_every_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        name: str, text: str, needles: tuple[str, ...]) -> None:
    """100k-deep nesting and .inf/.nan/negative settings: exit 2 at start, each problem on its own line of
    stderr (no traceback, no crash later in the loop)."""
    bad = tmp_path / f"{name}.yaml"
    bad.write_text(text)
    code = cli.main(["serve", "--sglang.log-file", str(tmp_path / "x.log"), "--config", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "RecursionError" not in err, err[-2000:]
    lines = err.strip().splitlines()
    assert len(lines) == len(needles), lines
    for needle in needles:
        assert sum(needle in line for line in lines) == 1, (needle, lines)


def test_deep_web_config_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--web.config.file nested 100k deep: one clear line, exit 2."""
    bad = tmp_path / "web.yml"
    bad.write_text("basic_auth_users: " + "{a: " * 100_000 + "1" + "}" * 100_000 + "\n")
    code = cli.main(["serve", "--sglang.log-file", str(tmp_path / "x.log"), "--web.config.file", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert len(err.strip().splitlines()) == 1 and "nested deeper than" in err


def test_a_gzip_or_device_log_file_is_refused_at_start(tmp_path: Path) -> None:
    """A compressed log (it used to be followed as text) and a device (read for ever) are listed problems."""
    import gzip

    gz = tmp_path / "server.log.gz"
    gz.write_bytes(gzip.compress(b"[2026-01-01 10:00:00] hello\n"))
    for path, why in ((str(gz), "gzip-compressed"), ("/dev/zero", "a device, not a log file"), (str(tmp_path), "is a directory")):
        with pytest.raises(ServeConfigError) as exc:
            build_config(_args("--sglang.log-file", path))
        assert [p for p in exc.value.problems if why in p], exc.value.problems


def test_web_bounds_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """--web.max-connections and the three timeouts (and their env mirrors) reach the HTTP server."""
    monkeypatch.setenv("SGLANG_TUNING_WEB_IDLE_TIMEOUT", "3s")
    cfg = build_config(_args("--sglang.url", "http://127.0.0.1:30000", "--web.max-connections", "100",
                             "--web.header-timeout", "2s", "--web.write-timeout", "1m",
                             "--web.listen-address", "127.0.0.1:0"))
    assert (cfg.web_max_connections, cfg.web_idle_timeout_s, cfg.web_header_timeout_s,
            cfg.web_write_timeout_s) == (100, 3.0, 2.0, 60.0)
    app = make_web(cfg, build_sidecar(cfg), lambda: 0.0, process_metrics=False)
    server, thread = serve_http(cfg, app)
    try:
        assert (server.max_connections, server.idle_timeout_s, server.header_timeout_s,
                server.write_timeout_s) == (100, 3.0, 2.0, 60.0)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_web_bounds_flags_problems() -> None:
    """Bad bounds are listed with the other problems; more connections than file descriptors too."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    too_many = "1000000000" if soft == resource.RLIM_INFINITY else str(soft)
    for argv, needle in ((("--web.max-connections", "0"), "at least 1"),
                         (("--web.max-connections", "lots"), "not an integer"),
                         (("--web.idle-timeout", "never"), "--web.idle-timeout"),
                         (("--web.header-timeout", "0s"), "--web.header-timeout"),
                         (("--web.max-connections", too_many), "file descriptors")):
        if needle == "file descriptors" and soft == resource.RLIM_INFINITY:
            continue  # no limit to exceed
        with pytest.raises(ServeConfigError) as err:
            build_config(_args("--sglang.url", "http://127.0.0.1:30000", *argv))
        assert len(err.value.problems) == 1 and needle in err.value.problems[0], err.value.problems
