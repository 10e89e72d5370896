"""What users feel, per server of the fleet report: the p95 latencies the sidecar measured (its windowed
`sglang_tuning_signal_seconds`, read like every other signal), else SGLang's histograms' (fleet/native.py),
and, when `--config` has `slo:`, how fast each server burns its error budget over the range; servers are
ranked by their worst burn.

Burn = the share of requests slower than the SLO target over the whole range / the error budget
(1 - objective): 1 spends the budget exactly, 10 ten times too fast. The share comes from SGLang's own
histograms (`1 - increase(bucket{le=target}) / increase(count)`, the `instance:sglang_slo_*` recording rules'
expression over the range), else from those recording rules' 1-hour ratio averaged over the range (a
long-term store that keeps only recorded series). Without `slo:` the report cannot know the target (the
recorded ratios do not say which one they were rendered for) and keeps the servers in name order.
Pure: the report (fleet/report.py) runs the queries named here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sglang_tuning_exporter.core.catalog import LATENCIES, LATENCY_HISTOGRAMS
from sglang_tuning_exporter.core.durations import duration_text
from sglang_tuning_exporter.fleet import native
from sglang_tuning_exporter.fleet import queries as fleet
from sglang_tuning_exporter.fleet.promapi import Sample
from sglang_tuning_exporter.guide.config import DEFAULT_OBJECTIVE

COLUMNS = tuple(f"{lat}_p95_seconds" for lat in LATENCIES)  # ttft, itl, e2e, queue_time
WORDS = {"ttft_p95_seconds": "p95 TTFT", "itl_p95_seconds": "p95 ITL", "e2e_p95_seconds": "p95 E2E",
         "queue_time_p95_seconds": "p95 queue time"}
SLO_KEY = "slo:"  # answers under this prefix are SLO ratios, not signals
RECORDED_RATIO = "instance:sglang_slo_{short}_slow_ratio:rate1h"  # render/slo.py's 1-hour recording rule


def _le(v: float) -> str:
    """Both spellings of a bucket bound (`2` and `2.0`), as a PromQL regex alternative."""
    spellings = dict.fromkeys((f"{v:g}", repr(float(v))))
    return 'le=~"' + "|".join(spellings) + '"'


def slo_queries(w: fleet.Window, slo: Mapping[str, float]) -> list[fleet.PlannedQuery]:
    """One instant query per SLO target of the config: the share of requests slower than it over the range,
    per instance (none without `slo:`)."""
    out: list[fleet.PlannedQuery] = []
    r = fleet.duration(w.length_s)
    for target in COLUMNS:
        if target not in slo:
            continue
        lat = target.removesuffix("_p95_seconds")
        families = [name for name, which in LATENCY_HISTOGRAMS.items() if which == lat]
        spelled = [p + f for f in families for p in native.SPELLINGS]  # Ray Serve's too
        good = " or ".join(f"sum by (instance) (increase({fleet.series(m + '_bucket', w.selector, _le(slo[target]))}[{r}]))"
                           for m in spelled)
        every = " or ".join(f"sum by (instance) (increase({fleet.series(m + '_count', w.selector)}[{r}]))"
                            for m in spelled)
        recorded = fleet.series(RECORDED_RATIO.format(short=lat), w.selector)
        out.append(fleet.PlannedQuery(SLO_KEY + target, f"(1 - (({good}) / ({every}))) or "
                                                        f"(max by (instance) (avg_over_time({recorded}[{r}])))"))
    return out


def slo_ratios(answers: Mapping[str, Sequence[Sample]]) -> dict[str, dict[str, float]]:
    """Instance -> SLO target -> share of requests slower than it (pure); no traffic is no share."""
    out: dict[str, dict[str, float]] = {}
    for key, samples in answers.items():
        if not key.startswith(SLO_KEY):
            continue
        for s in samples:
            name = s.labels.get("instance")
            if name and math.isfinite(s.value):
                out.setdefault(name, {})[key.removeprefix(SLO_KEY)] = min(1.0, max(0.0, s.value))
    return out


@dataclass(frozen=True, slots=True)
class Latency:
    """One server's p95 latencies (worst rank) and SLO burn."""

    p95: dict[str, float | None]
    unknown_why: dict[str, str] = field(default_factory=dict)
    slow_ratio: dict[str, float | None] = field(default_factory=dict)  # SLO target -> share slower, when configured
    budget: float | None = None  # 1 - objective

    def burn(self, target: str) -> float | None:
        """How many times too fast the error budget of `target` burns over the range."""
        ratio = self.slow_ratio.get(target)
        return None if ratio is None or not self.budget else round(ratio / self.budget, 4)

    @property
    def worst_burn(self) -> float | None:
        """The highest burn over the configured targets, None when none is known."""
        burns = [b for t in self.slow_ratio if (b := self.burn(t)) is not None]
        return max(burns) if burns else None

    def to_json_dict(self, slo: Mapping[str, float]) -> dict[str, Any]:
        """The `latency` entry of an instance in the report JSON."""
        return {**{c: self.p95.get(c) for c in COLUMNS}, "unknown_why": dict(self.unknown_why),
                "slo": {t: {"target": slo[t], "slow_ratio": self.slow_ratio.get(t), "burn": self.burn(t)}
                        for t in self.slow_ratio},
                "worst_burn": self.worst_burn}


