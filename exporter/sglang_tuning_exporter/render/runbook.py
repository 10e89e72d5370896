"""alerts/runbook.md generated from the checks table: one section per alert, anchors the alerts link to.

Every check of the table gets a section (whatever workload the rules were rendered for), plus the
health guards. A section says what the alert means, what it costs, how to confirm it (panel, log
line), the change to make (flag, direction, how the suggested value is computed) and the trade-off.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sglang_tuning_exporter.core.durations import duration_text, promql_duration
from sglang_tuning_exporter.guide.checks import Check, CheckTable, VersionFlag
from sglang_tuning_exporter.render.annotations import anchor, guide_fallback
from sglang_tuning_exporter.render.expressions import (
    has_native,
    levels,
    native_record_name,
    profile_of,
    window_of,
)
from sglang_tuning_exporter.render.options import RenderOptions
from sglang_tuning_exporter.render.slo import BURN_PAIRS, SLO_HISTOGRAMS, alert_name, kind

RUNBOOK_PATH = "alerts/runbook.md"


@dataclass(frozen=True, slots=True)
class GuardDoc:
    """Runbook text of a health guard (not in the checks table: it is about the exporter itself)."""

    alert: str
    check: str
    meaning: str
    impact: str
    confirm: str
    mitigation: str


GUARD_DOCS = (
    GuardDoc("SGLangTuningExporterDown", "exporter_down",
             "Prometheus scrapes the exporter's job but the target answers no more (`up == 0` for 5 minutes).",
             "Every guide check of that instance is blind; Alertmanager inhibits them so they do not page.",
             "`curl http://<host>:9470/-/healthy`; the Prometheus targets page shows the scrape error; the "
             "exporter's own log (`journalctl` / pod logs).",
             "Restart the exporter (`sglang-tuning-exporter serve`), check `--web.listen-address` "
             "(default :9470) and the firewall between Prometheus and the exporter."),
    GuardDoc("SGLangTuningExporterAbsent", "exporter_absent",
             "No `up` series exists for the exporter's job: the scrape configuration lost the target "
             "(service discovery, relabelling, a renamed job).",
             "No tuning alert can fire anywhere, and nothing looks broken.",
             "Prometheus `Status > Targets`: is a job with the configured name there? `up{job=...}` in the "
             "expression browser.",
             "Add the scrape job (see `deploy/prometheus/`), or re-render the rules with "
             "`render --exporter-job <name>` so they use your job name."),
    GuardDoc("SGLangTuningScrapeFailing", "sglang_scrape_failing",
             "The exporter is up but cannot read SGLang's `/metrics` (`sglang_tuning_up == 0` while the "
             "metrics source is enabled) although it had read it before (`sglang_tuning_scrape_samples` "
             "exists from the exporter's first successful scrape on): SGLang went down, hangs, or moved. "
             "Silent while SGLang is still loading after a start (SGLangTuningSGLangNeverUp covers that) and "
             "when server info says `enable_metrics` is false (SGLangMetricsDisabled covers that).",
             "Metric-based signals (exact retraction, CUDA-graph and cache counters) are missing; checks of "
             "this instance are inhibited in Alertmanager.",
             "Exporter status page (`/`) shows the metrics source error; `sglang_tuning_source_up{source=\"metrics\"}`; "
             "`curl <sglang>/metrics` from the exporter's host.",
             "Find out why SGLang stopped answering (crash, OOM kill, restart: its own log and the "
             "supervisor's); a restart of SGLang alone under a running exporter also lands here when the "
             "reload takes longer than 5 minutes. If SGLang moved, point `--sglang.url` at its new address; "
             "check `--api-key` auth if it changed."),
    GuardDoc("SGLangTuningSGLangNeverUp", "sglang_never_up",
             "Since the exporter started, not one scrape of SGLang's `/metrics` succeeded for 30 minutes "
             "(`sglang_tuning_up == 0` and no `sglang_tuning_scrape_samples`). A large model loads for "
             "10-20 minutes, so a normal start stays below this.",
             "No metric-based signal exists for this server yet; if SGLang failed to start, nothing serves.",
             "SGLang's log: is it still loading weights or capturing CUDA graphs, or did it exit? "
             "`curl <sglang>/metrics` from the exporter's host; the exporter's status page (`/`) shows the "
             "metrics source error.",
             "If SGLang is up, point `--sglang.url` at its HTTP port (default 30000) and check `--api-key`; "
             "if it is still loading, wait; if it exited, fix its start (the log's last error)."),
    GuardDoc("SGLangTuningLogStale", "log_stale",
             "SGLang has running requests but no new log line reached the exporter for more than the stale "
             "time (default 5 minutes).",
             "Log-derived signals (Decode-line queue, usage, CUDA graph, retractions, OOM phases) freeze; "
             "log-only checks stop seeing problems.",
             "`sglang_tuning_log_last_line_timestamp_seconds` not moving; `tail -F` the file named by "
             "`--sglang.log-file`; `sglang_tuning_log_rotations_total` after a rotation.",
             "Point `--sglang.log-file` at the file SGLang writes (with `--log-level info`); if SGLang logs "
             "to stdout under a supervisor, redirect it to a file the exporter can read."),
)


def _flags_by_version(flags: tuple[VersionFlag, ...]) -> str:
    parts = []
    for vf in flags:
        rng = " ".join(p for p in ((f"from {vf.since}" if vf.since else ""),
                                   (f"before {vf.until}" if vf.until else "")) if p)
        parts.append(f"`{vf.flag}` {rng}".strip())
    return "; ".join(parts)


def _md(text: str) -> str:
    return " ".join(text.split())


def _check_section(check: Check, table: CheckTable, opts: RenderOptions) -> list[str]:
    prof = profile_of(table, opts)
    lv = levels(check, table, replace_workload(opts, check))
    thresholds = ", ".join(f"{lvl} when `{check.signal} {check.comparison} {th:g}`" for lvl, th in lv)
    window = promql_duration(window_of(check, opts))
    lines = [f'<a id="{anchor(check.alert)}"></a>', f"## {check.alert}", "",
             f"*{check.title}.* Check `{check.id}`; {thresholds} (profile {prof}, window {window}). "
             f"Workloads: {', '.join(check.workloads)}.", ""]
    sources = "the exporter's signal"
    if has_native(check):
        sources += f" and, without the exporter, SGLang's own metrics (`{native_record_name(check, opts)}`)"
    lines += [f"- **Meaning.** {_md(check.runbook['meaning'])} Evaluated from {sources}.",
              f"- **Impact.** {_md(check.runbook['impact'])}",
              f"- **How to confirm.** {_md(check.runbook['confirm'])}"]
    if check.flag:
        change = (f"{check.action} `{check.flag}`"
                  + (f" (by SGLang version: {_flags_by_version(check.flags_by_version)})"
                     if check.flags_by_version else "")
                  + f". The alert's `suggested_value` is the exporter's computed value "
                    f"(`sglang_tuning_suggested_value`), else {guide_fallback(check, opts)}.")
    else:
        change = f"on the client side: {check.client_action}."
    lines += [f"- **Change to make.** {change} {_md(check.runbook['mitigation'])}",
              f"- **Trade-off.** {_md(check.tradeoff)}"]
    quotes = [q for q in check.guide if set(q.versions) & set(table.profiles[prof].guide_files)] or list(check.guide)
    for q in quotes[:2]:
        lines.append(f"- **Guide** ({', '.join(q.versions)}): \"{_md(q.text)}\"")
    return [*lines, ""]


def replace_workload(opts: RenderOptions, check: Check) -> RenderOptions:
    """Options whose workload applies to the check (its first workload when the chosen one does not)."""
    return opts if opts.workload in check.workloads else replace(opts, workload=check.workloads[0])


CHANGE_DOC = GuardDoc(
    "SGLangTuningChangeMadeWorse", "change_made_worse",
    "A server flag changed (a new startup section of the log, or server info answering another value) and the "
    "checks that name the flag, or that its remedy can hurt (`hurts` in checks.yaml), got worse over matching "
    "windows after the change at comparable load (requests running + queued); or an OOM followed a memory change.",
    "The change cost more than it gained: retractions, an underused KV cache, OOMs or a capped batch.",
    "The exporter's `/api/changes` (or the status page) gives the verdict, the windows compared and why; "
    "`diagnose` on the log across the restart gives the same.",
    "Restart SGLang with the flag back at `from_value` (the alert's `suggested_value`), then try a smaller step.")


def slo_docs(table: CheckTable, opts: RenderOptions) -> list[tuple[GuardDoc, str]]:
    """The burn-rate alerts an `slo:` renders, each with its severity: always documented (a chart or a render
    with `slo:` links here), with the config's target when the render has one."""
    out: list[tuple[GuardDoc, str]] = []
    by_id = table.by_id()
    for target, (_family, words, cid, other) in SLO_HISTOGRAMS.items():
        le = duration_text(opts.slo[target]) if target in opts.slo else f"the target (`slo.{target}`)"
        flag = by_id[cid].flag if cid in by_id and by_id[cid].flag else "the client side"
        for long_s, short_s, burn, _for_s, severity in BURN_PAIRS:
            out.append((GuardDoc(
                alert_name(target, severity), f"slo_{kind(target)}",
                f"More requests than the SLO allows were slower than {le} ({words}) over both "
                f"{promql_duration(long_s)} and {promql_duration(short_s)}: the error budget burns {burn:g}x too fast "
                "(the SRE workbook's multi-window, multi-burn-rate alert). Rendered only from an `slo:` (the "
                "exporter's config with `render --config`, or the Helm chart's `slo` value).",
                "Users feel it: at this rate the whole budget is gone in "
                f"{duration_text(30 * 86400 / burn)} of a 30-day period.",
                f"Dashboard row 'SLO burn' (server dashboard): the {words} burn rate over 5m, 30m, 1h and 6h "
                f"(`instance:sglang_slo_{kind(target)}_burn_rate:rate*`; the alert pages above {burn:g}) and the "
                f"row 'Latency': {words} p95.",
                f"Most likely `{cid}` ({flag}): follow its finding; first rule out `{other}` (the queue, a "
                "client-side matter)."), severity))
    return out


