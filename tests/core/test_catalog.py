"""The catalog's signal units: the one table the collector, the dashboards and the fleet report convert by."""

from __future__ import annotations

import re

import pytest

from helpers.paths import ROOT
from sglang_tuning_exporter.core.catalog import (
    BY_NAME,
    PREFIX,
    SIGNAL_FAMILIES,
    SIGNAL_FAMILY_UNITS,
    SIGNAL_UNITS,
)
from sglang_tuning_exporter.fleet.queries import sidecar_signals_expr
from sglang_tuning_exporter.pipeline.signals import SIGNAL_NAMES
from sglang_tuning_exporter.render.dashboards import worst_signal_expr


def _documented_signals() -> set[str]:
    text = (ROOT / "docs" / "signals.md").read_text(encoding="utf-8")
    section = text[text.index("## The signals"):]
    section = section[:section.index("\n## ", 1)]
    return {m.group(1) for m in re.finditer(r"^\| `([a-z0-9_]+)`", section, re.M)}


def test_every_signal_has_a_unit() -> None:
    """A signal computed (pipeline/signals.py) or documented (docs/signals.md) without a unit family fails."""
    documented = _documented_signals()
    assert len(documented) >= 20  # the table was read, not an empty section
    assert set(SIGNAL_NAMES) == set(SIGNAL_UNITS), set(SIGNAL_NAMES) ^ set(SIGNAL_UNITS)
    assert documented <= set(SIGNAL_UNITS), documented - set(SIGNAL_UNITS)
    assert {family for family, _, _ in SIGNAL_UNITS.values()} == set(SIGNAL_FAMILIES)


def test_each_family_converts_back_to_the_docs_unit() -> None:
    """The exported label plus the family's suffix is the docs name, the scale is the family's, and its
    PromQL operation undoes the scale (GiB: / 2^30, per minute: * 60)."""
    for name, (family, label, scale) in SIGNAL_UNITS.items():
        unit = SIGNAL_FAMILY_UNITS[family]
        assert label + unit.docs_suffix == name and scale == unit.scale, name
        assert BY_NAME[PREFIX + family].labels[-1] == "signal"
    for family, unit in SIGNAL_FAMILY_UNITS.items():
        op, _, operand = unit.to_docs.partition(" ")
        base, _, power = operand.partition("^")
        number = float(base) ** float(power or 1) if operand else 1.0
        back = 1 / number if op == "/" else number
        assert back * unit.scale == pytest.approx(1.0), family
        assert bool(unit.docs_suffix) <= bool(unit.shown_as), family  # a renamed unit is shown renamed


def test_dashboards_and_report_convert_by_the_table() -> None:
    """Both PromQL readers of the unit families take each family's conversion from the table."""
    report = sidecar_signals_expr("{}", 600.0)
    table = worst_signal_expr(())
    for family, unit in SIGNAL_FAMILY_UNITS.items():
        assert PREFIX + family in report and PREFIX + family in table
        if unit.docs_suffix:
            assert f"{unit.to_docs}, \"signal\", \"${{1}}{unit.docs_suffix}\"" in report, family
        if unit.shown_as:
            assert f"$1 ({unit.shown_as})" in table, family
        if unit.to_docs:
            assert f") {unit.to_docs}, \"signal\"" in table, family
