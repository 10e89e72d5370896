"""Prometheus recording and alerting rules generated from the checks table (mixin layout, readable YAML).

Five groups, one file each under `alerts/`:
- `sglang-tuning-exporter.recording` - per-rank rates of the exporter's counters (numerators and
  denominators recorded separately, for dashboards and ad-hoc ratios);
- `sglang-tuning.health` - guards: exporter down/absent, SGLang scrape failing or never up, log not advancing;
- `sglang-tuning.checks` - one alert per check and level, on the exporter's guide signals;
- `sglang-tuning.changes` - a flag change judged worse (the flag and the value to go back to);
- `sglang-tuning.native` - the same checks on SGLang's own `/metrics` (both spellings), for servers
  without the sidecar; silenced where the sidecar beside that SGLang (same host) already evaluates that
  model and DP rank.
`rule_groups(table, options)` returns plain dicts (also used for Kubernetes PrometheusRule objects);
`generate(table, options)` returns `{relative path: YAML text}` with explanatory comments.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sglang_tuning_exporter.core.durations import parse_duration, promql_duration
from sglang_tuning_exporter.core.problems import ProblemsError
from sglang_tuning_exporter.core.recording import RECORDING_WINDOW_S, recorded
from sglang_tuning_exporter.guide.checks import Check, CheckTable

DEFAULT_RUNBOOK_URL = ("https://github.com/sglang-tuning-exporter/sglang-tuning-exporter/blob/main/"
                       "alerts/runbook.md")
RULES_DIR = "alerts"
# level name -> severity label; a check with two levels gets two alerts of the same name.
LEVEL_ORDER = ("warning", "critical")
# SGLang's QueueCount gauges carry per-priority series under priority scheduling; the total is priority="".
PRIORITY_TOTAL_METRICS = frozenset({"num_queue_reqs", "num_running_reqs"})
# Labels that identify one rank of one server on the exporter's per-rank series.
RANK_JOIN = ("instance", "model_name", "dp_rank", "pp_rank")  # the same labels on exporter and SGLang series
# A derived join label: the host part of `instance`. A sidecar runs beside its SGLang (same pod IP or
# host), so its instance and SGLang's share the host and differ only in the port.
HOST_LABEL = "instance_host"
HOST_REGEX = "(.+?)(?::[0-9]+)?"  # label_replace anchors it: "gpu-a:30000" -> "gpu-a", "[::1]:9470" -> "[::1]"
# How long "SGLang had been up" is remembered: since the exporter started (scrape_samples is set by the
# first successful scrape and kept through failures); an SGLang that never came up gets its own alert.
NEVER_UP_FOR_S = 1800.0

_OURS = re.compile(r"(?<![\w:])(sglang_tuning_[a-z0-9_]+)(\{[^}]*\})?")
_NATIVE = re.compile(r"(?<![\w:])sglang:([a-z0-9_]+)(\{[^}]*\})?")


class OptionsError(ProblemsError):
    """Invalid render options; `problems` lists every problem."""

    what = "render options"


@dataclass(frozen=True, slots=True)
class RenderOptions:
    """What the rules depend on besides the table (YAML `render:` file keys or CLI flags)."""

    exporter_job: str = "sglang-tuning-exporter"  # job label of our scrape; "" = no job matcher
    sglang_job: str = "sglang"  # job label of SGLang's own /metrics scrape; "" = no job matcher
    runbook_url: str = DEFAULT_RUNBOOK_URL  # base URL; each alert links `<base>#<alert name lowercased>`
    profile: str | None = None  # guide profile for thresholds; None = the table's default
    workload: str = "throughput"  # the guide recipe the exporter runs with (same as `serve --workload`)
    override_for_s: float | None = None  # test override: every `for:` (e.g. 15s for end-to-end tests)
    override_window_s: float | None = None  # test override: every PromQL range window
    min_for_s: float = 60.0  # floor on `for:` so one evaluation never pages
    # native alert silenced where the exporter covers these labels; `instance_host` is derived from instance
    dedup_on: tuple[str, ...] = (HOST_LABEL, "model_name", "dp_rank")
    log_stale_s: float = 300.0  # log considered stalled after this long without a line
    native: bool = True  # render the SGLang-native group
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys for other renderers (kubernetes, ...)


OPTION_KEYS = {"exporter_job", "sglang_job", "runbook_url", "profile", "workload", "override_for",
               "override_window", "min_for", "dedup_on", "log_stale", "native"}


def options_from_mapping(raw: Any, base: RenderOptions | None = None) -> RenderOptions:
    """Render options from a YAML mapping (`render:` section or the whole file); raises OptionsError."""
    opts = base or RenderOptions()
    if raw is None:
        return opts
    if not isinstance(raw, dict):
        raise OptionsError(["render options must be a mapping"])
    problems: list[str] = []
    extra = {k: v for k, v in raw.items() if k not in OPTION_KEYS}
    changes: dict[str, Any] = {"extra": {**opts.extra, **extra}}
    for key in ("exporter_job", "sglang_job", "runbook_url", "workload"):
        if key in raw:
            if not isinstance(raw[key], str):
                problems.append(f"{key}: must be a string")
            else:
                changes[key] = raw[key]
    if "profile" in raw:
        changes["profile"] = None if raw["profile"] is None else str(raw["profile"])
    for key, attr in (("override_for", "override_for_s"), ("override_window", "override_window_s"),
                      ("min_for", "min_for_s"), ("log_stale", "log_stale_s")):
        if key in raw and raw[key] is not None:
            try:
                value = parse_duration(raw[key])
            except ValueError as exc:
                problems.append(f"{key}: {exc}")
                continue
            if not value.is_integer():  # PromQL ranges and `for:` are written in whole seconds
                problems.append(f"{key}: {raw[key]!r} is not a whole number of seconds")
                continue
            changes[attr] = value
    if "dedup_on" in raw:
        v = raw["dedup_on"]
        if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
            problems.append("dedup_on: must be a list of label names")
        else:
            changes["dedup_on"] = tuple(v)
    if "native" in raw:
        if not isinstance(raw["native"], bool):
            problems.append("native: must be true or false")
        else:
            changes["native"] = raw["native"]
    if problems:
        raise OptionsError(problems)
    return replace(opts, **changes)


def validate_options(table: CheckTable, opts: RenderOptions) -> list[str]:
    """Problems with options that depend on the table (profile, workload)."""
    problems = []
    if opts.profile is not None and opts.profile not in table.profiles:
        problems.append(f"profile: unknown guide profile {opts.profile!r} (known: {', '.join(table.profiles)})")
    if opts.workload not in table.workloads:
        problems.append(f"workload: unknown workload {opts.workload!r} (known: {', '.join(table.workloads)})")
    if opts.override_window_s is not None and opts.override_window_s <= 0:
        problems.append("override_window: must be > 0")
    return problems


# ----------------------------------------------------------------------------- selectors


def _add_matcher(braces: str | None, matcher: str) -> str:
    inner = (braces or "{}")[1:-1].strip()
    return "{" + (f"{matcher}," + inner if inner else matcher) + "}"


def _job(job: str) -> str:
    return f"job={json.dumps(job)}" if job else ""


def ours(expr: str, opts: RenderOptions) -> str:
    """Add the exporter's job matcher to every `sglang_tuning_*` selector of an expression."""
    job = _job(opts.exporter_job)
    if not job:
        return expr
    return _OURS.sub(lambda m: m.group(1) + _add_matcher(m.group(2), job), expr)


