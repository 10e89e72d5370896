"""Prometheus recording and alerting rules generated from the checks table (mixin layout, readable YAML).

Five groups, one file each under `alerts/`:
- `sglang-tuning-exporter.recording` - per-rank rates of the exporter's counters (numerators and
  denominators recorded separately, for dashboards and ad-hoc ratios);
- `sglang-tuning.health` - guards: exporter down/absent, SGLang scrape failing or never up, log not advancing;
- `sglang-tuning.checks` - one alert per check and level, on the exporter's guide signals;
- `sglang-tuning.changes` - a flag change judged worse (the flag and the value to go back to);
- `sglang-tuning.native` - the same checks on SGLang's own `/metrics` (every spelling), for servers
  without the sidecar; silenced where the sidecar beside that SGLang (same host) already evaluates that
  model and DP rank.
`rule_groups(table, options)` returns plain dicts (also used for Kubernetes PrometheusRule objects);
`generate(table, options)` returns `{relative path: YAML text}` with explanatory comments.
The PromQL pieces are in `render/expressions.py`, the annotations in `render/annotations.py`, the options
in `render/options.py`; this module assembles the groups and writes them as YAML.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

from sglang_tuning_exporter.core.durations import promql_duration
from sglang_tuning_exporter.core.recording import RECORDING_WINDOW_S, recorded
from sglang_tuning_exporter.guide.checks import Check, CheckTable
from sglang_tuning_exporter.render import slo
from sglang_tuning_exporter.render.annotations import (
    NATIVE_LOOKUP,
    alert_annotations,
    anchor,
    dashboard_url,
    guide_line,
)
from sglang_tuning_exporter.render.expressions import (
    RANK_JOIN,
    checks_in_scope,
    compare,
    exporter_has_signal,
    exporter_signal_expr,
    for_of,
    has_native,
    keep_selector_labels,
    levels,
    lowest_threshold,
    native_record_name,
    native_signal_exprs,
    num,
    ours,
    paren,
    profile_of,
    record_selector,
    selector_of,
    window_of,
    with_host,
)
from sglang_tuning_exporter.render.options import HOST_LABEL, RenderOptions

RULES_DIR = "alerts"
# How long "SGLang had been up" is remembered: since the exporter started (scrape_samples is set by the
# first successful scrape and kept through failures); an SGLang that never came up gets its own alert.
NEVER_UP_FOR_S = 1800.0



# ----------------------------------------------------------------------------- groups


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule plus the comment written above it in the YAML file."""

    body: dict[str, Any]
    comment: str = ""


@dataclass(frozen=True, slots=True)
class Group:
    """A rule group, the file it lives in, and a header comment."""

    name: str
    file: str
    header: str
    rules: tuple[Rule, ...]



def _suppressions(check: Check, by_id: dict[str, Check], table: CheckTable, opts: RenderOptions,
                  *, native_side: bool) -> list[str]:
    out = []
    for sid in check.suppressed_by:
        s = by_id.get(sid)
        if s is None or opts.workload not in s.workloads:
            continue
        if native_side:
            if not has_native(s):
                continue
            sig = record_selector(native_record_name(s, opts), opts)
        else:
            sig = paren(exporter_signal_expr(s, table, opts))
        out.append(f"unless on ({', '.join(RANK_JOIN)})\n  ({compare(sig, s.comparison, lowest_threshold(s, table, opts))})")
    return out


def _check_comment(check: Check, table: CheckTable, opts: RenderOptions, level: str, threshold: float) -> str:
    band = ""
    if "{band" in str(check.promql.get("exporter")) + str(check.promql.get("sglang")) + check.description:
        lo, hi = table.profiles[profile_of(table, opts)].queue_band
        band = f"; queue band {num(lo)}-{num(hi)}"
    change = (f"{check.action} {check.flag}" if check.flag else f"client side: {check.client_action}")
    exporter = str(check.promql.get("exporter"))
    windowed = "{window}" in exporter or "sglang_tuning_signal" in exporter
    over = f"over {promql_duration(window_of(check, opts))}" if windowed else "(startup fact)"
    return (f"{check.id} ({level}): {check.signal} {check.comparison} {num(threshold)} {over}{band} -> {change}\n"
            f"guide: {guide_line(check, table, opts)}")


