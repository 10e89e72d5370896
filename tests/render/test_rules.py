"""The Prometheus rules: promtool accepts them, the hand-written promtool tests pass, and every alert
follows the house conventions (labels, annotations naming flag/direction/value, thresholds in the expr)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.lookups import all_alerts, exposed_names
from helpers.netutil import free_port, stop_process
from helpers.paths import ROOT
from sglang_tuning_exporter.guide.checks import load_table
from sglang_tuning_exporter.render import rules as render_rules
from sglang_tuning_exporter.render.expressions import levels, num
from sglang_tuning_exporter.render.options import RenderOptions

ALERTS = ROOT / "alerts"
PROMTOOL = shutil.which("promtool")
AMTOOL = shutil.which("amtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian: prometheus)")
needs_amtool = pytest.mark.skipif(AMTOOL is None, reason="amtool not installed (Debian: prometheus-alertmanager)")


def rule_files() -> list[Path]:
    """The committed rule files (alertmanager.example.yml is .yml and not a rule file)."""
    return sorted(ALERTS.glob("*.yaml"))


def _run(cmd: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def loaded_groups() -> list[dict[str, Any]]:
    """Every group of every committed rule file."""
    out: list[dict[str, Any]] = []
    for f in rule_files():
        out.extend(yaml.safe_load(f.read_text(encoding="utf-8"))["groups"])
    return out


def alerts() -> list[dict[str, Any]]:
    """Every alerting rule of the committed files."""
    return [r for g in loaded_groups() for r in g["rules"] if "alert" in r]


@pytest.mark.integration
@needs_promtool
def test_promtool_check_rules_accepts_every_rule_file() -> None:
    """`promtool check rules alerts/*.yaml` succeeds."""
    files = rule_files()
    assert len(files) >= 4
    res = _run([str(PROMTOOL), "check", "rules", *map(str, files)])
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.integration
@needs_promtool
def test_promtool_unit_tests_pass() -> None:
    """`promtool test rules alerts/tests/*.yaml` (written by hand) succeeds."""
    tests = sorted((ALERTS / "tests").glob("*.yaml"))
    assert tests
    res = _run([str(PROMTOOL), "test", "rules", *map(str, tests)])
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("SUCCESS") == len(tests)


def test_one_hand_written_test_file_per_rule_group() -> None:
    """Each rule file is loaded by a test file in alerts/tests/, where every alert fires at every severity."""
    tests = {p: yaml.safe_load(p.read_text(encoding="utf-8")) for p in (ALERTS / "tests").glob("*.yaml")}
    for f in rule_files():
        users = [p for p, doc in tests.items() if f"../{f.name}" in doc["rule_files"]]
        assert users, f"no promtool test loads {f.name}"
        # A case counts only where the alert fires (an empty exp_alerts proves silence, not the rule).
        fired = {(t["alertname"], a["exp_labels"]["severity"]) for p in users for case in tests[p]["tests"]
                 for t in case.get("alert_rule_test", []) for a in t.get("exp_alerts") or []}
        pairs = {(r["alert"], r["labels"]["severity"]) for g in yaml.safe_load(f.read_text(encoding="utf-8"))["groups"]
                 for r in g["rules"] if "alert" in r}
        assert pairs <= fired, f"{f.name}: alert levels no promtool test fires: {sorted(pairs - fired)}"


def test_committed_files_parse_to_the_rule_groups() -> None:
    """The readable YAML emitter round-trips: the files hold exactly `rule_groups(table)`."""
    def by_name(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted(groups, key=lambda g: str(g["name"]))

    assert by_name(loaded_groups()) == by_name(render_rules.rule_groups(load_table()))


def test_alert_conventions() -> None:
    """CamelCase SGLang names, for:, severity and check labels, the annotation keys of interfaces.md."""
    found = alerts()
    assert len(found) >= 20
    for a in found:
        assert re.fullmatch(r"SGLang[A-Z][A-Za-z0-9]*", a["alert"]), a["alert"]
        assert re.fullmatch(r"\d+[smh]", a["for"]), a
        assert a["labels"]["severity"] in ("critical", "warning", "info")
        assert a["labels"]["check"]
        notes = a["annotations"]
        for key in ("summary", "description", "runbook_url", "check", "flag", "action", "suggested_value",
                    "guide"):
            assert notes.get(key), f"{a['alert']}: annotation {key} missing"
        assert "{{" not in notes["summary"], "summary must not carry values"
        assert "$labels.instance" in notes["description"] and "$value" in notes["description"]
        assert notes["runbook_url"].endswith("#" + a["alert"].lower())
        assert notes["check"] == a["labels"]["check"]
        assert notes["dashboard_url"].startswith("http://localhost:3000/d/sglang-tuning-server/"), a["alert"]
        assert "&var-instance={{ . | urlquery }}" in notes["dashboard_url"]


def test_every_check_alert_names_flag_direction_and_value() -> None:
    """A check alert says which flag to move, which way, and to what (or the client-side change)."""
    table = load_table()
    by_id = table.by_id()
    for a in alerts():
        c = by_id.get(a["labels"]["check"])
        if c is None:
            continue  # a health guard
        notes = a["annotations"]
        if c.flag is None:
            assert notes["action"] == "client" and notes["suggested_value"] == c.client_action
            assert re.match(r"(increase|reduce|decrease)", c.client_action)
            continue
        if c.flags_by_version:
            # the release-specific name comes from our metric's `flag` label, the guide's name is the fallback
            assert 'label "flag"' in notes["flag"] and notes["flag"].endswith(f"{{{{ else }}}}{c.flag}{{{{ end }}}}")
        else:
            assert notes["flag"] == c.flag
        assert c.flag in notes["description"]
        assert notes["action"] in ("increase", "decrease", "set")
        value = notes["suggested_value"]
        assert "sglang_tuning_suggested_value" in value, "value must come from our metric first"
        fallback = value.split("{{ else }}")[1].split("{{ end }}")[0]
        assert fallback and re.search(r"\d|fcfs|lpm|true", fallback), f"{a['alert']}: no fallback value"


def test_threshold_and_window_written_in_the_expression() -> None:
    """The threshold (and the range window where there is one) is readable in each check alert's expr."""
    table = load_table()
    by_id = table.by_id()
    opts = RenderOptions()
    for a in alerts():
        c = by_id.get(a["labels"]["check"])
        if c is None:
            continue
        th = dict(levels(c, table, opts))[a["labels"]["severity"]]
        first = a["expr"].splitlines()[0]
        assert f"{c.comparison} {num(th)}" in first, (a["alert"], first)
        if "{window}" in str(c.promql["exporter"]) and a["labels"]["source"] == "exporter":
            assert "[10m]" in a["expr"]


