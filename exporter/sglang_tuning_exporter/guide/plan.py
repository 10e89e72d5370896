"""What a findings document says before its findings: coverage, indications and the plan.

One place for every product (diagnose, `/api/findings`, the status page, each report instance), so
that they all say the same (interfaces.md, "Coverage, indications and the plan"):

- `coverage`: how many checks had a verdict, and why each other one had none. A document where
  nothing could be judged must never read as healthy.
- `indications`: checks left unknown for lack of samples whose every sample points past the
  threshold (short excerpts pasted by users). Never a finding: `--fail-on` and alerts ignore them.
- `plan`: the findings as changes to make one at a time, in the order of the table's `plan_stages`
  (crash first, client last), one entry per flag with one value every finding on it agrees with.

Pure functions of findings, signals and the server's arguments.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sglang_tuning_exporter.core.catalog import SAMPLE_COUNT_OF
from sglang_tuning_exporter.core.model import (
    STATUS_CODE,
    Finding,
    Rank,
    ServerState,
    finite_number,
    measure_text,
    rank_text,
    value_text,
)
from sglang_tuning_exporter.guide.checks import Check, CheckTable, spelling_note
from sglang_tuning_exporter.guide.config import Config
from sglang_tuning_exporter.guide.settings import resolve
from sglang_tuning_exporter.guide.suggest import ARG_KEYS, flag_spellings
from sglang_tuning_exporter.pipeline.signals import FEW

RankSignals = Mapping[Rank, Mapping[str, float | None]]
FIRING = ("warning", "critical")
# How a finding's evidence introduces its suggested value (advisor), and the words for a missing value:
# a plan step says what is missing and what would give it, never `?` (issue #24).
SUGGESTED_MARK = " Suggested value: "
CURRENT_UNKNOWN = "current not in the input"
NO_VALUE = "a value to measure first (see why)"
GRAPH_FLAGS = ("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode")
MEM_FLAG = "--mem-fraction-static"
# The floor of the guide's good headroom band (5-8 GB): a graph raise must not push below it.
HEADROOM_FLOOR_GB = 5.0


# --------------------------------------------------------------------------------------- coverage
def coverage(findings: Sequence[Finding]) -> dict[str, Any]:
    """`coverage` of interfaces.md: a check counts as judged when any rank has a verdict."""
    by: dict[str, list[Finding]] = {}
    for f in findings:
        by.setdefault(f.check, []).append(f)
    why: dict[str, str] = {}
    judged = 0
    for cid, fs in by.items():
        if any(f.status != "unknown" for f in fs):
            judged += 1
        else:
            why[cid] = fs[0].evidence if len(fs) == 1 else f"on {rank_text(fs[0].rank)}: {fs[0].evidence}"
    return {"checks": len(by), "judged": judged, "unknown": len(by) - judged, "unknown_why": why}


# ------------------------------------------------------------------------------------ indications
def _sample_word(n: float) -> str:
    return "the only sample" if n == 1 else f"all {measure_text(n)} samples"


def _indication(c: Check, sig: Mapping[str, float | None], threshold: float, band_high: float,
                usage_good: float) -> tuple[float, float, str] | None:
    """(value, threshold, what the samples say) when every sample points past the threshold."""
    s = c.signal
    ratio = sig.get(FEW + s)
    if s == "queue_over_band_ratio" and ratio is not None and ratio >= 1.0:
        v = float(sig.get(FEW + "queue_min") or 0.0)
        n = sig.get(FEW + "queue_samples") or 0.0
        times = f": {v / band_high:.1f}x the band's top ({measure_text(band_high)})" if band_high > 0 else ""
        return v, band_high, f"#queue-req {measure_text(v)}{' or more' if n > 1 else ''} in {_sample_word(n)}{times}"
    if s == "queue_empty_ratio" and ratio is not None and ratio >= 1.0:
        n = sig.get(FEW + "queue_samples") or 0.0
        return 0.0, 0.0, f"#queue-req 0 in {_sample_word(n)}"
    if s == "kv_underused_ratio" and ratio is not None and ratio >= 1.0:
        v = float(sig.get(FEW + "token_usage_max") or 0.0)
        n = sig.get(FEW + "kv_samples") or 0.0
        return v, usage_good, (f"token usage {measure_text(v)} or less (under {measure_text(usage_good)}) with requests waiting "
                               f"in {_sample_word(n)}")
    if s == "cuda_graph_miss_ratio" and ratio is not None and ratio >= 1.0:
        n = sig.get(FEW + "graph_samples") or 0.0
        return 1.0, threshold, f"no CUDA graph in {_sample_word(n)} of decode"
    if s == "decode_batch_p90":
        low = sig.get(FEW + "running_min")
        if low is not None and low > threshold:
            v = float(low)
            n = sig.get(FEW + "decode_samples") or 0.0
            return float(v), threshold, (f"decode batch of {measure_text(v)}{' or more' if n > 1 else ''} in "
                                         f"{_sample_word(n)} (above {measure_text(threshold)})")
    return None


def indications(table: CheckTable, findings: Sequence[Finding], signals: RankSignals, *,
                profile: str | None = None, workload: str | None = None,
                config: Config | None = None) -> list[dict[str, Any]]:
    """`indications` of interfaces.md, per check and rank, in the findings' order."""
    cfg = config or Config()
    prof, wl = resolve(table, cfg, profile=profile, workload=workload)
    band = cfg.queue_bands.get(prof, table.profiles[prof].queue_band)
    checks = table.by_id()
    by_rank = {tuple(sorted(r.as_dict().items())): s for r, s in signals.items()}
    firing = {(f.check, tuple(sorted(f.rank.items()))) for f in findings if f.status in FIRING}
    out: list[dict[str, Any]] = []
    for f in findings:
        c = checks.get(f.check)
        if f.status != "unknown" or c is None or c.signal not in SAMPLE_COUNT_OF:
            continue
        key = tuple(sorted(f.rank.items()))
        sig = by_rank.get(key) or (by_rank.get(()) if not key else None) or {}
        count_name = SAMPLE_COUNT_OF[c.signal]
        few = sig.get(FEW + count_name)
        if not few:
            continue
        if any((x, key) in firing for x in c.suppressed_by):
            continue
        ov = cfg.override(c.id)
        needed = ov.min_samples if ov.min_samples is not None else c.min_samples
        if few >= needed:
            continue
        levels = {**c.thresholds_for(prof, wl), **ov.thresholds}
        threshold = levels.get("warning", levels.get("critical"))
        if threshold is None:
            continue
        got = _indication(c, sig, threshold, band[1], cfg.usage_good)
        if got is None:
            continue
        value, thr, said = got
        out.append({"check": c.id, "rank": dict(f.rank), "flag": f.flag,
                    "action": "client" if c.action == "client" else c.action,
                    "value": value, "threshold": thr, "samples": int(few), "needed": needed,
                    "evidence": f"{said}; too few samples to judge ({int(few)} of the {needed} needed): "
                                f"{c.title.lower()}, if the rest of the log looks the same"})
    return out