def checks_group(table: CheckTable, opts: RenderOptions) -> Group:
    """One alert per check and level, on the exporter's signals."""
    by_id = table.by_id()
    rules: list[Rule] = []
    for c in checks_in_scope(table, opts):
        sig = exporter_signal_expr(c, table, opts)
        for level, th in levels(c, table, opts):
            expr = compare(paren(sig), c.comparison, th)
            for s in _suppressions(c, by_id, table, opts, native_side=False):
                expr += "\n" + s
            rules.append(Rule({
                "alert": c.alert, "expr": expr, "for": for_of(c.for_s, opts),
                "labels": {"severity": level, "check": c.id, "source": "exporter"},
                "annotations": alert_annotations(c, table, opts, th, by="instance"),
            }, _check_comment(c, table, opts, level, th)))
    return Group("sglang-tuning.checks", "checks.rules.yaml",
                 "One alert per guide check and level, evaluated on the exporter's signals "
                 "(sglang_tuning_signal_ratio, _per_second, _amount and friends).\nThresholds, windows and flags come from checks.yaml "
                 f"(profile {profile_of(table, opts)}, workload {opts.workload}).", tuple(rules))


def native_group(table: CheckTable, opts: RenderOptions) -> Group:
    """Recording rules for SGLang's own metrics (both spellings) and alerts on them."""
    by_id = table.by_id()
    rules: list[Rule] = []
    recorded: set[str] = set()
    natives = [c for c in checks_in_scope(table, opts) if has_native(c)]
    for c in natives:
        name = native_record_name(c, opts)
        if name in recorded:
            continue
        recorded.add(name)
        exprs = native_signal_exprs(c, table, opts)
        rules.append(Rule({"record": name, "expr": "\nor\n".join(paren(e) for e in exprs)},
                          f"{c.signal} from SGLang's own metrics; `or` keeps one series when a server "
                          "exposes sglang:x, sglang_x or (Ray Serve) ray_sglang_x"))
    dedup = ", ".join(opts.dedup_on)
    by_host = HOST_LABEL in opts.dedup_on
    for c in natives:
        sig = record_selector(native_record_name(c, opts), opts)
        # The exporter has this signal (judged or not: a feature switched off is its call, not SGLang's).
        covered = exporter_has_signal(c, table, opts)
        # By host: only the sidecar beside this SGLang silences it, not any exporter of the same model.
        covered = with_host(covered) if by_host else paren(covered)
        for level, th in levels(c, table, opts):
            expr = compare(sig, c.comparison, th)
            if by_host:
                expr = with_host(expr)
            for s in _suppressions(c, by_id, table, opts, native_side=True):
                expr += "\n" + s
            expr += f"\nunless on ({dedup})\n  {covered}"
            rules.append(Rule({
                "alert": c.alert, "expr": expr, "for": for_of(c.for_s, opts),
                "labels": {"severity": level, "check": c.id, "source": "sglang"},
                "annotations": alert_annotations(c, table, opts, th, by=NATIVE_LOOKUP),
            }, _check_comment(c, table, opts, level, th) + "\n(native variant: silent where the exporter "
               f"already has this signal for the same {dedup})"))
    return Group("sglang-tuning.native", "native.rules.yaml",
                 "The guide checks on SGLang's own /metrics (--enable-metrics), for servers without the "
                 "exporter.\nEvery sglang: name is read in its three spellings (sglang:x, sglang_x and Ray Serve's "
                 "ray_sglang_x, whose ReplicaId label keeps replicas apart). An alert "
                 f"here is silenced when the exporter publishes the same signal for the same {dedup}"
                 + (f"\n({HOST_LABEL} = the host part of instance: a sidecar and its SGLang share it)."
                    if by_host else "."),
                 tuple(rules))


