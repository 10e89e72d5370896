"""The PromQL evaluators of the conformance suite: what the shipped rules, dashboards and fleet report make of
a history of scrapes, computed by the real promtool and a real Prometheus (never re-implemented here).

- `rules_check`: the rendered alert rules (exporter or SGLang-native variant) under `promtool test rules`;
- `PromHistory`: the scrapes backfilled into TSDB blocks (`promtool tsdb create-blocks-from openmetrics`)
  and served by a real Prometheus on loopback, for instant queries;
- `dashboard_values`: every panel target of the shipped dashboards evaluated at one instant;
- `fleet_report`: the `report --format json` document over a range.

Also what the dashboard lints share: `concrete` (Grafana variables), `panels` / `dashboard_targets`. The
backfill and the Prometheus it starts are `helpers/tsdb.py`'s; missing binaries: callers skip with
`helpers.tsdb.missing_prometheus()`.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import re
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import requests
import yaml
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families as text_families

from helpers.paths import ROOT
from helpers.schemas import assert_valid
from helpers.tsdb import PROMTOOL, build_blocks, running_prometheus
from sglang_tuning_exporter.fleet import report
from sglang_tuning_exporter.guide.checks import load_table
from sglang_tuning_exporter.render import rules as render_rules
from sglang_tuning_exporter.render.options import RenderOptions

DASHBOARDS = ROOT / "dashboards"
EXPORTER_JOB = "sglang-tuning-exporter"
SGLANG_JOB = "sglang"

Labels = frozenset[tuple[str, str]]


@dataclass(frozen=True)
class Scrape:
    """One scrape of one target."""

    t: float  # unix seconds
    job: str  # "sglang-tuning-exporter" (our /metrics) or "sglang" (SGLang's own /metrics)
    instance: str
    text: str  # the exposition text the target served


# ----------------------------------------------------------------------------- scrapes -> series


def samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) for every sample of an exposition text (Prometheus text or OpenMetrics)."""
    parse = openmetrics_families if text.rstrip().endswith("# EOF") else text_families
    for fam in parse(text):
        for s in fam.samples:
            yield s.name, dict(s.labels), float(s.value)


def series_of(scrapes: Iterable[Scrape]) -> dict[tuple[str, Labels], dict[float, float]]:
    """Every series the scrapes make, as Prometheus stores them: target labels job and instance added
    (a clashing exposed label becomes exported_<name>, as with honor_labels: false); time -> value."""
    out: dict[tuple[str, Labels], dict[float, float]] = {}
    for sc in scrapes:
        for name, raw, value in samples(sc.text):
            labels = {(f"exported_{k}" if k in ("job", "instance") else k): v for k, v in raw.items() if v != ""}
            labels.update(job=sc.job, instance=sc.instance)
            out.setdefault((name, frozenset(labels.items())), {})[sc.t] = value
    return out


def scrape_interval(scrapes: Iterable[Scrape]) -> float:
    """The scrape interval: the greatest common step of the scrape times (whole seconds)."""
    times = sorted({round(s.t) for s in scrapes})
    step = 0
    for a, b in itertools.pairwise(times):
        step = math.gcd(step, b - a)
    if step <= 0:
        raise ValueError("a history needs at least two scrape times")
    return float(step)


def selector(name: str, labels: Labels) -> str:
    """`name{k="v",...}` in PromQL/promtool series notation (sorted labels)."""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels))
    return f"{name}{{{inner}}}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt(v: float) -> str:
    return repr(v) if not float(v).is_integer() else str(int(v))


# ----------------------------------------------------------------------------- promtool rule tests


def rendered_rules(tmp: Path, *, native: bool) -> list[str]:
    """Write the shipped rule files (rendered from the table with default options) into `tmp`; returns the
    file names of the variant: the exporter's groups, or the SGLang-native group."""
    files = render_rules.generate(load_table(), RenderOptions())
    names = []
    for rel, text in files.items():
        name = Path(rel).name
        (tmp / name).write_text(text, encoding="utf-8")
        if (name == "native.rules.yaml") == native:
            names.append(name)
    return names


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def _firing(alertname: str, subset: Mapping[str, str] | None = None) -> str:
    matchers = [f"alertname={json.dumps(alertname)}", 'alertstate="firing"']
    matchers += [f"{k}={json.dumps(v)}" for k, v in sorted((subset or {}).items())]
    return f"ALERTS{{{','.join(matchers)}}}"


