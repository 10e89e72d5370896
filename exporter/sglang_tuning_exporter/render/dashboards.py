"""The two Grafana dashboards (per server, fleet) generated from the checks table; JSON is committed.

`generate(table)` returns `{relative path: file content}`; `render/command.py` writes or diffs it. Output is
deterministic (sorted keys, fixed panel ids and layout) so `render --check` can detect drift. Guide
numbers (queue band, token usage, retractions/min, memory band) come from the table's default profile
(`GuideBands`); this module holds none of them. It holds the panels of each dashboard and their layout;
the Grafana building blocks (queries, panel shapes, variables, grid) are in `render/grafana.py`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sglang_tuning_exporter.core.catalog import SIGNAL_FAMILIES, SIGNAL_FAMILY_UNITS, SIGNAL_UNITS
from sglang_tuning_exporter.guide.checks import Check, CheckTable
from sglang_tuning_exporter.render import slo
from sglang_tuning_exporter.render.expressions import add_selector, keep_selector_labels
from sglang_tuning_exporter.render.grafana import (
    BY,
    HOST_SEL,
    PRIORITY_TOTAL,
    RANK_SEL,
    RATE,
    SERVER_UID,
    STATUS_MAPPINGS,
    STATUS_STEPS,
    Cell,
    Json,
    dashboard,
    dump,
    layout,
    link,
    ours,
    per_rank,
    rate_per_replica,
    ratio,
    rename_override,
    sglang,
    stat,
    state_timeline,
    steps,
    table_panel,
    target,
    timeseries,
    tokenizer_rate,
    variables,
)

GIB = 1024**3  # SGLang's "GB" is GiB (free memory divided by 1 << 30)


@dataclass(frozen=True, slots=True)
class GuideBands:
    """The guide numbers the dashboards draw, read from one profile of the checks table."""

    profile: str
    queue_low: float  # the profile's healthy #queue-req band
    queue_high: float
    token_usage_min: float  # below it while requests queue: too conservative
    retractions_per_minute: float  # the guide's "~1 time per minute" (warning level)
    mem_critical_gb: float  # available_gpu_mem (GiB) below which the headroom check is critical
    mem_low_gb: float  # the guide's good band starts here ...
    mem_good_high_gb: float  # ... and ends here
    mem_high_gb: float  # above: too much left unused (the check fires)
    cuda_graph_miss_ratio: float  # share of decode batches without a graph that raises the finding
    least_is_worst: tuple[str, ...] = ()  # signals a check pages on when low: a server shows its least replica


# The kv_underused signal counts samples with `token usage < X`; X lives in the check's PromQL.
_USAGE_IN_PROMQL = re.compile(r"token_usage\)*\s*<\s*(?:bool\s+)?([0-9]*\.?[0-9]+)")


def _check(table: CheckTable, check_id: str) -> Check:
    found = table.by_id().get(check_id)
    if found is None:
        raise ValueError(f"checks table has no check {check_id!r} (the dashboards draw its threshold)")
    return found


def _level(check: Check, profile: str, level: str) -> float:
    values = check.thresholds_for(profile)
    if level not in values:
        raise ValueError(f"check {check.id!r} has no {level} threshold for profile {profile!r}")
    return float(values[level])


def _token_usage_min(check: Check) -> float:
    for guard in check.guard:
        if guard.signal == "token_usage":
            return guard.value
    for expr in check.promql.values():
        m = _USAGE_IN_PROMQL.search(expr or "")
        if m:
            return float(m.group(1))
    raise ValueError(f"check {check.id!r} names no token-usage level (guard or promql `token_usage < X`)")


def bands_from_table(table: CheckTable, profile: str | None = None) -> GuideBands:
    """Read the dashboard bands from the checks table (default profile unless named)."""
    prof = profile or table.default_profile()
    if prof not in table.profiles:
        raise ValueError(f"unknown guide profile {prof!r} (known: {', '.join(sorted(table.profiles))})")
    low, high = table.profiles[prof].queue_band
    mem_low = _check(table, "gpu_mem_headroom_low")
    mem_high = _check(table, "gpu_mem_headroom_high")
    low_gb = _level(mem_low, prof, "warning")
    # The suggestion aims at the middle of the guide's good band, so the band's top mirrors its bottom.
    target_gb = float(mem_high.suggest.params.get("target_gb", low_gb))
    return GuideBands(
        profile=prof, queue_low=float(low), queue_high=float(high),
        token_usage_min=_token_usage_min(_check(table, "kv_underused")),
        retractions_per_minute=_level(_check(table, "retractions_frequent"), prof, "warning"),
        mem_critical_gb=_level(mem_low, prof, "critical"),
        mem_low_gb=low_gb,
        mem_good_high_gb=max(low_gb, 2 * target_gb - low_gb),
        mem_high_gb=_level(mem_high, prof, "warning"),
        cuda_graph_miss_ratio=_level(_check(table, "cuda_graph_uncovered"), prof, "warning"),
        least_is_worst=tuple(sorted({c.signal for c in table.checks if c.comparison in ("<", "<=")})),
    )



FLEET_UID = "sglang-tuning-fleet"


def _fmt(value: float) -> str:
    return f"{value:g}"


# --- the per-server dashboard -------------------------------------------------------------------

_STATUS_BY = "instance, model_name, dp_rank, check"


def findings_table() -> Json:
    """Active findings with the flag to change, the current and the suggested value."""
    firing = f"(sglang_tuning_check_level{{{RANK_SEL}}} > 0)"
    return table_panel(
        "Active findings and flag changes",
        "Checks of the tuning guide that fire now (sglang_tuning_check_level > 0: 1 warning, 2 critical), one "
        "row per server, DP rank "
        "and check, with the SGLang flag the check names, its current value and the value the exporter "
        "suggests (sglang_tuning_suggested_value). Healthy: the table is empty. Apply the suggested flag change "
        "on the server and restart it; alerts/runbook.md explains each check.",
        "none",
        [target(f"max by ({_STATUS_BY}) {firing}", ref="A", instant=True),
         target(f"max by ({_STATUS_BY}, flag) (sglang_tuning_suggested_value{{{RANK_SEL}}})", ref="B",
                instant=True),
         target(f"max by ({_STATUS_BY}, flag) (sglang_tuning_current_value{{{RANK_SEL}}}) "
                f"and on ({_STATUS_BY}) {firing}", ref="C", instant=True)],
        [{"id": "merge", "options": {}},
         {"id": "organize", "options": {"excludeByName": {"Time": True},
                                        "indexByName": {"instance": 0, "model_name": 1, "dp_rank": 2, "check": 3,
                                                        "Value #A": 4, "flag": 5,
                                                        "Value #C": 6, "Value #B": 7},
                                        "renameByName": {}}}],
        overrides=[rename_override("Value #A", "Status", status=True),
                   rename_override("Value #B", "Suggested"),
                   rename_override("Value #C", "Current")],
        sort_by="Status")


def signals_table(least_is_worst: Sequence[str] = ()) -> Json:
    """The windowed guide signals behind the verdicts, one row per signal, one column per server."""
    return table_panel(
        "Guide signals over the sidecar's window",
        "The values the checks compare with their thresholds, computed by the sidecar over its window "
        "(--window, default 10 min; see docs/signals.md): ratios such as queue_empty_ratio or "
        "kv_underused_ratio are shares of samples, retractions (/min) a rate, available_gpu_mem (GiB) a "
        "startup fact (one sglang_tuning_signal_<unit> family per unit). Healthy: every value on the ok side of its check's threshold (alerts/runbook.md); a "
        "missing signal is unknown (too few samples). Each check names the flag that moves its signal.",
        "none",
        [target(worst_signal_expr(least_is_worst), ref="A", instant=True)],
        [{"id": "groupingToMatrix", "options": {"columnField": "instance", "rowField": "signal",
                                                "valueField": "Value"}}],
        overrides=[{"matcher": {"id": "byType", "options": "number"},
                    "properties": [{"id": "decimals", "value": 3}]}])


def worst_signal_expr(least_is_worst: Sequence[str]) -> str:
    """Each signal of a server at its worst DP replica: the least for signals a check pages on when low
    (memory headroom), the most for the rest; one family per unit, GiB and per minute as the guide says."""
    parts = []  # `A or B or C`: each family adds its own signals
    for short in SIGNAL_FAMILIES:
        name = f"sglang_tuning_{short}"
        low = "|".join(sorted(lab for sig, (fam, lab, _) in SIGNAL_UNITS.items() if fam == short and sig in least_is_worst))
        expr = (f'max by (instance, signal) ({name}{{signal!~"{low}", {RANK_SEL}}}) or '
                f'min by (instance, signal) ({name}{{signal=~"{low}", {RANK_SEL}}})' if low
                else f"max by (instance, signal) ({name}{{{RANK_SEL}}})")
        unit = SIGNAL_FAMILY_UNITS[short]  # the row names the docs' unit: GiB and per minute as the guide says
        scaled = f"({expr}) {unit.to_docs}" if unit.to_docs else expr
        parts.append(f'label_replace({scaled}, "signal", "$1 ({unit.shown_as})", "signal", "(.+)")'
                     if unit.shown_as else expr)
    return " or ".join(parts)


def status_timeline(by: str, legend: str, title: str, description: str, *, firing_only: bool = False) -> Json:
    """Check status over time, one row per `by` group (only warning/critical stretches if `firing_only`)."""
    expr = f"max by ({by}) (sglang_tuning_check_level{{{RANK_SEL}}})"
    return state_timeline(title, description, [target(f"{expr} > 0" if firing_only else expr, legend)])


def queue_expr() -> str:
    """#queue-req per rank: ours, else SGLang's gauge (priority="" is the total under priority scheduling)."""
    return (per_rank(ours("queue_requests")) + " or "
            + per_rank(sglang("num_queue_reqs", PRIORITY_TOTAL)))


