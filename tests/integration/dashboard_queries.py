"""The shipped dashboards' queries made concrete for a live Prometheus: Grafana's variables replaced,
`or` branches split, and which SGLang names the recorded 0.5.23 exposition has (shared by the integration
tests of the dashboards and of the harness)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conformance import promql
from integration.standin_sglang import METRICS_FILE

DASHBOARDS = promql.DASHBOARDS


# Grafana's built-in variables, given concrete values; every dashboard variable becomes `.*`.
BUILTINS = {"__rate_interval": "15s", "__interval": "2s", "__range": "1m", "__range_s": "60",
            "__interval_ms": "2000", "__range_ms": "60000"}


_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<q>.*),\s*(?P<label>\w+)\s*\)\s*$", re.S)


def concrete(expr: str) -> str:
    """`expr` with Grafana variables replaced: built-ins by durations, dashboard variables by `.*`."""
    return promql.concrete(expr, BUILTINS)


def dashboard_files() -> list[Path]:
    """The shipped dashboards."""
    return sorted(DASHBOARDS.glob("*.json"))


def queries(dash: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    for p in promql.panels(dash):
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
