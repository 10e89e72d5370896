"""The Python advisor and the generated alert rules agree: the same scenario, fed to `advisor.evaluate`
as signals and to promtool as the exporter's series, gives the same set of firing checks.

The series are what the collector exposes for those signals (sglang_tuning_signal_<unit>, startup gauges in
bytes of GiB, OOM counters, server info/args); promtool evaluates the generated checks group and we
read the firing set back from ALERTS.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from sglang_tuning_exporter.core.catalog import SIGNAL_UNITS
from sglang_tuning_exporter.core.model import Rank, ServerState
from sglang_tuning_exporter.guide import advisor
from sglang_tuning_exporter.guide.checks import CheckTable, load_table
from sglang_tuning_exporter.guide.suggest import default_schedule_policy
from sglang_tuning_exporter.render import rules as render_rules
from sglang_tuning_exporter.render.expressions import checks_in_scope, levels
from sglang_tuning_exporter.render.options import RenderOptions

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian: prometheus)")

GIB = float(1 << 30)
EVAL_MIN = 40  # minutes: past the longest `for:` (30m) with the condition true from t=0
WINDOWED = ("queue_empty_ratio", "queue_over_band_ratio", "kv_underused_ratio", "retractions_per_minute",
            "cuda_graph_miss_ratio", "running_capped_ratio", "prefix_cache_hit_ratio", "decode_batch_p90")
# Enough samples that no windowed signal is "unknown" in the advisor.
COUNTS = {"queue_samples": 100.0, "kv_samples": 100.0, "graph_samples": 100.0, "decode_samples": 100.0,
          "prefill_samples": 100.0}
JOB = "sglang-tuning-exporter"
INSTANCE = "gpu-a:9470"


Scenario = dict[str, Any]  # {"ranks": {Rank: {signal: value}}, "args": {...}}


def _rank_labels(rank: Rank) -> str:
    labels = {"job": JOB, "instance": INSTANCE, "model_name": "qwen", **rank.labels()}
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


def series_for(scenario: Scenario) -> list[dict[str, str]]:
    """The exporter's /metrics for a scenario, as promtool input series."""
    n = EVAL_MIN + 5
    out: list[dict[str, str]] = []
    for rank, sig in scenario["ranks"].items():
        lab = _rank_labels(rank)
        for name, count in {**COUNTS, **{k: v for k, v in sig.items() if k in COUNTS}}.items():
            family, label, _ = SIGNAL_UNITS[name]  # the sample counts the rules gate each check on
            out.append({"series": f'sglang_tuning_{family}{{{lab},signal="{label}"}}', "values": f"{count!r}x{n}"})
        for name in WINDOWED:
            if sig.get(name) is not None:
                family, label, scale = SIGNAL_UNITS[name]  # as the collector exports it
                out.append({"series": f'sglang_tuning_{family}{{{lab},signal="{label}"}}',
                            "values": f"{sig[name] * scale!r}x{n}"})
        if sig.get("available_gpu_mem_gb") is not None:
            out.append({"series": f"sglang_tuning_available_gpu_memory_bytes{{{lab}}}",
                        "values": f"{sig['available_gpu_mem_gb'] * GIB}x{n}"})
        if sig.get("cuda_graph_max_bs_captured") is not None:
            out.append({"series": f"sglang_tuning_cuda_graph_max_batch_size{{{lab}}}",
                        "values": f"{sig['cuda_graph_max_bs_captured']}x{n}"})
        if sig.get("max_running_requests") is not None:
            out.append({"series": f"sglang_tuning_max_running_requests{{{lab}}}",
                        "values": f"{sig['max_running_requests']}x{n}"})
        for phase in ("startup", "prefill", "decode", "unknown"):
            count = sig.get(f"oom_{phase}_count")
            if count is not None:
                # zero first, then the errors 5 minutes before the evaluation (inside the 10m window)
                out.append({"series": f'sglang_tuning_oom_events_total{{{lab},phase="{phase}"}}',
                            "values": f"0x{EVAL_MIN - 5} {count}x10"})
    host = f'job="{JOB}",instance="{INSTANCE}"'
    # as collector.py: the info metric carries the effective policy (the args', else the version's default)
    policy = scenario["args"].get("schedule_policy") or default_schedule_policy("0.5.23") or ""
    out.append({"series": f'sglang_tuning_server_info{{{host},model_name="qwen",version="0.5.23",'
                          f'schedule_policy="{policy}"}}', "values": f"1x{n}"})
    enabled = scenario["args"].get("enable_metrics")
    if enabled is not None:
        out.append({"series": f'sglang_tuning_server_arg{{{host},arg="enable_metrics"}}',
                    "values": f"{1 if enabled else 0}x{n}"})
    return out


