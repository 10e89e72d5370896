"""Latency SLOs: the `slo:` of the exporter's config as recording rules and multi-window, multi-burn-rate
alerts over SGLang's own histograms (the SRE workbook's 1h/5m and 6h/30m pairs).

Per target and window: `instance:sglang_slo_<kind>_slow_ratio:rate<w>`, the share of requests slower than the
target (1 - rate of the target bucket / rate of all), and `instance:sglang_slo_<kind>_burn_rate:rate<w>`, that
share over the error budget (1 - objective): 1 spends the budget exactly over the SLO period, 14.4 in two days.
The dashboards' SLO row reads the burn rates, so it needs no SLO number of its own.

The numbers (target bucket, thresholds, budget) are written through `SloText`, so that the Helm chart can
store the rules with placeholders and fill them from its `slo:` value (render/helmchart.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang_tuning_exporter.core.durations import promql_duration
from sglang_tuning_exporter.guide.checks import CheckTable
from sglang_tuning_exporter.guide.config import DEFAULT_OBJECTIVE
from sglang_tuning_exporter.render.annotations import anchor, dashboard_url, guide_line
from sglang_tuning_exporter.render.expressions import SPELLINGS, for_of, native, num
from sglang_tuning_exporter.render.grafana import (
    HOST_SEL,
    Cell,
    Json,
    rename_override,
    stat,
    steps,
    table_panel,
    timeseries,
)
from sglang_tuning_exporter.render.grafana import target as target_of
from sglang_tuning_exporter.render.options import RenderOptions

# The SRE workbook's multi-window, multi-burn-rate pairs: (long, short window, burn rate, for, severity).
BURN_PAIRS = ((3600, 300, 14.4, 120, "critical"), (21600, 1800, 6.0, 900, "warning"))
WINDOWS = tuple(sorted({w for pair in BURN_PAIRS for w in pair[:2]}))
# SLO target -> (SGLang histogram, words, the latency check most likely responsible, the other one to rule out).
SLO_HISTOGRAMS = {"ttft_p95_seconds": ("time_to_first_token_seconds", "TTFT", "ttft_long_prompts",
                                       "latency_queue_dominates"),
                  "itl_p95_seconds": ("inter_token_latency_seconds", "ITL", "latency_high_batch_large",
                                      "latency_queue_dominates")}
# A recorded series keeps the server apart and the dashboards' scope (Kubernetes labels, absent elsewhere).
BY = "cluster, namespace, pod, job, instance, model_name"
GROUP = "sglang-tuning.slo"


def kind(target: str) -> str:
    """`ttft_p95_seconds` -> `ttft` (the recording rules' and the check label's short name)."""
    return target.split("_")[0]


def record_name(target: str, what: str, window_s: float) -> str:
    """`instance:sglang_slo_<kind>_<what>:rate<window>`, `what` slow_ratio or burn_rate."""
    return f"instance:sglang_slo_{kind(target)}_{what}:rate{promql_duration(window_s)}"


def record_names() -> set[str]:
    """Every recording rule an `slo:` can render (what a dashboard may query)."""
    return {record_name(t, what, w) for t in SLO_HISTOGRAMS for what in ("slow_ratio", "burn_rate")
            for w in WINDOWS}


def alert_name(target: str, severity: str) -> str:
    return f"SGLangSLO{SLO_HISTOGRAMS[target][1]}Burn{'Fast' if severity == 'critical' else 'Slow'}"


@dataclass(frozen=True, slots=True)
class SloText:
    """The numbers of the SLO rules as written into them."""

    le: dict[str, str]  # target -> the `le` label of its bucket ("2.0", as SGLang exposes it)
    limits: tuple[str, ...]  # per BURN_PAIRS: burn x budget, the slow share that pages
    budget: str  # the error budget as a ratio (1 - objective)
    budget_pct: str
    objective_pct: str


def text_of(slo: Any) -> SloText:
    """The numbers of a validated `slo:` mapping."""
    objective = float(slo.get("objective", DEFAULT_OBJECTIVE))
    budget = 1.0 - objective
    return SloText(le={t: repr(float(slo[t])) for t in SLO_HISTOGRAMS if t in slo},
                   limits=tuple(num(round(burn * budget, 6)) for _, _, burn, _, _ in BURN_PAIRS),
                   budget=num(round(budget, 9)), budget_pct=num(round(budget * 100, 6)),
                   objective_pct=num(round(objective * 100, 6)))


# What the Helm chart stores instead of the numbers, and fills from its `slo:` value.
PLACEHOLDERS = SloText(le={t: f"__slo_le_{t}__" for t in SLO_HISTOGRAMS},
                       limits=tuple(f"__slo_limit_{i}__" for i in range(len(BURN_PAIRS))),
                       budget="__slo_budget__", budget_pct="__slo_budget_pct__", objective_pct="__slo_objective_pct__")


def rules(table: CheckTable, opts: RenderOptions, text: SloText | None = None
          ) -> list[tuple[str, dict[str, Any], str]]:
    """(target, rule body, comment) for every target of `text` (default: the options' `slo:`)."""
    t = text or text_of(opts.slo)
    by_id = table.by_id()
    out: list[tuple[str, dict[str, Any], str]] = []
    for target, (family, words, cid, other) in SLO_HISTOGRAMS.items():
        le = t.le.get(target)
        if le is None:
            continue
        bucket = '{le="' + le + '"}'
        for w in WINDOWS:
            d = promql_duration(w)

            def rate(name: str, matcher: str, d: str = d) -> str:
                return " or ".join(f"rate({native(f'sglang:{name}{matcher}', opts, sp)}[{d}])" for sp in SPELLINGS)

            good = f"sum by ({BY}) ({rate(family + '_bucket', bucket)})"
            every = f"sum by ({BY}) ({rate(family + '_count', '')})"
            slow = record_name(target, "slow_ratio", w)
            out.append((target, {"record": slow, "expr": f"1 - ({good}\n  / {every})"},
                        f"requests slower than {le} s ({words}) over {d}"))
            out.append((target, {"record": record_name(target, "burn_rate", w), "expr": f"{slow} / {t.budget}"},
                        f"{words} error budget burn over {d}: 1 spends the budget exactly over the SLO period"))
        c = by_id.get(cid)
        flag = c.flag if c is not None and c.flag else "client-side"
        action = c.action if c is not None else "client"
        for (long_s, short_s, burn, for_s, severity), limit in zip(BURN_PAIRS, t.limits, strict=True):
            lng, sht = promql_duration(long_s), promql_duration(short_s)
            alert = alert_name(target, severity)
            expr = (f"{record_name(target, 'slow_ratio', long_s)} > {limit}\n"
                    f"and {record_name(target, 'slow_ratio', short_s)} > {limit}")
            out.append((target, {
                "alert": alert, "expr": expr, "for": for_of(for_s, opts),
                "labels": {"severity": severity, "check": f"slo_{kind(target)}", "source": "sglang"},
                "annotations": {
                    "summary": f"SGLang is burning its {words} SLO error budget {num(burn)}x too fast",
                    "description": (f"{{{{ $value | humanizePercentage }}}} of requests on {{{{ $labels.instance }}}} were "
                                    f"slower than {le} s ({words}) over {lng} and {sht}; the objective "
                                    f"({t.objective_pct} % within {le} s) allows {t.budget_pct} %. "
                                    f"Most likely: {cid} ({flag}); rule out {other} (client side) first."),
                    "runbook_url": f"{opts.runbook_url}#{anchor(alert)}",
                    "dashboard_url": dashboard_url(opts),
                    "check": cid, "flag": flag, "action": action,
                    "suggested_value": "see the exporter's finding for " + cid,
                    "guide": guide_line(c, table, opts) if c is not None else ""},
            }, f"{words} SLO: {num(burn)}x burn over {lng} and {sht}"))
    return out


def header(opts: RenderOptions) -> str:
    objective = float(opts.slo.get("objective", DEFAULT_OBJECTIVE))
    return ("Latency SLO burn rates (the SRE workbook's 1h/5m at 14.4x and 6h/30m at 6x) over SGLang's own\n"
            f"histograms; objective {num(objective)}. Rendered from the `slo:` of the exporter's config.")


# ----------------------------------------------------------------------------- dashboard row
# Always drawn: the burn rates carry the objective, so the dashboards need no SLO number and the same JSON
# serves a render with or without `slo:`; without one the panels say so instead of "No data".
NO_SLO = "no SLO: set slo: in the exporter's config (render --config) or the Helm chart's slo value"
_SEL = f'{{{HOST_SEL}, model_name=~"$model_name"}}'


def _burn(target: str, window_s: float) -> str:
    return record_name(target, "burn_rate", window_s) + _SEL


def _burn_steps() -> Json:
    return steps("green", *((burn, "orange" if severity == "warning" else "red")
                            for _, _, burn, _, severity in sorted(BURN_PAIRS, key=lambda p: p[2])))


def _pages() -> str:
    return "; ".join(f"above {num(burn)} over both {promql_duration(lng)} and {promql_duration(sht)} it pages "
                     f"({severity})" for lng, sht, burn, _, severity in BURN_PAIRS)


def server_cells(table: CheckTable) -> list[Cell]:
    """The server dashboard's SLO row: each target's burn rate per window, and the budget left."""
    by_id = table.by_id()
    cells = []
    for target, (_family, words, cid, other) in SLO_HISTOGRAMS.items():
        c = by_id.get(cid)
        flag = c.flag if c is not None and c.flag else "the client side"
        cells.append(Cell(timeseries(
            f"{words} SLO burn rate",
            f"How fast the {words} SLO spends its error budget: the share of requests slower than the target "
            f"(SGLang's histogram) over the budget (1 - objective), per window "
            f"(instance:sglang_slo_{kind(target)}_burn_rate). Healthy: below 1 (the budget lasts the SLO period). "
            f"{_pages()[0].upper()}{_pages()[1:]}. Most likely {cid}: {c.action if c else 'change'} {flag}; first "
            f"rule out {other} (the queue: the client or capacity). Empty without an slo: in the config.",
            "suffix: x",
            [target_of(_burn(target, w), f"{promql_duration(w)} · {{{{instance}}}}", chr(ord("A") + i))
             for i, w in enumerate(WINDOWS)],
            thresholds=_burn_steps(), style="dashed", minimum=0, no_value=NO_SLO), 9, 8))
    cells.append(Cell(stat(
        "Error budget left at the 6h pace",
        "1 - the 6h burn rate of each SLO: 100 % no request slower than the target, 0 % the budget spent "
        "exactly at the pace that uses it up over the SLO period, below 0 faster than that. Healthy: above 0. "
        "Below: the burn-rate panels and alerts name the check and its flag (--chunked-prefill-size for TTFT, "
        "--max-running-requests for ITL).",
        "percentunit",
        [target_of(f"1 - {_burn(t, max(WINDOWS))}", f"{words} · {{{{instance}}}}", chr(ord("A") + i))
         for i, (t, (_f, words, _c, _o)) in enumerate(SLO_HISTOGRAMS.items())],
        thresholds=steps("red", (0, "orange"), (0.5, "green")), no_value=NO_SLO), 6, 8))
    return cells


def fleet_cells() -> list[Cell]:
    """The fleet dashboard's SLO row: the fastest-burning servers, and every server ranked by burn."""
    hour = 3600
    ranked = table_panel(
        "Servers by SLO burn rate",
        "Every server's burn rate of each SLO over 1h and 6h (the long windows of the two burn-rate alerts), "
        f"fastest TTFT burn first. Healthy: all below 1. {_pages()[0].upper()}{_pages()[1:]}. TTFT: raise "
        "--chunked-prefill-size (ttft_long_prompts); ITL: lower --max-running-requests "
        "(latency_high_batch_large); first rule out the queue (latency_queue_dominates).",
        "none",
        [target_of(f"max by (instance, model_name) ({_burn(t, w)})", ref=f"{kind(t)}_{promql_duration(w)}",
                   instant=True) for t in SLO_HISTOGRAMS for w in (hour, max(WINDOWS))],
        [{"id": "merge", "options": {}},
         {"id": "organize", "options": {"excludeByName": {"Time": True}, "indexByName": {}, "renameByName": {}}}],
        overrides=[rename_override(f"Value #{kind(t)}_{promql_duration(w)}",
                                   f"{SLO_HISTOGRAMS[t][1]} {promql_duration(w)}")
                   for t in SLO_HISTOGRAMS for w in (hour, max(WINDOWS))],
        sort_by=f"{SLO_HISTOGRAMS[next(iter(SLO_HISTOGRAMS))][1]} 1h")
    ranked["fieldConfig"]["defaults"]["noValue"] = NO_SLO
    return [
        Cell(timeseries(
            "SLO burn rate over 1h, fastest servers",
            "The ten servers spending each SLO's error budget fastest over the last hour (burn rate: the share of "
            "requests slower than the target over 1 - objective). Healthy: below 1. Above 14.4 (with the 5m "
            "window) the fast-burn alert pages; open the server dashboard: TTFT points at --chunked-prefill-size, "
            "ITL at --max-running-requests, a queue-dominated latency at the client.",
            "suffix: x",
            [target_of(f"topk(10, max by (instance) ({_burn(t, hour)}))", f"{words} · {{{{instance}}}}",
                       chr(ord("A") + i)) for i, (t, (_f, words, _c, _o)) in enumerate(SLO_HISTOGRAMS.items())],
            thresholds=_burn_steps(), style="dashed", minimum=0, no_value=NO_SLO), 12, 8),
        Cell(ranked, 12, 8),
    ]
