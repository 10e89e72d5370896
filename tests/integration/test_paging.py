"""End to end: scenario logs and /metrics -> our exporter -> Prometheus rules -> Alertmanager -> webhook."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
import requests

from integration.conftest import TARGETS, RunningStack
from integration.stack import EXPORTER_JOB, SGLANG_JOB, Stack, wait_for
from sglang_tuning_exporter.core.catalog import CATALOG
from sglang_tuning_exporter.guide.checks import Check, load_table

pytestmark = pytest.mark.integration

# scenario -> the check whose alert must page for it
EXPECTED_CHECK = {
    "retraction_storm": "retractions_frequent",
    "memory_headroom_low": "gpu_mem_headroom_low",
    "memory_headroom_high": "gpu_mem_headroom_high",
    "cuda_graph_uncovered": "cuda_graph_uncovered",
    "prefill_oom": "prefill_oom",
}
# `native-same-model-storm` (SGLang alone, same model as the servers with the exporter) pages from its
# own metrics: a native alert is silenced only by the sidecar on its own host (instance_host), not by
# any exporter of the same model (found by this suite when the join was on model_name, dp_rank alone).
PAGING_KEYS = [t.key for t in TARGETS if t.scenario in EXPECTED_CHECK and t.key != "restart"]
ALERT_DEADLINE_S = 120.0  # from stack start; windows are 20 s and `for:` 3 s in the test render
ADVICE_ANNOTATIONS = ("flag", "action", "suggested_value", "runbook_url")
SCRAPE_DOWN_ALERTS = ("SGLangTuningScrapeFailing",)


def _checks() -> dict[str, Check]:
    return load_table().by_id()


def target_key(stack: Stack, labels: dict[str, str]) -> str | None:
    """Which target an alert belongs to: by the exporter's or the stand-in's `instance`."""
    for t in stack.targets:
        if labels.get("instance") in (t.exporter_instance, t.sglang_instance):
            return t.spec.key
    return labels.get("scenario")


def webhook_alerts(rs: RunningStack, key: str, alertname: str | None = None) -> list[tuple[str, dict[str, Any]]]:
    """Firing alerts the webhook got for target `key` (optionally only `alertname`): (receiver path, alert)."""
    return [(path, a) for path, a in rs.webhook.firing()
            if target_key(rs.stack, a["labels"]) == key
            and (alertname is None or a["labels"].get("alertname") == alertname)]


def _flags(check: Check) -> set[str]:
    return {f for f in (check.flag, *(v.flag for v in check.flags_by_version)) if f}


def test_alert_resolves_when_the_problem_stops(running_stack: RunningStack) -> None:
    """A healthy server switched into a retraction storm pages; switched back, the page resolves."""
    stack, hook = running_stack.stack, running_stack.webhook
    t = stack.target("switch")
    alert = _checks()["retractions_frequent"].alert

    def mine(pairs: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        return [a for _, a in pairs if a["labels"].get("instance") == t.exporter_instance
                and a["labels"].get("alertname") == alert]

    assert not mine(hook.firing()), "the switch target paged before it was switched"
    requests.post(f"http://{t.sglang_instance}/_standin/scenario", data="retraction_storm", timeout=5).raise_for_status()
    assert wait_for(lambda: mine(hook.firing()), 60), f"no {alert} after the switch\n{stack.describe('switch')}"
    requests.post(f"http://{t.sglang_instance}/_standin/scenario", data="healthy", timeout=5).raise_for_status()
    assert wait_for(lambda: mine(hook.resolved()), 90), (
        f"{alert} never resolved after the storm stopped; firing: "
        f"{[a['labels'] for a in stack.firing() if a['labels'].get('instance') == t.exporter_instance]}")


def assert_advice_is_the_exporters(stack: Stack, instance: str, check: Check) -> None:
    """The alert's `flag` and `suggested_value` are the exporter's computed ones, not the guide fallback.

    Annotations are templated from `sglang_tuning_suggested_value{instance, dp_rank, check}`; if the
    exporter's labels and the template drift apart, every page silently carries the fallback.
    The first notification may predate the exporter's suggestion (Alertmanager does not re-notify on
    an annotation change), so this reads the alert as Prometheus templates it now.
    """
    query = f'sglang_tuning_suggested_value{{instance="{instance}",check="{check.id}"}}'

    def settled() -> list[tuple[dict[str, str], dict[str, Any]]]:
        sugg = stack.query(query)
        alerts = [a for a in stack.firing() if a["labels"].get("instance") == instance
                  and a["labels"].get("alertname") == check.alert]
        if not sugg or not alerts:
            return []
        value, flag = float(sugg[0]["value"][1]), sugg[0]["metric"].get("flag")
        good = [a for a in alerts if a["annotations"].get("flag") == flag
                and math.isclose(float(a["annotations"].get("suggested_value", "nan")), value, rel_tol=1e-6)]
        return [] if len(good) != len(alerts) else [(sugg[0]["metric"], a) for a in good]

    if not stack.query(query):
        return  # the exporter suggests nothing for this check (client-side remedy)
    assert wait_for(settled, 30), (
        f"{check.alert} on {instance}: annotations never matched the exporter's suggestion "
        f"{stack.query(query)}; alert annotations: {[a['annotations'] for a in stack.firing() if a['labels'].get('instance') == instance]}")


@pytest.mark.parametrize("key", PAGING_KEYS)
def test_scenario_pages_with_advice(running_stack: RunningStack, key: str) -> None:
    """The scenario's alert reaches the webhook once, with flag, action, suggested value and runbook."""
    stack = running_stack.stack
    target = stack.target(key)
    check = _checks()[EXPECTED_CHECK[target.spec.scenario]]
    # with the exporter, its signal pages; alone, the rule over SGLang's own metrics in this spelling does
    instance, source = ((target.exporter_instance, "exporter") if target.spec.exporter
                        else (target.sglang_instance, "sglang"))

    def arrived() -> list[tuple[str, dict[str, Any]]]:
        return [(p, a) for p, a in webhook_alerts(running_stack, key, check.alert)
                if a["labels"].get("instance") == instance]

    got = wait_for(arrived, running_stack.deadline(ALERT_DEADLINE_S))
    assert got, (
        f"{check.alert} for {key} did not reach the webhook from {instance} within "
        f"{ALERT_DEADLINE_S:.0f}s; received for it: {[(p, a['labels']) for p, a in webhook_alerts(running_stack, key)]}\n"
        f"firing for it in Prometheus: {[a['labels'] for a in stack.firing() if target_key(stack, a['labels']) == key]}"
        f"\n{stack.describe(key)}")
    for path, alert in got:
        labels, notes = alert["labels"], alert["annotations"]
        missing = [k for k in ADVICE_ANNOTATIONS if not str(notes.get(k, "")).strip()]
        assert not missing, f"{check.alert} from {instance} lacks annotations {missing}: {notes}"
        assert labels.get("check") == check.id
        assert labels.get("source") == source
        assert labels.get("severity") in ("warning", "critical")
        assert notes["flag"] in _flags(check), f"flag {notes['flag']!r} is not one of {_flags(check)}"
        assert notes["action"] == check.action
        assert notes["runbook_url"].endswith("#" + check.alert.lower()), notes["runbook_url"]
        # the example routing: critical pages, warning/info become tickets
        assert path == ("/page" if labels["severity"] == "critical" else "/ticket"), (path, labels)
    if target.spec.exporter:
        assert_advice_is_the_exporters(stack, instance, check)
        # one problem, one page: the native twin stays silent where the exporter covers the server
        native = [a["labels"] for a in stack.firing() if a["labels"].get("instance") == target.sglang_instance]
        assert not native, f"native alerts fired for {key} although its exporter covers it: {native}"