# ------------------------------------------------------------------------------------------- plan
def _agg(signals: RankSignals, name: str, worst: str = "min") -> float | None:
    vals = [float(v) for s in signals.values() if (v := s.get(name)) is not None and math.isfinite(v)]
    if not vals:
        return None
    return min(vals) if worst == "min" else max(vals)


def _round_down(x: float, step: float) -> float:
    return round(math.floor(x / step + 1e-9) * step, 6)


def _watch_text(text: str, profile: str, band: tuple[float, float]) -> str:
    """A check's `plan.watch` with the active profile's numbers (`{band_low}`, `{band_high}`, `{profile}`)."""
    return (text.replace("{band_low}", measure_text(band[0])).replace("{band_high}", measure_text(band[1]))
            .replace("{profile}", profile))


def _no_value(f: Finding, c: Check) -> str:
    """Why a step has no value, and which measurement would give one (never a bare `?`)."""
    said = f.evidence.split(SUGGESTED_MARK, 1)[1].rstrip(". ") if SUGGESTED_MARK in f.evidence else ""
    what = f"; the value comes from the measurement named there. Meanwhile watch {c.plan.watch}" \
        if c.plan.watch else ""
    return f". No value computed: {said or 'the input lacks what the suggestion needs'}{what}"


def build_plan(table: CheckTable, findings: Sequence[Finding], signals: RankSignals,
               server: ServerState | None = None, *, profile: str | None = None,
               band: tuple[float, float] | None = None) -> list[dict[str, Any]]:
    """`plan` of interfaces.md: one step per flag (client steps one per check), in stage order.
    `profile` and `band`: the active guide profile and its queue band, for the numbers in `then`."""
    prof = profile or table.default_profile()
    band = band or table.profiles[prof].queue_band
    checks = table.by_id()
    stage_of = {s: i for i, s in enumerate(table.plan_stages)}
    order = {c.id: i for i, c in enumerate(table.checks)}
    fire = [f for f in findings if f.status in FIRING and f.check in checks]
    groups: dict[str, list[Finding]] = {}
    for f in fire:
        key = f.flag if f.flag is not None else f"client:{f.check}"
        groups.setdefault(key, []).append(f)

    def rank_key(f: Finding) -> tuple[int, float, int, int]:
        c = checks[f.check]
        return (stage_of.get(c.plan.stage, len(stage_of)), -STATUS_CODE[f.status],
                0 if f.action == "decrease" else 1, order[f.check])

    steps: list[dict[str, Any]] = []
    for fs in groups.values():
        fs = sorted(fs, key=rank_key)
        lead = fs[0]
        c = checks[lead.check]
        agree = [f for f in fs if f.action == lead.action]
        other = [f for f in fs if f.action != lead.action]
        names = list(dict.fromkeys(f.check for f in fs))
        values = [v for f in agree if (v := finite_number(f.suggested)) is not None]
        to: Any
        if lead.action == "increase" and values:
            to = max(values)
        elif lead.action == "decrease" and values:
            to = min(values)
        else:
            to = next((f.suggested for f in agree if f.suggested is not None), None)
        current = next((f.current for f in fs if f.current is not None), None)
        agreeing = list(dict.fromkeys(f.check for f in agree))
        if lead.flag is None:
            why = f"{lead.summary}: {lead.action}"  # a client check's action is the change in words
        elif len(agreeing) > 1:
            why = f"{' and '.join(agreeing)} all {lead.action} {lead.flag}; {measure_text(to)} satisfies each of them"
        else:
            why = lead.summary
        if other:
            dissent = list(dict.fromkeys(f.check for f in other))
            why += (f". {', '.join(dissent)} would {other[0].action} it instead, but {lead.check} "
                    f"({c.plan.stage}) comes first; judge {', '.join(dissent)} again after this step")
        if current is None and lead.flag is not None and to is not None:
            why += (f". Its current value is not in the input (no server_args line): {measure_text(to)} is "
                    f"{'the guide' if lead.suggested == c.suggest.guide_value else 'the computed'} value; "
                    f"{lead.action} to it only if the server is not already past it")
        if to is None and lead.flag is not None:
            why += _no_value(lead, c)
        spellings = flag_spellings(c, server.version, server.args) if server is not None else ()
        if lead.flag is not None and len(spellings) > 1:
            # The release is unknown (a floor from the line formats at most): both spellings, no guess.
            why += (f". The release is not in the input: {spelling_note(c, spellings)}; use the spelling the "
                    "server's --help lists")
        then = (f"watch {_watch_text(c.plan.watch, prof, band)} for {c.plan.watch_for}" if c.plan.watch else
                "watch the check's signal for 30 min of normal traffic")
        if isinstance(to, float) and to.is_integer() and isinstance(current, int) and not isinstance(current, bool):
            to = int(to)  # an integer flag (batch sizes, request counts) keeps integer values
        steps.append({"step": 0, "flag": lead.flag,
                      "action": "client" if lead.flag is None else lead.action,
                      "current": current, "to": to, "checks": names, "why": why, "then": then,
                      "_stage": stage_of.get(c.plan.stage, len(stage_of)), "_key": rank_key(lead)})
    steps.sort(key=lambda s: s["_key"])
    _memory_budget(table, steps, signals, server)
    steps.sort(key=lambda s: s["_key"])
    for i, s in enumerate(steps, 1):
        s["step"] = i
        if s["flag"] is None:
            s["action"] = "client"
    # The client-side remedy in words (the finding's action text) goes into `why`.
    return [{k: v for k, v in s.items() if not k.startswith("_")} for s in steps]


