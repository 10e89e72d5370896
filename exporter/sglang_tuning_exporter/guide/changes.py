"""Did the change help?  Flag changes between server-args snapshots, and a verdict on each.

Pure: no I/O, no clock.  The callers (diagnose over startup sections, the sidecar over its evaluated
windows, the fleet report over Prometheus samples) hand in per-window summaries; this module picks
matching windows before and after a change and compares the checks that name the changed flag plus
the checks its remedy can hurt (`hurts` in checks.yaml).

Load matching: requests in the server (p90 running batch + median queue).  A closed-loop client
(a benchmark, a fixed pool of workers) keeps that sum about constant whatever the scheduler flags do
(they move requests between the queue and the batch), while a change of offered load moves it.
The latest after-window that some before-window matches (within LOAD_RATIO) sets the load level; the
windows of both sides at that level are compared.  Nothing comparable is `inconclusive`, never a guess.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sglang_tuning_exporter.core.catalog import OOM_PHASES
from sglang_tuning_exporter.core.durations import duration_text, time_text
from sglang_tuning_exporter.core.model import STATUS_CODE, value_text
from sglang_tuning_exporter.guide.checks import Check, CheckTable

VERDICTS = ("improved", "worse", "no_change", "inconclusive")
SOURCES = ("log", "server_info", "prometheus")
LOAD_RATIO = 1.5  # windows whose requests-in-server differ by more than this factor are not comparable
# Flags whose change moves memory: an OOM after one of them is `worse` even without traffic to compare.
MEMORY_FLAGS = frozenset({"--mem-fraction-static", "--chunked-prefill-size", "--max-running-requests",
                          "--cuda-graph-max-bs", "--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill",
                          "--max-total-tokens", "--max-prefill-tokens", "--context-length",
                          "--kv-cache-dtype", "--page-size", "--cuda-graph-bs"})
# Flags no check names that still change what the server can do: judged on every check of the workload.
CAPACITY_FLAGS = frozenset({"--tp-size", "--dp-size", "--max-total-tokens", "--max-prefill-tokens",
                            "--context-length", "--kv-cache-dtype", "--page-size", "--attention-backend",
                            "--quantization", "--enable-torch-compile", "--disable-radix-cache",
                            "--enable-dp-attention", "--ep-size", "--speculative-algorithm"})
# Arguments SGLang lets POST /set_internal_state change without a restart (0.5.15-0.5.23): tracked so the log's
# `Config updated via context override` is judged like a restart's change.
RUNTIME_FLAGS = frozenset({"--pp-max-micro-batch-size", "--speculative-accept-threshold-single",
                           "--speculative-accept-threshold-acc"})
OOM_SIGNALS = tuple(f"oom_{p}_count" for p in OOM_PHASES)
# What users feel, guarded whatever the checks say: a change whose after-windows (at comparable load) show one
# of these more than LATENCY_MARGIN worse than before is `worse`, its trade stated (docs/signals.md).
LATENCY_GUARD = (("ttft_p95_seconds", "p95 TTFT"), ("itl_p95_seconds", "p95 ITL"))
LATENCY_MARGIN = 0.25
ACTIVITY_SIGNAL = "decode_samples"


def flag_of(arg: str) -> str:
    """`schedule_conservativeness` -> `--schedule-conservativeness`."""
    return "--" + arg.replace("_", "-")


def arg_of(flag: str) -> str:
    """`--schedule-conservativeness` -> `schedule_conservativeness`."""
    return flag.lstrip("-").replace("-", "_")


def checks_naming(table: CheckTable, flag: str) -> list[Check]:
    """Checks whose remedy is this flag (under any release's name)."""
    return [c for c in table.checks if c.flag == flag or any(v.flag == flag for v in c.flags_by_version)]


def tracked_flags(table: CheckTable) -> frozenset[str]:
    """Flags a change of which gets an entry: those the checks name, and the capacity flags."""
    named = {c.flag for c in table.checks if c.flag} | {v.flag for c in table.checks for v in c.flags_by_version}
    return frozenset(named) | CAPACITY_FLAGS | RUNTIME_FLAGS


def watched_checks(table: CheckTable, flag: str) -> list[str]:
    """Check ids a change of `flag` is judged on: the checks naming it, then what their remedies hurt
    (every check when no check names it)."""
    named = checks_naming(table, flag)
    if not named:
        return [c.id for c in table.checks]
    out: list[str] = []
    for c in named:
        for cid in (c.id, *c.hurts):
            if cid not in out:
                out.append(cid)
    return out


def _number(x: Any) -> float | None:
    """A flag value as a number: a number, or a string that spells one (`"1"` from a config file)."""
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            return None
    return None


def _same(a: Any, b: Any) -> bool:
    x, y = _number(a), _number(b)
    if x is not None and y is not None:
        return x == y  # 1, 1.0 and "1" are one value
    return str(a) == str(b)


def detect(before: Mapping[str, Any], after: Mapping[str, Any], table: CheckTable) -> list[tuple[str, Any, Any]]:
    """(flag, from, to) for each tracked flag whose value differs between two server-args snapshots.
    An argument missing on either side is not a change (the snapshot did not say)."""
    tracked = tracked_flags(table)
    out: list[tuple[str, Any, Any]] = []
    for arg in sorted(set(before) & set(after)):
        flag = flag_of(arg)
        if flag not in tracked:
            continue
        old, new = before[arg], after[arg]
        if old is None or new is None or _same(old, new):
            continue
        out.append((flag, old, new))
    return out


@dataclass(frozen=True, slots=True)
class WindowSummary:
    """One evaluated window: its bounds, the signals (worst across ranks) and each check's worst status."""

    start: float
    end: float
    signals: Mapping[str, float | None]
    statuses: Mapping[str, str]

    def activity(self) -> float:
        """Decode samples in the window (traffic)."""
        return float(self.signals.get(ACTIVITY_SIGNAL) or 0.0)

    def load(self) -> float:
        """Requests in the server: p90 running batch + median queue."""
        s = self.signals
        running = s.get("decode_batch_p90")
        if running is None:
            running = s.get("running_max")
        return float(running or 0.0) + float(s.get("queue_p50") or 0.0)

    def ooms(self) -> float:
        """OOM events of any phase in the window."""
        return sum(float(self.signals.get(k) or 0.0) for k in OOM_SIGNALS)


@dataclass(frozen=True, slots=True)
class Side:
    """The windows chosen on one side of a change."""

    windows: tuple[WindowSummary, ...]
    signals: dict[str, float | None] = field(default_factory=dict)
    statuses: dict[str, str] = field(default_factory=dict)

    def bounds(self) -> tuple[float | None, float | None]:
        """First start, last end."""
        if not self.windows:
            return None, None
        return min(w.start for w in self.windows), max(w.end for w in self.windows)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The judgement of one change."""

    verdict: str
    why: str
    before: Side
    after: Side
    checks: dict[str, dict[str, str]]


def _worst(statuses: Iterable[str]) -> str:
    judged = [s for s in statuses if s != "unknown"]
    if not judged:
        return "unknown"
    return max(judged, key=lambda s: STATUS_CODE[s])


def worst_statuses(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Check -> its worst status over (check, status) pairs of one window's ranks; a judged status beats
    unknown (a window summary's statuses, in every product)."""
    seen: dict[str, list[str]] = {}
    for check, status in pairs:
        seen.setdefault(check, []).append(status)
    return {check: _worst(statuses) for check, statuses in seen.items()}


def _side(windows: Sequence[WindowSummary], watched: Sequence[str], table: CheckTable) -> Side:
    import statistics  # here, not at the top: it imports fractions and decimal, a tenth of diagnose's start-up

    by_id = table.by_id()
    sig: dict[str, float | None] = {}
    for cid in watched:
        c = by_id.get(cid)
        if c is None or c.signal in sig:
            continue
        vals = [float(v) for w in windows if (v := w.signals.get(c.signal)) is not None]
        sig[c.signal] = round(statistics.fmean(vals), 4) if vals else None
    for name, _ in LATENCY_GUARD:
        vals = [float(v) for w in windows if (v := w.signals.get(name)) is not None]
        if vals:
            sig[name] = round(statistics.fmean(vals), 4)
    st = {cid: _worst(w.statuses.get(cid, "unknown") for w in windows) for cid in watched}
    return Side(tuple(windows), sig, st)


def _percent(before: float, after: float) -> str:
    return f"{(after - before) / before * 100:+.0f} %"


def latency_trade(b: Side, a: Side, tput: tuple[float, float] | None) -> tuple[list[str], bool]:
    """(the latencies that got more than LATENCY_MARGIN slower, with the throughput it bought:
    `throughput +12 %, p95 TTFT 0.8 s -> 1.6 s (+100 %)`), whether latency was seen on both sides."""
    slower: list[str] = []
    seen = False
    for name, label in LATENCY_GUARD:
        vb, va = b.signals.get(name), a.signals.get(name)
        if vb is None or va is None:
            continue
        seen = True
        if vb > 0 and va > vb * (1 + LATENCY_MARGIN):
            slower.append(f"{label} {duration_text(vb)} -> {duration_text(va)} ({_percent(vb, va)})")
    if slower and tput is not None and tput[0] > 0:
        slower.insert(0, f"throughput {_percent(*tput)}")
    return slower, seen


def _comparable(a: float, b: float) -> bool:
    lo, hi = sorted((a, b))
    return hi <= max(lo, 1.0) * LOAD_RATIO


def _rounded(v: float | None) -> str:
    """A load or throughput to three significant digits (`1.23e+03` never: `1234`), `?` for none."""
    if v is None:
        return "?"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def _minutes(ws: Sequence[WindowSummary]) -> str:
    if not ws:
        return "no window"
    return duration_text(max(w.end for w in ws) - min(w.start for w in ws))


def judge(flag: str, old: Any, new: Any, before: Sequence[WindowSummary], after: Sequence[WindowSummary],
          table: CheckTable, *, min_samples: int | None = None, recent: WindowSummary | None = None) -> Verdict:
    """The verdict on changing `flag` from `old` to `new`, from the windows before and after it.
    `recent`: the window still filling after the change (the sidecar's); only its OOMs count, at once."""
    import statistics  # see _side
    need = int(min_samples if min_samples is not None else table.defaults.get("min_samples", 10))
    watched = watched_checks(table, flag)
    by_id = table.by_id()
    goback = f"go back to {flag} {old}"
    # An OOM after a memory change is a verdict even when the server never served again.
    if flag in MEMORY_FLAGS:
        oom_after = sum(w.ooms() for w in after) or (recent.ooms() if recent is not None else 0.0)
        oom_before = sum(w.ooms() for w in before)
        if oom_after > 0 and oom_before == 0:
            a = _side(list(after) or ([recent] if recent is not None else []), watched, table)
            b = _side([w for w in before if w.activity() >= need][-3:] or list(before)[-1:], watched, table)
            return Verdict("worse", f"{int(oom_after)} out-of-memory error{'s' if oom_after != 1 else ''} after "
                           f"{flag} went from {old} to {new}, none before; {goback}",
                           b, a, _check_pairs(b, a, watched))
    act_b = [w for w in before if w.activity() >= need]
    act_a = [w for w in after if w.activity() >= need]
    if not act_b or not act_a:
        side = "before" if not act_b else "after"
        pool = before if not act_b else after
        samples = int(sum(w.activity() for w in pool))
        b, a = _side(act_b, watched, table), _side(act_a, watched, table)
        return Verdict("inconclusive", f"too little traffic {side} the change to judge: {samples} decode samples "
                       f"over {_minutes(pool)}, no window with the {need} needed", b, a, _check_pairs(b, a, watched))
    # The latest after-window some before-window matches sets the load level (the latest: settled).
    ref_a = next((wa.load() for wa in reversed(act_a) if any(_comparable(wa.load(), wb.load()) for wb in act_b)),
                 None)
    if ref_a is None:
        load_b = statistics.median(w.load() for w in act_b)
        load_a = statistics.median(w.load() for w in act_a)
        b, a = _side(act_b, watched, table), _side(act_a, watched, table)
        return Verdict("inconclusive", f"load not comparable: about {_rounded(load_b)} requests in the server before, "
                       f"{_rounded(load_a)} after (running + queued); compare again at the same load",
                       b, a, _check_pairs(b, a, watched))
    chosen_a = [w for w in act_a if _comparable(w.load(), ref_a)]
    chosen_b = [w for w in act_b if _comparable(w.load(), ref_a)]
    b, a = _side(chosen_b, watched, table), _side(chosen_a, watched, table)
    pairs = _check_pairs(b, a, watched)
    load_b = statistics.median(w.load() for w in chosen_b)
    ref_a = statistics.median(w.load() for w in chosen_a)
    tput_b = [v for w in chosen_b if (v := w.signals.get("gen_throughput_mean")) is not None]
    tput_a = [v for w in chosen_a if (v := w.signals.get("gen_throughput_mean")) is not None]
    load = f"at comparable load ({_rounded(load_b)} vs {_rounded(ref_a)} requests running + queued"
    if tput_b and tput_a:
        load += f"; {_rounded(statistics.fmean(tput_b))} -> {_rounded(statistics.fmean(tput_a))} tokens/s"
    load += ")"
    tput = (statistics.fmean(tput_b), statistics.fmean(tput_a)) if tput_b and tput_a else None
    slower, latency_seen = latency_trade(b, a, tput)
    unseen = "" if latency_seen else "; latency not seen (no TTFT/ITL histograms: SGLang's /metrics not read)"

    def moved(cid: str) -> str:
        c = by_id[cid]
        return (f"{cid} {pairs[cid]['before']} -> {pairs[cid]['after']} ({c.signal} {_rounded(b.signals.get(c.signal))}"
                f" -> {_rounded(a.signals.get(c.signal))})")

    judged = [cid for cid in watched if pairs[cid]["before"] != "unknown" and pairs[cid]["after"] != "unknown"]
    worse = [cid for cid in judged if STATUS_CODE[pairs[cid]["after"]] > STATUS_CODE[pairs[cid]["before"]]]
    better = [cid for cid in judged if STATUS_CODE[pairs[cid]["after"]] < STATUS_CODE[pairs[cid]["before"]]]
    trade = ", ".join(slower)
    if worse:
        why = ", ".join(moved(c) for c in worse) + (f", {trade}" if trade else "")
        if better:
            why = f"{', '.join(moved(c) for c in better)} but {why}"
        return Verdict("worse", f"{why} {load}; {goback}", b, a, pairs)
    if slower:
        gained = f"{', '.join(moved(c) for c in better)} but " if better else ""
        return Verdict("worse", f"{gained}{trade}, more than {LATENCY_MARGIN:.0%} slower {load}; {goback}",
                       b, a, pairs)
    if better:
        return Verdict("improved", f"{', '.join(moved(c) for c in better)} {load}{unseen}", b, a, pairs)
    named = [c.id for c in checks_naming(table, flag)]
    if not any(cid in judged for cid in (named or watched)):
        return Verdict("inconclusive", f"the checks reading {flag} ({', '.join(named or watched[:3])}) could not be "
                       f"judged on both sides {load}", b, a, pairs)
    firing = [cid for cid in judged if pairs[cid]["after"] in ("warning", "critical")]
    if firing:
        return Verdict("no_change", f"{', '.join(moved(c) for c in firing)}: still firing {load}{unseen}", b, a,
                       pairs)
    return Verdict("no_change", f"{', '.join(c for c in judged if c in (named or judged))} stayed ok {load}{unseen}",
                   b, a, pairs)


def _check_pairs(b: Side, a: Side, watched: Sequence[str]) -> dict[str, dict[str, str]]:
    return {cid: {"before": b.statuses.get(cid, "unknown"), "after": a.statuses.get(cid, "unknown")}
            for cid in watched}


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    out = time_text(t)
    return out if isinstance(out, str) else None


def entry(at: float, flag: str, old: Any, new: Any, source: str, v: Verdict) -> dict[str, Any]:
    """One `changes[]` item of interfaces.md."""
    bs, be = v.before.bounds()
    as_, ae = v.after.bounds()
    return {"at": _iso(at), "flag": flag, "from": old, "to": new, "source": source,
            "before": {"start": _iso(bs), "end": _iso(be), "signals": dict(v.before.signals)},
            "after": {"start": _iso(as_), "end": _iso(ae), "signals": dict(v.after.signals)},
            "checks": v.checks, "verdict": v.verdict, "why": v.why}


@dataclass(frozen=True, slots=True)
class Section:
    """A stretch of one server under one set of arguments (a startup section of the log, a run of
    samples under one server info)."""

    start: float | None
    args: Mapping[str, Any]
    windows: tuple[WindowSummary, ...]


def compare_sections(sections: Sequence[Section], table: CheckTable, source: str = "log", *,
                     min_samples: int | None = None) -> list[dict[str, Any]]:
    """The `changes` of consecutive sections: one entry per changed flag at each boundary; the windows
    before are those since the previous change, the windows after those until the next one."""
    out: list[dict[str, Any]] = []
    for prev, cur in itertools.pairwise(sections):
        at = cur.start if cur.start is not None else (prev.windows[-1].end if prev.windows else None)
        for flag, old, new in detect(prev.args, cur.args, table):
            v = judge(flag, old, new, prev.windows, cur.windows, table, min_samples=min_samples)
            out.append(entry(at if at is not None else 0.0, flag, old, new, source, v))
    return out


# What to do about the last change before the plan's next step (one flag at a time: judge, then move on).
_THEN = {"improved": "keep it; then the plan's next step",
         "worse": "go back to {flag} {old} before any other step",
         "no_change": "it did not move the checks it targets: go back to {flag} {old} or keep it, then the plan",
         "inconclusive": "leave it under comparable load until it can be judged, before changing another flag"}
_WORST_FIRST = ("worse", "inconclusive", "no_change", "improved")


def last_change(changes: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The plan's step 0: the latest change and whether it helped (the worst verdict when a restart changed
    several flags at once, the others in `with`); None without changes."""
    if not changes:
        return None
    at = max(str(c.get("at") or "") for c in changes)
    latest = [c for c in changes if str(c.get("at") or "") == at]
    c = min(latest, key=lambda x: _WORST_FIRST.index(x["verdict"]) if x["verdict"] in _WORST_FIRST else 9)
    return {"step": 0, "at": c.get("at"), "flag": c["flag"], "from": c["from"], "to": c["to"],
            "verdict": c["verdict"], "why": c["why"],
            "then": _THEN.get(c["verdict"], "").format(flag=c["flag"], old=c["from"]),
            "with": [x["flag"] for x in latest if x is not c]}


def last_change_text(note: Mapping[str, Any]) -> str:
    """`last change: --flag 1 -> 1.3 at ...: IMPROVED (why). Then: ...` (one line)."""
    also = f" (with {', '.join(note['with'])})" if note.get("with") else ""
    return (f"last change: {note['flag']} {value_text(note['from'])} -> {value_text(note['to'])}{also} at {note['at']}: "
            f"{str(note['verdict']).upper().replace('_', ' ')} ({note['why']}). Then: {note['then']}.")


__all__ = ["LATENCY_GUARD", "LATENCY_MARGIN", "MEMORY_FLAGS", "SOURCES", "VERDICTS", "Section", "Verdict", "WindowSummary", "arg_of",
           "checks_naming", "compare_sections", "detect", "entry", "flag_of", "judge", "last_change",
           "last_change_text", "latency_trade", "tracked_flags",
           "watched_checks"]