@pytest.mark.parametrize("key", [t.key for t in TARGETS if t.scenario == "healthy" and t.key not in ("killed", "switch", "change")])
def test_healthy_pages_nobody(running_stack: RunningStack, key: str) -> None:
    """A healthy server fires no alert at all, in Prometheus or at the webhook, once paging has had time."""
    stack = running_stack.stack
    # At least as long as the slowest expected page took: if they fired, a false alarm would have too.
    time.sleep(running_stack.deadline(45.0))
    firing = [a["labels"] for a in stack.firing() if target_key(stack, a["labels"]) == key]
    assert not firing, f"healthy target {key} has firing alerts: {firing}"
    assert not webhook_alerts(running_stack, key), f"healthy target {key} paged: {webhook_alerts(running_stack, key)}"
    # and it was really being watched: its scrapes are up and the exporter saw SGLang
    t = stack.target(key)
    ups = stack.query(f'up{{instance=~"{t.exporter_instance}|{t.sglang_instance}"}}')
    assert [float(s["value"][1]) for s in ups] == [1.0] * (2 if t.spec.exporter else 1), ups
    if t.spec.exporter:
        seen = stack.query(f'sglang_tuning_up{{instance="{t.exporter_instance}"}}')
        assert [float(s["value"][1]) for s in seen] == [1.0], seen