def recording_group(opts: RenderOptions) -> Group:
    """Per-rank rates of the exporter's counters; ratios are left to the reader (sum, then divide)."""
    ws = opts.override_window_s if opts.override_window_s is not None else RECORDING_WINDOW_S
    w = promql_duration(ws)
    by = "job, instance, model_name, dp_rank, pp_rank"
    specs = [
        (recorded("retractions", window_s=ws), "sglang_tuning_retractions_total", by,
         "retraction events per second (the guide: ~1 per minute is acceptable)"),
        (recorded("retracted_requests", window_s=ws), "sglang_tuning_retracted_requests_total", by,
         "requests retracted per second"),
        (recorded("decode_samples", window_s=ws), "sglang_tuning_decode_samples_total",
         by + ", cuda_graph", "decode samples per second by cuda_graph (true|false|unknown); "
         "coverage = sum of true / sum of all"),
        (recorded("prefill_tokens", window_s=ws), "sglang_tuning_prefill_tokens_total",
         by + ", source", "prefill tokens per second by source (new|cached); hit ratio = cached / (new + cached)"),
        (recorded("oom_events", "increase", ws), "sglang_tuning_oom_events_total",
         by + ", phase", "out-of-memory errors by phase"),
    ]
    rules = []
    for name, metric, labels, comment in specs:
        fn = "increase" if ":increase" in name else "rate"
        # TP/PP/EP ranks of one DP replica repeat the same events: max over them, never sum.
        rules.append(Rule({"record": name, "expr": f"max by ({labels}) ({fn}({ours(metric, opts)}[{w}]))"},
                          comment))
    return Group("sglang-tuning-exporter.recording", "recording.rules.yaml",
                 "Per-DP-replica rates of the exporter's counters (max over the TP ranks of a replica, which "
                 "repeat the same events).\nNumerators and denominators are recorded separately: sum them over "
                 "the replicas you want, then divide (never average ratios).",
                 tuple(rules))


def _guard(alert: str, gid: str, expr: str, for_s: float, summary: str, desc: str, flag: str, action: str,
           value: str, guide: str, opts: RenderOptions) -> Rule:
    for_text = promql_duration(for_s if opts.override_for_s is None else opts.override_for_s)
    desc = desc.replace("{for}", for_text)
    return Rule({
        "alert": alert, "expr": expr, "for": for_text,
        "labels": {"severity": "warning", "check": gid, "source": "exporter"},
        "annotations": {"summary": summary, "description": desc,
                        "runbook_url": f"{opts.runbook_url}#{anchor(alert)}", "dashboard_url": dashboard_url(opts),
                        "check": gid, "flag": flag,
                        "action": action, "suggested_value": value, "guide": guide},
    }, f"guard {gid}: a broken source must not look healthy")


