"""Every PromQL query of the shipped dashboards runs against the live stack; per-server panels show data."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conformance import promql
from integration.conftest import RunningStack
from integration.stack import PromQLError
from integration.standin_sglang import METRICS_FILE

pytestmark = pytest.mark.integration

DASHBOARDS = promql.DASHBOARDS
# Grafana's built-in variables, given concrete values; every dashboard variable becomes `.*`.
BUILTINS = {"__rate_interval": "15s", "__interval": "2s", "__range": "1m", "__range_s": "60",
            "__interval_ms": "2000", "__range_ms": "60000"}
_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<q>.*),\s*(?P<label>\w+)\s*\)\s*$", re.S)


def concrete(expr: str) -> str:
    """`expr` with Grafana variables replaced: built-ins by durations, dashboard variables by `.*`."""
    return promql.concrete(expr, BUILTINS)


panels = promql.panels


def dashboard_files() -> list[Path]:
    """The shipped dashboards."""
    return sorted(DASHBOARDS.glob("*.json"))


def queries(dash: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    for p in panels(dash):
        for t in p.get("targets") or []:
            if t.get("expr"):
                yield f"panel {p.get('title')!r} {t.get('refId', '')}", t["expr"]
    for v in (dash.get("templating") or {}).get("list") or []:
        if v.get("type") != "query":
            continue
        q = v.get("query")
        text = q.get("query") if isinstance(q, dict) else q
        m = _LABEL_VALUES.match(text or "")
        if m:
            yield f"variable {v['name']}", m["q"]
        elif text and not text.startswith(("label_names", "metrics(", "query_result(")):
            yield f"variable {v['name']}", text


_load = promql.load_dashboard


def test_dashboards_are_shipped() -> None:
    """The dashboards folder holds dashboards with PromQL to check (so the tests below are not vacuous)."""
    files = dashboard_files()
    assert files, f"no dashboards in {DASHBOARDS}"
    assert all(list(queries(_load(p))) for p in files)


@pytest.mark.parametrize("path", dashboard_files(), ids=lambda p: p.name)
def test_dashboard_queries_run(running_stack: RunningStack, path: Path) -> None:
    """No query of the dashboard errors in Prometheus (with variables set to `.*`)."""
    stack = running_stack.stack
    errors = []
    for where, expr in queries(_load(path)):
        try:
            stack.query(concrete(expr))
        except PromQLError as exc:
            errors.append(f"{where}: {exc.error}\n    {concrete(expr)}")
    assert not errors, f"{path.name}: queries Prometheus rejects:\n" + "\n".join(errors)


def or_branches(expr: str) -> list[str]:
    """The operands of top-level `or` in `expr` (a fallback branch must not hide a broken one)."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(expr):
        c = expr[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == '"':
            i = expr.index('"', i + 1)  # skip label values (no escaped quotes in our queries)
        elif depth == 0 and re.match(r"\sor\s", expr[i:i + 4]):
            parts.append(expr[start:i].strip())
            start = i + 4
            i += 3
        i += 1
    parts.append(expr[start:].strip())
    return [p for p in parts if p]


_SGLANG_NAME = re.compile(r"sglang(?:\[:_\]|:|_)(?!tuning_)([a-z][a-z0-9_]*)")


def recorded_sglang_names() -> set[str]:
    """SGLang sample names (without prefix) the recorded 0.5.23 exposition has."""
    text = METRICS_FILE.read_text(encoding="utf-8")
    return {m[1] for m in re.finditer(r"^sglang:([a-z0-9_]+)", text, re.M)}


def older_release_fallback(branch: str, recorded: set[str]) -> bool:
    """True for a branch reading only SGLang metrics that 0.5.23 no longer has (no data expected)."""
    if "sglang_tuning_" in branch:
        return False
    names = set(_SGLANG_NAME.findall(branch))
    return bool(names) and not names & recorded


def _per_server() -> list[Path]:
    return [p for p in dashboard_files() if "fleet" not in p.name]


@pytest.mark.parametrize("path", _per_server(), ids=lambda p: p.name)
def test_per_server_panels_return_data(running_stack: RunningStack, path: Path) -> None:
    """Every query of the per-server dashboard, and each `or` branch of it, returns data for the scenarios.

    The stack runs servers with the exporter and servers without it, so both an exporter branch and
    its SGLang-native fallback must find series; a renamed metric cannot hide behind its fallback.
    Only branches for metrics older SGLang releases had (absent from 0.5.23) may be empty.
    """
    stack = running_stack.stack
    dash = _load(path)
    # the data a dashboard needs builds up over the scenarios' first seconds
    time.sleep(running_stack.deadline(40))
    empty = []
    recorded = recorded_sglang_names()
    for p in panels(dash):
        for t in p.get("targets") or []:
            if not t.get("expr"):
                continue
            end = time.time()
            for branch in or_branches(concrete(t["expr"])):
                if older_release_fallback(branch, recorded):
                    continue  # e.g. sglang:total_retracted_reqs (0.4.10-0.5.2): the stand-in is 0.5.23
                if not stack.query_range(branch, end - 60, end, 2):
                    empty.append(f"{p.get('title')!r} {t.get('refId', '')}: {branch}")
    assert not empty, f"{path.name}: queries without data:\n" + "\n".join(empty)