def _memory_budget(table: CheckTable, steps: list[dict[str, Any]], signals: RankSignals,
                   server: ServerState | None) -> None:
    """One memory budget for --mem-fraction-static and a larger CUDA-graph capture (in place).

    Raising the captured batch size costs graph memory that comes out of the headroom the static
    fraction leaves; the startup log's `Capture cuda graph end ... mem usage=X GB` says how much the
    current capture took, so the larger one is estimated in proportion."""
    graph = next((s for s in steps if s["flag"] in GRAPH_FLAGS and s["action"] == "increase"), None)
    mem = next((s for s in steps if s["flag"] == MEM_FLAG), None)
    if graph is None:
        return
    captured = _agg(signals, "cuda_graph_max_bs_captured", "max") or finite_number(graph["current"])
    graph_gb = _agg(signals, "cuda_graph_gb", "max")
    avail = _agg(signals, "available_gpu_mem_gb")
    total = _agg(signals, "gpu_mem_total_gb")
    new_bs = finite_number(graph["to"])
    extra: float | None = None
    if captured and graph_gb is not None and new_bs is not None and new_bs > captured:
        extra = graph_gb * (new_bs - captured) / captured
        graph["why"] += (f". The startup log reports {measure_text(graph_gb)} GB of graph memory for batch sizes up to "
                         f"{measure_text(captured)}: about {extra:.1f} GB more for {measure_text(new_bs)}")
    head = next((c for c in table.checks if c.id == "gpu_mem_headroom_high"), None)
    params = head.suggest_params() if head is not None else {}
    target = float(params.get("target_gb", 6.5))
    lo, hi = float(params.get("min", 0.5)), float(params.get("max", 0.95))
    cur = finite_number(mem["current"]) if mem is not None else None
    if cur is None and server is not None:
        cur = finite_number(server.args.get("mem_fraction_static"))
    if extra is not None and avail is not None and total and cur is not None:
        raw = cur + (avail - extra - target) / total
        to = round(min(hi, max(lo, _round_down(raw, 0.01))), 2)
        budget = (f"one memory budget: {measure_text(avail)} GB free at startup - {extra:.1f} GB for the larger CUDA "
                  f"graphs of the graphs step = {avail - extra:.1f} GB; moving to the {measure_text(target)} GB target on a "
                  f"~{measure_text(total)} GB GPU gives {cur:g} {(avail - extra - target) / total:+.3f} = {raw:.3f}, "
                  f"rounded down to {to:.2f}")
        if mem is not None:
            mem["to"] = to
            mem["action"] = "increase" if to > cur else "decrease"
            mem["why"] = f"{budget} (instead of each finding's own value)"
            mem["checks"] = list(dict.fromkeys([*mem["checks"], *graph["checks"]]))
        elif avail - extra < HEADROOM_FLOOR_GB and to < cur:
            stage = {s: i for i, s in enumerate(table.plan_stages)}.get("memory", 1)
            steps.append({"step": 0, "flag": MEM_FLAG, "action": "decrease", "current": cur, "to": to,
                          "checks": list(graph["checks"]),
                          "why": f"{budget}: the larger capture would leave under {measure_text(HEADROOM_FLOOR_GB)} GB",
                          "then": "watch available_gpu_mem in the next startup summary (good: 5-8 GB) for one "
                                  "restart, then an hour of peak traffic",
                          "_stage": stage, "_key": (stage, -1, 0, -1)})
        return
    if mem is not None and mem["action"] == "increase":
        # Graph memory unknown: the two would pull the same headroom two ways; the graphs go first.
        mem["why"] += (". The graphs step will use part of this headroom and its size is not in the log: "
                       "make that change first, then re-check available_gpu_mem before raising this")
        mem["_key"] = (graph["_key"][0], graph["_key"][1], graph["_key"][2], graph["_key"][3] + 1)
    elif mem is not None and mem["action"] == "decrease":
        graph["why"] += (". Only once the memory step has brought available_gpu_mem to 5-8 GB: a larger "
                         "capture needs more of it")


