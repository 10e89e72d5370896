"""Output formats of the fleet report: JSON (interfaces.md), Markdown and self-contained HTML with inline SVG.

Pure functions of a FleetReport. HTML escapes every value that comes from Prometheus (instance names,
label values, arguments) and loads nothing external: no scripts, fonts, images or stylesheets.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from typing import Any

from sglang_tuning_exporter.core.durations import duration_text, iso_time
from sglang_tuning_exporter.core.markdown import md_text
from sglang_tuning_exporter.core.model import STATUS_CODE, STATUS_COLOURS, Finding, rank_text, value_text
from sglang_tuning_exporter.fleet.document import FleetReport, InstanceReport
from sglang_tuning_exporter.fleet.latency import COLUMNS, WORDS
from sglang_tuning_exporter.guide.plan import plan_step_change, plan_step_markdown

SHORT = {"ok": "ok", "warning": "WARN", "critical": "CRIT", "unknown": "?", "": "-"}
CHART_LABELS = {"queue": "#queue-req", "token_usage": "token usage", "retractions_per_minute": "retractions/min"}
MAX_DRIFT_LIST = 8  # majority-value servers listed by name in markdown/html before "and N more"


def render(report: FleetReport, fmt: str) -> str:
    """The report in `fmt` (markdown, html or json)."""
    if fmt == "json":
        return render_json(report)
    if fmt == "html":
        return render_html(report)
    return render_markdown(report)


def render_json(report: FleetReport) -> str:
    """The JSON document of interfaces.md, indented."""
    return json.dumps(report.to_json_dict(), indent=2, sort_keys=False, allow_nan=False, default=str) + "\n"


# --------------------------------------------------------------------------------------------- shared


def fmt_value(v: Any) -> str:
    """A current/suggested value as a person reads it (core.model.value_text; `?` when unknown)."""
    return "?" if v is None else value_text(v)


def change_text(f: Finding) -> str:
    """`increase --flag 1 -> 1.3`, or the client-side action."""
    if f.flag is None:
        return f.action or "client side"
    arrow = f"{fmt_value(f.current)} -> {fmt_value(f.suggested)}"
    return f"{f.action} {f.flag} {arrow}" if f.action in ("increase", "decrease", "set") else f"{f.flag}: {f.action} {arrow}"


def cell_status(inst: InstanceReport, check: str) -> str:
    """The worst status of a check over an instance's ranks ('' when not evaluated)."""
    statuses = [f.status for f in inst.findings if f.check == check]
    known = [s for s in statuses if s != "unknown"]
    if known:
        return max(known, key=lambda s: STATUS_CODE[s])
    return "unknown" if statuses else ""


def paired_with(inst: InstanceReport) -> str | None:
    """The SGLang target merged into this sidecar's row (fleet/pairing.py), if any."""
    paired = inst.parts.get("sglang_instance")
    return str(paired) if paired else None


def mistuned(report: FleetReport) -> list[InstanceReport]:
    """Servers with at least one warning or critical finding, critical first (then by SLO burn when the
    report ranks by it, else by name)."""
    hits = [i for i in report.instances if i.status in ("warning", "critical")]
    if report.order.get("by") == "slo_burn":
        return sorted(hits, key=lambda i: -STATUS_CODE[i.status])  # stable: the burn order within a status
    return sorted(hits, key=lambda i: (-STATUS_CODE[i.status], i.instance))


def latency_cell(v: float | None) -> str:
    """`0.812 s`, or `unknown`."""
    return "unknown" if v is None else duration_text(v)


def burn_cell(inst: InstanceReport) -> str:
    """`12.5 (p95 TTFT)`: the worst burn and the target burning it, or `unknown`."""
    lat = inst.latency
    burns = {t: b for t in lat.slow_ratio if (b := lat.burn(t)) is not None}
    if not burns:
        return "unknown"
    worst = max(burns, key=lambda t: burns[t])
    return f"{burns[worst]:.3g} ({WORDS[worst]})"


