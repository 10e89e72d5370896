"""One spelling per concept: a flag value, a rank, a status colour, a usage error (issue #27)."""

from __future__ import annotations

import re
from pathlib import Path

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
