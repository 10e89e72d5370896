"""The one duration grammar shared by serve flags, report flags and render options."""

from __future__ import annotations

import pytest

from sglang_tuning_exporter.core.durations import parse_duration, promql_duration
from sglang_tuning_exporter.core.flags import duration_flag
from sglang_tuning_exporter.fleet import report
from sglang_tuning_exporter.render import options as render_options
from sglang_tuning_exporter.sidecar import serveconfig


@pytest.mark.parametrize(("seconds", "text"), [(600, "10m"), (90, "90s"), (3600, "1h"), (5400, "90m")])
def test_promql_durations_round_trip(seconds: float, text: str) -> None:
    """The rules write whole seconds in the largest unit that divides them, read back by the parser."""
    assert promql_duration(seconds) == text
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("text", "seconds"), [
    ("500ms", 0.5), ("30s", 30), ("10m", 600), ("1h30m", 5400), ("1d12h", 129600), ("1w", 604800),
    ("1y", 31536000), ("1.5m", 90), (" 2h ", 7200), ("1h0m30s", 3630), ("1s500ms", 1.5), ("0s", 0)])
def test_prometheus_durations(text: str, seconds: float) -> None:
    """Prometheus's units, largest first, compound, with decimals."""
    assert parse_duration(text) == seconds
    assert parse_duration(text, bare_seconds=False) == seconds


@pytest.mark.parametrize("bad", ["", "soon", "5 minutes", "30 s", "30m1h", "1h1h", "-1s", "1e3s", "d7", "7days",
                                 "nan", "inf"])
def test_what_is_not_a_duration(bad: str) -> None:
    """Gaps, units out of order or repeated, signs, exponents and words are errors, never guesses."""
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(bad)


def test_bare_numbers_are_seconds_where_allowed() -> None:
    """`2` and 2.5 are seconds for serve and render options; report's ranges need a unit."""
    assert parse_duration("2") == 2 and parse_duration(2.5) == 2.5
    for bad in ("7", 7, float("inf"), -1):
        with pytest.raises(ValueError):
            parse_duration(bad, bare_seconds=False)
    with pytest.raises(ValueError):
        parse_duration(-3)


def test_every_caller_uses_it() -> None:
    """serve, report and render options read durations alike (report also wants > 0 and a unit)."""
    assert serveconfig.duration_flag is duration_flag and report.duration_flag is duration_flag
    assert render_options.parse_duration is parse_duration
    assert report.parse_duration("1d12h") == parse_duration("1d12h")
    for bad in ("7", "0s"):
        with pytest.raises(report.UsageError):
            report.parse_duration(bad)
