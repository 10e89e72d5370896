"""PromQL of the rules, check by check: the exporter's and SGLang's selectors (job matchers, both
spellings of SGLang's names, Ray Serve's third), each check's signal expression, window, `for:`, levels and thresholds for
the chosen profile and workload, and the derived host label that joins a sidecar to its SGLang.
"""

from __future__ import annotations

import json
import re

from sglang_tuning_exporter.core.catalog import PREFIX, SAMPLE_COUNT_OF, SIGNAL_UNITS
from sglang_tuning_exporter.core.durations import promql_duration
from sglang_tuning_exporter.guide.checks import Check, CheckTable
from sglang_tuning_exporter.guide.native import HOST_REGEX, add_matcher, respell
from sglang_tuning_exporter.guide.native import fill as fill_template
from sglang_tuning_exporter.render.options import HOST_LABEL, RenderOptions, selector_labels

# level name -> severity label; a check with two levels gets two alerts of the same name.
LEVEL_ORDER = ("warning", "critical")
# Labels that identify one rank of one server on the exporter's per-rank series.
RANK_JOIN = ("instance", "model_name", "dp_rank", "pp_rank")  # the same labels on exporter and SGLang series


_OURS = re.compile(r"(?<![\w:])(sglang_tuning_[a-z0-9_]+)(\{[^}]*\})?")

# ----------------------------------------------------------------------------- selectors


def job_matcher(job: str) -> str:
    return f"job={json.dumps(job)}" if job else ""


def scoped(braces: str | None, job: str, opts: RenderOptions) -> str | None:
    """A selector's braces with the job matcher, then the `selector` option's matchers in front
    (`{cluster="prod",job="x",...}`); None (no braces) when there is nothing to add."""
    if job:
        braces = add_matcher(braces, job)
    if opts.selector:
        braces = add_matcher(braces, opts.selector)
    return braces


def ours(expr: str, opts: RenderOptions) -> str:
    """Add the exporter's job matcher and the selector option to every `sglang_tuning_*` selector."""
    job = job_matcher(opts.exporter_job)
    if not job and not opts.selector:
        return expr
    return _OURS.sub(lambda m: m.group(1) + (scoped(m.group(2), job, opts) or ""), expr)


def selector_of(metric: str, opts: RenderOptions) -> str:
    """A bare metric of the exporter's job (e.g. `up`) with its job matcher and the selector option."""
    return metric + (scoped(None, job_matcher(opts.exporter_job), opts) or "")


_BRACES = re.compile(r"\{[^{}]*\}")


def add_selector(query: str, selector: str) -> str:
    """A dashboard query with the selector option's matchers in every `{...}` label-matcher block (each
    selector of the dashboards has braces: they all carry the dashboard variables)."""
    if not selector:
        return query
    return _BRACES.sub(lambda m: add_matcher(m.group(0), selector), query)


def record_selector(name: str, opts: RenderOptions) -> str:
    """A recorded series of these rules (it keeps its source's labels) with the selector option."""
    return name + (scoped(None, "", opts) or "")


_GROUPING = re.compile(r"\b(by|on) \(([^()]*)\)")


def keep_selector_labels(expr: str, selector: str) -> str:
    """Add the selector's labels (e.g. `cluster`) to every `by`/`on` grouping that keeps a server apart
    (names `instance` or `instance_host`): two clusters' `gpu-a:9470` stay two series."""
    keep = selector_labels(selector)
    if not keep:
        return expr

    def sub(m: re.Match[str]) -> str:
        names = [n.strip() for n in m.group(2).split(",") if n.strip()]
        if not {"instance", HOST_LABEL} & set(names):
            return m.group(0)
        return f"{m.group(1)} ({', '.join(names + [k for k in keep if k not in names])})"

    return _GROUPING.sub(sub, expr)


# SGLang's own names as a server exposes them: `sglang:x`, `sglang_x` (Prometheus 3 escaping, a gateway) and
# Ray Serve's `ray_sglang_x` (0.5.15+, with a `ReplicaId` label that `without (...)` keeps apart).
SPELLINGS = ("sglang:", "sglang_", "ray_sglang_")


