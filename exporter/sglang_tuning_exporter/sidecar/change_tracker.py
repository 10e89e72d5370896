"""The sidecar's memory of flag changes: server args as the log and the server info tell them, one
window summary per window length of evaluations, and a verdict per change (changes.judge) re-judged
as windows after it arrive.  No clock of its own: every call carries the (log) time.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from prometheus_client.registry import Collector

from sglang_tuning_exporter.core import limits
from sglang_tuning_exporter.core.catalog import CATALOG, PREFIX
from sglang_tuning_exporter.core.model import Finding, Rank
from sglang_tuning_exporter.guide.advisor import aggregate_signals
from sglang_tuning_exporter.guide.changes import VERDICTS, WindowSummary, detect, entry, judge, worst_statuses
from sglang_tuning_exporter.guide.checks import CheckTable

MAX_WINDOWS = 288  # two days of 10-minute windows
MAX_CHANGES = 64


class ChangeTracker:
    """Thread-safe: the loop thread writes, the web threads read."""

    def __init__(self, table: CheckTable, window_s: float) -> None:
        self.table = table
        self.window_s = window_s
        self._lock = threading.Lock()
        self._args: dict[str, Any] | None = None
        self._windows: deque[WindowSummary] = deque(maxlen=MAX_WINDOWS)
        self._next_record: float | None = None
        # (at, flag, from, to, source) of each change, oldest first
        self._changes: deque[tuple[float, str, Any, Any, str]] = deque(maxlen=MAX_CHANGES)
        self._cache: tuple[int, list[dict[str, Any]]] | None = None
        self._version = 0
        self._latest: WindowSummary | None = None  # the last evaluation, recorded or not

    def note_args(self, args: Mapping[str, Any], source: str, t: float) -> list[str]:
        """A server-args snapshot from `source` (log|server_info) at time `t`; the flags that changed."""
        new = {k: v for k, v in args.items() if not isinstance(v, (dict, list))}
        with self._lock:
            old = self._args
            self._args = dict(old or {})
            limits.merge_args(self._args, new)  # bounded as the state's (which counts the names dropped)
            if old is None:
                return []
            found = detect(old, new, self.table)
            for flag, a, b in found:
                self._changes.append((t, flag, a, b, source))
            if found:
                self._next_record = t + self.window_s  # the first window after holds only the new flags
                self._version += 1
            return [f for f, _, _ in found]

    def observe(self, now: float, signals: Mapping[Rank, Mapping[str, float | None]],
                findings: Iterable[Finding]) -> None:
        """One evaluation; kept as a window summary once per window length."""
        worst = worst_statuses((f.check, f.status) for f in findings)
        summary = WindowSummary(now - self.window_s, now, aggregate_signals(signals), worst)
        with self._lock:
            self._version += 1
            self._latest = summary
            if self._next_record is None:
                self._next_record = now  # the first evaluation
            if now < self._next_record:
                return
            self._next_record = now + self.window_s
            self._windows.append(summary)

    def changes(self) -> list[dict[str, Any]]:
        """The `changes[]` entries (interfaces.md), oldest first, judged on the windows known now."""
        with self._lock:
            if self._cache is not None and self._cache[0] == self._version:
                return self._cache[1]
            windows = list(self._windows)
            changes = list(self._changes)
            version = self._version
            latest = self._latest
        out: list[dict[str, Any]] = []
        for i, (at, flag, a, b, source) in enumerate(changes):
            prev_at = max((c[0] for c in changes[:i]), default=float("-inf"))
            next_at = min((c[0] for c in changes[i + 1:] if c[0] > at), default=float("inf"))
            before = [w for w in windows if prev_at <= w.start and w.end <= at]
            after = [w for w in windows if w.start >= at and w.end <= next_at]
            recent = latest if latest is not None and latest.end > at and latest.end <= next_at else None
            out.append(entry(at, flag, a, b, source, judge(flag, a, b, before, after, self.table, recent=recent)))
        with self._lock:
            self._cache = (version, out)
        return out

    def last_by_flag(self) -> dict[str, dict[str, Any]]:
        """The last change of each flag."""
        return {c["flag"]: c for c in self.changes()}


def _value_text(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v)) if abs(v) >= 1e3 else f"{v:g}"
    return str(v)


def change_families(tracker: ChangeTracker) -> list[Any]:
    """`sglang_tuning_change_verdict` and `sglang_tuning_change_info` for the last change of each flag."""
    from sglang_tuning_exporter.sidecar.collector import (
        Family,  # collector imports the state layer; keep this module light
    )

    specs = {m.name: m for m in CATALOG}
    verdict, info = Family(specs[PREFIX + "change_verdict"]), Family(specs[PREFIX + "change_info"])
    for flag, c in sorted(tracker.last_by_flag().items()):
        for v in VERDICTS:
            verdict.add((flag, v), 1.0 if c["verdict"] == v else 0.0)
        info.add((flag, _value_text(c["from"]), _value_text(c["to"]), str(c["source"])), 1.0)
    return [f for f in (verdict, info) if f.rows]


class ChangeCollector(Collector):
    """Registers beside the TuningCollector; yields nothing until a flag changed."""

    def __init__(self, tracker: ChangeTracker) -> None:
        self.tracker = tracker

    def describe(self) -> list[Any]:
        """Nothing up front (as TuningCollector)."""
        return []

    def collect(self) -> Iterator[Any]:
        """The change families."""
        yield from change_families(self.tracker)


__all__ = ["ChangeCollector", "ChangeTracker", "change_families"]
