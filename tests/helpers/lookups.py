"""Views of production data that only tests read: kept here so that the package carries no code only its
tests call (issue #27, dead code)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from sglang_tuning_exporter.core.catalog import CATALOG
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.core.model import Observation, ServerState
from sglang_tuning_exporter.guide.checks import CheckTable
from sglang_tuning_exporter.pipeline.observations import EventConverter
from sglang_tuning_exporter.render.options import RenderOptions
from sglang_tuning_exporter.render.rules import rule_groups

_ANCHOR = re.compile(r'<a id="([^"]+)"></a>')


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile (q in 0-1) of a non-empty list: the textbook rule hist_quantile follows."""
    ordered = sorted(values)
    idx = max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))
    return ordered[idx]


def exposed_names() -> set[str]:
    """Every sample name that can appear on our /metrics (info metrics carry `_info` already)."""
    return {m.name for m in CATALOG}


def all_alerts(table: CheckTable, options: RenderOptions | None = None) -> list[dict[str, Any]]:
    """Every alerting rule body across the rendered groups."""
    return [r for g in rule_groups(table, options) for r in g["rules"] if "alert" in r]


def anchors(markdown: str) -> set[str]:
    """Every explicit anchor id in a runbook text."""
    return set(_ANCHOR.findall(markdown))


def events_to_observations(events: Iterable[Event], clock: Callable[[], float] | None = None,
                           server: ServerState | None = None) -> Iterator[Observation]:
    """Observations for `events`; times from the log unless a clock is given (live data)."""
    return EventConverter(clock, server).convert_all(events)
