"""The checks table evaluated on signals: one Finding per (check, rank), and the diagnose document."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from sglang_tuning_exporter.core.catalog import LATENCIES, SAMPLE_COUNT_OF, WORST_IS_LOWEST
from sglang_tuning_exporter.core.durations import duration_text, time_text
from sglang_tuning_exporter.core.features import FEATURE_WORDS, disabled_text
from sglang_tuning_exporter.core.model import (
    STATUS_CODE,
    Finding,
    Rank,
    ServerState,
    measure_text,
    rank_text,
    version_fields,
)
from sglang_tuning_exporter.guide.checks import Check, CheckTable, spelling_note
from sglang_tuning_exporter.guide.config import Config
from sglang_tuning_exporter.guide.plan import SUGGESTED_MARK, FlagValue, flag_values, planned_reason
from sglang_tuning_exporter.guide.settings import resolve
from sglang_tuning_exporter.guide.suggest import Suggestion, default_schedule_policy, flag_spellings, suggest
from sglang_tuning_exporter.pipeline.signals import (
    FACT_NAMES,
    FACTS_KEPT_MIN,
    FEW,
    LATENCY_COUNTS,
    SignalParams,
)
from sglang_tuning_exporter.pipeline.window import Window

RankSignals = Mapping[Rank, Mapping[str, float | None]]
FIRING = ("warning", "critical")
# Signals stated once at startup (not windowed): the evidence says "at startup".
STARTUP_SIGNALS = FACT_NAMES | {"cuda_graph_ceiling_ratio", "kv_pool_context_ratio"}


# Why a check has no verdict, in words a person reads (coverage.unknown_why).
_LATENCY_WORDS = {"ttft": "TTFT", "itl": "ITL", "e2e": "E2E", "queue_time": "queue-time"}
COUNT_WORDS = {"queue_samples": "batch lines with #queue-req", "kv_samples": "batch lines with token usage",
               "decode_samples": "batch lines with #running-req", "graph_samples": "Decode lines with `cuda graph`",
               "prefill_samples": "Prefill lines", "pool_samples": "hybrid Decode lines with #queue-req",
               **{f"{lat}_requests": f"requests in SGLang's {_LATENCY_WORDS[lat]} histogram" for lat in LATENCIES}}
# A latency count never seen: the histograms were not read (docs/signals.md, latency rows).
LATENCY_UNSEEN = ("SGLang's latency histograms were not read: a log has none, the sidecar reads them from /metrics "
                  "(TTFT and E2E 0.3.6+, ITL 0.4.4+, queue time 0.5.2+)")
MISSING_WHY = {
    "kv_pool_context_ratio": "neither the KV pool's tokens nor the context length is in the input",
    "available_gpu_mem_gb": "no startup memory line (`available_gpu_mem=`, or `avail mem=` after the KV pool) "
                            "in the input",
    "cuda_graph_ceiling_ratio": "the captured CUDA-graph batch sizes or max_running_requests are not in the input",
    "metrics_enabled": "the server arguments (enable_metrics) are not in the input",
    "prefix_cache_hit_ratio": "no Prefill lines with cached tokens in the input",
    "retractions_per_minute": "no batch activity in the window",
}
OOM_WHY = "OOMs are seen only in the log, and none was read"


def compare(value: float, op: str, threshold: float) -> bool:
    """`value <op> threshold` for the table's comparison operators."""
    if op == ">":
        return value > threshold
    if op == ">=":
        return value >= threshold
    if op == "<":
        return value < threshold
    if op == "<=":
        return value <= threshold
    return math.isclose(value, threshold)


def signal_params(table: CheckTable, profile: str, cfg: Config) -> SignalParams:
    """What shapes the signals themselves: the profile's queue band (or the config's) and the config's
    thresholds (the sidecar's window and the fleet report alike)."""
    band = cfg.queue_bands.get(profile, table.profiles[profile].queue_band)
    return SignalParams(queue_band=band, usage_good=cfg.usage_good, capped_fraction=cfg.capped_fraction,
                        min_samples=cfg.min_samples)


def window_for(table: CheckTable, profile: str | None = None, config: Config | None = None,
               *, expire_s: float | None = None) -> Window:
    """A signal Window shaped by the profile's queue band and the config (what the sidecar should use)."""
    cfg = config or Config()
    name, _ = resolve(table, cfg, profile=profile, workload=None)
    return Window(cfg.window_s, cfg.max_ranks, params=signal_params(table, name, cfg),
                  expire_s=expire_s if expire_s is not None else cfg.expire_s)