def latency_rows(report: FleetReport) -> tuple[list[str], list[list[str]], list[str]]:
    """(headers, rows of plain text cells, `unknown` reasons grouped by reason) of the latency table."""
    headers = ["instance", *(WORDS[c] for c in COLUMNS)] + (["SLO burn"] if report.slo else [])
    rows = [[inst.instance, *(latency_cell(inst.latency.p95.get(c)) for c in COLUMNS)]
            + ([burn_cell(inst)] if report.slo else []) for inst in report.instances]
    servers: dict[tuple[str, str], list[str]] = {}
    for inst in report.instances:
        for c, why in inst.latency.unknown_why.items():
            servers.setdefault((why, c), []).append(inst.instance)
    # Columns unknown for the same reason on the same servers share one line.
    columns: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for (why, c), names in servers.items():
        columns.setdefault((why, tuple(names)), []).append(WORDS[c])
    reasons = [f"{', '.join(cols)}: {why} ({_listing(names)})" for (why, names), cols in columns.items()]
    return headers, rows, reasons


def _range_text(report: FleetReport) -> str:
    return f"{iso_time(report.start)} → {iso_time(report.end)} ({duration_text(report.end - report.start)})"


def _code(text: Any) -> str:
    # Inside a code span entities are shown literally, so only backticks, pipes and newlines need care.
    return "`" + str(text).replace("`", "'").replace("|", "\\|").replace("\n", " ") + "`"


# --------------------------------------------------------------------------------------------- markdown


def render_markdown(report: FleetReport) -> str:
    """The report as Markdown (GitHub tables)."""
    out: list[str] = ["# SGLang fleet tuning report", ""]
    out.append(f"Prometheus {_code(report.prometheus)}, range {_range_text(report)}"
               + (f", selector {_code('{' + report.selector + '}')}" if report.selector else "")
               + f"; guide profile {_code(report.profile)}, workload {_code(report.workload)}; "
               f"{report.queries} PromQL queries.")
    out += [f"\nNote: {md_text(n)}." for n in report.notes]
    out += ["", "## Summary", "", "| status | servers |", "|---|---:|"]
    out += [f"| {s} | {n} |" for s, n in report.by_status().items()]
    out.append(f"| **total** | **{len(report.instances)}** |")
    common = report.common_findings()
    out += ["", "### Most common findings", ""]
    if common:
        out += ["| check | servers | worst | flag | action |", "|---|---:|---|---|---|"]
        out += [f"| {c['check']} | {c['servers']} | {c['worst']} | {md_text(c['flag'] or 'client side')} | "
                f"{md_text(c['action'])} |" for c in common]
    else:
        out.append(_nothing_fired(report))
    out += _latency_markdown(report)
    out += ["", "## Mis-tuned servers", ""]
    bad = mistuned(report)
    if not bad:
        out.append("None.")
    for inst in bad:
        out.append(f"### {_code(inst.instance)} — {inst.status}")
        out.append("")
        out.append(f"Model {_code(inst.model_name or '?')}, SGLang {md_text(inst.version or '?')}."
                   + (f" SGLang's own metrics from {_code(paired)} (same host)." if (paired := paired_with(inst)) else ""))
        out.append("")
        out += _plan_markdown(inst)
        out += ["| check | rank | status | change | evidence |", "|---|---|---|---|---|"]
        for f in inst.firing():
            out.append(f"| {f.check} | {rank_text(f.rank)} | {f.status} | {md_text(change_text(f))} | {md_text(f.evidence)} |")
        out.append("")
    out += _changes_markdown(report)
    out += _drift_markdown(report)
    out += ["", "## Every instance × check", ""]
    checks = list(report.checks)
    out.append("| instance | model | status | " + " | ".join(checks) + " |")
    out.append("|---|---|---|" + "---|" * len(checks))
    for inst in report.instances:
        cells = [SHORT[cell_status(inst, c)] for c in checks]
        out.append(f"| {_code(inst.instance)} | {md_text(inst.model_name or '?')} | {inst.status} | "
                   + " | ".join(cells) + " |")
    out += ["", "Legend: ok, WARN = warning, CRIT = critical, ? = unknown (not enough data), "
                "- = not evaluated.", ""]
    return "\n".join(out)


def no_latency(report: FleetReport) -> bool:
    """No server has a latency or a burn: the table would be all `unknown`, the reasons say it all."""
    return all(v is None for i in report.instances for v in i.latency.p95.values()) and \
        all(i.latency.worst_burn is None for i in report.instances)


def _latency_markdown(report: FleetReport) -> list[str]:
    headers, rows, reasons = latency_rows(report)
    out = ["", "## Latency", "", f"Order: {md_text(report.order.get('why', ''))}.", ""]
    if no_latency(report):
        return [*out, f"No latency known on any of the {len(report.instances)} servers:", "",
                *(f"- {md_text(r)}" for r in reasons)]
    out += ["| " + " | ".join(headers) + " |", "|---" + "|---:" * (len(headers) - 1) + "|"]
    out += ["| " + " | ".join([_code(r[0]), *(md_text(c) for c in r[1:])]) + " |" for r in rows]
    if reasons:
        out += ["", "Unknown:", ""] + [f"- {md_text(r)}" for r in reasons]
    return out


