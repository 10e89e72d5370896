"""Changes made within the reviewed range, from Prometheus: the `changes` of each instance (interfaces.md,
"Changes and their effect") and the servers that still lag a peer's improvement.

Pure: the report (fleet/report.py) runs the queries named here and hands the answers back.  A change is a
`sglang_tuning_server_arg` series taking another value within [start, end] (an instant query names the servers
whose arguments moved; only theirs are read over time).  Its verdict is guide/changes.py's
`judge` on slices of the range: the report's own plan, run as range queries whose step is the slice length
(each point covers the slice before it), folded per slice like the instant report, evaluated by the same
advisor, and split at the change time.  The number of queries does not depend on the fleet size: one instant
query finds the servers that changed, and only when there are some does one range query read their arguments
and the plan run again, once, restricted to them.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sglang_tuning_exporter.core.model import Finding, Rank, value_text
from sglang_tuning_exporter.fleet import queries as fleet
from sglang_tuning_exporter.fleet.promapi import Sample, Series
from sglang_tuning_exporter.guide.advisor import aggregate_signals
from sglang_tuning_exporter.guide.changes import WindowSummary, arg_of, detect, entry, judge, worst_statuses
from sglang_tuning_exporter.guide.checks import CheckTable

SOURCE = "prometheus"
MIN_SLICE_S = 600.0  # ten minutes: enough scrapes (at 15-60 s) for a check's min_samples
MAX_SLICES = 200  # a week splits into 50-minute slices: the judge compares a few slices each side

Evaluate = Callable[[Mapping[Any, dict[str, float | None]], fleet.InstanceData, float], list[Finding]]


def moved_query(w: fleet.Window) -> str:
    """The instant query naming the (instance, arg) whose value changed within the range: a series whose value
    moved (across a gap too), or one whose old and new values sit in two series (other target labels). Only
    those servers' arguments are then read over time: every argument of 1000 servers over 7 days answered more
    than the 64 MiB cap, and took seconds to compute."""
    s, r, at = fleet.series("sglang_tuning_server_arg", w.selector), fleet.duration(w.length_s), f"{w.end:.3f}"
    return (f"(max by (instance, arg) (changes({s}[{r}] @ {at})) > 0) or (count by (instance, arg) "
            f'(count_values by (instance, arg) ("value", last_over_time({s}[{r}] @ {at}))) > 1)')


def moved_instances(samples: Iterable[Sample]) -> list[str]:
    """The servers the moved query names."""
    return sorted({name for s in samples if (name := s.labels.get("instance"))})


def args_query(w: fleet.Window, instances: Iterable[str]) -> str:
    """The range query whose changes of value are the flag changes (one series per instance and arg), for the
    servers whose arguments moved."""
    return f"max by (instance, arg) ({fleet.series('sglang_tuning_server_arg', w.selector, instance_matcher(instances))})"


@dataclass(frozen=True, slots=True)
class ArgChange:
    """One argument of one server taking another value at `at` (the first sample showing it)."""

    instance: str
    at: float
    flag: str
    old: float | int
    new: float | int


def _number(v: float) -> float | int:
    return int(v) if float(v).is_integer() and abs(v) < 2**53 else float(v)


def detect_changes(series: Iterable[Series], table: CheckTable) -> dict[str, list[ArgChange]]:
    """Instance -> its tracked-flag changes in time order (a gap, e.g. a restart, is bridged: the value
    before it is compared with the value after it)."""
    out: dict[str, list[ArgChange]] = {}
    for s in series:
        name, arg = s.labels.get("instance"), s.labels.get("arg")
        if not name or not arg:
            continue
        prev: float | None = None
        for t, v in s.points:
            if math.isnan(v) or math.isinf(v):
                continue
            if prev is not None and v != prev:
                for flag, old, new in detect({arg: _number(prev)}, {arg: _number(v)}, table):
                    out.setdefault(name, []).append(ArgChange(name, t, flag, old, new))
            prev = v
    for changes in out.values():
        changes.sort(key=lambda c: (c.at, c.flag))
    return out


def slice_seconds(w: fleet.Window) -> float:
    """The length of one judged slice: at least MIN_SLICE_S, at most MAX_SLICES of them, whole minutes."""
    return max(MIN_SLICE_S, math.ceil(w.length_s / MAX_SLICES / 60.0) * 60.0)


def instance_matcher(instances: Iterable[str]) -> str:
    """`instance=~"a|b"` (regex-escaped, as a PromQL string) for the servers that changed."""
    alts = "|".join(re.escape(i) for i in sorted(set(instances)))
    return 'instance=~"' + alts.replace("\\", "\\\\").replace('"', '\\"') + '"'


def slice_window(w: fleet.Window, instances: Iterable[str]) -> fleet.Window:
    """The window one slice's plan is written for (the range queries slide it over the range)."""
    length = slice_seconds(w)
    sel = ",".join(p for p in (w.selector, instance_matcher(instances)) if p)
    return fleet.Window(start=w.end - length, end=w.end, step_s=min(w.step_s, length / 10.0), selector=sel)


def slice_times(w: fleet.Window) -> tuple[float, float, float]:
    """(first, last, step) of the slice range queries: each point covers the slice ending at it."""
    length = slice_seconds(w)
    return w.start + length, w.end, length


