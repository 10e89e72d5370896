"""The per-file pipeline of `diagnose`: chunk results merged in log order into the signals window,
the guide evaluated window by window (each check keeps its worst window) and at the log's end
(what the sidecar would show), on a grid that ends at the log's last stamp."""

from __future__ import annotations

import gzip
import math
import os
from dataclasses import dataclass, field
from typing import Any

from sglang_tuning_exporter.core.durations import time_text
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.core.model import STATUS_CODE, Finding, Rank, ServerState
from sglang_tuning_exporter.core.timeparse import (
    BACKWARD_TOLERANCE_S,
    has_date,
    plausible_seconds,
)
from sglang_tuning_exporter.guide.advisor import (
    aggregate_signals,
    evaluate,
    findings_document,
    statuses,
    window_for,
)
from sglang_tuning_exporter.guide.checks import CheckTable
from sglang_tuning_exporter.guide.config import Config
from sglang_tuning_exporter.guide.plan import FIRING, flag_values
from sglang_tuning_exporter.offline.scanner import ChunkResult
from sglang_tuning_exporter.pipeline.observations import EventConverter
from sglang_tuning_exporter.pipeline.window import Window, bucket_start
from sglang_tuning_exporter.sources.logparse import parse_line

BUCKETS_PER_WINDOW = 1  # windows are evaluated back to back, so one bucket per window suffices
LIVE_BUCKETS = 60  # the sidecar's buckets per window (signals.Window's default resolution)
MAX_SERIES_POINTS = 1500  # chart points kept per series (halved when exceeded)
TAIL_BLOCK_BYTES = 1 << 20  # read back from a log's end to find its last stamp


# --- the per-file pipeline ----------------------------------------------------------------------
# The series a diagnosis keeps over time, each drawn as one chart of the HTML page (key, title).
CHARTS = (("queue_p50", "#queue-req (p50 per window)"), ("token_usage_mean", "token usage (mean)"),
          ("retractions_per_minute", "retractions per minute"), ("decode_batch_p90", "decode batch size (p90)"))


@dataclass
class Series:
    """A chart series: (time, value) points, decimated to stay small."""

    name: str
    points: list[tuple[float, float]] = field(default_factory=list)

    def add(self, t: float, v: float | None) -> None:
        """Append a point (None is skipped)."""
        if v is None or not math.isfinite(v):
            return
        self.points.append((t, v))
        if len(self.points) > MAX_SERIES_POINTS:
            self.points = self.points[::2]


@dataclass
class FileDiagnosis:
    """The outcome for one input."""

    source: str
    document: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None
    lines: int = 0
    events: int = 0
    fast_lines: int = 0
    unparsed: int = 0
    synthetic_time: bool = False
    evaluations: int = 0
    series: dict[str, Series] = field(default_factory=dict)
    elapsed_s: float = 0.0
    # Per rank, each check's status in the log's last window (findings hold each check's worst window).
    final_statuses: dict[Rank, dict[str, str]] = field(default_factory=dict)
    final_signals: dict[Rank, dict[str, float | None]] = field(default_factory=dict)
    section_marks: int | None = None  # scanner.SECTION_MARKS in the input, where its reader counted them


class ClockSetBack(Exception):
    """Fast-path lines stamped far before lines already merged: the log's clock was set back."""