def native(expr: str, opts: RenderOptions, spelling: str) -> str:
    """Rewrite `sglang:x` selectors to one spelling (':' or '_'), with the SGLang job matcher."""
    job = _job(opts.sglang_job)

    def sub(m: re.Match[str]) -> str:
        name, braces = m.group(1), m.group(2)
        if name in PRIORITY_TOTAL_METRICS and "priority" not in (braces or ""):
            braces = _add_matcher(braces, 'priority=""')
        if job:
            braces = _add_matcher(braces, job)
        return f"sglang{spelling}{name}{braces or ''}"

    return _NATIVE.sub(sub, expr)


# ----------------------------------------------------------------------------- check helpers


def profile_of(table: CheckTable, opts: RenderOptions) -> str:
    """The guide profile whose thresholds the rules use."""
    return opts.profile or table.default_profile()


def window_of(check: Check, opts: RenderOptions) -> float:
    """The check's PromQL range in seconds (after the test override)."""
    return opts.override_window_s if opts.override_window_s is not None else check.window_s


def for_of(check_for_s: float, opts: RenderOptions) -> str:
    """The `for:` duration (override, else the table's value with the floor)."""
    if opts.override_for_s is not None:
        return promql_duration(opts.override_for_s)
    return promql_duration(max(check_for_s, opts.min_for_s))