CACHE_AWARE_POLICIES = frozenset({"lpm", "dfs-weight", "hrrn", "shortest-prefill-first"})


def server_signals(server: ServerState) -> dict[str, float | None]:
    """Signals read from the server configuration rather than measured."""
    args = server.args
    policy = args.get("schedule_policy") or default_schedule_policy(server.version)
    out: dict[str, float | None] = {
        "schedule_policy_lpm": None if policy is None else (1.0 if str(policy) == "lpm" else 0.0),
        # SGLang's CacheAwarePolicy set (schedule_policy.py): these already match prefixes, so the
        # "fcfs with reuse -> lpm" advice does not apply to them (hrrn and shortest-prefill-first, 2026).
        "schedule_policy_cache_aware": None if policy is None else (
            1.0 if str(policy) in CACHE_AWARE_POLICIES else 0.0)}
    asked = args.get("max_running_requests")
    # The cap asked for on the command line: what a larger state pool need not exceed (suggest.py).
    out["max_running_requests_arg"] = float(asked) if isinstance(asked, (int, float)) and asked else None
    em = args.get("enable_metrics")
    out["metrics_enabled"] = None if em is None else (1.0 if em in (True, "true", "True", 1) else 0.0)
    return out


def _pct(v: Any) -> str:
    return f"{float(v) * 100:.0f}%" if isinstance(v, (int, float)) else str(v)


def _span(sig: Mapping[str, float | None], window_s: float) -> float:
    """The seconds of data the rank's windowed signals cover (window_span_s; the whole window when the
    evaluator does not measure it, e.g. a Prometheus range)."""
    span = sig.get("window_span_s")
    return window_s if span is None else min(float(span), window_s)


def _span_text(span: float, window_s: float) -> str:
    """`the last 10 min` for a full window, `the 12 s seen` for less: the evidence never claims more."""
    return f"the last {duration_text(window_s)}" if span >= window_s - 0.5 else f"the {duration_text(span)} seen"


def too_short(c: Check, sig: Mapping[str, float | None]) -> bool:
    """An `ok` of `c` over less data than its min_span_s: the absence of an event over too short a span."""
    span = sig.get("window_span_s")
    return c.min_span_s > 0 and span is not None and span < c.min_span_s


def _status(check: Check, value: float, levels: Mapping[str, float]) -> tuple[str, float | None]:
    if "critical" in levels and compare(value, check.comparison, levels["critical"]):
        return "critical", levels["critical"]
    if "warning" in levels and compare(value, check.comparison, levels["warning"]):
        return "warning", levels["warning"]
    return "ok", levels.get("warning", levels.get("critical"))


def evaluate(table: CheckTable, signals: RankSignals, server: ServerState, *, profile: str | None = None,
             workload: str | None = None, config: Config | None = None,
             planned: Mapping[str, FlagValue] | None = None,
             words: Mapping[str, str] | None = None) -> list[Finding]:
    """Every check of the workload, once per rank: ok / warning / critical / unknown.

    The findings on one flag carry the plan's one value for it (issue #24): the plan of these findings,
    or `planned` when the caller planned over more findings (diagnose's worst windows). `words` names the
    data an evaluator read where it is not a log (the fleet report: Prometheus series), by sample count or
    signal name, over COUNT_WORDS and MISSING_WHY (OOM_WHY under "oom")."""
    cfg = config or Config()
    prof, wl = resolve(table, cfg, profile=profile, workload=workload)
    band = cfg.queue_bands.get(prof, table.profiles[prof].queue_band)
    checks = [c for c in table.for_workload(wl) if cfg.override(c.id).enabled]
    extra = server_signals(server)
    args = {**server.args, **cfg.server_args}
    ranks: list[Rank] = sorted(signals) or [Rank()]
    findings: list[Finding] = []
    rank_sig: list[tuple[Rank, dict[str, float | None]]] = []  # per finding: its rank and signals
    for rank in ranks:
        sig: dict[str, float | None] = with_server_wide(
            {**extra, **{k: v for k, v in signals.get(rank, {}).items() if v is not None or k not in extra}}, signals)
        by_id: dict[str, Finding] = {}
        for c in checks:
            by_id[c.id] = _evaluate_one(c, sig, rank, args, server.version, prof, wl, cfg, band, words=words)
        for c in checks:
            f = by_id[c.id]
            if f.status not in FIRING:
                continue
            fired = [s for s in c.suppressed_by if s in by_id and by_id[s].status in FIRING]
            if fired:
                by_id[c.id] = Finding(
                    check=c.id, status="ok", rank=f.rank, flag=f.flag, action=f.action, current=f.current,
                    suggested=None, summary=f"suppressed while {', '.join(fired)} fires",
                    # The measurement only: the remedy of a suppressed check is not advice.
                    evidence=f"{f.evidence.partition('. ')[0]}. Suppressed: {', '.join(fired)} explains it"
                             + (" (decode batches miss the CUDA graph, so an empty queue does not mean a slow "
                                "client)." if any(x.startswith("cuda_graph") for x in fired)
                                else ", and names the flag that moves the limit that binds."),
                    severity=f.severity, guide=f.guide, tradeoff=f.tradeoff)
        findings.extend(by_id[c.id] for c in checks)
        rank_sig.extend((rank, sig) for _ in checks)
    values = planned if planned is not None else flag_values(table, findings, signals, server)
    if not values:
        return findings
    by_check = {c.id: c for c in checks}
    for i, f in enumerate(findings):
        v = values.get(f.flag) if f.flag is not None and f.status in FIRING else None
        if v is None or (f.suggested == v.to and f.action == v.action):
            continue
        rank, sig = rank_sig[i]
        findings[i] = _evaluate_one(by_check[f.check], sig, rank, args, server.version, prof, wl, cfg, band,
                                    planned=v, words=words)
    return findings