def fold_slices(answers: Mapping[str, Sequence[Series]]) -> dict[str, dict[float, dict[Rank, dict[str, float | None]]]]:
    """Instance -> slice end -> per-rank signals, folded by queries.collect exactly like the instant report."""
    by_time: dict[float, dict[str, list[Sample]]] = {}
    for key, items in answers.items():
        for s in items:
            for t, v in s.points:
                by_time.setdefault(t, {}).setdefault(key, []).append(Sample(s.labels, v, t))
    out: dict[str, dict[float, dict[Rank, dict[str, float | None]]]] = {}
    for t, results in sorted(by_time.items()):
        for name, d in fleet.collect(results).items():
            out.setdefault(name, {})[t] = d.signals
    return out


def args_at(series: Iterable[Series]) -> dict[str, dict[str, list[tuple[float, float | int]]]]:
    """Instance -> arg -> (time, value) points, for the arguments in force at a slice's end."""
    out: dict[str, dict[str, list[tuple[float, float | int]]]] = {}
    for s in series:
        name, arg = s.labels.get("instance"), s.labels.get("arg")
        if name and arg:
            out.setdefault(name, {})[arg] = [(t, _number(v)) for t, v in s.points if math.isfinite(v)]
    return out


def _value_at(points: Sequence[tuple[float, float | int]], t: float) -> float | int | None:
    i = bisect.bisect_right([p[0] for p in points], t)
    return points[i - 1][1] if i else None


def _worst(findings: Iterable[Finding]) -> dict[str, str]:
    return worst_statuses((f.check, f.status) for f in findings)


def summaries(data: fleet.InstanceData, slices: Mapping[float, dict[Rank, dict[str, float | None]]],
              args: Mapping[str, Sequence[tuple[float, float | int]]], length_s: float,
              evaluate: Evaluate, overrides: Mapping[str, Any] | None = None) -> list[WindowSummary]:
    """One WindowSummary per slice, evaluated under the arguments in force at its end (`--server-arg`
    overrides still win, as in the instant report)."""
    out: list[WindowSummary] = []
    for t, sig in sorted(slices.items()):
        now = {a: v for a, pts in args.items() if (v := _value_at(pts, t)) is not None}
        d = replace(data, signals=sig, args={**data.args, **now, **(overrides or {})})
        signals = fleet.derive_signals(d)
        out.append(WindowSummary(t - length_s, t, aggregate_signals(signals), _worst(evaluate(signals, d, length_s))))
    return out


def judge_instance(changes: Sequence[ArgChange], windows: Sequence[WindowSummary], table: CheckTable,
                   margin_s: float = 0.0) -> list[dict[str, Any]]:
    """The `changes[]` of one instance: before = the slices since the previous change, after = those until
    the next one; a slice straddling a change (or within `margin_s` before it: the change is seen at the
    first sample showing it) belongs to neither."""
    times = sorted({c.at for c in changes})
    out: list[dict[str, Any]] = []
    for c in changes:
        k = times.index(c.at)
        lo = times[k - 1] if k else -math.inf
        hi = times[k + 1] - margin_s if k + 1 < len(times) else math.inf
        before = [w for w in windows if w.start >= lo and w.end <= c.at - margin_s]
        after = [w for w in windows if w.start >= c.at and w.end <= hi]
        v = judge(c.flag, c.old, c.new, before, after, table)
        out.append(entry(c.at, c.flag, c.old, c.new, SOURCE, v))
    return out


@dataclass(frozen=True, slots=True)
class Lagging:
    """Servers of one model still on another value of a flag a change judged `improved` on a peer."""

    model_name: str
    flag: str
    value: float | int | str
    improved_on: tuple[str, ...]
    servers: dict[str, float | int | str]  # instance -> the value it runs

    def to_json_dict(self) -> dict[str, Any]:
        """The `lagging` entry of the report JSON."""
        return {"model_name": self.model_name, "flag": self.flag, "value": self.value,
                "improved_on": list(self.improved_on), "servers": dict(self.servers)}


def find_lagging(changes: Mapping[str, Sequence[Mapping[str, Any]]],
                 data: Mapping[str, fleet.InstanceData]) -> list[Lagging]:
    """Per model, flag and improved value: the servers that do not run it now (pure)."""
    improved: dict[tuple[str, str, str], list[str]] = {}
    values: dict[tuple[str, str, str], float | int | str] = {}
    for name, entries in changes.items():
        model = data[name].model_name if name in data else None
        if not model:
            continue
        for e in entries:
            # Only an improvement the server still runs: a later change may have gone back.
            cur = data[name].args.get(arg_of(e["flag"]))
            if e["verdict"] != "improved" or cur is None or value_text(cur) != value_text(e["to"]):
                continue
            key = (model, e["flag"], value_text(e["to"]))
            improved.setdefault(key, []).append(name)
            values[key] = e["to"]
    out: list[Lagging] = []
    for (model, flag, text), where in sorted(improved.items()):
        arg = arg_of(flag)
        behind = {d.instance: d.args[arg] for d in sorted(data.values(), key=lambda x: x.instance)
                  if d.model_name == model and arg in d.args and value_text(d.args[arg]) != text}
        if behind:
            out.append(Lagging(model, flag, values[(model, flag, text)], tuple(sorted(set(where))), behind))
    return out


__all__ = [
    "SOURCE",
    "ArgChange",
    "Lagging",
    "args_at",
    "args_query",
    "detect_changes",
    "find_lagging",
    "fold_slices",
    "instance_matcher",
    "judge_instance",
    "moved_instances",
    "moved_query",
    "slice_seconds",
    "slice_times",
    "slice_window",
    "summaries",
]