def test_native_rules_read_every_spelling() -> None:
    """Each SGLang-native recording rule reads sglang:x, sglang_x or Ray Serve's ray_sglang_x, filtered to
    SGLang's job."""
    records = [r for g in loaded_groups() if g["name"] == "sglang-tuning.native" for r in g["rules"]
               if "record" in r]
    assert len(records) >= 5
    for r in records:
        colon = set(re.findall(r"sglang:([a-z_]+)\{", r["expr"]))
        under = set(re.findall(r"(?<![\w:])sglang_([a-z_]+)\{", r["expr"]))
        ray = set(re.findall(r"(?<![\w:])ray_sglang_([a-z_]+)\{", r["expr"]))
        assert colon and colon == under == ray, r
        assert "\nor\n" in r["expr"] and 'job="sglang"' in r["expr"]


def test_rules_only_use_metrics_from_the_catalog() -> None:
    """Every sglang_tuning_* name in the rules is one the exporter emits."""
    names = set()
    for f in rule_files():
        names |= set(re.findall(r"(?<![\w:])(sglang_tuning_[a-z0-9_]+)", f.read_text(encoding="utf-8")))
    unknown = names - exposed_names()
    assert not unknown, f"rules query metrics the catalog does not define: {sorted(unknown)}"


def _native_alerts(opts: RenderOptions) -> list[dict[str, Any]]:
    groups = render_rules.rule_groups(load_table(), opts)
    return [r for g in groups if g["name"] == "sglang-tuning.native" for r in g["rules"] if "alert" in r]