def _guard_section(g: GuardDoc, kind: str = "Health guard", severity: str = "warning") -> list[str]:
    return [f'<a id="{anchor(g.alert)}"></a>', f"## {g.alert}", "",
            f"*{kind}* `{g.check}` (severity {severity}).", "",
            f"- **Meaning.** {g.meaning}", f"- **Impact.** {g.impact}", f"- **How to confirm.** {g.confirm}",
            f"- **Change to make.** {g.mitigation}", ""]


def generate(table: CheckTable, options: RenderOptions | None = None) -> str:
    """The runbook markdown."""
    opts = options or RenderOptions()
    out = ["# sglang-tuning-exporter runbook", "",
           "Generated by `sglang-tuning-exporter render` from `checks.yaml`; edit the table, not this file.",
           "Each alert's `runbook_url` points at its section. Alerts carry `flag`, `action` and "
           "`suggested_value` annotations; this page says how the value is computed and what the change costs.",
           "", "Alerts come in two variants with the same name and `check` label: `source=\"exporter\"` "
           "(the sidecar's signals) and `source=\"sglang\"` (SGLang's own `/metrics`, used where no exporter "
           "covers the same model and DP rank).", "", "## Contents", ""]
    for c in table.checks:
        out.append(f"- [{c.alert}](#{anchor(c.alert)}): {c.title}")
    for g in GUARD_DOCS:
        out.append(f"- [{g.alert}](#{anchor(g.alert)}): health guard")
    out.append(f"- [{CHANGE_DOC.alert}](#{anchor(CHANGE_DOC.alert)}): flag change")
    slo = slo_docs(table, opts)
    for g, _ in slo:
        out.append(f"- [{g.alert}](#{anchor(g.alert)}): latency SLO")
    out.append("")
    for c in table.checks:
        out += _check_section(c, table, opts)
    out += ["# Health guards", ""]
    for g in GUARD_DOCS:
        out += _guard_section(g)
    out += ["# Flag changes", ""]
    out += _guard_section(CHANGE_DOC, "Flag change")
    if slo:
        out += ["# Latency SLO", ""]
        for g, severity in slo:
            out += _guard_section(g, "Latency SLO", severity)
    return "\n".join(out).rstrip("\n") + "\n"


