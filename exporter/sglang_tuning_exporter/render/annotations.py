"""Alert annotations of a check (interfaces.md): summary, description with Go-template placeholders filled,
the flag, the suggested and current values looked up from the exporter's series (the guide's value as the
fallback), the guide's line and the runbook anchor.
"""

from __future__ import annotations

import json

from sglang_tuning_exporter.core.model import value_text
from sglang_tuning_exporter.guide.checks import Check, CheckTable
from sglang_tuning_exporter.render.expressions import fill, job_matcher, num, profile_of, with_host
from sglang_tuning_exporter.render.grafana import SERVER_UID
from sglang_tuning_exporter.render.options import HOST_LABEL, RenderOptions, selector_labels

# ----------------------------------------------------------------------------- annotations


def guide_fallback(check: Check, opts: RenderOptions) -> str:
    """The suggested value to print when the exporter's suggested-value metric is absent."""
    params = check.suggest_params(opts.workload)
    method = check.suggest.method
    if method == "toward_target" and "target" in params:
        return value_text(params["target"])
    if method == "constant" and "value" in params:
        return value_text(params["value"])
    if check.suggest.guide_value is not None:
        return value_text(check.suggest.guide_value)
    if method == "mem_fraction_headroom":
        return (f"current + (available_gpu_mem - {value_text(params.get('target_gb', 6.5))} GB) / GPU memory, "
                f"rounded to {value_text(params.get('step', 0.01))}")
    if method == "scale_down_running":
        return (f"{value_text(params.get('factor', 0.75))} x the current value, "
                f"a multiple of {value_text(params.get('multiple', 8))}")
    if method == "cuda_graph_ceiling_down":
        return (f"{value_text(params.get('factor', 0.5))} x the current ceiling, a multiple of "
                f"{value_text(params.get('step', 8))} (SGLang's example: {value_text(params.get('example'))})")
    if method == "mamba_cache_for_wanted":
        return (f"(running cap + median queue, at most {value_text(params.get('max_factor', 4.0))} x the cap) x "
                f"state slots per request, a multiple of {value_text(params.get('multiple', 8))}")
    if method == "kv_pool_for_cap":
        return ("current + KV size x (requested / granted - 1) / GPU memory, within the headroom above "
                f"{value_text(params.get('min_headroom_gb', 5.0))} GB, rounded down to {value_text(params.get('step', 0.01))}")
    if method == "swa_ratio_balance":
        return (f"current x mean swa usage / mean full usage, at most {value_text(params.get('max_factor', 2.0))} x, "
                f"rounded up to {value_text(params.get('step', 0.05))}")
    if method == "context_to_pool":
        return f"the KV pool's tokens, rounded down to a multiple of {value_text(params.get('multiple', 1024))}"
    return f"see the runbook ({method})"


# `by` of the annotation helpers: "instance" on the exporter's own alerts; NATIVE_LOOKUP on native alerts,
# which look the exporter's series up by the dedup_on labels (the server's host, model and DP rank).
NATIVE_LOOKUP = "dedup_on"


def _lookup(metric: str, check: Check, opts: RenderOptions, by: str) -> str:
    """Go template opening `{{ with <query of metric for this alert's server, rank and check> }}`."""
    job = job_matcher(opts.exporter_job)
    keys = opts.dedup_on if by == NATIVE_LOOKUP else (by, "dp_rank")
    matchers = [m for m in (opts.selector, job) if m]
    args: list[str] = []
    # The selector's labels take the alert's own values: a regex selector spanning clusters would otherwise
    # let another cluster's server of the same instance lend its value.
    for key in (*selector_labels(opts.selector), *keys):
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
    text = fill(check.description, check, table, opts)
    repl = {"{value}": value, "{threshold}": num(threshold),
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
        "dashboard_url": dashboard_url(opts),
        "check": check.id,
        "flag": flag_template(check, opts, by=by) if check.flag else "client-side",
        "action": check.action,
        "suggested_value": suggested_template(check, opts, by=by),
        "guide": guide_line(check, table, opts),
    }


# The per-server dashboard's path (Grafana's `d/<uid>/<slug>`; its slug is its uid).
SERVER_DASHBOARD = f"d/{SERVER_UID}/{SERVER_UID}"
# Dashboard variables filled from the alert's labels when it has them (the Kubernetes scope, then the server).
DASHBOARD_VARS = ("cluster", "namespace", "pod", "instance")


def dashboard_url(opts: RenderOptions) -> str:
    """Go template: the per-server dashboard over the last 3 hours, its variables set to the alert's labels."""
    var_params = "".join(f"{{{{ with $labels.{v} }}}}&var-{v}={{{{ . | urlquery }}}}{{{{ end }}}}" for v in DASHBOARD_VARS)
    return f"{opts.grafana_url.rstrip('/')}/{SERVER_DASHBOARD}?from=now-3h&to=now{var_params}"


def anchor(alert: str) -> str:
    """The runbook anchor of an alert (GitHub's heading slug of `## <AlertName>`)."""
    return alert.lower()
