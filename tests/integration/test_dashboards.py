"""Every PromQL query of the shipped dashboards runs against the live stack; per-server panels show data."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.conftest import RunningStack
from integration.harness import ROOT
from integration.stack import PromQLError, wait_for

pytestmark = pytest.mark.integration

DASHBOARDS = ROOT / "dashboards"
# Grafana's built-in variables, given concrete values; every dashboard variable becomes `.*`.
BUILTINS = {"__rate_interval": "15s", "__interval": "2s", "__range": "1m", "__range_s": "60",
            "__interval_ms": "2000", "__range_ms": "60000"}
_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")
_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<q>.*),\s*(?P<label>\w+)\s*\)\s*$", re.S)


def concrete(expr: str) -> str:
    """`expr` with Grafana variables replaced: built-ins by durations, dashboard variables by `.*`."""
    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        return BUILTINS.get(name, ".*")
    return _VAR.sub(sub, expr)


def panels(node: Any) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in rows."""
    for p in node.get("panels") or []:
        yield p
        yield from panels(p)


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


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    inner: dict[str, Any] = data.get("dashboard", data)  # a provisioning wrapper or the bare model
    return inner


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


def _per_server() -> list[Path]:
    return [p for p in dashboard_files() if "fleet" not in p.name]


@pytest.mark.parametrize("path", _per_server(), ids=lambda p: p.name)
def test_per_server_panels_return_data(running_stack: RunningStack, path: Path) -> None:
    """Every panel of the per-server dashboard shows data for the running scenarios."""
    stack = running_stack.stack
    dash = _load(path)
    # the data a dashboard needs builds up over the scenarios' first seconds
    wait_for(lambda: time.monotonic() - running_stack.started > 40, running_stack.deadline(40), interval_s=1)
    empty = []
    for p in panels(dash):
        exprs = [t["expr"] for t in p.get("targets") or [] if t.get("expr")]
        if not exprs:
            continue
        end = time.time()
        if not any(stack.query_range(concrete(e), end - 60, end, 2) for e in exprs):
            empty.append(f"{p.get('title')!r}: " + " | ".join(concrete(e) for e in exprs))
    assert not empty, f"{path.name}: panels without data:\n" + "\n".join(empty)
