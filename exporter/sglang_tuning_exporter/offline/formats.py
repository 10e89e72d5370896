"""Output formats of `diagnose`: text (terminal), JSON (interfaces.md), Markdown, self-contained HTML.

Pure functions of the per-file diagnoses.  HTML escapes every value that comes from the log and
loads nothing external (no scripts, fonts, images or stylesheets); charts are inline SVG.
"""

from __future__ import annotations

import html
import json
import textwrap
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from sglang_tuning_exporter.core.durations import duration_text
from sglang_tuning_exporter.core.markdown import md_text
from sglang_tuning_exporter.core.model import STATUS_CODE, STATUS_COLOURS, Finding, rank_text, value_text
from sglang_tuning_exporter.guide.checks import CheckTable
from sglang_tuning_exporter.guide.plan import (
    CURRENT_UNKNOWN,
    plan_step_change,
    plan_step_markdown,
    plan_step_text,
)
from sglang_tuning_exporter.offline.diagnosis import CHARTS, FileDiagnosis, Series

_ANSI = {"ok": "\x1b[32m", "warning": "\x1b[33m", "critical": "\x1b[1;31m", "unknown": "\x1b[90m"}
_RESET = "\x1b[0m"


def render(results: Sequence[FileDiagnosis], fmt: str, *, table: CheckTable, color: bool = False) -> str:
    """All diagnoses in one output of format `fmt`: its head, each input's part, its tail."""
    out = Output(fmt, len(results))
    summary = summary_html([summary_row(r, i) for i, r in enumerate(results, 1)]) if fmt == "html" else ""
    return out.head + summary + out.sep.join(out.part(r, table, color=color, index=i)
                                             for i, r in enumerate(results, 1)) + out.tail(
        worst_status(r.document for r in results))


def worst_status(docs: Iterable[dict[str, Any]]) -> str:
    """The worst `status` of the documents."""
    return max((d.get("status", "ok") for d in docs), key=lambda s: STATUS_CODE.get(s, STATUS_CODE["unknown"]),
               default="ok")


class Output:
    """An output of format `fmt` for `count` inputs, as pieces (head, each input's part joined by `sep`,
    tail): `diagnose` writes the parts as the inputs are read, keeping none (memory flat in the number
    of inputs)."""

    def __init__(self, fmt: str, count: int) -> None:
        self.fmt, self.count = fmt, count
        self.sep = ",\n" if fmt == "json" else "\n"
        if fmt == "json":
            self.head = "" if count == 1 else '{\n  "sources": [\n'
        elif fmt == "markdown":
            self.head = "# SGLang tuning diagnosis\n\n"
        elif fmt == "html":
            self.head = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                         '<meta name="viewport" content="width=device-width, initial-scale=1">'
                         "<title>SGLang tuning diagnosis</title>"
                         f"<style>{_CSS}</style></head><body>\n<h1>SGLang tuning diagnosis</h1>\n")
        else:
            self.head = ""

    def part(self, r: FileDiagnosis, table: CheckTable, *, color: bool = False, index: int | None = None) -> str:
        """One input's part (`index`: its place among several, the summary's link to it)."""
        if self.fmt == "json":
            text = json.dumps(r.document, indent=2, sort_keys=False)
            return text if self.count == 1 else textwrap.indent(text, "    ", lambda _: True)
        if self.fmt == "markdown":
            return file_markdown(r, table)
        if self.fmt == "html":
            return file_html(r, table, index)
        return file_text(r, table, color=color)

    def tail(self, worst: str) -> str:
        """The end, once every input was read (`worst`: their worst status)."""
        if self.fmt == "json":
            return "\n" if self.count == 1 else f'\n  ],\n  "status": {json.dumps(worst)}\n}}\n'
        return "\n</body></html>\n" if self.fmt == "html" else ""


def change_text(f: Finding) -> str:
    """The exact change a person makes: `--flag current -> suggested (action)`."""
    if f.flag is None:
        return f"client side: {f.action}"
    cur = CURRENT_UNKNOWN if f.current is None else value_text(f.current)
    if f.suggested is None:
        return f"{f.action} {f.flag} (current {cur}; no value computed, see evidence)"
    if f.action == "set":
        return f"set {f.flag} {value_text(f.suggested)} (now {cur})"
    return f"{f.action} {f.flag}: {cur} -> {value_text(f.suggested)}"




def _rows(r: FileDiagnosis, table: CheckTable) -> list[tuple[str, str, str, str]]:
    """(check, worst status, ranks at that status, summary) per check, in table order."""
    by: dict[str, list[Finding]] = {}
    for f in r.findings:
        by.setdefault(f.check, []).append(f)
    rows: list[tuple[str, str, str, str]] = []
    for c in table.checks:
        fs = by.get(c.id)
        if not fs:
            continue
        worst = max(fs, key=lambda f: STATUS_CODE[f.status]).status
        at = [f for f in fs if f.status == worst]
        ranks = ", ".join(rank_text(f.rank) for f in at)
        if len(fs) > 1:
            ranks = f"{ranks} ({len(at)}/{len(fs)})" if len(at) < len(fs) else f"all {len(fs)}"
        rows.append((c.id, worst, ranks, at[0].summary))
    return rows