def test_native_dedup_ties_a_sidecar_to_its_own_host() -> None:
    """By default a native alert is silenced only by an exporter on the same host (instance without port)."""
    natives = _native_alerts(RenderOptions())
    assert natives
    for a in natives:
        assert a["expr"].startswith("label_replace(rank:sglang_"), a["expr"]
        tail = a["expr"].split("unless on (instance_host, model_name, dp_rank)\n", 1)[1]
        assert re.match(r"label_replace\((m(ax|in) without \(tp_rank, moe_ep_rank\) \()?sglang_tuning_", tail.strip()), tail
        assert '"instance_host", "$1", "instance", "(.+?)(?::[0-9]+)?"' in tail
    # an explicit label both scrapes share (e.g. Kubernetes `pod`) needs no host derivation
    by_pod = _native_alerts(RenderOptions(dedup_on=("pod", "model_name", "dp_rank")))
    assert all("label_replace" not in a["expr"] and "unless on (pod, model_name, dp_rank)" in a["expr"]
               for a in by_pod)
    # the annotations look the exporter's values up by the same key, never by the model alone
    for alerts_, key in ((natives, 'and on (instance_host) label_replace(vector(1), "instance_host", %q, "", "")'),
                         (by_pod, "pod=%q,model_name=%q,dp_rank=%q,check=%q")):
        looked_up = [a["annotations"]["suggested_value"] for a in alerts_ if "| query" in a["annotations"]["suggested_value"]]
        assert looked_up and all(key in v for v in looked_up), looked_up


_DEDUP_TEST = """
rule_files: [native.rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
%s
    promql_expr_test:
      - expr: count by (instance) (ALERTS{alertname="SGLangGPUMemHeadroomHigh",alertstate="firing"})
        eval_time: 2m
        exp_samples:
%s
"""


def _headroom_series(instance: str, extra: str = "") -> str:
    return (f"      - series: 'sglang:startup_available_gpu_memory_gb{{job=\"sglang\",instance=\"{instance}\","
            f"model_name=\"qwen\"{extra}}}'\n        values: '13.5x5'")


def _exporter_series(instance: str, extra: str = "") -> str:
    return (f"      - series: 'sglang_tuning_available_gpu_memory_bytes{{job=\"sglang-tuning-exporter\","
            f"instance=\"{instance}\",model_name=\"qwen\"{extra}}}'\n        values: '14495514624x5'")


def _promtool_native(tmp_path: Path, opts: RenderOptions, series: list[str],
                     firing: list[str]) -> subprocess.CompletedProcess[str]:
    """promtool over the native group rendered with `opts`: exactly the `firing` instances page."""
    for rel, text in render_rules.generate(load_table(), opts).items():
        (tmp_path / Path(rel).name).write_text(text, encoding="utf-8")
    samples = "\n".join(f"          - labels: '{{instance=\"{i}\"}}'\n            value: 1" for i in firing)
    (tmp_path / "dedup.test.yaml").write_text(_DEDUP_TEST % ("\n".join(series), samples), encoding="utf-8")
    return _run([str(PROMTOOL), "test", "rules", "dedup.test.yaml"], cwd=tmp_path)


