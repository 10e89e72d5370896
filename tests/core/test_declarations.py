"""Each declaration has its proof and its definition: every event kind a parser test, every signal a row
of docs/signals.md (docs/contracts.md, "How to add ...")."""

from __future__ import annotations

import re
from fnmatch import fnmatchcase

import pytest

from helpers.paths import ROOT, TESTS
from sglang_tuning_exporter.core.catalog import BY_NAME, PREFIX, SIGNAL_UNITS
from sglang_tuning_exporter.core.events import DECODE, KINDS, SPECS, KindSpec, counted, declare
from sglang_tuning_exporter.pipeline.signals import SIGNAL_NAMES


def _signal_rows() -> set[str]:
    """The names docs/signals.md defines in a table row's first cell; `a_{x,y}_b` stands for a_x_b, a_y_b,
    `*_samples` for every name it matches."""
    names: set[str] = set()
    for line in (ROOT / "docs" / "signals.md").read_text(encoding="utf-8").splitlines():
        if not line.startswith("| `"):
            continue
        for name in re.findall(r"`([^`]+)`", line.split("|")[1]):
            m = re.fullmatch(r"(\w*)\{([\w,]+)\}(\w*)", name)
            names.update(f"{m[1]}{x}{m[3]}" for x in m[2].split(",")) if m else names.add(name)
    return names


def test_every_signal_has_its_row_in_docs_signals_md() -> None:
    rows = _signal_rows()
    missing = sorted(s for s in SIGNAL_NAMES if not any(fnmatchcase(s, row) for row in rows))
    assert not missing, f"define these in docs/signals.md: {missing}"


def test_every_event_kind_has_a_parser_test() -> None:
    tests = "".join(p.read_text(encoding="utf-8") for p in (TESTS / "sources").glob("test_*.py"))
    missing = [k for k in KINDS if not re.search(rf"[\"']{re.escape(k)}[\"']", tests)]
    assert not missing, f"no parser test names these kinds: {missing}"


def test_every_declared_rule_reads_its_declared_fields() -> None:
    """A kind's pattern fills exactly the fields it declares; a count's amount is one of them; a counted
    kind's rate is a signal in the per-minute family and its raw counter a catalog metric."""
    for spec in SPECS.values():
        if spec.pattern is not None:
            assert set(re.compile(spec.pattern).groupindex) == set(spec.fields), spec.name
        if spec.count is not None:
            assert spec.count.amount is None or spec.count.amount in spec.fields, spec.name
    for spec in counted():
        assert spec.count is not None
        assert SIGNAL_UNITS[f"{spec.count.name}_per_minute"][0] == "signal_per_second", spec.name
        assert BY_NAME[f"{PREFIX}{spec.count.name}_total"].type == "counter", spec.name


def test_a_kind_is_declared_once() -> None:
    """`declare` refuses a second kind of the same name and a pattern without its gate."""
    with pytest.raises(ValueError):
        declare(KindSpec(DECODE))
    with pytest.raises(ValueError):
        declare(KindSpec("gateless", pattern="x"))