@dataclass(frozen=True, slots=True)
class FlagValue:
    """The plan's one value for a flag of one server (issue #24): every finding on the flag shows it."""

    flag: str
    to: Any
    action: str
    lead: str  # the check whose stage and direction the step follows
    checks: tuple[str, ...]  # every firing check on the flag (and those whose memory the step budgets)


def flag_values(table: CheckTable, findings: Sequence[Finding], signals: RankSignals,
                server: ServerState | None = None) -> dict[str, FlagValue]:
    """Flag -> the plan's value for it: what every finding, card, alert and report entry on the flag says."""
    out: dict[str, FlagValue] = {}
    for s in build_plan(table, findings, signals, server):
        if s["flag"] is not None:
            out[s["flag"]] = FlagValue(s["flag"], s["to"], s["action"], s["checks"][0], tuple(s["checks"]))
    return out


def planned_reason(own: Any, own_reason: str, check: str, action: str, planned: FlagValue) -> str:
    """A finding's "Suggested value" when the plan reconciled its flag: the plan's value first, then what
    this check alone would take and why (its own value becomes a reason, never a second number to apply)."""
    others = [c for c in planned.checks if c != check]
    text = f"{value_text(planned.to)}, the plan's one value for {planned.flag}"
    if planned.action != action and action in ("increase", "decrease") and planned.lead != check:
        return (f"{text} ({planned.action} first, for {planned.lead}); this check alone would {action} it"
                + (f" to {value_text(own)}" if own is not None else "")
                + ": judge it again after that step" + (f" ({own_reason})" if own_reason else ""))
    if planned.lead == check and planned.action != action:
        text += " (one memory budget with the plan's other steps)"
    elif others:
        text += f", which {' and '.join(others)} also {'need' if len(others) > 1 else 'needs'}"
    if own is None or own == planned.to:
        return text + (f" ({own_reason})" if own_reason else "")
    return text + f"; this check alone: {value_text(own)}" + (f" ({own_reason})" if own_reason else "")