def moot(c: Check, sig: Mapping[str, float | None]) -> tuple[str, str] | None:
    """(what is off, why the remedy cannot help) when a feature the check's remedy needs is switched off."""
    for name, why in c.moot_when:
        off = disabled_text(name, sig.get(name))
        if off is not None:
            return off, why
    return None


def with_server_wide(sig: dict[str, float | None], signals: RankSignals) -> dict[str, float | None]:
    """A feature switched off for the whole server (a warning or argument without a rank prefix) holds for
    every rank: its fact, known on the rank-less entry, fills the ranks' own."""
    server = signals.get(Rank(), {})
    for name in FEATURE_WORDS:
        if not sig.get(name) and server.get(name):
            sig[name] = server[name]
    return sig


def quick_status(c: Check, sig: Mapping[str, float | None], levels: Mapping[str, float], min_samples: int) -> str:
    """The status `_evaluate_one` would give, without building any text (before suppression)."""
    if moot(c, sig) is not None:
        return "unknown"
    count_name = SAMPLE_COUNT_OF.get(c.signal)
    if count_name is not None and (sig.get(count_name) or 0) < min_samples:
        return "unknown"
    value = sig.get(c.signal)
    if value is None:
        return "unknown"
    for g in c.guard:
        gv = sig.get(g.signal)
        if gv is None:
            return "unknown"
        if not compare(gv, g.comparison, g.value):
            return "ok"
    status = _status(c, value, levels)[0]
    return "unknown" if status == "ok" and too_short(c, sig) else status


def statuses(table: CheckTable, signals: RankSignals, server: ServerState, *, profile: str | None = None,
             workload: str | None = None, config: Config | None = None) -> dict[Rank, dict[str, str]]:
    """Check id -> status per rank, like `evaluate` (suppression included) but without findings' text:
    cheap enough to run on every window of a long log."""
    cfg = config or Config()
    prof, wl = resolve(table, cfg, profile=profile, workload=workload)
    checks = [c for c in table.for_workload(wl) if cfg.override(c.id).enabled]
    plans = []
    for c in checks:
        ov = cfg.override(c.id)
        levels = c.thresholds_for(prof, wl)
        levels.update(ov.thresholds)
        plans.append((ov.on(c), levels, ov.min_samples if ov.min_samples is not None else c.min_samples))
    extra = server_signals(server)
    out: dict[Rank, dict[str, str]] = {}
    for rank in sorted(signals) or [Rank()]:
        sig = with_server_wide({**extra, **{k: v for k, v in signals.get(rank, {}).items()
                                            if v is not None or k not in extra}}, signals)
        st = {c.id: quick_status(c, sig, levels, ms) for c, levels, ms in plans}
        for c in checks:
            if st[c.id] in FIRING and any(st.get(x) in FIRING for x in c.suppressed_by):
                st[c.id] = "ok"
        out[rank] = st
    return out