def native(expr: str, opts: RenderOptions, spelling: str) -> str:
    """Rewrite `sglang:x` selectors to one spelling (a prefix of SPELLINGS), with the SGLang job matcher."""
    job = job_matcher(opts.sglang_job)
    return respell(expr, spelling, lambda braces: scoped(braces, job, opts))


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


def fill(template: str, check: Check, table: CheckTable, opts: RenderOptions) -> str:
    band = table.profiles[profile_of(table, opts)].queue_band
    # The guard's value (a config may override it): the same number on the exporter and native side.
    return fill_template(template, window=promql_duration(window_of(check, opts)), band=(num(band[0]), num(band[1])),
                         min_samples=num(check.min_samples), guard=num(check.guard[0].value) if check.guard else None)


def num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def paren(expr: str) -> str:
    e = expr.strip()
    return e if re.fullmatch(r"[\w:]+(\{[^}]*\})?", e) else f"({e})"


def exporter_signal_expr(check: Check, table: CheckTable, opts: RenderOptions, *, judged: bool = True) -> str:
    """The exporter-side PromQL yielding the check's signal per rank; `judged`: only where the check is
    judged (not while a feature its remedy needs is switched off on the instance: `moot_when`)."""
    expr = fill(str(check.promql["exporter"]), check, table, opts)
    if judged:
        expr = with_enough_samples(expr, check)
        for name, _ in check.moot_when:
            expr = f"({expr}) unless on (instance) (max by (instance) ({signal_series(name)}) > 0)"
    return ours(expr, opts)


def with_enough_samples(expr: str, check: Check) -> str:
    """The check's signal only where its sample count reaches the check's min_samples: below it the sidecar
    exports the signal (from 3 samples) but calls the check unknown (catalog.SAMPLE_COUNT_OF)."""
    count = SAMPLE_COUNT_OF.get(check.signal)
    if count is None:
        return expr
    # The count is a sibling series of the signal: same rank labels, another `signal`.
    return f"({expr}) and ignoring (signal) ({signal_series(count)} >= {num(check.min_samples)})"


def signal_series(signal: str) -> str:
    """The exporter's series of one signal of docs/signals.md, in its unit's family (catalog.SIGNAL_UNITS)."""
    family, label, _ = SIGNAL_UNITS[signal]
    return f'{PREFIX}{family}{{signal="{label}"}}'


def native_signal_exprs(check: Check, table: CheckTable, opts: RenderOptions) -> tuple[str, ...]:
    """The SGLang-native signal PromQL in each of SPELLINGS."""
    raw = fill(str(check.promql["sglang"]), check, table, opts)
    return tuple(native(raw, opts, spelling) for spelling in SPELLINGS)


def has_native(check: Check) -> bool:
    """True when the check can be judged from SGLang's own metrics alone."""
    # A guard (e.g. the schedule policy) is a fact SGLang's /metrics does not carry, unless the native
    # expression applies it itself (`{guard}`: the latency checks' batch, queue time and prompt length).
    raw = check.promql.get("sglang")
    return bool(raw) and (not check.guard or "{guard}" in str(raw))


def exporter_has_signal(check: Check, table: CheckTable, opts: RenderOptions) -> str:
    """The exporter's series of the check's signal whether or not its guard holds (a native alert is
    silenced where the sidecar has the signal: a guard it reads as not met is its verdict, not a gap)."""
    if not check.guard:
        return exporter_signal_expr(check, table, opts, judged=False)
    return ours(signal_series(check.signal), opts)


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


def compare(expr: str, comparison: str, threshold: float) -> str:
    return f"{expr} {comparison} {num(threshold)}"


def with_host(expr: str) -> str:
    """Add the derived `instance_host` label (the host part of `instance`) to an expression's series."""
    return f'label_replace({expr}, "{HOST_LABEL}", "$1", "instance", "{HOST_REGEX}")'