def latency_of(signals: Mapping[Any, Mapping[str, float | None]], ratios: Mapping[str, float],
               slo: Mapping[str, float]) -> Latency:
    """A server's latencies from its per-rank signals (the worst rank: latency is the server's, shared by
    its ranks) and its SLO ratios (pure)."""
    p95: dict[str, float | None] = {}
    why: dict[str, str] = {}
    for col in COLUMNS:
        vals = [float(v) for sig in signals.values() if (v := sig.get(col)) is not None]
        p95[col] = round(max(vals), 6) if vals else None
        if not vals:
            lat = col.removesuffix("_p95_seconds")
            seen = [float(n) for sig in signals.values() if (n := sig.get(f"{lat}_requests")) is not None]
            why[col] = (f"{max(seen):g} {fleet.PROMETHEUS_WORDS[f'{lat}_requests']}" if seen
                        else fleet.PROMETHEUS_WORDS["latency"])
    targets = [t for t in COLUMNS if t in slo]
    budget = 1.0 - float(slo.get("objective", DEFAULT_OBJECTIVE)) if targets else None
    return Latency(p95, why, {t: ratios.get(t) for t in targets}, budget)


def rank(names: Sequence[str], latency: Mapping[str, Latency], slo: Mapping[str, float]) -> tuple[list[str], dict[str, str]]:
    """The servers in report order and the `order` entry saying why: by worst SLO burn (unknown last, then
    name order) when `slo:` is configured and some burn is known, else name order with the reason."""
    targets = [t for t in COLUMNS if t in slo]
    if not targets:
        return list(names), {"by": "instance", "why": "no slo: in --config, so no error budget to rank by: "
                                                      "servers in name order"}
    burns = {n: latency[n].worst_burn if n in latency else None for n in names}
    if all(b is None for b in burns.values()):
        return list(names), {"by": "instance", "why": "no server's SLO burn is known (neither SGLang's latency "
                                                      "histograms nor the instance:sglang_slo_* recording rules in "
                                                      "Prometheus): servers in name order"}
    ordered = sorted(names, key=lambda n: (burns[n] is None, -(burns[n] or 0.0)))  # stable: name order on ties
    objective = float(slo.get("objective", DEFAULT_OBJECTIVE))
    what = ", ".join(f"{WORDS[t]} {duration_text(slo[t])}" for t in targets)
    return ordered, {"by": "slo_burn",
                     "why": f"servers ordered by their worst SLO burn over the range ({what}, objective "
                            f"{objective * 100:g} %; burn 1 spends the error budget exactly); unknown burn last"}