def _evaluate_one(c: Check, sig: Mapping[str, float | None], rank: Rank, args: Mapping[str, Any],
                  version: str | None, profile: str, workload: str, cfg: Config,
                  band: tuple[float, float], planned: FlagValue | None = None,
                  words: Mapping[str, str] | None = None) -> Finding:
    ov = cfg.override(c.id)
    c = ov.on(c)
    levels = c.thresholds_for(profile, workload)
    levels.update(ov.thresholds)
    window_s = cfg.window_s
    span = _span(sig, window_s)
    seen = _span_text(span, window_s)
    min_samples = ov.min_samples if ov.min_samples is not None else c.min_samples
    severity = c.severity_for(workload)
    action = c.client_action if c.action == "client" else c.action
    # Every finding names the flag this server accepts, not only the firing ones; with its version unknown,
    # the newest spelling, the text naming the others (never a guess from which lines the excerpt holds).
    spellings = flag_spellings(c, version, args)
    named = spellings[-1] if spellings else None
    named_text = spelling_note(c, spellings)

    notes = "".join(" " + text.replace("{value}", measure_text(sig[name])) for name, text in c.evidence_notes
                    if sig.get(name))

    def make(status: str, summary: str, evidence: str, flag: str | None = named, current: Any = None,
             suggested: Any = None) -> Finding:
        if notes:
            evidence = evidence.rstrip() + ("" if evidence.rstrip().endswith(".") else ".") + notes
        return Finding(check=c.id, status=status, rank=rank.as_dict(), flag=flag, action=action,
                       current=current, suggested=suggested, summary=summary, evidence=evidence,
                       severity=severity, guide=c.guide_text(flag or named), tradeoff=c.tradeoff)

    def unknown(why: str) -> Finding:
        return make("unknown", f"{c.title}: not enough data", why)

    off = moot(c, sig)
    if off is not None:
        # The check's remedy needs a feature the configuration switched off: say so, advise nothing.
        return make("unknown", f"{c.title}: not judged ({off[0]})",
                    f"not judged: {off[0]}; {off[1].replace('{flag}', named_text)}", flag=None)
    value = sig.get(c.signal)
    count_name = SAMPLE_COUNT_OF.get(c.signal)
    count = sig.get(count_name) if count_name else None
    if count is None and count_name in LATENCY_COUNTS:
        return unknown(f"{(words or {}).get('latency', LATENCY_UNSEEN)} ({c.signal} unknown on {rank_text(rank)})")
    if count_name is not None and (count or 0) < min_samples:
        said = (words or {}).get(count_name) or COUNT_WORDS.get(count_name, count_name.replace('_', ' '))
        return unknown(f"{measure_text(count or 0.0)} {said} in {seen}; {min_samples} needed")
    if value is None:
        said_why = words or {}
        missing = said_why.get(c.signal) or MISSING_WHY.get(c.signal) or (
            said_why.get("oom", OOM_WHY) if c.signal.startswith("oom_") else None)
        return unknown(f"{missing} ({c.signal} unknown on {rank_text(rank)})" if missing else
                       f"signal {c.signal} unknown on {rank_text(rank)} (no data in {seen})")
    for g in c.guard:
        gv = sig.get(g.signal)
        if gv is None:
            return unknown(f"{g.signal} unknown (needed to judge {c.signal})")
        if not compare(gv, g.comparison, g.value):
            return make("ok", f"{c.title}: not applicable",
                        f"{c.signal}={measure_text(value)}; {g.signal}={measure_text(gv)} does not meet "
                        f"{g.comparison} {measure_text(g.value)}")
    status, threshold = _status(c, value, levels)
    when = "at startup" if c.signal in STARTUP_SIGNALS else f"over {seen}"
    measured = f"{c.signal}={measure_text(value)} {when} on {rank_text(rank)}"
    if c.signal.endswith("_per_minute") and span < window_s - 0.5:
        # A rate says the events and the span behind it: "2 in 12 s", not a rate over a window never seen.
        events = value * max(1.0, span / 60.0)
        measured = (f"{measure_text(round(events, 1))} {c.signal.removesuffix('_per_minute').replace('_', ' ')} in {seen} "
                    f"on {rank_text(rank)} ({c.signal}={measure_text(value)}"
                    f"{', a span under a minute counting as one minute' if span < 60 else ''})")
    if count_name is not None:
        measured += f" ({measure_text(count)} samples)"
    if status == "ok" and too_short(c, sig):
        return unknown(f"nothing counted in {seen} on {rank_text(rank)} ({c.signal}={measure_text(value)}): an absence "
                       f"is judged only over at least {duration_text(c.min_span_s)} of data (min_span_s "
                       f"{measure_text(c.min_span_s)})")
    if status == "ok":
        return make("ok", f"{c.title}: ok", f"{measured}; fires at {c.comparison} {measure_text(threshold)}")
    flag, s = suggest(c, sig, args, version, workload)
    if planned is not None and planned.flag == flag:
        s = Suggestion(s.current, planned.to, planned_reason(s.suggested, s.reasoning, c.id, c.action, planned))
    shown = _pct if c.signal.endswith("_ratio") else measure_text
    window = duration_text(span)
    if c.signal.endswith("_per_minute") and span < 60:
        window += " (counted as one minute)"
    fields = {"value": shown(value), "threshold": shown(threshold), "window": window,
              "flag": (named_text if flag == named else flag) or "",
              "suggested": "a value not computed from this input" if s.suggested is None else measure_text(s.suggested),
              "current": "its current value" if s.current is None else measure_text(s.current),
              "rank": rank_text(rank), "band_low": measure_text(band[0]), "band_high": measure_text(band[1])}
    try:
        description = c.description.format(**fields)
    except (KeyError, IndexError, ValueError):
        description = c.description
    evidence = f"{measured}; {status} at {c.comparison} {measure_text(threshold)}. {description}"
    if s.reasoning:
        evidence += f"{SUGGESTED_MARK}{s.reasoning}."
    return make(status, c.summary, evidence, flag=flag, current=s.current, suggested=s.suggested)