@pytest.mark.integration
@needs_promtool
def test_native_dedup_host_key_reads_ipv6_and_portless_instances(tmp_path: Path) -> None:
    """`[fd00::1]:30000` pairs with `[fd00::1]:9470`, a port-less `gpu-c` with `gpu-c:9470`; gpu-d pages."""
    series = [_headroom_series("[fd00::1]:30000"), _exporter_series("[fd00::1]:9470"),
              _headroom_series("gpu-c"), _exporter_series("gpu-c:9470"),
              _headroom_series("gpu-d:30000"), _exporter_series("gpu-dd:9470")]
    res = _promtool_native(tmp_path, RenderOptions(), series,
                           ["gpu-d:30000"])
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.integration
@needs_promtool
def test_native_dedup_on_a_shared_target_label(tmp_path: Path) -> None:
    """With `dedup_on: [pod, ...]` the pod label pairs a sidecar with its SGLang whatever the addresses."""
    series = [_headroom_series("10.0.0.5:30000", ',pod="a"'), _exporter_series("10.0.0.9:9470", ',pod="a"'),
              _headroom_series("10.0.0.6:30000", ',pod="b"')]
    opts = RenderOptions(dedup_on=("pod", "model_name", "dp_rank"))
    res = _promtool_native(tmp_path, opts, series, ["10.0.0.6:30000"])
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.integration
@needs_promtool
def test_native_rules_read_ray_serve_replicas_apart(tmp_path: Path) -> None:
    """Under Ray Serve (`ray_sglang_x{ReplicaId=...}` behind one Ray agent) each replica is judged alone:
    the replica with 13.5 GB of headroom pages, its neighbour with 2 GB does not."""
    for rel, text in render_rules.generate(load_table(), RenderOptions()).items():
        (tmp_path / Path(rel).name).write_text(text, encoding="utf-8")
    series = "\n".join(
        f"      - series: 'ray_sglang_startup_available_gpu_memory_gb{{job=\"sglang\",instance=\"ray-head:8080\","
        f"model_name=\"qwen\",tp_rank=\"{tp}\",ReplicaId=\"{rid}\"}}'\n        values: '{gb}x5'"
        for rid, gb in (("r-a", 13.5), ("r-b", 2)) for tp in (0, 1))
    test = _DEDUP_TEST.replace("count by (instance)", "count by (instance, ReplicaId)") % (
        series, "          - labels: '{instance=\"ray-head:8080\",ReplicaId=\"r-a\"}'\n            value: 1")
    (tmp_path / "ray.test.yaml").write_text(test, encoding="utf-8")
    res = _run([str(PROMTOOL), "test", "rules", "ray.test.yaml"], cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr


def test_scrape_guards_split_an_outage_from_a_slow_start() -> None:
    """ScrapeFailing needs an earlier successful scrape; SGLangNeverUp (30m) covers a start that never ends."""
    health = {r["alert"]: r for g in render_rules.rule_groups(load_table()) if g["name"] == "sglang-tuning.health"
              for r in g["rules"]}
    seen = 'sglang_tuning_scrape_samples{job="sglang-tuning-exporter"}'
    assert f"\nand on (job, instance) {seen}\n" in health["SGLangTuningScrapeFailing"]["expr"]
    assert health["SGLangTuningScrapeFailing"]["for"] == "5m"
    assert f"\nunless on (job, instance) {seen}\n" in health["SGLangTuningSGLangNeverUp"]["expr"]
    assert health["SGLangTuningSGLangNeverUp"]["for"] == "30m"
    assert health["SGLangTuningSGLangNeverUp"]["labels"]["severity"] == "warning"
    short = render_rules.rule_groups(load_table(), RenderOptions(override_for_s=3))
    assert {r["for"] for g in short if g["name"] == "sglang-tuning.health" for r in g["rules"]} == {"3s"}


@pytest.mark.integration
@needs_promtool
def test_short_window_copy_for_end_to_end_tests(tmp_path: Path) -> None:
    """Overrides give a valid rule set with `for: 15s` and 1m windows; the committed files are untouched."""
    table = load_table()
    opts = RenderOptions(override_for_s=15, override_window_s=60)
    files = render_rules.generate(table, opts)
    for rel, text in files.items():
        (tmp_path / Path(rel).name).write_text(text, encoding="utf-8")
    res = _run([str(PROMTOOL), "check", "rules", *map(str, sorted(tmp_path.glob("*.yaml")))])
    assert res.returncode == 0, res.stdout + res.stderr
    for a in all_alerts(table, opts):
        assert a["for"] == "15s"
        assert "[10m" not in a["expr"]
    assert any("[1m]" in a["expr"] for a in all_alerts(table, opts))


def test_job_selectors_follow_the_options() -> None:
    """Render options choose the job matchers; '' drops them."""
    table = load_table()
    text = "".join(render_rules.generate(table, RenderOptions(
        exporter_job="tuning", sglang_job="llm")).values())
    assert 'sglang_tuning_signal_ratio{job="tuning",' in text and 'sglang:num_queue_reqs{job="llm",priority=""}' in text
    bare = "".join(render_rules.generate(table, RenderOptions(exporter_job="", sglang_job="")).values())
    assert "job=" not in bare.replace("$labels.job", "")
    assert "SGLangTuningExporterAbsent" not in bare  # absent() needs a job to look for


def test_workload_chooses_the_checks() -> None:
    """The latency recipe renders its own checks (batch size) and drops the throughput-only queue check."""
    table = load_table()
    names = {a["alert"] for a in all_alerts(table, RenderOptions(workload="latency"))}
    assert "SGLangLatencyBatchTooLarge" in names and "SGLangQueueEmpty" not in names


# ----------------------------------------------------------------------------- Alertmanager example


@pytest.mark.integration
@needs_amtool
def test_alertmanager_example_is_valid() -> None:
    """`amtool check-config` accepts the example with its template file."""
    res = _run([str(AMTOOL), "check-config", str(ALERTS / "alertmanager.example.yml")])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 templates" in res.stdout


@needs_amtool
@pytest.mark.parametrize(("labels", "receiver"), [
    (["severity=critical", "check=retractions_frequent", "instance=a:9470"], "page"),
    (["severity=warning", "check=kv_underused", "instance=a:9470"], "ticket"),
    (["severity=info", "check=x", "instance=a:9470"], "ticket"),
])
@pytest.mark.integration
def test_alertmanager_routes_by_severity(labels: list[str], receiver: str) -> None:
    """Critical pages, warning and info open tickets."""
    res = _run([str(AMTOOL), "config", "routes", "test", "--config.file", str(ALERTS / "alertmanager.example.yml"),
                f"--verify.receivers={receiver}", *labels])
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.integration
@needs_amtool
def test_alertmanager_message_prints_the_flag_change(tmp_path: Path) -> None:
    """The notification template renders 'increase --flag to value' from the common annotations."""
    data = {"receiver": "page", "status": "firing", "externalURL": "http://am",
            "groupLabels": {"instance": "a:9470"},
            "commonLabels": {"alertname": "SGLangRetractionsFrequent", "instance": "a:9470"},
            "commonAnnotations": {"flag": "--schedule-conservativeness", "action": "increase",
                                  "suggested_value": "1.3"},
            "alerts": [{"status": "firing", "labels": {"alertname": "SGLangRetractionsFrequent"},
                        "annotations": {"summary": "s", "description": "d", "flag": "--schedule-conservativeness",
                                        "action": "increase", "suggested_value": "1.3", "guide": "g",
                                        "runbook_url": "u", "dashboard_url": "http://g/d/x?var-instance=a%3A9470"}}]}
    path = tmp_path / "data.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    res = _run([str(AMTOOL), "template", "render", f"--template.glob={ALERTS / 'alertmanager.templates.tmpl'}",
                '--template.text={{ template "sglang.tuning.title" . }}|{{ template "sglang.tuning.text" . }}',
                f"--template.data={path}"])
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("[FIRING:1] SGLangRetractionsFrequent on a:9470|")
    assert "Change: increase --schedule-conservativeness to 1.3" in res.stdout
    assert "  runbook: u\n  dashboard: http://g/d/x?var-instance=a%3A9470\n" in res.stdout


ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")




