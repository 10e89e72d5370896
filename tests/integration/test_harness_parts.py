"""Fast checks of the suite's own parts: stand-in exposition, scenario log lines, config rewriting."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from helpers.paths import ROOT
from integration.dashboard_queries import concrete, older_release_fallback, or_branches, recorded_sglang_names
from integration.scenario_log import SCENARIOS, startup_messages, tick_messages, with_prefix
from integration.stack import AM_EXAMPLE, Timing, alertmanager_config, render_rules
from integration.standin_sglang import METRICS_FILE, MetricsState, Selector, spell


class FakeClock:
    """Monotonic time the test moves by hand."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _value(text: str, selector: str) -> float:
    sel = Selector.parse(selector)
    for line in text.splitlines():
        m = re.match(r"^([^\s{]+)(\{[^}]*\})?\s+(\S+)", line)
        if m and not line.startswith("#") and sel.matches(m[1], m[2] or ""):
            return float(m[3])
    raise AssertionError(f"{selector} not in exposition")


def test_counter_grows_in_steps_and_never_back() -> None:
    """The retraction counter grows by whole events (3 requests) at the scenario's rate, across a switch."""
    clock = FakeClock()
    state = MetricsState(METRICS_FILE.read_text(), SCENARIOS["retraction_storm"], clock=clock)
    name = "sglang:num_retracted_requests_total"
    assert _value(state.render(), name) == 3.0  # the recorded value
    clock.t += 1.9  # 2.85 requests' worth: not yet a whole event
    assert _value(state.render(), name) == 3.0
    clock.t += 0.2
    assert _value(state.render(), name) == 6.0
    state.switch(SCENARIOS["healthy"])
    clock.t += 60
    assert _value(state.render(), name) == 6.0


def test_gauge_override_and_underscore_spelling() -> None:
    """Gauges take the scenario's value; the underscore spelling renames samples and HELP/TYPE alike."""
    state = MetricsState(METRICS_FILE.read_text(), SCENARIOS["memory_headroom_low"], spelling="underscore",
                         clock=FakeClock())
    text = state.render()
    assert not re.search(r"^(# (HELP|TYPE) )?sglang:", text, re.M)
    assert "# TYPE sglang_startup_available_gpu_memory_gb gauge" in text
    assert _value(text, "sglang_startup_available_gpu_memory_gb") == 1.2
    assert _value(text, 'sglang_cuda_graph_passes_total{mode="decode_none"}') == 50.0


def test_bad_spelling_is_refused() -> None:
    """An unknown spelling is a clear error."""
    with pytest.raises(ValueError, match="spelling"):
        MetricsState("", SCENARIOS["healthy"], spelling="dots")


def test_spell_only_touches_the_prefix() -> None:
    """Only SGLang's namespace separator changes."""
    assert spell("sglang:token_usage", "underscore") == "sglang_token_usage"
    assert spell("sglang:token_usage", "colon") == "sglang:token_usage"


def test_scenario_lines_have_sglang_formats() -> None:
    """Startup and tick messages look like 0.5.23's, with the scenario's numbers."""
    storm = SCENARIOS["retraction_storm"]
    lines = [m for tick in range(8) for m in tick_messages(storm, tick)]
    assert sum("KV cache pool is full. Retract requests. #retracted_reqs: 3" in m for m in lines) == 2
    assert sum(m.startswith("Decode batch, #running-req: 187") for m in lines) == 8
    graph = SCENARIOS["cuda_graph_uncovered"]
    assert "cuda graph: False" in tick_messages(graph, 1)[-1]
    start = startup_messages(SCENARIOS["memory_headroom_low"])
    assert start[0].startswith("server_args={'model_path': 'Qwen/Qwen2.5-7B-Instruct'")
    assert start[-1].endswith("available_gpu_mem=1.20 GB")
    assert "Capture cuda graph bs [1, 2, 4, 8, 12, 16, 24, 32]" in startup_messages(graph)
    import datetime as dt
    assert with_prefix("x", dt.datetime(2026, 1, 2, 3, 4, 5)) == "[2026-01-02 03:04:05] x"


