"""The fleet report as data: one InstanceReport per server and the FleetReport the formats render
(shared by the command and its formats, so neither imports the other)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sglang_tuning_exporter.core.durations import iso_time
from sglang_tuning_exporter.core.model import STATUS_CODE, Finding, version_fields
from sglang_tuning_exporter.fleet import queries as fleet
from sglang_tuning_exporter.fleet.changes import Lagging
from sglang_tuning_exporter.fleet.latency import Latency

STATUS_ORDER = ("critical", "warning", "ok", "unknown")


def natural_key(text: str) -> tuple[Any, ...]:
    """Sort `10.0.0.2:9470` before `10.0.0.10:9470`."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


# --------------------------------------------------------------------------------------------- model


@dataclass(frozen=True, slots=True)
class InstanceReport:
    """One server's verdicts."""

    instance: str
    model_name: str | None
    version: str | None
    args: dict[str, Any]
    findings: tuple[Finding, ...]
    signals: dict[str, dict[str, float | None]] = field(default_factory=dict)  # rank text -> signals
    # coverage, indications, plan (interfaces.md), from the same code as diagnose's document
    parts: dict[str, Any] = field(default_factory=dict)
    latency: Latency = field(default_factory=lambda: Latency({}))  # p95 latencies and SLO burn

    @property
    def status(self) -> str:
        """The worst verdict among the checks that had data."""
        seen = {f.status for f in self.findings}
        for s in STATUS_ORDER:
            if s in seen:
                return s
        return "unknown"

    def firing(self) -> list[Finding]:
        """Findings at warning or critical, worst first."""
        hits = [f for f in self.findings if f.status in ("warning", "critical")]
        return sorted(hits, key=lambda f: (-STATUS_CODE[f.status], f.check))

    def to_json_dict(self, slo: dict[str, float] | None = None) -> dict[str, Any]:
        """The `instances[]` entry of interfaces.md."""
        return {"instance": self.instance, "model_name": self.model_name, **version_fields(self.version),
                "status": self.status, "args": dict(self.args),
                "findings": [f.to_json_dict() for f in self.findings],
                "signals": {rank: {k: v for k, v in sig.items() if v is not None}
                            for rank, sig in self.signals.items()},
                "latency": self.latency.to_json_dict(slo or {}),
                **self.parts}


@dataclass(frozen=True, slots=True)
class FleetReport:
    """Everything the formats render."""

    prometheus: str
    start: float
    end: float
    queries: int
    profile: str
    workload: str
    selector: str
    instances: tuple[InstanceReport, ...]
    drift: tuple[fleet.Drift, ...]
    checks: tuple[str, ...]  # check ids evaluated, table order
    charts: dict[str, dict[str, list[tuple[float, float]]]] = field(default_factory=dict)
    elapsed_s: float = 0.0
    # servers still on another value of a flag whose change a peer of the same model judged `improved`
    lagging: tuple[Lagging, ...] = ()
    # what the reader must know to read the figures right (e.g. windows reaching back before the range)
    notes: tuple[str, ...] = ()
    # the order of `instances` and why (fleet/latency.rank), and the config's SLO targets it ranked by
    order: dict[str, str] = field(default_factory=lambda: {"by": "instance", "why": "servers in name order"})
    slo: dict[str, float] = field(default_factory=dict)

    def by_status(self) -> dict[str, int]:
        """Servers per status (every status present, in a fixed order)."""
        counts = Counter(i.status for i in self.instances)
        return {s: counts.get(s, 0) for s in ("ok", "warning", "critical", "unknown")}

    def common_findings(self, limit: int = 10) -> list[dict[str, Any]]:
        """The most common firing checks: check, servers, worst status, flag and action."""
        counts: Counter[str] = Counter()
        worst: dict[str, str] = {}
        flag: dict[str, tuple[str | None, str]] = {}
        for inst in self.instances:
            for f in {f.check: f for f in reversed(inst.firing())}.values():
                counts[f.check] += 1
                if f.status == "critical" or f.check not in worst:
                    worst[f.check] = f.status
                flag.setdefault(f.check, (f.flag, f.action))
        return [{"check": c, "servers": n, "worst": worst[c], "flag": flag[c][0], "action": flag[c][1]}
                for c, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]]

    def to_json_dict(self) -> dict[str, Any]:
        """The `report --format json` document of interfaces.md."""
        return {"prometheus": self.prometheus, "range": {"start": iso_time(self.start), "end": iso_time(self.end)},
                "selector": self.selector, "profile": self.profile, "workload": self.workload,
                "queries": self.queries,
                "summary": {"instances": len(self.instances), "by_status": self.by_status(),
                            "common_findings": self.common_findings()},
                "slo": dict(self.slo) or None, "order": dict(self.order),
                "instances": [i.to_json_dict(self.slo) for i in self.instances],
                "drift": [d.to_json_dict() for d in self.drift],
                "lagging": [g.to_json_dict() for g in self.lagging], "notes": list(self.notes)}


# --------------------------------------------------------------------------------------------- evaluation