def health_group(opts: RenderOptions) -> Group:
    """Guards: the exporter and its sources are working, so silence means healthy."""
    up_sel = selector_of("up", opts)
    on = "on (job, instance)"
    rules = [
        _guard("SGLangTuningExporterDown", "exporter_down", f"{up_sel} == 0", 300,
               "sglang-tuning-exporter is down",
               "Prometheus cannot scrape the exporter at {{ $labels.instance }} (job {{ $labels.job }}) "
               "for {for}; its guide checks are blind. Value: {{ $value }}.",
               "--web.listen-address", "restart", "the exporter running and reachable on its port (default 9470)",
               "Monitor metrics: enable metrics collection to make data-driven tuning decisions.", opts),
    ]
    if opts.exporter_job:
        rules.append(_guard(
            "SGLangTuningExporterAbsent", "exporter_absent", f"absent({up_sel})", 900,
            "No sglang-tuning-exporter target is scraped",
            f"No `up` series for job {opts.exporter_job}{{{{ with $labels.instance }}}} on {{{{ . }}}}{{{{ end }}}} "
            "for {for}: the "
            "scrape config lost the exporter, so no tuning alert can fire. Value: {{ $value }}.",
            "--web.listen-address", "set", f"a scrape job named {opts.exporter_job} for the exporter",
            "Monitor metrics: enable metrics collection to make data-driven tuning decisions.", opts))
    up = ours("sglang_tuning_up", opts)
    enabled = ours('sglang_tuning_source_enabled{source="metrics"}', opts)
    disabled = ours('sglang_tuning_server_arg{arg="enable_metrics"}', opts)
    # Present from the exporter's first successful scrape on, kept through failures: "SGLang had been up".
    seen = ours("sglang_tuning_scrape_samples", opts)
    failing = f"{up} == 0\nand {on} {enabled} == 1"
    # Only an SGLang that had been up pages: a large model loads for 10-20 minutes after a deploy.
    rules.append(_guard(
        "SGLangTuningScrapeFailing", "sglang_scrape_failing",
        f"{failing}\nand {on} {seen}\nunless {on} {disabled} == 0", 300,
        "The exporter cannot scrape SGLang's /metrics",
        "The exporter at {{ $labels.instance }} failed to scrape SGLang's /metrics for {for} after it had "
        "worked (sglang_tuning_up = {{ $value }}); metric-based signals are missing or stale.",
        "--sglang.url", "set", "the SGLang HTTP address serving /metrics (e.g. http://127.0.0.1:30000)",
        "Monitor metrics: enable metrics collection to make data-driven tuning decisions.", opts))
    rules.append(_guard(
        "SGLangTuningSGLangNeverUp", "sglang_never_up",
        f"{failing}\nunless {on} {seen}\nunless {on} {disabled} == 0", NEVER_UP_FOR_S,
        "SGLang's /metrics never answered since the exporter started",
        "The exporter at {{ $labels.instance }} has not reached SGLang's /metrics once in {for} "
        "(sglang_tuning_up = {{ $value }}): SGLang is still loading, failed to start, or --sglang.url is "
        "wrong.",
        "--sglang.url", "set", "the SGLang HTTP address serving /metrics (e.g. http://127.0.0.1:30000), "
        "once SGLang has finished loading",
        "Monitor metrics: enable metrics collection to make data-driven tuning decisions.", opts))
    last = ours("sglang_tuning_log_last_line_timestamp_seconds", opts)
    running = ours("sglang_tuning_running_requests", opts)
    stale = promql_duration(opts.log_stale_s)
    rules.append(_guard(
        "SGLangTuningLogStale", "log_stale",
        f"time() - {last} > {num(opts.log_stale_s)}\nand {on} max by (job, instance) ({running}) > 0", 300,
        "The SGLang log is not advancing while SGLang serves requests",
        f"No new log line reached the exporter at {{{{ $labels.instance }}}} for more than {stale} "
        "(last line {{ $value | humanizeDuration }} ago) while requests are running: the log path, "
        "rotation or --decode-log-interval hides Decode lines.",
        "--sglang.log-file", "set", "the path SGLang writes its log to (the file the Decode lines go to)",
        "Look for log entries like: Decode batch. #running-req ... #queue-req (the guide's signals).", opts))
    return Group("sglang-tuning.health", "health.rules.yaml",
                 "Guards: the exporter is scraped, it reaches SGLang, and the log advances.\nAlertmanager "
                 "inhibits the check alerts of an instance while its exporter is down or cannot scrape.",
                 tuple(rules))


def changes_group(opts: RenderOptions) -> Group:
    """A flag change the exporter judged `worse` (changes.py): page with the flag and the value to go back to."""
    verdict = ours('sglang_tuning_change_verdict{verdict="worse"}', opts)
    info = ours("sglang_tuning_change_info", opts)
    expr = f"({verdict} == 1)\n* on (job, instance, flag) group_left (from_value, to_value) {info}"
    rule = Rule({
        "alert": "SGLangTuningChangeMadeWorse", "expr": expr, "for": promql_duration(
            300 if opts.override_for_s is None else opts.override_for_s),
        "labels": {"severity": "warning", "check": "change_made_worse", "source": "exporter"},
        "annotations": {
            "summary": "A flag change made SGLang worse",
            "description": "On {{ $labels.instance }} {{ $labels.flag }} went from {{ $labels.from_value }} to "
                           "{{ $labels.to_value }} and the checks it touches got worse at comparable load "
                           "(verdict worse = {{ $value }}); go back to {{ $labels.flag }} "
                           "{{ $labels.from_value }}. The exporter's /api/changes says why.",
            "runbook_url": f"{opts.runbook_url}#{anchor('SGLangTuningChangeMadeWorse')}",
            "dashboard_url": dashboard_url(opts),
            "check": "change_made_worse", "flag": "{{ $labels.flag }}", "action": "set",
            "suggested_value": "{{ $labels.from_value }}",
            "guide": "Change one flag at a time, then benchmark again."},
    }, "the last change of a flag, judged on matching windows before and after it (changes.py)")
    return Group("sglang-tuning.changes", "changes.rules.yaml",
                 "Flag changes: the exporter compares the checks a changed flag touches before and after the "
                 "change\n(sglang_tuning_change_verdict); a change judged worse pages with the value to go back to.",
                 (rule,))