def _firing(r: FileDiagnosis) -> list[Finding]:
    fs = [f for f in r.findings if f.status in ("warning", "critical")]
    return sorted(fs, key=lambda f: -STATUS_CODE[f.status])


def _header_lines(r: FileDiagnosis) -> list[str]:
    d = r.document
    srv = d.get("server", {})
    win = d.get("window", {})
    inp = d.get("input", {})
    floor = f" (>= {srv['version_floor']} by its line formats)" if srv.get("version_floor") else ""
    out = [f"server: SGLang {srv.get('version') or 'version unknown' + floor}"
           + (f", model {srv['model_name']}" if srv.get("model_name") else "")
           + f" | guide profile {d.get('profile')} | workload {d.get('workload')}",
           f"log: {win.get('start')} .. {win.get('end')}, {inp.get('lines', 0)} lines, "
           f"{inp.get('fast_path_lines', 0) + inp.get('events', 0)} SGLang records, "
           f"{inp.get('evaluations', 0)} window{'' if inp.get('evaluations') == 1 else 's'} of "
           f"{duration_text(inp.get('window_s', 600))} evaluated"]
    if inp.get("time_from_line_order"):
        out.append("note: the log has no timestamps; time is taken from line order (1 s per line)")
    if inp.get("unparsed"):
        out.append(f"note: {inp['unparsed']} lines looked like SGLang records but could not be read")
    if inp.get("implausible_times"):
        n = inp["implausible_times"]
        out.append(f"note: {n} timestamp{'' if n == 1 else 's'} far off the log's clock (e.g. "
                   f"{inp.get('implausible_time_example') or '?'}: another host's clock, a stray line) "
                   "took a neighbour's time")
    return out


def file_text(r: FileDiagnosis, table: CheckTable, *, color: bool = False) -> str:
    """One input's part of the text output."""
    lines: list[str] = []
    lines.append(f"== {r.source}")
    lines.extend("  " + h for h in _header_lines(r))
    lines.append("")
    d = r.document
    lines.append(f"  {d.get('verdict', '')}")
    if d.get("plan"):
        lines.append("")
        lines.append("  Plan (one change at a time, in this order):")
        lines.extend("    " + x for x in plan_lines(d))
        if d.get("command_diff"):
            lines.append("  Command line:")
            lines.extend("    " + x for x in d["command_diff"])
    lines.append("")
    rows = _rows(r, table)
    w1 = max([len("CHECK")] + [len(x[0]) for x in rows])
    w3 = max([len("RANKS")] + [len(x[2]) for x in rows])
    lines.append(f"  {'CHECK':<{w1}}  {'STATUS':<8}  {'RANKS':<{w3}}  SUMMARY")
    for cid, status, ranks, summary in rows:
        st = f"{status:<8}"
        if color:
            st = f"{_ANSI[status]}{st}{_RESET}"
        lines.append(f"  {cid:<{w1}}  {st}  {ranks:<{w3}}  {summary}")
    firing = _firing(r)
    why = not_judged(d)
    if why:
        lines.append("")
        lines.append(f"  Not judged ({len(why)} of {d['coverage']['checks']} checks):")
        lines.extend(f"    {cid}: {text}" for cid, text in why)
    if d.get("indications"):
        lines.append("")
        lines.append("  Indications (too few samples to judge; not findings, --fail-on ignores them):")
        lines.extend(f"    {i['check']} on {rank_text(i['rank'])}: {i['evidence']}"
                     for i in d["indications"])
    if firing:
        lines.append("")
        lines.append(f"  {len(firing)} finding(s):")
    for f in firing:
        tag = f.status.upper()
        if color:
            tag = f"{_ANSI[f.status]}{tag}{_RESET}"
        lines.append("")
        lines.append(f"  [{tag}] {f.check} on {rank_text(f.rank)}: {f.summary}")
        lines.extend(f"    {label.lower() + ':':<10} " + (f'"{value}"' if label == "Guide" else value)
                     for label, value in _parts(r, f))
    lines.append("")
    return "\n".join(lines)


def plan_lines(doc: dict[str, Any]) -> list[str]:
    """The plan as plain lines (shared by text and Markdown)."""
    out: list[str] = []
    for step in doc.get("plan") or []:
        out.append(plan_step_text(step))
        out.append(f"   why:  {step.get('why', '')}")
        out.append(f"   then: {step.get('then', '')}")
    return out