def advisor_firing(table: CheckTable, scenario: Scenario) -> set[str]:
    """Checks the Python advisor reports as warning or critical on any rank."""
    signals = {}
    for rank, sig in scenario["ranks"].items():
        s = {**COUNTS, **sig}
        cap, mrr = s.get("cuda_graph_max_bs_captured"), s.get("max_running_requests")
        if cap is not None and mrr:
            s["cuda_graph_ceiling_ratio"] = cap / mrr  # the signal window derives it the same way
        signals[rank] = s
    server = ServerState(version="0.5.23", args=dict(scenario["args"]), model_name="qwen")
    findings = advisor.evaluate(table, signals, server, workload="throughput")
    return {f.check for f in findings if f.status in ("warning", "critical")}


R0, R1 = Rank(dp=0, tp=0), Rank(dp=1, tp=0)
HEALTHY = {"queue_empty_ratio": 0.1, "queue_over_band_ratio": 0.0, "kv_underused_ratio": 0.1,
           "retractions_per_minute": 0.3, "cuda_graph_miss_ratio": 0.0, "running_capped_ratio": 0.1,
           "prefix_cache_hit_ratio": 0.3, "available_gpu_mem_gb": 6.5, "cuda_graph_max_bs_captured": 256.0,
           "max_running_requests": 256.0, "oom_startup_count": 0.0, "oom_prefill_count": 0.0,
           "oom_decode_count": 0.0, "oom_unknown_count": 0.0}
OK_ARGS = {"schedule_policy": "fcfs", "enable_metrics": True}


def _with(**changes: float) -> dict[str, float]:
    return {**HEALTHY, **changes}


SCENARIOS: dict[str, Scenario] = {
    "healthy": {"ranks": {R0: HEALTHY}, "args": OK_ARGS},
    "client too slow": {"ranks": {R0: _with(queue_empty_ratio=0.8)}, "args": OK_ARGS},
    "queue-empty explained by graph misses": {"ranks": {R0: _with(queue_empty_ratio=0.8, cuda_graph_miss_ratio=0.3)},
                                              "args": OK_ARGS},
    "queue-empty explained by a low ceiling": {
        "ranks": {R0: _with(queue_empty_ratio=0.8, cuda_graph_max_bs_captured=8.0)}, "args": OK_ARGS},
    "overloaded on one DP rank": {"ranks": {R0: HEALTHY, R1: _with(queue_over_band_ratio=0.95)}, "args": OK_ARGS},
    "too conservative": {"ranks": {R0: _with(kv_underused_ratio=0.7, running_capped_ratio=0.8)}, "args": OK_ARGS},
    "retracting": {"ranks": {R0: _with(retractions_per_minute=7.0)}, "args": OK_ARGS},
    "retractions exactly at 1/min": {"ranks": {R0: _with(retractions_per_minute=1.0)}, "args": OK_ARGS},
    "headroom too high": {"ranks": {R0: _with(available_gpu_mem_gb=13.5)}, "args": OK_ARGS},
    "headroom 10 GB is not above 10": {"ranks": {R0: _with(available_gpu_mem_gb=10.0)}, "args": OK_ARGS},
    "headroom just under 5 GB": {"ranks": {R0: _with(available_gpu_mem_gb=4.9)}, "args": OK_ARGS},
    "out of memory everywhere": {"ranks": {R0: _with(oom_startup_count=1.0, oom_prefill_count=2.0,
                                                     oom_decode_count=1.0, oom_unknown_count=1.0)},
                                 "args": OK_ARGS},
    "lpm without reuse": {"ranks": {R0: _with(prefix_cache_hit_ratio=0.02)},
                          "args": {"schedule_policy": "lpm", "enable_metrics": True}},
    "fcfs with reuse": {"ranks": {R0: _with(prefix_cache_hit_ratio=0.7)}, "args": OK_ARGS},
    "metrics disabled": {"ranks": {R0: HEALTHY}, "args": {"schedule_policy": "fcfs", "enable_metrics": False}},
    "signals unknown": {"ranks": {R0: {"available_gpu_mem_gb": 6.5}}, "args": OK_ARGS},
}