def slo_group(table: CheckTable, opts: RenderOptions) -> Group:
    """The `slo:` of the config as recording rules and burn-rate alerts (render/slo.py)."""
    return Group(slo.GROUP, "slo.rules.yaml", slo.header(opts),
                 tuple(Rule(body, comment) for _, body, comment in slo.rules(table, opts)))


def groups(table: CheckTable, opts: RenderOptions) -> list[Group]:
    """Every group with its comments, in file order."""
    out = [recording_group(opts), health_group(opts), checks_group(table, opts), changes_group(opts)]
    if opts.slo:
        out.append(slo_group(table, opts))
    if opts.native:
        out.append(native_group(table, opts))
    if opts.selector:  # a server is told apart by its selector labels too (two clusters' gpu-a:9470)
        def keep(r: Rule) -> Rule:
            return replace(r, body={**r.body, "expr": keep_selector_labels(r.body["expr"], opts.selector)})
        out = [replace(g, rules=tuple(keep(r) for r in g.rules)) for g in out]
    return out


def rule_groups(table: CheckTable, options: RenderOptions | None = None) -> list[dict[str, Any]]:
    """Plain rule groups (`{"name", "rules"}`) as in a Prometheus rule file or a PrometheusRule spec."""
    opts = options or RenderOptions()
    return [{"name": g.name, "rules": [dict(r.body) for r in g.rules]} for g in groups(table, opts)]


# ----------------------------------------------------------------------------- YAML text

_PLAIN = re.compile(r"^[A-Za-z0-9_./-](?:[A-Za-z0-9_ ./()-]|:(?! ))*(?<!:)$")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}


def _scalar(v: Any) -> str:
    if isinstance(v, str):
        if (_PLAIN.match(v) and v.lower() not in _YAML_WORDS and not v.endswith(" ")
                and not v.startswith("- ") and not re.fullmatch(r"[0-9.eE+-]+", v)):
            return v
        if "\n" not in v and v.isprintable():
            return "'" + v.replace("'", "''") + "'"  # single quotes: no backslash escapes to read
        return json.dumps(v, ensure_ascii=False)
    return json.dumps(v)


def _emit_rule(rule: Rule, indent: str) -> list[str]:
    lines = [f"{indent}# {c}".rstrip() for c in rule.comment.splitlines()]
    first = True
    for key, val in rule.body.items():
        lead = f"{indent}- " if first else f"{indent}  "
        first = False
        if isinstance(val, dict):
            lines.append(f"{lead}{key}:")
            lines.extend(f"{indent}    {k}: {_scalar(v)}" for k, v in val.items())
        elif key == "expr":
            # Block literal, final newline stripped: the file parses back to exactly this string.
            lines.append(f"{lead}{key}: |-")
            lines.extend(f"{indent}    {ln}".rstrip() for ln in val.splitlines())
        else:
            lines.append(f"{lead}{key}: {_scalar(val)}")
    return lines


def group_yaml(group: Group, source: str = "checks.yaml") -> str:
    """One rule file: header comment, then the group in mixin layout."""
    lines = [f"# Generated by `sglang-tuning-exporter render` from {source}: edit the table, not this file.",
             *[f"# {h}" for h in group.header.splitlines()], "groups:", f"  - name: {group.name}", "    rules:"]
    for r in group.rules:
        lines.extend(_emit_rule(r, "      "))
    return "\n".join(lines) + "\n"


def generate(table: CheckTable, options: RenderOptions | None = None) -> dict[str, str]:
    """Every rule file as `{relative path: YAML text}`."""
    opts = options or RenderOptions()
    return {f"{RULES_DIR}/{g.file}": group_yaml(g) for g in groups(table, opts)}