class Diagnosis:
    """Merges chunk results in order and evaluates the guide window by window."""

    def __init__(self, table: CheckTable, cfg: Config, profile: str, workload: str,
                 server_overrides: dict[str, Any], *, end_hint: float | None = None,
                 live_grid: bool = False, fast: bool = True) -> None:
        self.table, self.cfg, self.profile, self.workload = table, cfg, profile, workload
        self.server = ServerState()
        self.overrides = server_overrides
        self.step, self.res, self.origin = grid(cfg.window_s, end_hint)
        self.end_aligned = end_hint is not None and not live_grid
        if live_grid:
            self.res = cfg.window_s / LIVE_BUCKETS
        self.window: Window = window_for(table, profile, cfg, expire_s=math.inf)
        self.window.resolution_s = self.res
        self.window.origin_s = self.origin
        # Fast path: the scanners judged the dated stamps by the log clock already; full path: this
        # converter's log clock judges every line's, in line order, as the sidecar's does.
        self.conv = EventConverter(server=self.server, judge_dated=not fast)
        self.line_offset = 0
        self.next_eval: float | None = None
        self.first_t: float | None = None
        self.last_t: float | None = None
        # (check, rank) -> its worst finding, that window's bounds, and what it was judged on (the rank's
        # signals, the server) so that the finding can be restated with the plan's value at the end.
        self.worst: dict[tuple[str, tuple[Any, ...]], tuple[Finding, float, float, Any]] = {}
        self.last_signals: dict[Rank, dict[str, float | None]] = {}
        self.last_statuses: dict[Rank, dict[str, str]] = {}  # the latest evaluation's: at the log's end, what the sidecar shows
        self.evaluations = 0
        self.lines = self.events = self.fast = self.unparsed = self.nul = 0
        self.oversized = 0  # lines longer than the reader's limit, skipped
        self.section_marks: int | None = 0  # None once a chunk was read without counting them
        self.implausible = 0  # stamps the scanners' log clocks took at a neighbour's time (fast path)
        self.implausible_example: str | None = None
        self.series = {k: Series(k) for k, _ in CHARTS}  # the charts drawn, no more

    def _see(self, t: float) -> None:
        if self.first_t is None or t < self.first_t:
            self.first_t = t
        if self.last_t is None or t > self.last_t:
            self.last_t = t

    def _evaluate(self, now: float, *, final: bool = False) -> None:
        server = self.server
        if self.overrides:
            server = ServerState(server.version, {**server.args, **self.overrides}, server.model_name)
        sig = self.window.signals(now)
        self.last_signals = sig
        self.evaluations += 1
        start = now - self.window.length_s
        kw: dict[str, Any] = {"profile": self.profile, "workload": self.workload, "config": self.cfg}
        # Full findings (with text) only for ranks where some check got worse, and at the end.
        quick = statuses(self.table, sig, server, **kw)
        self.last_statuses = quick
        for rank, st in quick.items():
            key_r = tuple(sorted(rank.as_dict().items()))
            worse = final or any(
                (cur := self.worst.get((cid, key_r))) is None or STATUS_CODE[s] > STATUS_CODE[cur[0].status]
                for cid, s in st.items())
            if not worse:
                continue
            judged_on = ({rank: sig.get(rank, {})}, server)
            for f in evaluate(self.table, judged_on[0], server, **kw):
                key = (f.check, key_r)
                cur = self.worst.get(key)
                if cur is None or STATUS_CODE[f.status] > STATUS_CODE[cur[0].status] or (
                        final and STATUS_CODE[f.status] == STATUS_CODE[cur[0].status] and f.status not in ("warning", "critical")):
                    self.worst[key] = (f, start, now, judged_on)
        agg = aggregate_signals(sig)
        for name, ser in self.series.items():
            ser.add(now, agg.get(name))

    def _advance(self, t: float) -> None:
        if self.next_eval is None:
            self.next_eval = bucket_start(t, self.step, self.origin) + self.step
            return
        while t >= self.next_eval:
            self._evaluate(self.next_eval)
            self.next_eval += self.step
            if t - self.window.length_s > self.next_eval:
                # Windows between here and `t` hold no data: evaluation costs what the data costs,
                # not what the time span does (a gap, or a stamp far off its neighbours).
                self.next_eval = bucket_start(t - self.window.length_s, self.step, self.origin) + self.step

    def add_chunk(self, chunk: ChunkResult) -> None:
        """Merge one chunk (in file order)."""
        off = self.line_offset - (chunk.first_line - 1)  # chunks of one scanner are numbered across calls
        if chunk.version_floor is not None:  # as converting those lines would, before any evaluation
            self.conv.note_version_floor(chunk.version_floor)
        items: list[tuple[float, int, Any]] = []
        self.conv.hint_time(chunk.first_t)  # lines before any stamp take the first one read
        self.conv.log_clock.seed(e.time for e in chunk.events)  # full path: a stray first stamp is no anchor
        for e in chunk.events:
            if off:
                e = Event(e.line + off, e.kind, e.time, e.rank, e.fields)  # cheaper than e._replace(line=...)
            for o in self.conv.convert(e):
                items.append((o.time, 0, o))
        if self.end_aligned and self.conv.log_clock.jumps:
            # The clock was set back: the log's last stamp is not its last log time, so the grid laid to
            # end there would cut the last window short.
            raise ClockSetBack(self.conv.log_clock.latest or 0.0)
        latest = self.last_t
        if chunk.clock_irregular or (latest is not None and chunk.first_t is not None
                                     and chunk.first_t > latest + BACKWARD_TOLERANCE_S):
            # A stamp far off its neighbours (a gap, another host's clock, a stray line; between ranges
            # of a parallel read too): the fast paths took it as written, the log clock may not.
            raise ClockSetBack(latest or 0.0)
        for (dp, pp, start), b in chunk.buckets.items():
            if latest is not None and start + self.res < latest - BACKWARD_TOLERANCE_S:
                raise ClockSetBack(start)
            items.append((start, 1, (Rank(dp=dp, pp=pp), start, b)))
        items.sort(key=lambda x: x[0])
        for t, kind, payload in items:
            self._advance(t)
            if kind == 0:
                self.window.add(payload)
                self._see(t)
            else:
                rank, start, b = payload
                span = chunk.rank_span.get((rank.dp, rank.pp))
                self.window.add_bucket(rank, start, b, first=span[0] if span else None,
                                       last=span[1] if span else None)
        for (dp, pp), key in chunk.retract_keys.items():
            self.window.carry_event_key(Rank(dp=dp, pp=pp), "retraction", key)
        if chunk.first_t is not None:
            self._see(chunk.first_t)
        if chunk.last_t is not None:
            self._see(chunk.last_t)
            self.conv.note_time(chunk.last_t)
        self.line_offset += chunk.lines
        self.lines += chunk.lines
        self.events += len(chunk.events) + chunk.summed_events
        self.fast += chunk.fast
        self.unparsed += chunk.unparsed
        self.nul += chunk.nul_lines
        self.oversized += chunk.oversized
        marks = self.section_marks
        self.section_marks = None if marks is None or chunk.section_marks is None else marks + chunk.section_marks
        self.implausible += chunk.implausible_times
        if self.implausible_example is None:
            self.implausible_example = chunk.implausible_example

    def finish(self, source: str) -> FileDiagnosis:
        """Evaluate the last (partial) window and build the document."""
        end = self.last_t if self.last_t is not None else 0.0
        self._evaluate(end + 1e-6, final=True)
        order = {c.id: i for i, c in enumerate(self.table.checks)}
        entries = sorted(self.worst.values(), key=lambda x: (tuple(sorted(x[0].rank.items())), order.get(x[0].check, 0)))
        server = self.server
        if self.overrides:
            server = ServerState(server.version, {**server.args, **self.overrides}, server.model_name)
        findings = self._with_plan_values([f for f, _, _, _ in entries], [j for _, _, _, j in entries], server)
        doc = findings_document(findings=findings, signals=self.last_signals, server=server, profile=self.profile,
                                workload=self.workload, window=(self.first_t, self.last_t), table=self.table,
                                config=self.cfg)
        for fd, (_, ws, we, _) in zip(doc["findings"], entries, strict=True):
            fd["window"] = {"start": time_text(max(ws, self.first_t or ws)), "end": time_text(min(we, end))}
        doc["source"] = source
        clock = self.conv.log_clock  # the full path's (every stamp), or the fast path's for time-only ones
        clock.settle()
        doc["input"] = {"lines": self.lines, "events": self.events, "fast_path_lines": self.fast,
                        "unparsed": self.unparsed, "oversized_lines": self.oversized, "evaluations": self.evaluations,
                        "time_from_line_order": self.conv.synthetic_time,
                        "implausible_times": self.implausible + clock.implausible,
                        "implausible_time_example": self.implausible_example or clock.example,
                        "window_s": self.cfg.window_s}
        return FileDiagnosis(source=source, document=doc, findings=findings, lines=self.lines, events=self.events,
                             fast_lines=self.fast, unparsed=self.unparsed, synthetic_time=self.conv.synthetic_time,
                             evaluations=self.evaluations, series=self.series,
                             final_statuses=self.last_statuses, final_signals=self.last_signals,
                             section_marks=self.section_marks)


    def _with_plan_values(self, findings: list[Finding], judged_on: list[Any], server: ServerState) -> list[Finding]:
        """The worst findings come from different windows: a flag's findings are restated with the plan's one
        value over all of them (issue #24), each on the signals of its own window."""
        values = flag_values(self.table, findings, self.last_signals, server)
        kw: dict[str, Any] = {"profile": self.profile, "workload": self.workload, "config": self.cfg}
        out = []
        for f, (sig, at) in zip(findings, judged_on, strict=True):
            v = values.get(f.flag) if f.flag is not None and f.status in FIRING else None
            if v is not None and (f.suggested != v.to or f.action != v.action):
                f = next(g for g in evaluate(self.table, sig, at, planned=values, **kw) if g.check == f.check)
            out.append(f)
        return out