def _nothing_fired(report: FleetReport) -> str:
    """No firing check: say how much was judged, so that no data never reads as a healthy fleet."""
    judged = sum(1 for i in report.instances if i.status != "unknown")
    if not report.instances:
        return "No server matched: nothing was judged."
    if judged == 0:
        return f"No check could be judged on any of the {len(report.instances)} servers (not enough data)."
    return (f"No check fired on the {judged} of {len(report.instances)} servers that could be judged"
            + (f"; {len(report.instances) - judged} had no verdict." if judged < len(report.instances) else "."))


def _plan_markdown(inst: InstanceReport) -> list[str]:
    """The instance's verdict line and plan: what to change first (interfaces.md `plan`)."""
    out = [f"*{md_text(inst.parts.get('verdict', ''))}*", ""] if inst.parts.get("verdict") else []
    steps = inst.parts.get("plan") or []
    if steps:
        out += ["Plan, one change at a time:", ""]
        out += [plan_step_markdown(s, code=_code, text=md_text) for s in steps]
        out.append("")
    return out


def _listing(insts: Sequence[str]) -> str:
    shown = ", ".join(insts[:MAX_DRIFT_LIST])
    more = len(insts) - MAX_DRIFT_LIST
    return shown + (f" and {more} more" if more > 0 else "")


def changed(report: FleetReport) -> list[tuple[str, dict[str, Any]]]:
    """(instance, change) for every flag change within the range, in time order."""
    rows = [(i.instance, c) for i in report.instances for c in i.parts.get("changes") or []]
    return sorted(rows, key=lambda r: (str(r[1].get("at")), r[0], str(r[1].get("flag"))))


def lagging_text(g: Any) -> str:
    """`--flag 1.3 improved 10.0.0.1; still 1 on 10.0.0.2, 10.0.0.3`."""
    behind = ", ".join(f"{i} ({fmt_value(v)})" for i, v in g.servers.items())
    return f"{g.flag} {fmt_value(g.value)} improved {', '.join(g.improved_on)}; still on another value: {behind}"


def _changes_markdown(report: FleetReport) -> list[str]:
    # Only when something changed: a quiet range keeps the report as it was.
    rows = changed(report)
    if not rows:
        return []
    out = ["## Changes within the range", "", "| at | server | flag | from | to | verdict | why |",
           "|---|---|---|---|---|---|---|"]
    out += [f"| {md_text(c['at'])} | {_code(name)} | {_code(c['flag'])} | {md_text(fmt_value(c['from']))} | "
            f"{md_text(fmt_value(c['to']))} | **{md_text(c['verdict'])}** | {md_text(c['why'])} |" for name, c in rows]
    out += ["", "### Servers that still lag their peers", ""]
    if not report.lagging:
        out.append("None: no improvement seen on one server is missing on a peer of the same model.")
    for g in report.lagging:
        out.append(f"- {md_text(g.model_name)}: {md_text(lagging_text(g))}")
    return [*out, ""]


def _drift_markdown(report: FleetReport) -> list[str]:
    out = ["## Configuration drift", ""]
    if not report.drift:
        return [*out, "Servers of the same model run the same flags."]
    out += ["Servers of the same model with different flag values (most common value first).", "",
            "| model | argument | most common | differs |", "|---|---|---|---|"]
    for d in report.drift:
        items = list(d.values.items())
        top_val, top_insts = items[0]
        others = "; ".join(f"{_code(v)} on {md_text(_listing(i))}" for v, i in items[1:])
        out.append(f"| {md_text(d.model_name)} | {_code(d.arg)} | {_code(top_val)} ({len(top_insts)} servers) | {others} |")
    return out