def rules_check(scrapes: list[Scrape], at: float, expected: dict[str, list[dict[str, str]]], tmp: Path, *,
                native: bool = False) -> None:
    """`promtool test rules` on the rendered rules over the scrapes: at `at`, each alert named in `expected`
    fires exactly as often as listed, each listed label subset on exactly one firing alert (an empty list:
    it must not fire). Raises AssertionError with promtool's output (and what did fire) when it disagrees."""
    tmp.mkdir(parents=True, exist_ok=True)
    rule_files = rendered_rules(tmp, native=native)
    t0 = min(s.t for s in scrapes)
    step = scrape_interval(scrapes)
    if at < t0:
        raise ValueError("`at` is before the first scrape")
    input_series = []
    for (name, labels), points in sorted(series_of(scrapes).items(), key=lambda kv: selector(*kv[0])):
        last = max(points)
        slots = [t0 + i * step for i in range(round((last - t0) / step) + 1)]
        values = [_fmt(points[t]) if t in points else "_" for t in slots]
        input_series.append({"series": selector(name, labels), "values": " ".join(values)})
    eval_time = f"{round(at - t0)}s"
    exprs = []
    for alert, subsets in sorted(expected.items()):
        total = [{"labels": "{}", "value": len(subsets)}] if subsets else []
        exprs.append({"expr": f"count({_firing(alert)})", "eval_time": eval_time, "exp_samples": total})
        exprs += [{"expr": f"count({_firing(alert, sub)})", "eval_time": eval_time,
                   "exp_samples": [{"labels": "{}", "value": 1}]} for sub in subsets]
    case: dict[str, Any] = {"interval": f"{round(step)}s", "input_series": input_series, "promql_expr_test": exprs}
    test = {"rule_files": rule_files, "evaluation_interval": f"{round(step)}s", "tests": [case]}
    path = tmp / "conformance.test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False), encoding="utf-8")
    res = _run([PROMTOOL, "test", "rules", path.name], tmp)
    if res.returncode == 0:
        return
    # Name what did fire: a second run whose only expectation (nothing) fails and prints the alerts.
    names = "|".join(re.escape(a) for a in expected)
    case["promql_expr_test"] = [{"expr": f'ALERTS{{alertname=~"{names}",alertstate="firing"}}',
                                 "eval_time": eval_time, "exp_samples": []}]
    path.write_text(yaml.safe_dump(test, sort_keys=False), encoding="utf-8")
    got = _run([PROMTOOL, "test", "rules", path.name], tmp)
    raise AssertionError(f"promtool test rules disagrees ({'native' if native else 'exporter'} rules):\n"
                         f"{res.stdout}{res.stderr}\n--- firing at {eval_time}:\n{got.stdout}{got.stderr}")


# ----------------------------------------------------------------------------- a real Prometheus


def write_openmetrics(scrapes: Iterable[Scrape], path: Path) -> None:
    """The scrapes as one OpenMetrics document with timestamps (each series contiguous, in time order;
    untyped families, so any sample name is accepted as Prometheus stored it)."""
    by_name: dict[str, list[tuple[Labels, dict[float, float]]]] = {}
    for (name, labels), points in series_of(scrapes).items():
        by_name.setdefault(name, []).append((labels, points))
    with path.open("w", encoding="utf-8") as out:
        for name in sorted(by_name):
            out.write(f"# TYPE {name} unknown\n")
            for labels, points in sorted(by_name[name], key=lambda lp: sorted(lp[0])):
                sel = selector(name, labels)
                out.writelines(f"{sel} {v!r} {t:.3f}\n" for t, v in sorted(points.items()))
        out.write("# EOF\n")


