"""`diagnose` over restarts: split a log at its startup sections (each `server_args=` line starts one),
diagnose each section window by window, and judge every flag change between them (changes.py).

Several files of one server given in time order (`diagnose a.log b.log --same-server`) are read as one
log: their sections follow each other.  Only inputs with at least two startup sections (or several
files) pay for the second read.
"""

from __future__ import annotations

import gzip
import html
import json
import math
import mmap
from collections.abc import Sequence
from typing import Any

from sglang_tuning_exporter.guide.advisor import aggregate_signals
from sglang_tuning_exporter.guide.changes import (
    Section,
    WindowSummary,
    compare_sections,
    last_change,
    last_change_text,
    tracked_flags,
    worst_statuses,
)
from sglang_tuning_exporter.guide.checks import CheckTable
from sglang_tuning_exporter.guide.config import Config
from sglang_tuning_exporter.offline import formats as diagnose_formats
from sglang_tuning_exporter.offline.diagnosis import Diagnosis, FileDiagnosis
from sglang_tuning_exporter.offline.scanner import Scanner

MARK = b"server_args="


class _Recording(Diagnosis):
    """A Diagnosis that keeps a summary of every window it evaluates."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.summaries: list[WindowSummary] = []

    def _evaluate(self, now: float, *, final: bool = False) -> None:
        super()._evaluate(now, final=final)
        sig = self.last_signals
        # The statuses the evaluation just computed (not a second evaluation).
        worst = worst_statuses((cid, s) for st in self.last_statuses.values() for cid, s in st.items())
        start = now - self.window.length_s
        if self.first_t is not None:
            start = max(start, self.first_t)
        self.summaries.append(WindowSummary(start, now, aggregate_signals(sig), worst))


def read_bytes(path: str) -> bytes:
    """The whole input (gunzipped when it is gzip)."""
    with open(path, "rb") as fh:
        head = fh.read(2)
    if head == b"\x1f\x8b":
        with gzip.open(path, "rb") as gz:
            return gz.read()
    with open(path, "rb") as fh:
        return fh.read()


def section_starts(data: bytes) -> list[int]:
    """Byte offsets of the lines holding `server_args=` (0 is always a start)."""
    starts = [0]
    pos = data.find(MARK)
    while pos >= 0:
        line = data.rfind(b"\n", 0, pos) + 1
        if line > starts[-1]:
            starts.append(line)
        pos = data.find(MARK, pos + len(MARK))
    return starts


def restarts(path: str) -> bool:
    """Whether the input has two `server_args=` lines or more (a plain file is searched through a map,
    without reading it into memory; a gzip file is streamed)."""
    try:
        with open(path, "rb") as fh:
            if fh.read(2) == b"\x1f\x8b":
                seen, carry = 0, b""
                with gzip.open(path, "rb") as gz:
                    while block := gz.read(1 << 20):
                        buf = carry + block
                        seen += buf.count(MARK)
                        if seen >= 2:
                            return True
                        carry = buf[-len(MARK):]
                        seen -= carry.count(MARK)  # counted again with the next block
                return False
            fh.seek(0)
            try:
                m = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):  # an empty file
                return False
            with m:
                first = m.find(MARK)
                return first >= 0 and m.find(MARK, first + len(MARK)) >= 0
    except (OSError, EOFError, gzip.BadGzipFile):
        return False


def _section(data: bytes, table: CheckTable, cfg: Config, profile: str, workload: str,
             overrides: dict[str, Any]) -> Section | None:
    d = _Recording(table, cfg, profile, workload, overrides)
    scanner = Scanner(d.res, d.cfg.usage_good, d.window.params.queue_band, origin_s=d.origin)
    d.add_chunk(scanner.scan_bytes(data, final=True))
    if d.lines == 0 or d.first_t is None:
        return None
    d.finish("section")
    args = {**d.server.args, **overrides}
    return Section(d.first_t, args, tuple(d.summaries))


def sections_of(paths: Sequence[str], table: CheckTable, cfg: Config, profile: str, workload: str,
                overrides: dict[str, Any]) -> list[Section]:
    """The startup sections of the inputs, in order; consecutive sections whose tracked flags agree (a
    restart with the same arguments, a file without a `server_args=` line) are one."""
    raw: list[Section] = []
    for path in paths:
        data = read_bytes(path)
        starts = section_starts(data)
        for a, b in zip(starts, [*starts[1:], len(data)], strict=True):
            s = _section(data[a:b], table, cfg, profile, workload, overrides)
            if s is not None:
                raw.append(s)
    tracked = {f.lstrip("-").replace("-", "_") for f in tracked_flags(table)}
    merged: list[Section] = []
    for s in raw:
        if merged:
            prev = merged[-1]
            keys = tracked & set(prev.args) & set(s.args)
            if not s.args or all(str(prev.args[k]) == str(s.args[k]) for k in keys):
                merged[-1] = Section(prev.start, {**prev.args, **s.args}, prev.windows + s.windows)
                continue
        merged.append(s)
    return merged


def changes_of(paths: Sequence[str], table: CheckTable, cfg: Config, profile: str, workload: str,
               overrides: dict[str, Any]) -> list[dict[str, Any]]:
    """The `changes` entries of the inputs read as one server's log."""
    secs = sections_of(paths, table, cfg, profile, workload, overrides)
    return compare_sections(secs, table, "log")