# --------------------------------------------------------------------------------------------- html

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222;max-width:80rem}
table{border-collapse:collapse;margin:.5rem 0 1rem}th,td{border:1px solid #ccc;padding:.2rem .45rem;text-align:left;
font-size:.85rem;vertical-align:top}th{background:#f3f3f3}code{font-size:.85rem}
.ok{background:#e8f5e9}.warning{background:#fff8e1}.critical{background:#ffebee}.unknown{color:#777}
.server{border:1px solid #ddd;border-radius:6px;padding:.5rem 1rem;margin:.75rem 0}
.charts svg{margin-right:1rem}.matrix td{text-align:center}.matrix td:first-child{text-align:left}
.wide{overflow-x:auto;max-width:100%}svg{max-width:100%;height:auto}p,h1,h2,h3,li{overflow-wrap:anywhere}
@media (max-width:600px){body{margin:.5rem}.server{padding:.5rem}}
"""


def _e(v: Any) -> str:
    return html.escape(str(v), quote=True)


def status_bar_svg(counts: dict[str, int], width: int = 480, height: int = 28) -> str:
    """A stacked horizontal bar of servers per status."""
    total = sum(counts.values()) or 1
    x = 0.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="status-bar" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img"><title>servers per status</title>']
    for status, n in counts.items():
        if n <= 0:
            continue
        w = width * n / total
        parts.append(f'<rect x="{x:.1f}" y="0" width="{w:.1f}" height="{height}" fill="{STATUS_COLOURS[status]}">'
                     f"<title>{_e(status)}: {n}</title></rect>")
        if w > 30:
            parts.append(f'<text x="{x + 4:.1f}" y="{height - 9}" font-size="12" fill="#fff">{n}</text>')
        x += w
    parts.append("</svg>")
    return "".join(parts)


def sparkline_svg(points: Sequence[tuple[float, float]], label: str, width: int = 220, height: int = 56) -> str:
    """A small line chart with its label and min/max, or an empty frame when there are no points."""
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" class="spark" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img"><title>{_e(label)}</title>'
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fafafa" stroke="#ddd"/>')
    if not points:
        return head + f'<text x="6" y="16" font-size="11" fill="#777">{_e(label)}: no data</text></svg>'
    ts = [p[0] for p in points]
    vs = [p[1] for p in points]
    t0, t1 = min(ts), max(ts)
    lo, hi = min(vs), max(vs)
    span_t = (t1 - t0) or 1.0
    span_v = (hi - lo) or 1.0
    top, bottom = 18.0, height - 4.0
    def y(v: float) -> float:
        # A flat series sits mid-height rather than on the frame.
        return (top + bottom) / 2 if hi == lo else bottom - (v - lo) / span_v * (bottom - top)

    coords = " ".join(f"{4 + (t - t0) / span_t * (width - 8):.1f},{y(v):.1f}" for t, v in points)
    return (head + f'<polyline fill="none" stroke="#1565c0" stroke-width="1.5" points="{coords}"/>'
            f'<text x="6" y="13" font-size="11" fill="#333">{_e(label)}: {_e(fmt_value(round(lo, 3)))} – '
            f"{_e(fmt_value(round(hi, 3)))}</text></svg>")


def _table(headers: Iterable[str], rows: Iterable[Iterable[str]], cls: str = "") -> str:
    """Rows are already-escaped HTML cells."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(rows_cell for rows_cell in r) + "</tr>" for r in rows)
    c = f' class="{cls}"' if cls else ""
    # A wide table scrolls inside its own box on a phone; the page itself never scrolls sideways.
    return f'<div class="wide"><table{c}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _td(v: Any, cls: str = "") -> str:
    c = f' class="{_e(cls)}"' if cls else ""
    return f"<td{c}>{_e(v)}</td>"


def render_html(report: FleetReport) -> str:
    """A self-contained HTML page (inline CSS and SVG only)."""
    counts = report.by_status()
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src \'unsafe-inline\'">',
             "<title>SGLang fleet tuning report</title>", f"<style>{_CSS}</style></head><body>",
             "<h1>SGLang fleet tuning report</h1>",
             f"<p>Prometheus <code>{_e(report.prometheus)}</code>, range {_e(_range_text(report))}"
             + (f", selector <code>{{{_e(report.selector)}}}</code>" if report.selector else "")
             + f"; guide profile <code>{_e(report.profile)}</code>, workload <code>{_e(report.workload)}</code>; "
             f"{report.queries} PromQL queries.</p>",
             *(f'<p class="note">Note: {_e(n)}.</p>' for n in report.notes),
             '<h2 id="summary">Summary</h2>', status_bar_svg(counts),
             _table(["status", "servers"], [[_td(s, s), _td(n)] for s, n in counts.items()])]
    common = report.common_findings()
    parts.append("<h3>Most common findings</h3>")
    parts.append(_table(["check", "servers", "worst", "flag", "action"],
                        [[_td(c["check"]), _td(c["servers"]), _td(c["worst"], c["worst"]),
                          _td(c["flag"] or "client side"), _td(c["action"])] for c in common])
                 if common else f"<p>{_e(_nothing_fired(report))}</p>")
    headers, lat_rows, reasons = latency_rows(report)
    parts.append('<h2 id="latency">Latency</h2>' + f"<p>Order: {_e(report.order.get('why', ''))}.</p>"
                 + (f"<p>No latency known on any of the {len(report.instances)} servers:</p>" if no_latency(report)
                    else _table(headers, [[_td(c) for c in r] for r in lat_rows]))
                 + ("<ul>" + "".join(f"<li>unknown {_e(r)}</li>" for r in reasons) + "</ul>" if reasons else ""))
    parts.append('<h2 id="mistuned">Mis-tuned servers</h2>')
    bad = mistuned(report)
    if not bad:
        parts.append("<p>None.</p>")
    for inst in bad:
        charts = report.charts.get(inst.instance, {})
        spark = "".join(sparkline_svg(charts.get(k, []), lbl) for k, lbl in CHART_LABELS.items()) if charts else ""
        rows = [[_td(f.check), _td(rank_text(f.rank)), _td(f.status, f.status), _td(change_text(f)), _td(f.evidence),
                 _td(f.tradeoff)] for f in inst.firing()]
        parts.append(f'<section class="server" id="{_e("srv-" + inst.instance)}">'
                     f"<h3><code>{_e(inst.instance)}</code> — {_e(inst.status)}</h3>"
                     f"<p>Model <code>{_e(inst.model_name or '?')}</code>, SGLang {_e(inst.version or '?')}."
                     + (f" SGLang's own metrics from <code>{_e(paired)}</code> (same host)."
                        if (paired := paired_with(inst)) else "") + "</p>"
                     + (f"<p><i>{_e(inst.parts['verdict'])}</i></p>" if inst.parts.get("verdict") else "")
                     + ("<ol class=\"plan\">" + "".join(
                         f"<li><code>{_e(plan_step_change(s))}</code> {_e(s.get('why', ''))}. "
                         f"<i>Then:</i> {_e(s.get('then', ''))}.</li>" for s in inst.parts.get("plan") or [])
                        + "</ol>" if inst.parts.get("plan") else "")
                     + (f'<div class="charts">{spark}</div>' if spark else "")
                     + _table(["check", "rank", "status", "change", "evidence", "trade-off"], rows) + "</section>")
    rows_c = changed(report)
    if rows_c:
        parts.append('<h2 id="changes">Changes within the range</h2>')
        parts.append(_table(["at", "server", "flag", "from", "to", "verdict", "why"],
                            [[_td(c["at"]), _td(name), _td(c["flag"]), _td(fmt_value(c["from"])),
                              _td(fmt_value(c["to"])), _td(c["verdict"], "v-" + str(c["verdict"])), _td(c["why"])]
                             for name, c in rows_c]))
        parts.append('<h3 id="lagging">Servers that still lag their peers</h3>')
        parts.append(_table(["model", "flag", "improved value", "improved on", "still on another value"],
                            [[_td(g.model_name), _td(g.flag), _td(fmt_value(g.value)), _td(", ".join(g.improved_on)),
                              _td(", ".join(f"{i} ({fmt_value(v)})" for i, v in g.servers.items()))]
                             for g in report.lagging])
                     if report.lagging else "<p>None: no improvement seen on one server is missing on a peer.</p>")
    parts.append('<h2 id="drift">Configuration drift</h2>')
    if report.drift:
        rows = []
        for d in report.drift:
            items = list(d.values.items())
            top_val, top_insts = items[0]
            others = "; ".join(f"{v} on {_listing(i)}" for v, i in items[1:])
            rows.append([_td(d.model_name), _td(d.arg), _td(f"{top_val} ({len(top_insts)} servers)"), _td(others)])
        parts.append(_table(["model", "argument", "most common", "differs"], rows))
    else:
        parts.append("<p>Servers of the same model run the same flags.</p>")
    parts.append('<h2 id="matrix">Every instance × check</h2>')
    rows = []
    for inst in report.instances:
        cells = [_td(inst.instance), _td(inst.model_name or "?"), _td(inst.status, inst.status)]
        for c in report.checks:
            st = cell_status(inst, c)
            cells.append(_td(SHORT[st], st))
        rows.append(cells)
    parts.append(_table(["instance", "model", "status", *report.checks], rows, cls="matrix"))
    parts.append("</body></html>\n")
    return "\n".join(parts)