def command_diff(plan: Sequence[Mapping[str, Any]], args: Mapping[str, Any]) -> list[str]:
    """The launch flags the plan changes, as diff lines; empty when the server's arguments are unknown."""
    if not args:
        return []
    out: list[str] = []
    for s in plan:
        flag = s.get("flag")
        if flag is None or s.get("to") is None:
            continue
        keys = ARG_KEYS.get(flag, (flag.lstrip("-").replace("-", "_"),))
        cur = next((args[k] for k in keys if args.get(k) is not None), None)
        to = s["to"]
        if isinstance(to, bool):
            out.append(f"+ {flag}" if to else f"- {flag}")
            continue
        if cur is not None and not isinstance(cur, bool):
            out.append(f"- {flag} {measure_text(cur)}")
        out.append(f"+ {flag} {measure_text(to)}")
    return out


# ---------------------------------------------------------------------------------------- summary
def verdict_line(doc: Mapping[str, Any]) -> str:
    """The one line a person reads first: how much was judged, what fired, what hints at more."""
    cov = doc.get("coverage") or {}
    n, judged, unknown = cov.get("checks", 0), cov.get("judged", 0), cov.get("unknown", 0)
    fs = [f for f in doc.get("findings", []) if f.get("status") in FIRING]
    crit = sum(1 for f in fs if f.get("status") == "critical")
    ind = len(doc.get("indications") or [])
    hint = f" {ind} indication{'s' if ind != 1 else ''} from too few samples (below)." if ind else ""
    if n and judged == 0:
        return (f"NOT JUDGED: none of the {n} checks had enough data, so this says nothing about the tuning "
                f"(not a clean bill of health).{hint}")
    if fs:
        checks = len({f.get("check") for f in fs})
        return (f"{checks} check{'s' if checks != 1 else ''} fired ({crit} critical) among the {judged} of {n} "
                f"judged; {unknown} could not be judged.{hint}")
    if unknown:
        return (f"No findings among the {judged} of {n} checks that could be judged; {unknown} could not be "
                f"judged (why below), so this is not a clean bill of health.{hint}")
    return f"No findings: all {n} checks judged; nothing contradicts the tuning guide."