def running_expr() -> str:
    """#running-req per rank: ours, else SGLang's gauge."""
    return (per_rank(ours("running_requests")) + " or "
            + per_rank(sglang("num_running_reqs", PRIORITY_TOTAL)))


def server_dashboard(b: GuideBands, slo_cells: Sequence[Cell] = ()) -> Json:
    """Per-server dashboard: every guide signal with its band, findings and suggested flag changes; the SLO
    burn row (render/slo.py) after the latency row."""
    prof = f"(guide profile {b.profile})"
    rows: list[tuple[str, list[Cell]]] = []
    rows.append(("Guide verdicts", [
        Cell(findings_table(), 24, 7),
        Cell(status_timeline("instance, check", "{{check}} · {{instance}}", "Check status over time",
                             "Verdict of every guide check for the selected servers: green ok, orange warning, "
                             "red critical, grey unknown (not enough samples in the window). Healthy: all green "
                             "or grey. Each check names its flag in the findings table above."), 24, 8),
        Cell(signals_table(b.least_is_worst), 24, 8),
    ]))
    rows.append(("Queue and KV cache", [
        Cell(timeseries(
            "Queue (#queue-req)",
            f"Requests waiting in the scheduler queue. Healthy for throughput workloads: inside the guide band "
            f"{_fmt(b.queue_low)}-{_fmt(b.queue_high)} {prof}, drawn as the green area. Often 0: the client "
            f"submits too slowly (raise the request rate; not a server flag). Above {_fmt(b.queue_high)}: "
            "scheduling overhead grows (lower the request rate, or use --schedule-policy fcfs when prefixes are "
            "not reused). Checks queue_empty and queue_overloaded.",
            "short", [target(queue_expr(), "{{instance}} dp{{dp_rank}}")],
            thresholds=steps("yellow", (b.queue_low, "green"), (b.queue_high, "red")),
            style="dashed+area", minimum=0)),
        Cell(timeseries(
            "KV-cache token usage",
            f"Share of the KV-cache pool in use (token usage; on hybrid models the fullest of the full, SWA and mamba pools, as SGLang reports it). Healthy: above {_fmt(b.token_usage_min)} {prof} "
            f"while requests queue. Below {_fmt(b.token_usage_min)} with #queue-req > 0 means the server admits "
            "too conservatively: decrease --schedule-conservativeness (the guide: toward 0.3). Very high usage "
            "with frequent retractions: increase it (toward 1.3). Check kv_underused.",
            "percentunit",
            [target(f"{per_rank(ours('token_usage_ratio'))} or {per_rank(sglang('token_usage'))}",
                    "{{instance}} dp{{dp_rank}}")],
            thresholds=steps("orange", (b.token_usage_min, "green")), style="dashed+area",
            minimum=0, maximum=1)),
        Cell(timeseries(
            "Retractions per minute",
            f"Retraction events per minute per DP replica (`KV cache pool is full. Retract requests.`; the TP "
            f"ranks that all print or export a retraction count it once). Healthy: at most about "
            f"{_fmt(b.retractions_per_minute)} per minute {prof}, the dashed line. More often: increase "
            "--schedule-conservativeness (the guide: toward 1.3). Without the sidecar the panel falls back to "
            "SGLang's retracted-request counters, which count requests, not events. Check retractions_frequent.",
            "suffix: /min",
            [target(f"60 * {rate_per_replica(ours('retractions_total'))}"
                    f" or 60 * {rate_per_replica(sglang('num_retracted_requests_total'))}"
                    f" or 60 * {per_rank('deriv(' + sglang('total_retracted_reqs') + RATE + ')')}",
                    "{{instance}} dp{{dp_rank}}")],
            thresholds=steps("green", (b.retractions_per_minute, "red")), style="dashed", minimum=0)),
        Cell(timeseries(
            "Out-of-memory events",
            "OOM errors by phase in each interval. Healthy: none. Prefill OOM: decrease --chunked-prefill-size "
            "(the guide: 4096, then 2048). Decode OOM: decrease --max-running-requests. Either: decrease "
            "--mem-fraction-static. A startup `Not enough memory` is the opposite case: increase "
            "--mem-fraction-static. Checks prefill_oom and decode_oom.",
            "short",
            [target(f"max by ({BY}, phase) (increase({ours('oom_events_total')}{RATE}))",
                    "{{phase}} · {{instance}} dp{{dp_rank}}")],
            thresholds=steps("green", (1, "red")), bars=True, minimum=0)),
    ]))
    rows.append(("Memory and CUDA graphs", [
        Cell(stat(
            "Available GPU memory after startup",
            f"GPU memory left for activations once weights, KV cache and CUDA graphs are allocated "
            f"(available_gpu_mem in the startup log). Healthy: {_fmt(b.mem_low_gb)}-{_fmt(b.mem_good_high_gb)} GB "
            f"{prof}, green. Above {_fmt(b.mem_high_gb)} GB (orange): the KV cache could be larger, increase "
            f"--mem-fraction-static. Below {_fmt(b.mem_low_gb)} GB (orange; red under {_fmt(b.mem_critical_gb)} "
            "GB): risk of OOM, decrease --mem-fraction-static. Checks gpu_mem_headroom_high and "
            "gpu_mem_headroom_low.",
            "bytes",
            [target(f"{per_rank(ours('available_gpu_memory_bytes'), 'min')} or "
                    f"{per_rank(sglang('startup_available_gpu_memory_gb'), 'min')} * {GIB}",
                    "{{instance}} dp{{dp_rank}}")],
            thresholds=steps("red", (b.mem_critical_gb * GIB, "orange"), (b.mem_low_gb * GIB, "green"),
                             (b.mem_good_high_gb * GIB, "yellow"), (b.mem_high_gb * GIB, "orange"))), 8, 8),
        Cell(timeseries(
            "Decode CUDA-graph coverage",
            f"Share of decode batches that ran in a CUDA graph. Healthy: close to 1 (the line marks "
            f"{_fmt(1 - b.cuda_graph_miss_ratio)}, where the check fires {prof}). Lower: batches run eagerly "
            "at several times the per-token latency; increase --cuda-graph-max-bs (--cuda-graph-max-bs-decode "
            "on 0.5.14+) and lower --mem-fraction-static a little to pay for it. Check cuda_graph_uncovered.",
            "percentunit",
            [target(ratio(ours("decode_samples_total", 'cuda_graph="true", '),
                          ours("decode_samples_total", 'cuda_graph=~"true|false", '), "cuda_graph")
                    + " or " + ratio(sglang("cuda_graph_passes_total", 'mode="decode_cuda_graph", '),
                                     sglang("cuda_graph_passes_total", 'mode=~"decode_.*", '), "mode"),
                    "{{instance}} dp{{dp_rank}}")],
            thresholds=steps("orange", (1 - b.cuda_graph_miss_ratio, "green")), style="dashed",
            minimum=0, maximum=1), 8, 8),
        Cell(timeseries(
            "Decode batch size vs captured CUDA-graph max",
            "Running batch size, the 90th percentile of batch sizes that ran without a CUDA graph, and the "
            "largest captured graph batch size. Healthy: batches stay under the captured max, and nothing runs "
            "without a graph. Batches above the max: increase --cuda-graph-max-bs (bounded by "
            "--max-running-requests). Check cuda_graph_uncovered.",
            "short",
            [target(running_expr(), "batch · {{instance}} dp{{dp_rank}}", "A"),
             target(per_rank(ours("decode_batch_size_without_graph")),
                    "p90 without graph · {{instance}} dp{{dp_rank}}", "B"),
             target(per_rank(ours("cuda_graph_max_batch_size")),
                    "captured max · {{instance}} dp{{dp_rank}}", "C")], minimum=0), 8, 8),
    ]))
    rows.append(("Latency", [
        Cell(timeseries(
            "Latency p95: TTFT, ITL, end-to-end, queue time",
            "The 95th percentile of SGLang's latency histograms over the exporter's window, as the sidecar "
            "computes them (histogram_quantile's rule on the bucket deltas; docs/signals.md): the numbers its "
            "latency checks judge. Healthy: under your targets, queue time a small part of E2E. High ITL with large batches: lower --max-running-requests (check "
            "latency_high_batch_large); queue time most of E2E: the client or capacity (latency_queue_dominates); "
            "high TTFT with long prompts: raise --chunked-prefill-size (ttft_long_prompts).",
            "s",
            [target(per_rank(ours("signal_seconds", 'signal=~"ttft_p95|itl_p95|e2e_p95|queue_time_p95", '))
                    .replace("by (", "by (signal, ", 1), "{{signal}} · {{instance}} dp{{dp_rank}}")],
            minimum=0), 24, 8),
    ]))
    if slo_cells:
        rows.append(("SLO burn", list(slo_cells)))
    rows.append(("Admission and throughput", [
        Cell(timeseries(
            "Running requests vs --max-running-requests",
            "Requests in the running batch and the effective max-running-requests. Healthy under load: close to "
            "the max with usage below 1. Pinned at the max while requests queue and memory is left: increase "
            "--max-running-requests. Decode OOMs: decrease it. Check running_capped.",
            "short",
            [target(running_expr(), "running · {{instance}} dp{{dp_rank}}", "A"),
             target(per_rank(ours("max_running_requests")), "max · {{instance}} dp{{dp_rank}}", "B")],
            minimum=0), 8, 8),
        Cell(timeseries(
            "Generation throughput",
            "Decode tokens per second per rank. Healthy: steady under steady load. A drop with a full queue "
            "points at retractions, eager decode (CUDA-graph coverage) or a too-large batch for latency "
            "targets (lower --max-running-requests for latency workloads; check latency_batch_too_large).",
            "suffix: tok/s",
            [target(f"{per_rank(ours('gen_throughput_tokens_per_second'))} or "
                    f"{per_rank(sglang('gen_throughput'))}", "{{instance}} dp{{dp_rank}}")],
            minimum=0), 8, 8),
        Cell(timeseries(
            "Prefix-cache hit ratio",
            "Prefill tokens served from the prefix cache over all prefill tokens (from token counters; SGLang's "
            "cache_hit_rate gauge is zeroed on decode ticks in many releases). Healthy: the schedule policy fits "
            "the reuse. High reuse: --schedule-policy lpm pays off. Near 0: lpm only adds scheduling cost, use "
            "fcfs. Checks schedule_policy_lpm_no_reuse and "
            "schedule_policy_fcfs_with_reuse.",
            "percentunit",
            [target(ratio(ours("prefill_tokens_total", 'source="cached", '),
                          ours("prefill_tokens_total", 'source=~"new|cached", '), "source")
                    + " or " + tokenizer_rate(sglang("cached_tokens_total")) + " / "
                    + tokenizer_rate(sglang("prompt_tokens_total")),
                    "{{instance}} dp{{dp_rank}}")],
            minimum=0, maximum=1), 8, 8),
    ]))
    rows.append(("Exporter health", [
        Cell(stat(
            "Sources",
            "Whether the sidecar's sources worked at their last attempt (log, metrics, server_info) and whether "
            "its scrape of SGLang's /metrics succeeded. Healthy: all 1. A 0 means the matching panels are "
            "blank or stale: check --sglang.url, --sglang.log-file and SGLang's --enable-metrics (check "
            "metrics_disabled).",
            "none",
            [target(f"min by (instance, source) (sglang_tuning_source_up{{{HOST_SEL}}})",
                    "{{source}} · {{instance}}", "A"),
             # Only sidecars configured to scrape SGLang (--sglang.url) have a scrape to report.
             target(f"min by (instance) (sglang_tuning_up{{{HOST_SEL}}}) and on (instance) max by (instance) "
                    f'(sglang_tuning_source_enabled{{source="metrics", {HOST_SEL}}} == 1)',
                    "scrape · {{instance}}", "B")],
            thresholds=steps("red", (1, "green")),
            mappings=[{"type": "value", "options": {"0": {"color": "red", "index": 0, "text": "down"},
                                                    "1": {"color": "green", "index": 1, "text": "up"}}}]),
             8, 6),
        Cell(timeseries(
            "Seconds since the last log line",
            "Age of the newest log line the sidecar read. Healthy: small while SGLang serves traffic (Decode "
            "lines come every --decode-log-interval steps). Growing while traffic flows: the log path or "
            "volume is wrong, or SGLang logs elsewhere.",
            "s",
            [target(f"time() - max by (instance) (sglang_tuning_log_last_line_timestamp_seconds{{{HOST_SEL}}})",
                    "{{instance}}")], minimum=0), 8, 6),
        Cell(timeseries(
            "Log lines read",
            "Log lines per second by event kind, and lines with a recognised head that could not be parsed. "
            "Healthy: decode/prefill lines under load and no unparsed lines. No decode lines under load: SGLang's "
            "stdout does not reach --sglang.log-file. Unparsed lines mean a log format the parser does not "
            "know yet (please report it with an example line).",
            "suffix: /s",
            [target(f"sum by (instance, kind) (rate(sglang_tuning_log_lines_total{{{HOST_SEL}}}{RATE}))",
                    "{{kind}} · {{instance}}", "A"),
             target(f"sum by (instance) (rate(sglang_tuning_log_unparsed_lines_total{{{HOST_SEL}}}{RATE}))",
                    "unparsed · {{instance}}", "B")], minimum=0), 8, 6),
    ]))
    return dashboard(SERVER_UID, "SGLang tuning / server",
                     "SGLang server signals of the hyperparameter-tuning guide, with the guide's bands "
                     f"{prof} and the flag changes the exporter suggests. Generated by "
                     "`sglang-tuning-exporter render`; do not edit.",
                     layout(rows), variables(), [link("Fleet", FLEET_UID)])