class PromHistory:
    """The scrapes backfilled into a real Prometheus started on loopback (a context manager)."""

    def __init__(self, scrapes: list[Scrape], tmp: Path) -> None:
        self.scrapes = scrapes
        self.tmp = tmp
        self.interval_s = scrape_interval(scrapes)
        self.url = ""
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> PromHistory:
        self.tmp.mkdir(parents=True, exist_ok=True)
        om = self.tmp / "history.om"
        write_openmetrics(self.scrapes, om)
        build_blocks([om], self.tmp / "data")
        self.url = self._stack.enter_context(running_prometheus(self.tmp / "data"))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stack.close()

    def query(self, expr: str, at: float) -> dict[Labels, float]:
        """An instant query at `at`: labels -> value (a scalar answer is keyed by no labels)."""
        resp = requests.get(f"{self.url}/api/v1/query", params={"query": expr, "time": f"{at:.3f}"}, timeout=60)
        body = resp.json()
        if body.get("status") != "success":
            raise AssertionError(f"Prometheus rejected {expr!r}: {body.get('error')}")
        data = body["data"]
        if data["resultType"] == "scalar":
            return {frozenset(): float(data["result"][1])}
        return {frozenset(r["metric"].items()): float(r["value"][1]) for r in data["result"]}


# ----------------------------------------------------------------------------- dashboards

_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")


def grafana_builtins(scrape_interval_s: float) -> dict[str, str]:
    """Grafana's built-in variables for a data source scraped every `scrape_interval_s`:
    $__rate_interval = max($__interval + scrape interval, 4 x scrape interval), $__interval = the interval."""
    s = round(scrape_interval_s)
    return {"__rate_interval": f"{4 * s}s", "__interval": f"{s}s", "__range": "1h", "__range_s": "3600",
            "__interval_ms": str(1000 * s), "__range_ms": "3600000"}


def concrete(expr: str, builtins: Mapping[str, str]) -> str:
    """`expr` with Grafana variables replaced: built-ins by durations, dashboard variables by their
    "All" value `.*` (every variable of the shipped dashboards has allValue `.*`)."""
    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name.isdigit():
            return m.group(0)  # `$1` is label_replace's capture; Grafana leaves names no variable has
        return builtins.get(name, ".*")
    return _VAR.sub(sub, expr)


def panels(node: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in rows."""
    for p in node.get("panels") or []:
        yield p
        yield from panels(p)


def load_dashboard(path: Path) -> dict[str, Any]:
    """A dashboard model (a provisioning wrapper or the bare model)."""
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    inner: dict[str, Any] = data.get("dashboard", data)
    return inner


def dashboard_targets() -> Iterator[tuple[str, str]]:
    """("dashboard/panel title/refId", PromQL with variables) for every panel target of every dashboard."""
    for path in sorted(DASHBOARDS.glob("*.json")):
        for p in panels(load_dashboard(path)):
            for t in p.get("targets") or []:
                if t.get("expr"):
                    yield f"{path.stem}/{p.get('title')}/{t.get('refId', '')}", t["expr"]


def dashboard_values(prom: PromHistory, at: float) -> dict[str, dict[Labels, float]]:
    """Every panel target expression of every shipped dashboard at `at` (variables at "All", Grafana's
    rate interval for the history's scrape interval), keyed "dashboard/panel title/refId"."""
    builtins = grafana_builtins(prom.interval_s)
    return {key: prom.query(concrete(expr, builtins), at) for key, expr in dashboard_targets()}


# ----------------------------------------------------------------------------- the fleet report


def fleet_report(prom: PromHistory, start: float, end: float, selector: str = "") -> dict[str, Any]:
    """The report's JSON document (`report --format json`) run against that Prometheus over [start, end], on the
    series `selector` picks (all without one)."""
    out = prom.tmp / f"report-{round(start)}-{round(end)}-{len(selector)}.json"
    parser = argparse.ArgumentParser(prog="report")
    report.add_arguments(parser)
    code = report.run(parser.parse_args(["--prometheus.url", prom.url, "--range", f"{round(end - start)}s",
                                         "--end", f"{end:.3f}", "--format", "json", "--output", str(out),
                                         *(["--selector", selector] if selector else [])]))
    if code != 0:
        raise AssertionError(f"report exited with {code}")
    doc: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    assert_valid(doc, "report")  # the published contract, docs/schemas/report.schema.json
    return doc


SCRAPE_STEP_S = 15.0  # the scrape interval of the synthetic histories


def tolerance(rate_per_min: float, window_s: float, step_s: float = SCRAPE_STEP_S) -> float:
    """How far PromQL's rate() may be from the true rate of evenly spaced events (docs/signals.md): one event
    per window, plus the extrapolation to the window's edges (up to one scrape interval of events)."""
    return 60.0 / window_s + rate_per_min * step_s / window_s