def _fill(template: str, check: Check, table: CheckTable, opts: RenderOptions) -> str:
    band = table.profiles[profile_of(table, opts)].queue_band
    return (template.replace("{window}", promql_duration(window_of(check, opts)))
            .replace("{band_low}", _num(band[0])).replace("{band_high}", _num(band[1])))


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def _paren(expr: str) -> str:
    e = expr.strip()
    return e if re.fullmatch(r"[\w:]+(\{[^}]*\})?", e) else f"({e})"


def exporter_signal_expr(check: Check, table: CheckTable, opts: RenderOptions) -> str:
    """The exporter-side PromQL yielding the check's signal per rank."""
    return ours(_fill(str(check.promql["exporter"]), check, table, opts), opts)


def native_signal_exprs(check: Check, table: CheckTable, opts: RenderOptions) -> tuple[str, str]:
    """The SGLang-native signal PromQL in both spellings (colon, underscore)."""
    raw = _fill(str(check.promql["sglang"]), check, table, opts)
    return native(raw, opts, ":"), native(raw, opts, "_")


def has_native(check: Check) -> bool:
    """True when the check can be judged from SGLang's own metrics alone."""
    # A guard (e.g. the schedule policy) is a fact SGLang's /metrics does not carry.
    return bool(check.promql.get("sglang")) and not check.guard


def native_record_name(check: Check, opts: RenderOptions) -> str:
    """`rank:sglang_<signal>:over<window>` (or `:latest` for a startup gauge)."""
    raw = str(check.promql["sglang"])
    ops = f"over{promql_duration(window_of(check, opts))}" if "{window}" in raw else "latest"
    return f"rank:sglang_{check.signal}:{ops}"


def levels(check: Check, table: CheckTable, opts: RenderOptions) -> list[tuple[str, float]]:
    """(level, threshold) pairs of the check for the chosen profile and workload, warning first."""
    th = check.thresholds_for(profile_of(table, opts), opts.workload)
    return [(lvl, th[lvl]) for lvl in LEVEL_ORDER if lvl in th]


def lowest_threshold(check: Check, table: CheckTable, opts: RenderOptions) -> float:
    """The threshold at which the check first leaves ok."""
    return levels(check, table, opts)[0][1]


def checks_in_scope(table: CheckTable, opts: RenderOptions) -> list[Check]:
    """The checks of the chosen workload, in table order."""
    return table.for_workload(opts.workload)


# ----------------------------------------------------------------------------- annotations


def _fmt_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def guide_fallback(check: Check, opts: RenderOptions) -> str:
    """The suggested value to print when the exporter's suggested-value metric is absent."""
    params = check.suggest_params(opts.workload)
    method = check.suggest.method
    if method == "toward_target" and "target" in params:
        return _fmt_value(params["target"])
    if method == "constant" and "value" in params:
        return _fmt_value(params["value"])
    if check.suggest.guide_value is not None:
        return _fmt_value(check.suggest.guide_value)
    if method == "mem_fraction_headroom":
        return (f"current + (available_gpu_mem - {_fmt_value(params.get('target_gb', 6.5))} GB) / GPU memory, "
                f"rounded to {_fmt_value(params.get('step', 0.01))}")
    if method == "scale_down_running":
        return (f"{_fmt_value(params.get('factor', 0.75))} x the current value, "
                f"a multiple of {_fmt_value(params.get('multiple', 8))}")
    return f"see the runbook ({method})"


# `by` of the annotation helpers: "instance" on the exporter's own alerts; NATIVE_LOOKUP on native alerts,
# which look the exporter's series up by the dedup_on labels (the server's host, model and DP rank).
NATIVE_LOOKUP = "dedup_on"


def _lookup(metric: str, check: Check, opts: RenderOptions, by: str) -> str:
    """Go template opening `{{ with <query of metric for this alert's server, rank and check> }}`."""
    job = _job(opts.exporter_job)
    keys = opts.dedup_on if by == NATIVE_LOOKUP else (by, "dp_rank")
    matchers, args = [job] if job else [], []
    for key in keys:
        if key != HOST_LABEL:
            matchers.append(f"{key}=%q")
            args.append(f"$labels.{key}")
    matchers.append("check=%q")
    args.append(json.dumps(check.id))
    sel = f"{metric}{{{','.join(matchers)}}}"
    if HOST_LABEL in keys:
        # Exact match on the derived host (no regex to escape): only the sidecar beside this SGLang
        # lends its values; another server of the same model does not.
        sel = f'{with_host(sel)} and on ({HOST_LABEL}) label_replace(vector(1), "{HOST_LABEL}", %q, "", "")'
        args.append(f"$labels.{HOST_LABEL}")
    # A Go raw string keeps the PromQL quotes readable; %q quotes the label values safely.
    return f"{{{{ with printf `{sel}` {' '.join(args)} | query }}}}"