# --- the fleet dashboard ------------------------------------------------------------------------


def _count_stat(title: str, description: str, expr: str, *, bad: str = "red") -> Cell:
    return Cell(stat(title, description, "none", [target(f"{expr} or vector(0)", "")],
                     thresholds=steps("green", (1, bad))), 6, 4)


def fleet_dashboard(b: GuideBands) -> Json:
    """Fleet dashboard: every instance x check, top offenders, suggested changes."""
    status = f"sglang_tuning_check_level{{{RANK_SEL}}}"
    worst = f"max by (instance) ({status})"
    rows: list[tuple[str, list[Cell]]] = []
    rows.append(("Fleet status", [
        _count_stat("Servers with a critical finding",
                    "Servers where at least one guide check is critical. Healthy: 0. Open the server dashboard "
                    "of each to see the flag change.", f"count({worst} == 2)"),
        _count_stat("Servers with a warning",
                    "Servers whose worst check is a warning. Healthy: 0. The suggested changes table names the flag "
                    "for each.", f"count({worst} == 1)", bad="orange"),
        Cell(stat("Servers reporting",
                  "Sidecars Prometheus scrapes. Healthy: one per SGLang server, each started with --sglang.url and "
                  "--sglang.log-file pointing at its server.", "none",
                  [target(f"count(max by (instance) (sglang_tuning_build_info{{{HOST_SEL}}}))", "")],
                  thresholds=steps("blue")), 6, 4),
        _count_stat("Sidecars that cannot scrape SGLang",
                    "Sidecars whose last scrape of SGLang's /metrics failed (sglang_tuning_up 0). Healthy: 0. "
                    "Check --sglang.url and SGLang's --enable-metrics.",
                    f"count(sglang_tuning_up{{{HOST_SEL}}} == 0 and on (job, instance) "
                    f'sglang_tuning_source_enabled{{source="metrics", {HOST_SEL}}} == 1)'),
        Cell(status_timeline("instance, check", "{{instance}} · {{check}}", "Firing checks by server",
                             "Every server x guide check that was warning (orange) or critical (red) in the "
                             "range, over time; ok and unknown stretches are left blank so a large fleet stays "
                             "readable (the matrix below has every pair). Healthy: empty. Each check names one "
                             "flag; see the suggested changes table.", firing_only=True), 24, 10),
        Cell(table_panel(
            "Check status matrix (now)",
            "Current verdict of each check (columns) on each server (rows): green ok, orange warning, red "
            "critical, grey unknown. Healthy: no orange or red cells. Each check names one flag (see the "
            "suggested changes table and alerts/runbook.md).",
            "none", [target(f"max by (instance, check) ({status})", ref="A", instant=True)],
            [{"id": "groupingToMatrix", "options": {"columnField": "check", "rowField": "instance",
                                                    "valueField": "Value"}}],
            overrides=[{"matcher": {"id": "byType", "options": "number"},
                        "properties": [{"id": "mappings", "value": STATUS_MAPPINGS},
                                       {"id": "thresholds", "value": STATUS_STEPS},
                                       {"id": "custom.cellOptions", "value": {"type": "color-background"}}]}]),
             24, 8),
    ]))
    firing = f"({status} > 0)"
    rows.append(("Offenders and changes", [
        Cell(table_panel(
            "Top offenders",
            "Servers with the most firing checks, scored by the sum of their statuses (warning 1, critical 2). "
            "Healthy: empty. Start with the top row: its server dashboard lists the flag changes.",
            "none",
            # One verdict per check and server (its worst DP replica), so a DP8 server is not scored 8 times.
            [target(f"topk(10, sum by (instance, model_name) (max by (instance, model_name, check) {firing}))",
                    ref="A", instant=True),
             target(f"count by (instance, model_name) (max by (instance, model_name, check) {firing})", ref="B",
                    instant=True)],
            [{"id": "merge", "options": {}},
             {"id": "organize", "options": {"excludeByName": {"Time": True}, "indexByName": {},
                                            "renameByName": {}}}],
            overrides=[rename_override("Value #A", "Score"), rename_override("Value #B", "Firing checks")],
            sort_by="Score"), 10, 10),
        Cell(table_panel(
            "Suggested flag changes",
            "Every flag change the sidecars suggest now, with the current value when known. Healthy: empty. "
            "Rows for servers of the same model that disagree point at configuration drift.",
            "none",
            [target(f"max by ({_STATUS_BY}, flag) (sglang_tuning_suggested_value{{{RANK_SEL}}})",
                    ref="A", instant=True),
             target(f"max by ({_STATUS_BY}, flag) (sglang_tuning_current_value{{{RANK_SEL}}}) "
                    f"and on ({_STATUS_BY}) {firing}", ref="B", instant=True)],
            [{"id": "merge", "options": {}},
             {"id": "organize", "options": {"excludeByName": {"Time": True},
                                            "indexByName": {"instance": 0, "model_name": 1, "dp_rank": 2,
                                                            "check": 3, "flag": 4, "Value #B": 5,
                                                            "Value #A": 6},
                                            "renameByName": {}}}],
            overrides=[rename_override("Value #A", "Suggested"), rename_override("Value #B", "Current")]),
             14, 10),
        Cell(timeseries(
            "Firing checks by check",
            "How many servers each check fires on. Healthy: 0. A check firing across a whole model's fleet "
            "usually means a shared launch flag to change once.",
            "short",
            [target(f"count by (check) (max by (instance, check) ({status}) > 0)", "{{check}}")],
            minimum=0), 12, 8),
        Cell(timeseries(
            "Retractions per minute, worst servers",
            f"The ten servers with the most retraction events per minute, each at its worst DP replica (TP "
            f"ranks that repeat a retraction count it once). Healthy: at most about "
            f"{_fmt(b.retractions_per_minute)} per minute (guide profile {b.profile}). More: increase "
            "--schedule-conservativeness on those servers.",
            "suffix: /min",
            # A server's rate is its worst DP replica's (the rank the alert fires on), not a sum over ranks.
            [target(f"topk(10, 60 * max by (instance) (rate({ours('retractions_total')}{RATE})) or "
                    f"60 * max by (instance) (rate({sglang('num_retracted_requests_total')}{RATE})))",
                    "{{instance}}")],
            thresholds=steps("green", (b.retractions_per_minute, "red")), style="dashed", minimum=0), 12, 8),
    ]))
    rows.append(("Latency", [
        Cell(timeseries(
            "p95 time to first token, slowest servers",
            "The ten servers with the highest p95 TTFT over the exporter's window (SGLang's histogram, as the "
            "sidecar computes it). Healthy: under your TTFT target. Higher with long prompts: raise "
            "--chunked-prefill-size (ttft_long_prompts); with queue time most of it: the client or capacity "
            "(latency_queue_dominates).",
            "s",
            [target("topk(10, max by (instance) (" + ours("signal_seconds", 'signal="ttft_p95", ') + "))",
                    "{{instance}}")], minimum=0), 12, 8),
        Cell(timeseries(
            "p95 inter-token latency, slowest servers",
            "The ten servers with the highest p95 ITL over the exporter's window. Healthy: under your ITL "
            "target. Higher while batches are large: lower --max-running-requests (latency_high_batch_large).",
            "s",
            [target("topk(10, max by (instance) (" + ours("signal_seconds", 'signal="itl_p95", ') + "))",
                    "{{instance}}")], minimum=0), 12, 8),
    ]))
    rows.append(("SLO burn", slo.fleet_cells()))
    return dashboard(FLEET_UID, "SGLang tuning / fleet",
                     "Guide check verdicts across every SGLang server, top offenders and the flag changes the "
                     f"sidecars suggest (guide profile {b.profile}). Generated by `sglang-tuning-exporter "
                     "render`; do not edit.",
                     layout(rows), variables(), [link("Server", SERVER_UID)])



def scope_queries(node: Any, selector: str) -> Any:
    """The dashboard with the selector option in every query: panel and annotation `expr`, variable
    `query`/`definition` (a mixin's `_config` selector); groupings by instance keep its labels, as in the rules."""
    if isinstance(node, list):
        return [scope_queries(n, selector) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in ("expr", "query", "definition") and isinstance(value, str) and value.strip():
            out[key] = keep_selector_labels(add_selector(value, selector), selector) if "{" in value else value
        else:
            out[key] = scope_queries(value, selector)
    return out


def generate(table: CheckTable, profile: str | None = None, selector: str = "") -> dict[str, str]:
    """All dashboards as `{relative path: JSON text}` for `render` to write or compare."""
    bands = bands_from_table(table, profile)
    return {
        "dashboards/sglang-tuning-server.json": dump(scope_queries(server_dashboard(bands, slo.server_cells(table)), selector)),
        "dashboards/sglang-tuning-fleet.json": dump(scope_queries(fleet_dashboard(bands), selector)),
    }