# --- output -------------------------------------------------------------------------------------
def render(results: Sequence[FileDiagnosis], fmt: str, *, table: CheckTable, color: bool, cfg: Config,
           profile: str, workload: str, overrides: dict[str, Any], same_server: bool) -> str:
    """diagnose's output with the `changes` of each input that restarts with other arguments (or of all
    inputs read as one server with `same_server`)."""
    found: list[dict[str, Any]] = []
    files = [r.source for r in results if r.source != "-"]  # standard input cannot be read twice
    if same_server and len(files) > 1:
        found = changes_of(files, table, cfg, profile, workload, overrides)
    else:
        for r in results:
            if r.source != "-" and restarts(r.source):
                r.document["changes"] = ch = changes_of([r.source], table, cfg, profile, workload, overrides)
                found.extend(ch)
    if same_server and len(results) == 1 and len(files) == 1:
        results[0].document.setdefault("changes", found)
    # The plan's step 0: whether the last change helped, read before the next step is proposed.
    note = last_change(found)
    for r in results:
        if r.document.get("changes"):
            r.document["last_change"] = last_change(r.document["changes"])
    text = diagnose_formats.render(results, fmt, table=table, color=color)
    if fmt == "json":
        if same_server and len(results) > 1:
            doc = json.loads(text)
            doc["changes"] = found
            doc["last_change"] = note
            text = json.dumps(doc, indent=2) + "\n"
        return text
    if fmt == "markdown":
        return markdown_last(note) + text + markdown_section(found)
    if fmt == "html":
        sec = html_section(found)
        cut = text.rfind("</body>")
        text = text[:cut] + sec + text[cut:] if cut >= 0 else text + sec
        return html_last(note, text)
    return (f"== {last_change_text(note)}\n\n" if note else "") + text + text_section(found)


def markdown_last(note: dict[str, Any] | None) -> str:
    """The last change's verdict as the first paragraph."""
    if not note:
        return ""
    return "> **" + last_change_text(note).replace("|", "\\|") + "**\n\n"


def html_last(note: dict[str, Any] | None, page: str) -> str:
    """The last change's verdict right after the page's title (first in the body otherwise)."""
    if not note:
        return page
    para = (f'<p id="last-change" class="verdict-{html.escape(str(note["verdict"]))}"><b>'
            f"{html.escape(last_change_text(note))}</b></p>")
    for mark in ("</h1>", "<body>"):
        cut = page.find(mark)
        if cut >= 0:
            return page[:cut + len(mark)] + para + page[cut + len(mark):]
    return para + page


def _v(x: Any) -> str:
    if isinstance(x, float) and math.isfinite(x):
        return f"{x:g}"
    return str(x)


def text_section(changes: Sequence[dict[str, Any]]) -> str:
    """The terminal section."""
    if not changes:
        return ""
    out = ["", "== changes (before/after each flag change)"]
    for c in changes:
        out.append(f"  {c['at']}  {c['flag']} {_v(c['from'])} -> {_v(c['to'])}: {c['verdict'].upper()}")
        out.append(f"      {c['why']}")
        for cid, st in c["checks"].items():
            if st["before"] != st["after"] or st["after"] in ("warning", "critical"):
                out.append(f"      {cid}: {st['before']} -> {st['after']}")
    return "\n".join(out) + "\n"


def markdown_section(changes: Sequence[dict[str, Any]]) -> str:
    """A Markdown table."""
    if not changes:
        return ""
    out = ["", "## Changes", "", "| at | flag | from | to | verdict | why |", "|---|---|---|---|---|---|"]
    for c in changes:
        why = str(c["why"]).replace("|", "\\|")
        out.append(f"| {c['at']} | `{c['flag']}` | {_v(c['from'])} | {_v(c['to'])} | **{c['verdict']}** | {why} |")
    return "\n".join(out) + "\n"


def html_section(changes: Sequence[dict[str, Any]]) -> str:
    """An HTML section (every value escaped)."""
    if not changes:
        return ""
    rows = "".join(
        f"<tr><td>{html.escape(str(c['at']))}</td><td><code>{html.escape(str(c['flag']))}</code></td>"
        f"<td>{html.escape(_v(c['from']))}</td><td>{html.escape(_v(c['to']))}</td>"
        f"<td><b>{html.escape(str(c['verdict']))}</b></td><td>{html.escape(str(c['why']))}</td></tr>"
        for c in changes)
    return ("<section id=\"changes\"><h2>Changes</h2><table><tr><th>at</th><th>flag</th><th>from</th><th>to</th>"
            f"<th>verdict</th><th>why</th></tr>{rows}</table></section>")


__all__ = [
    "changes_of",
    "html_section",
    "markdown_section",
    "render",
    "restarts",
    "section_starts",
    "sections_of",
    "text_section",
]