def document_parts(table: CheckTable, findings: Sequence[Finding], signals: RankSignals, server: ServerState, *,
                   profile: str | None = None, workload: str | None = None,
                   config: Config | None = None) -> dict[str, Any]:
    """`coverage`, `indications`, `plan`, the command diff and the verdict line of a findings document
    (diagnose, `/api/findings`, each instance of the fleet report)."""
    cfg = config or Config()
    prof, _ = resolve(table, cfg, profile=profile, workload=workload)
    band = cfg.queue_bands.get(prof, table.profiles[prof].queue_band)
    plan = build_plan(table, findings, signals, server, profile=prof, band=band)
    parts: dict[str, Any] = {
        "coverage": coverage(findings),
        "indications": indications(table, findings, signals, profile=profile, workload=workload, config=config),
        "plan": plan, "command_diff": command_diff(plan, server.args)}
    return _with_verdict(parts, findings)


def unplanned_parts(findings: Sequence[Finding]) -> dict[str, Any]:
    """The same parts without a checks table to plan from: coverage and the verdict line only."""
    return _with_verdict({"coverage": coverage(findings), "indications": [], "plan": [], "command_diff": []},
                         findings)


def _with_verdict(parts: dict[str, Any], findings: Sequence[Finding]) -> dict[str, Any]:
    parts["verdict"] = verdict_line({**parts, "findings": [f.to_json_dict() for f in findings]})
    return parts


__all__ = ["CURRENT_UNKNOWN", "FIRING", "NO_VALUE", "SUGGESTED_MARK", "FlagValue", "build_plan", "command_diff", "coverage", "document_parts", "flag_values", "indications", "plan_step_change",
           "plan_step_markdown", "plan_step_text", "plan_step_values", "planned_reason", "unplanned_parts", "value_text", "verdict_line"]


def plan_step_values(step: Mapping[str, Any]) -> tuple[str, str]:
    """A flag step's current and proposed values as every format shows them (`8192`, not `8192.0`)."""
    cur = CURRENT_UNKNOWN if step.get("current") is None else value_text(step["current"])
    to = NO_VALUE if step.get("to") is None else value_text(step["to"])
    return cur, to


def plan_step_change(step: Mapping[str, Any]) -> str:
    """What a step changes, as every format shows it: `increase --mem-fraction-static: 0.8 -> 0.86`
    (client steps: `client side (queue_empty)`)."""
    if step.get("flag") is None:
        return f"client side ({', '.join(step.get('checks', []))})"
    cur, to = plan_step_values(step)
    return f"{step['action']} {step['flag']}: {cur} -> {to}"


def plan_step_text(step: Mapping[str, Any]) -> str:
    """`1. increase --mem-fraction-static: 0.8 -> 0.86`: the numbered change (text formats)."""
    return f"{step['step']}. {plan_step_change(step)}"


def plan_step_markdown(step: Mapping[str, Any], *, code: Callable[[str], str], text: Callable[[Any], str]) -> str:
    """One Markdown list item of the plan: the change as a code span, why, then what to look at next;
    `code` and `text` are the document's own escapers (a table cell and a list item escape alike)."""
    return (f"{step['step']}. {code(plan_step_change(step))} — {text(step.get('why', ''))}. "
            f"*Then:* {text(step.get('then', ''))}.")
