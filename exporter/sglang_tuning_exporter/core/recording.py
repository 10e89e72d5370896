"""Recording-rule names: the contract between `render` (which writes the rules) and the fleet report
(which reads them when a store keeps only recorded series)."""

from __future__ import annotations

from sglang_tuning_exporter.core.durations import promql_duration

RECORDING_WINDOW_S = 300.0


def recorded(stem: str, fn: str = "rate", window_s: float = RECORDING_WINDOW_S) -> str:
    """The name of a recording rule of recording_group (the fleet report reads them by this name)."""
    return f"instance:sglang_tuning_{stem}:{fn}{promql_duration(window_s)}"