def _http(url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"},
                                 method="GET" if body is None else "POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        text = resp.read().decode()
    return json.loads(text) if text.strip().startswith(("[", "{")) else text


@pytest.mark.integration
@pytest.mark.skipif(ALERTMANAGER is None, reason="prometheus-alertmanager not installed")
def test_alertmanager_inhibits_checks_of_a_blind_exporter(tmp_path: Path) -> None:
    """A real Alertmanager with the example config: exporter down mutes that instance's checks only."""
    for name in ("alertmanager.example.yml", "alertmanager.templates.tmpl"):
        shutil.copy(ALERTS / name, tmp_path / name)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([str(ALERTMANAGER), f"--config.file={tmp_path / 'alertmanager.example.yml'}",
                             f"--storage.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--cluster.listen-address="], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if _http(f"{base}/-/ready").strip() == "OK":
                    break
            except OSError:
                pass
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "exited"
            assert time.monotonic() < deadline, "alertmanager did not become ready"
            time.sleep(0.1)  # polling a real process, not a unit test
        _http(f"{base}/api/v2/alerts", [
            {"labels": {"alertname": "SGLangTuningExporterDown", "instance": "a:9470", "severity": "warning",
                        "check": "exporter_down"}},
            {"labels": {"alertname": "SGLangRetractionsFrequent", "instance": "a:9470", "severity": "critical",
                        "check": "retractions_frequent"}},
            {"labels": {"alertname": "SGLangRetractionsFrequent", "instance": "b:9470", "severity": "critical",
                        "check": "retractions_frequent"}},
        ])
        states: dict[tuple[str, str], str] = {}
        deadline = time.monotonic() + 10
        while len(states) < 3 and time.monotonic() < deadline:
            states = {(a["labels"]["alertname"], a["labels"]["instance"]): a["status"]["state"]
                      for a in _http(f"{base}/api/v2/alerts")}
            time.sleep(0.05)
        assert states == {("SGLangTuningExporterDown", "a:9470"): "active",
                          ("SGLangRetractionsFrequent", "a:9470"): "suppressed",
                          ("SGLangRetractionsFrequent", "b:9470"): "active"}
    finally:
        stop_process(proc)


def test_latency_checks_apply_their_guard_natively() -> None:
    """The latency checks have SGLang-native variants (issue 25): the guard's value is written once in the
    table (`{guard}`) and reaches the exporter and the native expression alike; a native alert is silenced
    by the exporter's signal itself, guard met or not (the sidecar's `not applicable` is a verdict)."""
    from dataclasses import replace

    from sglang_tuning_exporter.guide.checks import Guard
    from sglang_tuning_exporter.render.expressions import (
        exporter_signal_expr,
        has_native,
        native_signal_exprs,
    )

    table = load_table()
    by_id = table.by_id()
    for cid in ("latency_high_batch_large", "latency_queue_dominates", "ttft_long_prompts"):
        assert has_native(by_id[cid]), cid
    assert not has_native(by_id["schedule_policy_fcfs_with_reuse"])  # its guard is a server argument
    c = by_id["ttft_long_prompts"]
    moved = replace(c, guard=(Guard(c.guard[0].signal, c.guard[0].comparison, 4096.0),))
    opts = RenderOptions()
    assert ">= 4096)" in exporter_signal_expr(moved, table, opts) and "2048" not in exporter_signal_expr(moved, table, opts)
    assert all(">= 4096)" in e and "2048" not in e for e in native_signal_exprs(moved, table, opts))
    (alert,) = [a for a in _native_alerts(opts) if a["alert"] == c.alert and a["labels"]["severity"] == "warning"]
    assert 'sglang_tuning_signal_seconds{job="sglang-tuning-exporter",signal="ttft_p95"}, "instance_host"' in alert["expr"]


_OLD_NAMES_TEST = """
rule_files: [native.rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
%s
    promql_expr_test:
      - expr: rank:sglang_itl_p95_seconds:over10m
        eval_time: 12m
        exp_samples:
          - labels: 'rank:sglang_itl_p95_seconds:over10m{job="sglang",instance="old-a:30000",model_name="qwen"}'
            value: 0.39
      - expr: rank:sglang_queue_time_share:over10m
        eval_time: 12m
        exp_samples:
          - labels: 'rank:sglang_queue_time_share:over10m{job="sglang",instance="old-b:30000",model_name="qwen"}'
            value: 1
"""


@pytest.mark.integration
@needs_promtool
def test_native_latency_reads_the_older_histogram_names(tmp_path: Path) -> None:
    """0.3.6-0.4.4 named the ITL histogram `time_per_output_token_seconds`, 0.5.2 the queue time `queue_time_s`
    (docs/signals.md): the native latency signals read them as the sidecar does."""
    for rel, text in render_rules.generate(load_table(), RenderOptions()).items():
        (tmp_path / Path(rel).name).write_text(text, encoding="utf-8")

    def hist(name: str, instance: str, at: float) -> list[str]:
        lab = f'job="sglang",instance="{instance}",model_name="qwen"'
        out = [f"      - series: '{name}_bucket{{{lab},le=\"{b}\"}}'\n        values: '"
               + ("0+100x15" if b == "+Inf" or float(b) >= at else "0x15") + "'" for b in ("0.2", "0.4", "4", "6", "+Inf")]
        return [*out, f"      - series: '{name}_count{{{lab}}}'\n        values: '0+100x15'"]

    series = [*hist("sglang:time_per_output_token_seconds", "old-a:30000", 0.3),
              "      - series: 'sglang:num_running_reqs{job=\"sglang\",instance=\"old-a:30000\",model_name=\"qwen\"}'\n"
              "        values: '187x15'",
              *hist("sglang:queue_time_s", "old-b:30000", 5), *hist("sglang:e2e_request_latency_seconds", "old-b:30000", 5)]
    (tmp_path / "old.test.yaml").write_text(_OLD_NAMES_TEST % "\n".join(series), encoding="utf-8")
    res = _run([str(PROMTOOL), "test", "rules", "old.test.yaml"], cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