def worst_status(findings: list[Finding]) -> str:
    """The worst status among findings ('ok' when none)."""
    worst = "ok"
    for f in findings:
        if STATUS_CODE[f.status] > STATUS_CODE[worst]:
            worst = f.status
    return worst


# Signals whose worst is the least (catalog.SIGNALS), and the headroom facts: ranks (and the fleet report's TP ranks)
# fold with min, the others with max.
MIN_AGG = WORST_IS_LOWEST | FACTS_KEPT_MIN


def aggregate_signals(signals: RankSignals) -> dict[str, float | None]:
    """One value per signal across ranks: the worst (the lowest for MIN_AGG, else the highest)."""
    out: dict[str, float | None] = {}
    for sig in signals.values():
        for k, v in sig.items():
            if v is None:
                out.setdefault(k, None)
                continue
            old = out.get(k)
            if old is None:
                out[k] = v
            else:
                out[k] = min(old, v) if k in MIN_AGG else max(old, v)
    return out


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return str(v)


def findings_document(*, findings: list[Finding], signals: RankSignals, server: ServerState,
                      profile: str | None, workload: str | None, window: tuple[Any, Any] | None = None,
                      table: CheckTable | None = None, extra: Mapping[str, Any] | None = None,
                      config: Config | None = None) -> dict[str, Any]:
    """The diagnose JSON of interfaces.md (also `/api/findings`), with coverage, indications and plan."""
    from sglang_tuning_exporter.guide import plan  # plan imports this module's neighbours: no cycle at load

    prof = profile
    if prof is None and table is not None:
        prof = table.default_profile()
    start, end = window if window is not None else (None, None)
    doc: dict[str, Any] = {
        "profile": prof, "workload": workload or "throughput",
        "server": {**version_fields(server.version), "args": _jsonable(dict(server.args))},
        "window": {"start": time_text(start), "end": time_text(end)},
        "signals": {k: _jsonable(v) for k, v in sorted(aggregate_signals(signals).items()) if not k.startswith(FEW)},
        "signals_by_rank": [{"rank": r.as_dict(), "signals": {k: _jsonable(v) for k, v in sorted(s.items())
                                                              if not k.startswith(FEW)}}
                            for r, s in sorted(signals.items())],
        "findings": [_jsonable(f.to_json_dict()) for f in findings],
        "status": worst_status(findings),
        "status_code": STATUS_CODE[worst_status(findings)],
    }
    if server.model_name:
        doc["server"]["model_name"] = server.model_name
    if table is not None:
        parts = plan.document_parts(table, findings, signals, server, profile=prof, workload=workload, config=config)
    else:
        parts = plan.unplanned_parts(findings)
    doc.update(_jsonable(parts))
    if extra:
        doc.update(extra)
    return doc
