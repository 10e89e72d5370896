"""The PromQL pieces every query of the fleet report is built from: the grouping that keeps one series per DP
replica, SGLang's spellings, a series with the user's matchers, durations, the reviewed window and a planned
query (fleet/queries.py writes the plan, fleet/native.py its SGLang-only parts)."""

from __future__ import annotations

from dataclasses import dataclass

from sglang_tuning_exporter.core.durations import promql_duration

GROUP = "instance, dp_rank, pp_rank"
SGLANG_SPELLINGS = ("sglang:", "sglang_")


def series(metric: str, selector: str, matchers: str = "") -> str:
    """`metric{matchers,selector}`; works for names with a colon."""
    inner = ",".join(p for p in (matchers, selector) if p)
    return f"{metric}{{{inner}}}"


def duration(seconds: float) -> str:
    """A PromQL duration in core/durations' one spelling (`168h`, `5m`), at least a second (`[0s]` is no range)."""
    return promql_duration(max(1.0, seconds))


@dataclass(frozen=True, slots=True)
class Window:
    """The reviewed range, the subquery resolution and the user's label matchers (already parsed)."""

    start: float
    end: float
    step_s: float
    selector: str = ""

    @property
    def length_s(self) -> float:
        """Seconds between start and end."""
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class PlannedQuery:
    """One instant query of the plan and the signal it yields."""

    key: str
    expr: str


def sources(*exprs: str) -> str:
    """Join per-source aggregations with `or`: the first source that has an instance wins for it."""
    return " or ".join(f"({e})" for e in exprs)