def test_killed_sglang_fires_scrape_down_only(running_stack: RunningStack) -> None:
    """Killing SGLang fires the scrape-down alert for its exporter, and no tuning alert for that server."""
    stack = running_stack.stack
    t = stack.target("killed")
    assert t.standin is not None
    wait_for(lambda: stack.query(f'sglang_tuning_up{{instance="{t.exporter_instance}"}} == 1'), 30)
    t.standin.kill()

    def scrape_down() -> list[dict[str, Any]]:
        return [a for a in stack.firing()
                if a["labels"].get("alertname") in SCRAPE_DOWN_ALERTS and target_key(stack, a["labels"]) == "killed"]

    assert wait_for(scrape_down, 60), (
        f"no {SCRAPE_DOWN_ALERTS} firing for the killed SGLang; firing: {[a['labels'] for a in stack.firing()]}\n"
        f"{t.exporter.describe() if t.exporter else ''}")
    assert wait_for(lambda: webhook_alerts(running_stack, "killed", SCRAPE_DOWN_ALERTS[0]), 30), (
        "scrape-down alert fired in Prometheus but never reached the webhook")
    time.sleep(8)  # long enough for any stale-data tuning alert to pass its `for:`
    checks = _checks()  # guide checks; the guards (exporter down, scrape failing, ...) are not among them
    tuning = [a["labels"] for a in stack.firing()
              if target_key(stack, a["labels"]) == "killed" and a["labels"].get("check") in checks]
    assert not tuning, f"tuning alerts fired for a server that is down: {tuning}"
    paged = [a["labels"] for _, a in webhook_alerts(running_stack, "killed") if a["labels"].get("check") in checks]
    assert not paged, f"tuning alerts reached the webhook for a server that is down: {paged}"


def _counter_names() -> list[str]:
    return [m.name for m in CATALOG if m.type == "counter"]


Series = tuple[tuple[str, str], ...]


def _per_series(stack: Stack, fn: str, instance: str, window: str) -> dict[Series, float]:
    """`fn(counter[window])` for every catalog counter of `instance`, keyed by name and labels."""
    out: dict[Series, float] = {}
    for name in _counter_names():
        for s in stack.query(f'{fn}({name}{{instance="{instance}"}}[{window}])'):
            out[(("__name__", name), *sorted(s["metric"].items()))] = float(s["value"][1])
    return out


def test_exporter_restart_keeps_counters(running_stack: RunningStack) -> None:
    """Restarting our exporter keeps every counter's rate and increase right across the restart."""
    stack = running_stack.stack
    t = stack.target("restart")
    assert t.exporter is not None
    window = "10s"

    def moving() -> dict[Series, float]:
        return {k: v for k, v in _per_series(stack, "rate", t.exporter_instance, window).items() if v > 0}

    assert wait_for(moving, 60), f"no counter of the exporter moves in a retraction storm\n{t.exporter.describe()}"
    # Past one rate window from the first movement: the before-rate then sees the running process only, not
    # its start from zero (with 3 s it read a half-empty window and the after-rate looked 2.5x higher).
    time.sleep(12)
    before = moving()
    restart_at = time.time()
    t.exporter.stop()
    stack.start_exporter(t)
    time.sleep(14)  # past the rate window: after-rates only see samples of the new process
    after = _per_series(stack, "rate", t.exporter_instance, window)
    span_s = math.ceil(time.time() - restart_at) + 10
    increases = _per_series(stack, "increase", t.exporter_instance, f"{span_s}s")
    problems = []
    for series, r0 in before.items():
        r1 = after.get(series)
        if r1 is None:
            problems.append(f"{dict(series)}: series gone after the restart (labels changed?)")
            continue
        if not 0.5 * r0 <= r1 <= 2.0 * r0:
            problems.append(f"{dict(series)}: rate {r0:.3f}/s before, {r1:.3f}/s after the restart")
        inc, expected = increases.get(series, 0.0), r0 * span_s
        if not 0.4 * expected <= inc <= 2.0 * expected:
            problems.append(f"{dict(series)}: increase over {span_s}s across the restart is {inc:.1f}, "
                            f"expected about {expected:.1f}")
    assert not problems, "\n".join(problems) + f"\n{t.exporter.describe()}"


