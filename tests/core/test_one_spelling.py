"""One spelling per concept: a flag value, a rank, a status colour, a usage error, time text (issue #27)."""

from __future__ import annotations

import re
from pathlib import Path

from sglang_tuning_exporter.core.durations import ago_text, duration_text, iso_time, time_text
from sglang_tuning_exporter.core.model import Finding, Rank, rank_key, rank_text, value_text
from sglang_tuning_exporter.fleet import formats as fleet_formats
from sglang_tuning_exporter.offline import formats as offline_formats

PACKAGE = Path(__file__).resolve().parents[2] / "exporter" / "sglang_tuning_exporter"


def test_a_large_integral_value_is_spelled_as_the_integer_everywhere() -> None:
    assert value_text(2980168.0) == "2980168"  # was `2.98017e+06` in the plan
    assert value_text(0.8600000000000001) == "0.86"
    assert value_text(True) == "true"
    assert value_text(8192) == "8192"


def test_a_rank_reads_the_same_in_every_output() -> None:
    assert rank_text(Rank(dp=1, tp=0)) == rank_text({"dp": 1, "tp": 0}) == "DP1 TP0"
    assert rank_text(Rank()) == rank_text({}) == "the server"
    assert rank_key(Rank(dp=1)) == "dp=1" and rank_key({}) == "all"


def _finding() -> Finding:
    return Finding(check="retractions_frequent", status="critical", rank={}, flag="--max-total-tokens",
                   action="increase", current=2980168.0, suggested=3500000.0, summary="s", evidence="e")


def test_the_change_line_uses_one_arrow_and_one_number_spelling() -> None:
    fleet = fleet_formats.change_text(_finding())
    offline = offline_formats.change_text(_finding())
    for text in (fleet, offline):
        assert "2980168 -> 3500000" in text, text
        assert "→" not in text and "e+06" not in text


def _definitions(pattern: str) -> list[str]:
    rx = re.compile(pattern, re.M)
    return sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if rx.search(p.read_text()))


def test_each_helper_is_defined_once() -> None:
    assert _definitions(r"^class UsageError\b") == ["core/exit_codes.py"]
    assert _definitions(r"^(STATUS_)?COLOU?RS = ") == ["core/model.py"]
    assert _definitions(r"^def _?rank_(text|of_finding)\(") == ["core/model.py"]
    assert _definitions(r"^def (_num|_fmt_value|fmt_value|value_text)\(") == ["core/model.py", "fleet/formats.py"]
    assert _definitions(r"^def finite_number\(") == ["core/model.py"]


def test_time_text_has_one_spelling() -> None:
    """Durations, times and ages a person reads: `12.5 s`, `1.5 min`, `3 h`, `7 d`; RFC 3339 UTC times."""
    assert [duration_text(s) for s in (0.812, 12, 12.5, 90, 600, 5400, 604800, -3)] == [
        "0.812 s", "12 s", "12.5 s", "1.5 min", "10 min", "1.5 h", "7 d", "0 s"]
    assert time_text(1795845600.0) == iso_time(1795845600.0) == "2026-11-28T06:00:00Z"
    assert time_text(3723.0) == "01:02:03" and time_text(None) is None
    assert iso_time(1795845600.25, millis=True) == "2026-11-28T06:00:00.250Z"
    assert ago_text(1795845600.0, 1795845690.0) == "2026-11-28T06:00:00Z (1.5 min ago)"


# A number written with a time unit by hand (`f"{t:.0f} s"`, `f"{s / 60:g} min"`) or a clock formatted by
# hand: core/durations.py spells time text, core/timeparse.py the parser's own stamps (Event.time).
_HAND_UNIT = re.compile(r"\{[^{}\n]+\} (s|ms|min|h|d)\b")
_HAND_CLOCK = re.compile(r"strftime|gmtime|localtime|(?<!from)isoformat\(|fromtimestamp|\{[^{}\n]*/ ?(60|3600|86400)\b")
# render/slo.py: `{le} s` is the SLO's `le` bucket label as SGLang exposes it (`2.0`), or a Helm placeholder.
_ALLOWED = {"core/durations.py", "core/timeparse.py", "render/slo.py"}


def _hand_written(rel: str, line: str) -> bool:
    return rel not in _ALLOWED and bool(_HAND_UNIT.search(line) or _HAND_CLOCK.search(line))


def test_time_text_is_written_by_core_durations_only() -> None:
    """Every page, report, evidence and note spells a duration or a time with core/durations.py."""
    hits = [f"{p.relative_to(PACKAGE)}:{n}: {line.strip()}" for p in sorted(PACKAGE.rglob("*.py"))
            for n, line in enumerate(p.read_text().splitlines(), 1) if _hand_written(str(p.relative_to(PACKAGE)), line)]
    assert hits == []
    templates = list(PACKAGE.rglob("*.j2"))
    assert templates and not [p for p in templates if re.search(r"\}\} ?(s|ms|min|h|d)\b", p.read_text())]
    # the guard sees a new hand-written spelling
    for line in ('x = f"{age:.0f} s ago"', 'x = f"{span / 60:g} min"', 'x = time.strftime("%H:%M", t)',
                 'x = dt.datetime.now().isoformat()'):
        assert _hand_written("sidecar/web.py", line), line