def grid(window_s: float, end: float | None) -> tuple[float, float, float]:
    """(evaluation step, bucket width, origin): one bucket per window; when the log's last time is known
    the grid is shifted (whole seconds, so bucket arithmetic stays exact) to end just after it, so the
    last window is the sidecar's (`end - window_s`, `end`] (to a second), not a partial bucket divided by
    a whole window."""
    width = window_s / BUCKETS_PER_WINDOW
    if end is None or not math.isfinite(end):
        return window_s, width, 0.0
    return window_s, width, float((math.floor(end) + 1) % round(width)) if width >= 1 else 0.0


def last_log_time(path: str, kind: str, max_bytes: int = 8 << 20) -> float | None:
    """The last plausible dated stamp of a log file (read from its end; a gzip file is read through),
    or None (no stamp near the end, time-only stamps, or not a file)."""
    tail = b""
    try:
        if kind == "gzip":
            with gzip.open(path, "rb") as gz:
                while block := gz.read(TAIL_BLOCK_BYTES):
                    tail = (tail + block)[-(1 << 20):]
            return _last_stamp(tail.splitlines())
        with open(path, "rb") as fh:
            end = fh.seek(0, os.SEEK_END)
            pos, carry = end, b""
            while pos > 0 and end - pos < max_bytes:
                step = min(1 << 20, pos)
                pos -= step
                fh.seek(pos)
                block = fh.read(step) + carry
                lines = block.split(b"\n")
                carry = lines[0] if pos > 0 else b""
                found = _last_stamp(lines[1:] if pos > 0 else lines)
                if found is not None:
                    return found
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    return None


def _last_stamp(lines: list[bytes]) -> float | None:
    for raw in reversed(lines):
        e = parse_line(raw.decode("utf-8", "replace"), 0) if raw.strip() else None
        if e is not None and e.time and has_date(e.time):
            t = plausible_seconds(e.time)
            if t is not None:
                return t
    return None