def not_judged(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(check, why) for each check without a verdict."""
    return sorted((doc.get("coverage") or {}).get("unknown_why", {}).items())


def _parts(r: FileDiagnosis, f: Finding) -> list[tuple[str, str]]:
    """What every format shows of a firing finding, labelled: change and evidence, then its window,
    guide quote and trade-off where it has them."""
    more = (("Window", _window_of(r, f)), ("Guide", f.guide), ("Trade-off", f.tradeoff))
    return [("Change", change_text(f)), ("Evidence", f.evidence), *((k, v) for k, v in more if v)]


def _window_of(r: FileDiagnosis, f: Finding) -> str:
    for fd in r.document.get("findings", []):
        if fd.get("check") == f.check and fd.get("rank") == f.rank:
            w = fd.get("window") or {}
            return f"{w.get('start')} .. {w.get('end')}" if w else ""
    return ""


def _md_code(s: Any) -> str:
    """A Markdown code span: its text is shown literally, so it is not HTML-escaped."""
    text = str(s).replace("\n", " ")
    fence = "``" if "`" in text else "`"
    return f"{fence} {text} {fence}" if fence == "``" else f"`{text}`"


def file_markdown(r: FileDiagnosis, table: CheckTable) -> str:
    """One input's part of the Markdown report (HTML in values is escaped)."""
    out: list[str] = []
    out.append(f"## {_md_code(r.source)}")
    out.append("")
    out.extend(f"- {md_text(h)}" for h in _header_lines(r))
    out.append("")
    d = r.document
    out.append(f"**{md_text(d.get('verdict', ''))}**")
    out.append("")
    if d.get("plan"):
        out.append("### Plan (one change at a time, in this order)")
        out.append("")
        for step in d["plan"]:
            out.append(plan_step_markdown(step, code=_md_code, text=md_text))
        out.append("")
        if d.get("command_diff"):
            out.append("```diff")
            out.extend(d["command_diff"])
            out.append("```")
            out.append("")
    out.append("| check | status | ranks | summary |")
    out.append("|---|---|---|---|")
    for cid, status, ranks, summary in _rows(r, table):
        out.append(f"| `{cid}` | **{status}** | {md_text(ranks)} | {md_text(summary)} |")
    out.append("")
    firing = _firing(r)
    why = not_judged(d)
    if why:
        out.append(f"### Not judged ({len(why)} of {d['coverage']['checks']} checks)")
        out.append("")
        out.extend(f"- `{cid}`: {md_text(text)}" for cid, text in why)
        out.append("")
    if d.get("indications"):
        out.append("### Indications (too few samples to judge; not findings)")
        out.append("")
        out.extend(f"- `{i['check']}` on {md_text(rank_text(i['rank']))}: {md_text(i['evidence'])}"
                   for i in d["indications"])
        out.append("")
    for f in firing:
        out.append(f"### {f.status.upper()}: `{f.check}` on {md_text(rank_text(f.rank))}")
        out.append("")
        out.extend(f"- **{label}:** " + (_md_code(value) if label == "Change" else md_text(value))
                   for label, value in _parts(r, f))
        out.append("")
    out.append("")
    return "\n".join(out)


def svg_chart(series: Series, title: str, width: int = 560, height: int = 140) -> str:
    """A small inline SVG line chart of one series (no external assets)."""
    pts = series.points
    e = html.escape
    if len(pts) < 2:
        return (f'<figure class="chart"><figcaption>{e(title)}</figcaption>'
                f'<p class="muted">not enough data for a chart</p></figure>')
    x0, x1 = pts[0][0], pts[-1][0]
    ys = [v for _, v in pts]
    lo, hi = min(0.0, min(ys)), max(ys)
    if hi <= lo:
        hi = lo + 1.0
    pad = 28
    sx = (width - 2 * pad) / ((x1 - x0) or 1.0)
    sy = (height - 2 * pad) / (hi - lo)
    coords = " ".join(f"{pad + (t - x0) * sx:.1f},{height - pad - (v - lo) * sy:.1f}" for t, v in pts)
    return (f'<figure class="chart"><figcaption>{e(title)}</figcaption>'
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
            f'aria-label="{e(title)}" viewBox="0 0 {width} {height}">'
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fafafa"/>'
            f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="#999"/>'
            f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="#999"/>'
            f'<text x="2" y="{pad + 4}" font-size="10">{e(f"{hi:g}")}</text>'
            f'<text x="2" y="{height - pad}" font-size="10">{e(f"{lo:g}")}</text>'
            f'<polyline fill="none" stroke="#1565c0" stroke-width="1.5" points="{coords}"/>'
            f'</svg></figure>')


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3}.status{font-weight:bold}.muted{color:#777}.finding{border-left:4px solid #999;padding:.2em 1em;margin:1em 0}
code{background:#f3f3f3;padding:0 3px}.charts{display:flex;flex-wrap:wrap;gap:1em}figure{margin:0;max-width:100%}
.wide,pre{overflow-x:auto;max-width:100%}svg{max-width:100%;height:auto}p,h1,h2,h3,li,code{overflow-wrap:anywhere}
.status{white-space:nowrap}
@media (max-width:600px){body{margin:.5em}}"""


def summary_row(r: FileDiagnosis, index: int) -> str:
    """The summary's row of one input (status, verdict line, first plan step, a link to its part): kept
    while the inputs are read, as the parts are not."""
    e = html.escape
    d = r.document
    status = str(d.get("status", "unknown"))
    plan = d.get("plan") or []
    step = f"<code>{e(plan_step_change(plan[0]))}</code>" if plan else "nothing to change"
    return (f'<tr data-status="{e(status)}"><td><a href="#input-{index}"><code>{e(r.source)}</code></a></td>'
            f'<td class="status" style="color:{STATUS_COLOURS.get(status, STATUS_COLOURS["unknown"])}">{e(status)}</td>'
            f"<td>{e(str(d.get('verdict', '')))}</td><td>{step}</td></tr>")


def summary_html(rows: Sequence[str]) -> str:
    """Several inputs open with a summary, one row per input; one input has none."""
    if len(rows) < 2:
        return ""
    counts = Counter(row.split('"', 2)[1] for row in rows)
    said = ", ".join(f"{counts[k]} {k}" for k in ("critical", "warning", "ok", "unknown") if counts[k])
    return (f'<section id="summary"><h2>Summary: {len(rows)} inputs ({html.escape(said)})</h2>'
            '<div class="wide"><table><tr><th>input</th><th>status</th><th>verdict</th><th>first step</th></tr>'
            + "".join(rows) + "</table></div></section>\n")


def file_html(r: FileDiagnosis, table: CheckTable, index: int | None = None) -> str:
    """One input's part of the HTML page: checks table, findings, inline SVG charts of key signals."""
    e = html.escape
    body: list[str] = []
    anchor = f' id="input-{index}"' if index is not None else ""
    body.append(f"<h2{anchor}><code>{e(r.source)}</code></h2>")
    body.append("<ul>" + "".join(f"<li>{e(h)}</li>" for h in _header_lines(r)) + "</ul>")
    d = r.document
    body.append(f'<p class="verdict"><b>{e(d.get("verdict", ""))}</b></p>')
    if d.get("plan"):
        body.append("<h3>Plan (one change at a time, in this order)</h3><ol class=\"plan\">")
        for step in d["plan"]:
            body.append(f"<li><code>{e(plan_step_change(step))}</code>"
                        f"<br>{e(step.get('why', ''))}<br><i>Then:</i> {e(step.get('then', ''))}</li>")
        body.append("</ol>")
        if d.get("command_diff"):
            body.append("<pre>" + e("\n".join(d["command_diff"])) + "</pre>")
    body.append('<div class="wide"><table><tr><th>check</th><th>status</th><th>ranks</th><th>summary</th></tr>')
    for cid, status, ranks, summary in _rows(r, table):
        body.append(f'<tr><td><code>{e(cid)}</code></td><td class="status" style="color:{STATUS_COLOURS[status]}">'
                    f"{e(status)}</td><td>{e(ranks)}</td><td>{e(summary)}</td></tr>")
    body.append("</table></div>")
    firing = _firing(r)
    why = not_judged(d)
    if why:
        body.append(f"<h3>Not judged ({len(why)} of {d['coverage']['checks']} checks)</h3><ul>"
                    + "".join(f"<li><code>{e(cid)}</code>: {e(text)}</li>" for cid, text in why) + "</ul>")
    if d.get("indications"):
        body.append("<h3>Indications (too few samples to judge; not findings)</h3><ul>"
                    + "".join(f"<li><code>{e(i['check'])}</code> on {e(rank_text(i['rank']))}: "
                              f"{e(i['evidence'])}</li>" for i in d["indications"]) + "</ul>")
    for f in firing:
        colour = STATUS_COLOURS[f.status]
        body.append(f'<div class="finding" style="border-color:{colour}">'
                    f'<h3><span style="color:{colour}">{e(f.status.upper())}</span> '
                    f"<code>{e(f.check)}</code> on {e(rank_text(f.rank))}</h3>"
                    + "".join(f"<p><b>{label}:</b> " + (f"<code>{e(value)}</code>" if label == "Change" else e(value))
                              + "</p>" for label, value in _parts(r, f))
                    + "</div>")
    body.append('<h3>Signals over time</h3><div class="charts">')
    for key, title in CHARTS:
        s = r.series.get(key)
        if s is not None:
            body.append(svg_chart(s, title))
    body.append("</div>")
    return "\n".join(body)