def random_scenarios(table: CheckTable, n: int, seed: int) -> dict[str, Scenario]:
    """Scenarios with every signal drawn at, just below, just above or far from a threshold."""
    rng = random.Random(seed)
    points: dict[str, list[float]] = {}
    opts = RenderOptions()
    for c in checks_in_scope(table, opts):
        for _, th in levels(c, table, opts):
            points.setdefault(c.signal, []).extend([th, th * 0.9, th * 1.1 + 0.01, th * 3 + 1, 0.0])
    out: dict[str, Scenario] = {}
    for i in range(n):
        sig = dict(HEALTHY)
        for name in ("queue_empty_ratio", "queue_over_band_ratio", "kv_underused_ratio", "retractions_per_minute",
                     "cuda_graph_miss_ratio", "running_capped_ratio", "prefix_cache_hit_ratio",
                     "available_gpu_mem_gb", "oom_prefill_count", "oom_decode_count"):
            if name in points and rng.random() < 0.5:
                v = rng.choice(points[name])
                sig[name] = min(v, 1.0) if name.endswith("_ratio") else v
        if rng.random() < 0.3:
            sig["cuda_graph_max_bs_captured"] = rng.choice([8.0, 64.0, 160.0])
        args = {"schedule_policy": rng.choice(["lpm", "fcfs"]), "enable_metrics": rng.random() < 0.8}
        out[f"random {i}"] = {"ranks": {R0: sig}, "args": args}
    return out


def promtool_cases(table: CheckTable, scenarios: dict[str, Scenario]) -> list[dict[str, Any]]:
    """One promtool test per scenario: the firing set in ALERTS must equal the advisor's."""
    cases = []
    for name, sc in scenarios.items():
        expected = sorted(advisor_firing(table, sc))
        cases.append({"name": name, "interval": "1m", "input_series": series_for(sc),
                      "promql_expr_test": [{
                          "expr": 'max by (check) (ALERTS{alertstate="firing"})',
                          "eval_time": f"{EVAL_MIN}m",
                          "exp_samples": [{"labels": f'{{check="{c}"}}', "value": 1} for c in expected]}]})
    return cases


def run_promtool(tmp_path: Path, table: CheckTable, scenarios: dict[str, Scenario]) -> subprocess.CompletedProcess[str]:
    """Generate the checks group and the test file in tmp_path, run promtool test rules."""
    rules = render_rules.generate(table, RenderOptions())["alerts/checks.rules.yaml"]
    (tmp_path / "checks.rules.yaml").write_text(rules, encoding="utf-8")
    doc = {"rule_files": ["checks.rules.yaml"], "evaluation_interval": "1m",
           "tests": promtool_cases(table, scenarios)}
    (tmp_path / "consistency.test.yaml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return subprocess.run([str(PROMTOOL), "test", "rules", "consistency.test.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.integration
def test_named_scenarios_agree(tmp_path: Path) -> None:
    """Hand-picked scenarios (boundaries, suppression, unknowns, per-rank) give the same verdicts."""
    table = load_table()
    # the scenarios must exercise both sides: something fires, something stays silent
    firing = {name: advisor_firing(table, sc) for name, sc in SCENARIOS.items()}
    assert firing["healthy"] == set() and firing["signals unknown"] == set()
    assert firing["client too slow"] == {"queue_empty"}
    assert "queue_empty" not in firing["queue-empty explained by graph misses"]
    assert firing["out of memory everywhere"] >= {"prefill_oom", "decode_oom", "startup_mem_fraction_too_small"}
    res = run_promtool(tmp_path, table, SCENARIOS)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.integration
def test_random_scenarios_near_thresholds_agree(tmp_path: Path) -> None:
    """Seeded scenarios drawn at and around every threshold give the same verdicts."""
    table = load_table()
    scenarios = random_scenarios(table, 16, seed=20251122)
    assert any(advisor_firing(table, sc) for sc in scenarios.values())
    res = run_promtool(tmp_path, table, scenarios)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.integration
def test_policy_known_only_from_the_version(tmp_path: Path) -> None:
    """Server args without schedule_policy on 0.5.23: both sides should judge fcfs with prefix reuse."""
    table = load_table()
    scenario = {"ranks": {R0: _with(prefix_cache_hit_ratio=0.7)}, "args": {"enable_metrics": True}}
    assert advisor_firing(table, scenario) == {"schedule_policy_fcfs_with_reuse"}
    res = run_promtool(tmp_path, table, {"policy from version": scenario})
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.integration
def test_the_comparison_can_fail(tmp_path: Path) -> None:
    """A deliberately wrong expectation is reported by promtool (the harness is not vacuous)."""
    table = load_table()
    cases = promtool_cases(table, {"client too slow": SCENARIOS["client too slow"]})
    cases[0]["promql_expr_test"][0]["exp_samples"] = []
    rules = render_rules.generate(table, RenderOptions())["alerts/checks.rules.yaml"]
    (tmp_path / "checks.rules.yaml").write_text(rules, encoding="utf-8")
    (tmp_path / "t.yaml").write_text(yaml.safe_dump({"rule_files": ["checks.rules.yaml"], "evaluation_interval": "1m",
                                                     "tests": cases}), encoding="utf-8")
    res = subprocess.run([str(PROMTOOL), "test", "rules", "t.yaml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode != 0 and 'check="queue_empty"' in res.stdout + res.stderr
