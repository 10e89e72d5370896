"""The Python evaluators of the conformance suite: the sidecar live (lines arriving in real time with an
injected clock), the sidecar replaying `--from-start`, the sidecar started mid-log, and `diagnose`.
Each returns what a person or Prometheus would read at the log's end: statuses and signals per rank,
and (live) the history of our /metrics expositions for the PromQL evaluators."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sglang_tuning_exporter.core.model import STATUS_CODE, Rank
from sglang_tuning_exporter.core.timeparse import EARLIEST_PLAUSIBLE
from sglang_tuning_exporter.guide.checks import load_table
from sglang_tuning_exporter.guide.config import Config
from sglang_tuning_exporter.offline.diagnose import diagnose_source
from sglang_tuning_exporter.sidecar.collector import BuildInfo
from sglang_tuning_exporter.sidecar.engine import Sidecar
from sglang_tuning_exporter.sidecar.serve import build_sidecar, log_input_for, make_web
from sglang_tuning_exporter.sidecar.serveconfig import add_serve_flags, build_config
from sglang_tuning_exporter.sources.logreader import EventReader
from sglang_tuning_exporter.sources.serverinfo import HttpError

from .scenarios import START, Scenario, stamp_of

TABLE = load_table()
SKEW_S = 3 * 3600.0  # the sidecar's wall clock runs 3 h ahead of the log's stamps (another timezone)
TICK_S = 5.0
SCRAPE_S = 15.0
BUILD = BuildInfo("0.0.0-conformance", "3.x")


@dataclass
class Reading:
    """What an evaluator reads at the end."""

    statuses: dict[Rank, dict[str, str]]
    signals: dict[Rank, Mapping[str, float | None]]
    expositions: list[tuple[float, str]] = field(default_factory=list)  # (log time, our /metrics)
    evidence: dict[Rank, dict[str, str]] = field(default_factory=dict)  # rank -> check -> finding's evidence

    def worst_status(self, check: str) -> str | None:
        found = [s[check] for s in self.statuses.values() if check in s]
        return max(found, key=lambda x: STATUS_CODE[x]) if found else None

    def worst_signal(self, name: str) -> float | None:
        vals = [v for s in self.signals.values() if (v := s.get(name)) is not None]
        if not vals:
            return None
        return min(vals) if name == "available_gpu_mem_gb" else max(vals)


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_serve_flags(p)
    return p.parse_args(list(argv))


def _from_sidecar(sc: Sidecar, expositions: list[tuple[float, str]] | None = None) -> Reading:
    st: dict[Rank, dict[str, str]] = {}
    evidence: dict[Rank, dict[str, str]] = {}
    for f in sc.state._findings:
        st.setdefault(Rank.from_dict(f.rank), {})[f.check] = f.status
        evidence.setdefault(Rank.from_dict(f.rank), {})[f.check] = f.evidence
    return Reading(st, dict(sc.state._signals), expositions or [], evidence)


def write_log(sc: Scenario, tmp: Path) -> Path:
    path = tmp / f"{sc.name}.log"
    path.write_text("\n".join(sc.lines) + ("\n" if sc.lines else ""), encoding="utf-8")
    return path


def diagnose(sc: Scenario, tmp: Path) -> Reading:
    res = diagnose_source(str(write_log(sc, tmp)), TABLE, Config(), TABLE.default_profile(), "throughput", {},
                          jobs=1)
    assert res.error is None, res.error
    evidence: dict[Rank, dict[str, str]] = {}
    for f in res.findings:
        evidence.setdefault(Rank.from_dict(f.rank), {})[f.check] = f.evidence
    return Reading(res.final_statuses, dict(res.final_signals), evidence=evidence)


def replay(sc: Scenario, tmp: Path) -> Reading:
    """`serve --sglang.log-file F --from-start`: the whole history arrives at once."""
    cfg = build_config(_args("--sglang.log-file", str(write_log(sc, tmp)), "--from-start"))
    side = build_sidecar(cfg, timer=lambda: 0.0)
    wall = 2_000_000_000.0
    for i in range(200):  # until the follower has handed out the whole file
        side.tick(wall + i * 1e-3)
    side.tick(wall + 1.0)
    side.tick(wall + 6.0)  # one evaluation after everything was read
    return _from_sidecar(side)


def arrivals(lines: list[str]) -> list[tuple[float, str]]:
    """When each line reaches the log (real time, from START): its stamp's distance from the previous
    plausible stamp; a stamp set back or implausible costs no time."""
    out: list[tuple[float, str]] = []
    at, prev = START, None
    for line in lines:
        t = stamp_of(line, -1.0)
        if t >= EARLIEST_PLAUSIBLE:
            if prev is not None and t > prev:
                at += t - prev
            prev = t
        out.append((at, line))
    return out


class _Feeder:
    """A follower handing out the lines whose stamp is due by the injected wall clock."""

    def __init__(self, lines: list[str], now: Callable[[], float]) -> None:
        self.due = arrivals(lines)
        self.now = now
        self.i = 0
        self.rotations = self.truncations = 0
        self.exists = True

    def poll(self) -> list[str]:
        out: list[str] = []
        limit = self.now() - SKEW_S
        while self.i < len(self.due) and self.due[self.i][0] <= limit:
            out.append(self.due[self.i][1])
            self.i += 1
        return out


def _metrics_get(sc: Scenario, now: Callable[[], float]) -> Callable[[str, float], bytes]:
    def get(url: str, timeout: float) -> bytes:
        if url.endswith("/metrics"):
            t = now() - SKEW_S - START
            due = [text for at, text in sc.metrics if at <= t]
            if not due:
                raise HttpError("connection refused")
            return due[-1].encode()
        raise HttpError("HTTP 404", 404)
    return get


def _append(path: Path, lines: list[str]) -> None:
    if lines:
        with path.open("a", encoding="utf-8", newline="") as fh:
            fh.write("".join(f"{line}\n" for line in lines))


def live(sc: Scenario, tmp: Path, *, lines: list[str] | None = None, from_end_of: Path | None = None) -> Reading:
    """Lines arrive when their stamp is due on a wall clock SKEW_S ahead; ticks every TICK_S; our
    /metrics is rendered every SCRAPE_S (the history a Prometheus would have scraped)."""
    wall = [START + SKEW_S]
    argv = ["--sglang.scrape-interval", "15s"]
    if sc.metrics:
        argv += ["--sglang.url", "http://127.0.0.1:30000"]
    log_input = None
    feed_lines = sc.lines if lines is None else lines
    follower = _Feeder(feed_lines, lambda: wall[0])
    if feed_lines and from_end_of is None:
        argv += ["--sglang.log-file", str(tmp / f"{sc.name}.live.log")]
        log_input = log_input_for(follower, EventReader())
    elif from_end_of is not None:
        # The file the server writes, appended to as its lines fall due; the sidecar's log input is the
        # one `serve` wires (serve.build_log_input: followed from the end, its last startup section first).
        argv += ["--sglang.log-file", str(from_end_of)]
    cfg = build_config(_args(*argv))
    side = build_sidecar(cfg, timer=lambda: 0.0, http_get=_metrics_get(sc, lambda: wall[0]), log_input=log_input)
    web = make_web(build_config(_args("--sglang.url", "http://x:1")), side, clock=lambda: wall[0], build=BUILD,
                   process_metrics=False)
    due = arrivals(feed_lines)
    last = max([at for at, _ in due] + [START + t for t, _ in sc.metrics] + [START])
    expositions: list[tuple[float, str]] = []
    next_scrape = wall[0]
    while wall[0] <= last + SKEW_S + TICK_S:
        if from_end_of is not None and wall[0] > START + SKEW_S:
            _append(from_end_of, follower.poll())
        side.tick(wall[0])
        if from_end_of is not None and wall[0] == START + SKEW_S:
            # Written just after the sidecar's first poll (which opened the file at its end).
            _append(from_end_of, follower.poll())
        if wall[0] >= next_scrape:
            expositions.append((wall[0] - SKEW_S, web.handle("GET", "/metrics").body.decode()))
            next_scrape += SCRAPE_S
        wall[0] += TICK_S
    side.tick(wall[0] + TICK_S)  # evaluate at the end
    return _from_sidecar(side, expositions)


def sidecar_restarted(sc: Scenario, tmp: Path) -> Reading:
    """A sidecar started (without --from-start) when the log already holds lines [0, split): the log
    input is serve's own (build_sidecar -> build_log_input), the rest of the lines appended to the file."""
    assert sc.sidecar_starts_at is not None
    before = tmp / f"{sc.name}.before.log"
    before.write_text("\n".join(sc.lines[: sc.sidecar_starts_at]) + "\n", encoding="utf-8")
    return live(sc, tmp, lines=sc.lines[sc.sidecar_starts_at:], from_end_of=before)


def replayed_then_scraped(sc: Scenario, tmp: Path, *, at: float, scrapes: int) -> Reading:
    """`serve --from-start` replays the whole log at wall time `at` (between two scrapes), then Prometheus
    scrapes it every SCRAPE_S, `scrapes` times: every counter grew before the first scrape, which a raw
    `rate()` over the range counts as nothing while the sidecar's windowed signals carry the replay."""
    cfg = build_config(_args("--sglang.log-file", str(write_log(sc, tmp)), "--from-start"))
    wall = [at]
    side = build_sidecar(cfg, timer=lambda: 0.0)
    web = make_web(build_config(_args("--sglang.url", "http://x:1")), side, clock=lambda: wall[0], build=BUILD,
                   process_metrics=False)
    for i in range(200):  # until the follower has handed out the whole file
        side.tick(at + i * 1e-3)
    expositions: list[tuple[float, str]] = []
    for k in range(scrapes):
        wall[0] = at + 1.0 + k * SCRAPE_S
        side.tick(wall[0])
        expositions.append((wall[0], web.handle("GET", "/metrics").body.decode()))
    return _from_sidecar(side, expositions)