def _query(metric: str, check: Check, opts: RenderOptions, by: str, fallback: str) -> str:
    return f"{_lookup(metric, check, opts, by)}{{{{ . | first | value }}}}{{{{ else }}}}{fallback}{{{{ end }}}}"


def flag_template(check: Check, opts: RenderOptions, *, by: str) -> str:
    """The flag name; where it changed across SGLang releases, the one our metric names for this server."""
    if not check.flags_by_version:
        return str(check.flag)
    return (f"{_lookup('sglang_tuning_suggested_value', check, opts, by)}"
            f"{{{{ . | first | label \"flag\" }}}}{{{{ else }}}}{check.flag}{{{{ end }}}}")


def suggested_template(check: Check, opts: RenderOptions, *, by: str) -> str:
    """Go template: our suggested-value metric for this alert's series, else the guide's value."""
    if check.flag is None:
        return check.client_action
    return _query("sglang_tuning_suggested_value", check, opts, by, guide_fallback(check, opts))


def current_template(check: Check, opts: RenderOptions, *, by: str) -> str:
    """Go template: the exporter's current value of the check's flag, else 'the current value'."""
    return _query("sglang_tuning_current_value", check, opts, by, "the current value")


# "gpu-a:9470, model qwen, DP0 TP0": only the rank labels the series has (SGLang's own DP0/TP0 style).
RANK_TEXT = ("{{ $labels.instance }}{{ with $labels.model_name }}, model {{ . }}{{ end }}"
             "{{ with $labels.dp_rank }}, DP{{ . }}{{ end }}{{ with $labels.tp_rank }} TP{{ . }}{{ end }}")


def guide_line(check: Check, table: CheckTable, opts: RenderOptions) -> str:
    """The guide's reason in one line, from the chosen profile's guide file when it has one."""
    files = set(table.profiles[profile_of(table, opts)].guide_files)
    quote = next((q for q in check.guide if files & set(q.versions)), check.guide[0] if check.guide else None)
    return " ".join(quote.text.split()) if quote else ""


def description(check: Check, table: CheckTable, opts: RenderOptions, threshold: float, *, by: str) -> str:
    """The table's description with placeholders turned into alert template expressions."""
    value = ("{{ $value | humanizePercentage }}" if check.signal.endswith("_ratio")
             else '{{ printf "%.4g" $value }}')
    text = _fill(check.description, check, table, opts)
    repl = {"{value}": value, "{threshold}": _num(threshold),
            "{flag}": flag_template(check, opts, by=by) if check.flag else "the client", "{suggested}": suggested_template(check, opts, by=by),
            "{current}": current_template(check, opts, by=by), "{rank}": RANK_TEXT}
    for k, v in repl.items():
        text = text.replace(k, v)
    if "$labels.instance" not in text:
        text += f" (on {RANK_TEXT})"
    if "$value" not in text:
        text += f" Value: {value}."
    return text


def alert_annotations(check: Check, table: CheckTable, opts: RenderOptions, threshold: float, *,
                by: str) -> dict[str, str]:
    """The annotation set of interfaces.md for one check alert."""
    return {
        "summary": check.summary,
        "description": description(check, table, opts, threshold, by=by),
        "runbook_url": f"{opts.runbook_url}#{anchor(check.alert)}",
        "check": check.id,
        "flag": flag_template(check, opts, by=by) if check.flag else "client-side",
        "action": check.action,
        "suggested_value": suggested_template(check, opts, by=by),
        "guide": guide_line(check, table, opts),
    }


def anchor(alert: str) -> str:
    """The runbook anchor of an alert (GitHub's heading slug of `## <AlertName>`)."""
    return alert.lower()


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


def _cmp(expr: str, comparison: str, threshold: float) -> str:
    return f"{expr} {comparison} {_num(threshold)}"


def with_host(expr: str) -> str:
    """Add the derived `instance_host` label (the host part of `instance`) to an expression's series."""
    return f'label_replace({expr}, "{HOST_LABEL}", "$1", "instance", "{HOST_REGEX}")'


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
            sig = native_record_name(s, opts)
        else:
            sig = _paren(exporter_signal_expr(s, table, opts))
        out.append(f"unless on ({', '.join(RANK_JOIN)})\n  ({_cmp(sig, s.comparison, lowest_threshold(s, table, opts))})")
    return out