def test_every_rule_evaluates(running_stack: RunningStack) -> None:
    """Every loaded alerting and recording rule evaluates without error, and the recording rules run as queries."""
    stack = running_stack.stack
    rules = wait_for(lambda: [r for r in stack.rules() if r.get("lastEvaluation", "").startswith("2")] and
                     stack.rules(), 30)
    assert rules, "Prometheus loaded no rules"
    bad = [(r["name"], r.get("lastError")) for r in rules if r.get("health") != "ok"]
    assert not bad, f"rules failing in Prometheus: {bad}"
    for r in rules:
        if r["type"] == "recording":
            stack.query(r["query"])  # raises PromQLError with the text
    jobs = {s["metric"]["job"] for s in stack.query("up")}
    assert {EXPORTER_JOB, SGLANG_JOB} <= jobs


CHANGE_ALERT = "SGLangTuningChangeMadeWorse"


def test_restart_with_other_flags_then_oom_pages_change_made_worse(running_stack: RunningStack) -> None:
    """The stand-in restarts (a new startup section in the same log, new /server_info) with
    --mem-fraction-static 0.85 -> 0.95 and a prefill then runs out of memory: the exporter judges the change
    `worse` and the alert reaches the webhook with the flag and the value to go back to."""
    stack = running_stack.stack
    t = stack.target("change")
    assert not webhook_alerts(running_stack, "change", CHANGE_ALERT), "paged before the change"
    requests.post(f"http://{t.sglang_instance}/_standin/restart", data="memory_raised_oom",
                  timeout=5).raise_for_status()
    verdicts = f'sglang_tuning_change_verdict{{instance="{t.exporter_instance}"}} == 1'
    assert wait_for(lambda: webhook_alerts(running_stack, "change", CHANGE_ALERT), 120), (
        f"no {CHANGE_ALERT} after the restart; verdicts: {stack.query(verdicts)}\n{stack.describe('change')}")
    (_, alert), *_ = webhook_alerts(running_stack, "change", CHANGE_ALERT)
    labels, notes = alert["labels"], alert["annotations"]
    assert labels["instance"] == t.exporter_instance
    assert (labels["flag"], labels["from_value"], labels["to_value"]) == ("--mem-fraction-static", "0.85", "0.95")
    assert (notes["flag"], notes["action"], notes["suggested_value"]) == ("--mem-fraction-static", "set", "0.85")
    assert "go back to --mem-fraction-static 0.85" in notes["description"]
    api = requests.get(f"http://{t.exporter_instance}/api/changes", timeout=5).json()
    (change,) = [c for c in api["changes"] if c["flag"] == "--mem-fraction-static"]
    assert change["verdict"] == "worse" and "out-of-memory" in change["why"]


def test_one_value_per_flag_across_plan_findings_metrics_and_alerts(running_stack: RunningStack) -> None:
    """Issue #24, the CUDA-graph scenario: SGLangCUDAGraphUncovered (alone: 192) and SGLangCUDAGraphCeilingLow
    (alone: 256) name one flag; the plan, /api/findings, the exported suggested values and both alerts'
    `suggested_value` annotations all carry the plan's one value."""
    stack = running_stack.stack
    t = stack.target("graph-underscore")
    checks = _checks()
    alerts = {checks[c].alert for c in ("cuda_graph_uncovered", "cuda_graph_ceiling_low")}

    def both_firing() -> list[dict[str, Any]]:
        got = [a for a in stack.firing() if a["labels"].get("instance") == t.exporter_instance
               and a["labels"].get("alertname") in alerts]
        return got if {a["labels"]["alertname"] for a in got} == alerts else []

    assert wait_for(both_firing, running_stack.deadline(ALERT_DEADLINE_S)), (
        f"not both of {alerts} fired for {t.spec.key}\n{stack.describe(t.spec.key)}")
    doc = requests.get(f"http://{t.exporter_instance}/api/findings", timeout=5).json()
    step = next(s for s in doc["plan"] if s["flag"] == "--cuda-graph-max-bs-decode")
    planned = float(step["to"])
    assert planned == 256, step
    fired = [f for f in doc["findings"] if f["flag"] == step["flag"] and f["status"] in ("warning", "critical")]
    assert {f["check"] for f in fired} == {"cuda_graph_uncovered", "cuda_graph_ceiling_low"}
    assert {float(f["suggested"]) for f in fired} == {planned}, fired
    exported = stack.query(f'sglang_tuning_suggested_value{{instance="{t.exporter_instance}",'
                           f'flag="{step["flag"]}"}}')
    assert {s["metric"]["check"] for s in exported} == {"cuda_graph_uncovered", "cuda_graph_ceiling_low"}
    assert {float(s["value"][1]) for s in exported} == {planned}, exported

    def annotated() -> set[float]:
        return {float(a["annotations"]["suggested_value"]) for a in both_firing()}

    assert wait_for(lambda: annotated() == {planned}, 30), f"alert annotations say {annotated()}, the plan {planned}"