def test_alertmanager_example_points_every_receiver_at_the_webhook() -> None:
    """Routing and inhibition are kept; every receiver only posts to the webhook; waits are short."""
    example = yaml.safe_load(AM_EXAMPLE.read_text())
    cfg = alertmanager_config(example, "http://127.0.0.1:1")
    assert cfg["inhibit_rules"] == example["inhibit_rules"]
    assert [r["matchers"] for r in cfg["route"]["routes"]] == [r["matchers"] for r in example["route"]["routes"]]
    for r in cfg["receivers"]:
        assert set(r) == {"name", "webhook_configs"}
        assert r["webhook_configs"][0]["url"] == f"http://127.0.0.1:1/{r['name']}"
    assert cfg["route"]["group_wait"] == "1s"


def test_grafana_variables_become_concrete() -> None:
    """Built-in intervals get durations and dashboard variables match everything."""
    expr = 'rate(x{job=~"$job", instance=~"${instance}"}[$__rate_interval])'
    assert concrete(expr) == 'rate(x{job=~".*", instance=~".*"}[15s])'


def _durations_out(text: str) -> str:
    return re.sub(r"\d+(?:ms|s|m|h|d)\b", "<duration>", text)


def test_suite_rules_are_the_shipped_rules_with_short_durations(tmp_path: Path) -> None:
    """The rules the suite loads differ from alerts/*.rules.yaml only in windows and `for:` durations."""
    # The stack renders with an `slo:` (stack.STACK_SLO): its SLO group is the one file not shipped by default.
    rendered = render_rules(tmp_path, Timing())
    assert "slo.rules.yaml" in [p.name for p in rendered]
    rendered = [p for p in rendered if p.name != "slo.rules.yaml"]
    shipped = sorted((ROOT / "alerts").glob("*.rules.yaml"))
    assert [p.name for p in rendered] == [p.name for p in shipped]
    assert any(o.read_text() != t.read_text() for o, t in zip(rendered, shipped, strict=True)), "no override applied"
    for ours, theirs in zip(rendered, shipped, strict=True):
        assert _durations_out(ours.read_text()) == _durations_out(theirs.read_text()), (
            f"{ours.name}: the test render differs from the shipped file beyond durations "
            "(run `sglang-tuning-exporter render` and commit, or fix the override)")


def test_or_branches_split_only_at_top_level() -> None:
    """`a or b` splits; `or` inside parentheses, label values or names does not."""
    expr = 'max by (x) (sglang_tuning_queue{a="x or y"}) or max(rate(sglang:q[1m]) or vector(0)) or sortable'
    assert or_branches(expr) == ['max by (x) (sglang_tuning_queue{a="x or y"})',
                                 "max(rate(sglang:q[1m]) or vector(0))", "sortable"]
    assert or_branches("up") == ["up"]


def test_only_pre_0_5_23_sglang_branches_may_be_empty() -> None:
    """A branch on a metric 0.5.23 dropped is a version fallback; ours and 0.5.23's are required."""
    recorded = recorded_sglang_names()
    assert "num_retracted_requests_total" in recorded
    assert older_release_fallback('deriv({__name__=~"sglang[:_]total_retracted_reqs"}[1m])', recorded)
    assert not older_release_fallback('rate({__name__=~"sglang[:_]num_retracted_requests_total"}[1m])', recorded)
    assert not older_release_fallback("sglang_tuning_retractions_total", recorded)
    assert not older_release_fallback("vector(0)", recorded)


def test_children_die_with_a_killed_parent(tmp_path: Path) -> None:
    """A child started by the harness is terminated when its parent is SIGKILLed (no leaked servers)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from integration.harness import python_env

    parent_code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from integration.harness import ManagedProcess\n"
        f"p = ManagedProcess('sleeper', [sys.executable, '-c', 'import time; time.sleep(60)'], Path({str(tmp_path)!r}))\n"
        "print(p.start().pid, flush=True)\n"
        "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True,
                              env=python_env())
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        os.kill(child, 0)  # running
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            # a zombie until reaped by init still answers kill(0): check its state
            stat = Path(f"/proc/{child}/stat")
            if stat.exists() and stat.read_text().split(") ", 1)[1].startswith("Z"):
                break
            time.sleep(0.1)
        else:
            os.kill(child, signal.SIGKILL)
            raise AssertionError("the child outlived its SIGKILLed parent")
    finally:
        if parent.poll() is None:
            parent.kill()