def _check_comment(check: Check, table: CheckTable, opts: RenderOptions, level: str, threshold: float) -> str:
    band = ""
    if "{band" in str(check.promql.get("exporter")) + str(check.promql.get("sglang")) + check.description:
        lo, hi = table.profiles[profile_of(table, opts)].queue_band
        band = f"; queue band {_num(lo)}-{_num(hi)}"
    change = (f"{check.action} {check.flag}" if check.flag else f"client side: {check.client_action}")
    exporter = str(check.promql.get("exporter"))
    windowed = "{window}" in exporter or "sglang_tuning_signal" in exporter
    over = f"over {promql_duration(window_of(check, opts))}" if windowed else "(startup fact)"
    return (f"{check.id} ({level}): {check.signal} {check.comparison} {_num(threshold)} {over}{band} -> {change}\n"
            f"guide: {guide_line(check, table, opts)}")


def checks_group(table: CheckTable, opts: RenderOptions) -> Group:
    """One alert per check and level, on the exporter's signals."""
    by_id = table.by_id()
    rules: list[Rule] = []
    for c in checks_in_scope(table, opts):
        sig = exporter_signal_expr(c, table, opts)
        for level, th in levels(c, table, opts):
            expr = _cmp(_paren(sig), c.comparison, th)
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
        colon, under = native_signal_exprs(c, table, opts)
        rules.append(Rule({"record": name, "expr": f"{_paren(colon)}\nor\n{_paren(under)}"},
                          f"{c.signal} from SGLang's own metrics; `or` keeps one series when a server "
                          "exposes sglang:x or sglang_x"))
    dedup = ", ".join(opts.dedup_on)
    by_host = HOST_LABEL in opts.dedup_on
    for c in natives:
        sig = native_record_name(c, opts)
        covered = exporter_signal_expr(c, table, opts)
        # By host: only the sidecar beside this SGLang silences it, not any exporter of the same model.
        covered = with_host(covered) if by_host else _paren(covered)
        for level, th in levels(c, table, opts):
            expr = _cmp(sig, c.comparison, th)
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
                 "exporter.\nEvery sglang: name is read in both spellings (sglang:x and sglang_x). An alert "
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
                        "runbook_url": f"{opts.runbook_url}#{anchor(alert)}", "check": gid, "flag": flag,
                        "action": action, "suggested_value": value, "guide": guide},
    }, f"guard {gid}: a broken source must not look healthy")


def health_group(opts: RenderOptions) -> Group:
    """Guards: the exporter and its sources are working, so silence means healthy."""
    job_sel = f"{{{_job(opts.exporter_job)}}}" if opts.exporter_job else ""
    on = "on (job, instance)"
    rules = [
        _guard("SGLangTuningExporterDown", "exporter_down", f"up{job_sel} == 0", 300,
               "sglang-tuning-exporter is down",
               "Prometheus cannot scrape the exporter at {{ $labels.instance }} (job {{ $labels.job }}) "
               "for {for}; its guide checks are blind. Value: {{ $value }}.",
               "--web.listen-address", "restart", "the exporter running and reachable on its port (default 9470)",
               "Monitor metrics: enable metrics collection to make data-driven tuning decisions.", opts),
    ]
    if opts.exporter_job:
        rules.append(_guard(
            "SGLangTuningExporterAbsent", "exporter_absent", f"absent(up{job_sel})", 900,
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
        f"time() - {last} > {_num(opts.log_stale_s)}\nand {on} max by (job, instance) ({running}) > 0", 300,
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
            "check": "change_made_worse", "flag": "{{ $labels.flag }}", "action": "set",
            "suggested_value": "{{ $labels.from_value }}",
            "guide": "Change one flag at a time, then benchmark again."},
    }, "the last change of a flag, judged on matching windows before and after it (changes.py)")
    return Group("sglang-tuning.changes", "changes.rules.yaml",
                 "Flag changes: the exporter compares the checks a changed flag touches before and after the "
                 "change\n(sglang_tuning_change_verdict); a change judged worse pages with the value to go back to.",
                 (rule,))


def groups(table: CheckTable, opts: RenderOptions) -> list[Group]:
    """Every group with its comments, in file order."""
    out = [recording_group(opts), health_group(opts), checks_group(table, opts), changes_group(opts)]
    if opts.native:
        out.append(native_group(table, opts))
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


def all_alerts(table: CheckTable, options: RenderOptions | None = None) -> list[dict[str, Any]]:
    """Every alerting rule body across groups (for the runbook and the tests)."""
    return [r for g in rule_groups(table, options) for r in g["rules"] if "alert" in r]
