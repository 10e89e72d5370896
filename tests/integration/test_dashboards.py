"""Every PromQL query of the shipped dashboards runs against the live stack; per-server panels show data."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conformance import promql
from integration.conftest import RunningStack
from integration.dashboard_queries import (
    DASHBOARDS,
    _load,
    concrete,
    dashboard_files,
    older_release_fallback,
    or_branches,
    queries,
    recorded_sglang_names,
)
from integration.stack import PromQLError

pytestmark = pytest.mark.integration

panels = promql.panels








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
