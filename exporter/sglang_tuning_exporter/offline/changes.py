"""`diagnose` over restarts: split a log at its startup sections (each `server_args=` line starts one, and so
does each change without a restart, SGLang's `Config updated via context override: {...}` or 0.5.15's
`Global server args updated! ...`), diagnose each section window by window, and judge every flag change
between them (changes.py).

Several files of one server given in time order (`diagnose a.log b.log --same-server`) are read as one
log: their sections follow each other.  Only inputs with at least two startup sections (or several
files) pay for the second read.
"""

from __future__ import annotations

import gzip
import html
import json
import mmap
import re
from collections.abc import Iterator, Sequence
from typing import Any

from sglang_tuning_exporter.core.markdown import md_text
from sglang_tuning_exporter.core.model import value_text
from sglang_tuning_exporter.guide.advisor import aggregate_signals
from sglang_tuning_exporter.guide.changes import (
    Section,
    WindowSummary,
    compare_sections,
    detect,
    last_change,
    last_change_text,
    worst_statuses,
)
from sglang_tuning_exporter.guide.checks import CheckTable
from sglang_tuning_exporter.guide.config import Config
from sglang_tuning_exporter.offline import formats as diagnose_formats
from sglang_tuning_exporter.offline.diagnosis import Diagnosis, FileDiagnosis
from sglang_tuning_exporter.offline.scanner import SECTION_MARKS, Scanner, count_marks
from sglang_tuning_exporter.sources.logfiles import LineBlocks
from sglang_tuning_exporter.sources.tail import MAX_LINE_BYTES

# Where a section starts (scanner.SECTION_MARKS): a startup's arguments, or arguments changed without a restart.
MARKS = re.compile(b"|".join(re.escape(w) for w in SECTION_MARKS))
LONGEST_MARK = max(map(len, SECTION_MARKS))
BLOCK_BYTES = 1 << 20  # bytes read at once from an input read for its sections


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


def _blocks(path: str) -> Iterator[bytes]:
    """The input (gunzipped when it is gzip) as blocks of whole lines (the last may lack its newline):
    never more than a block and a line in memory."""
    with open(path, "rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    with (gzip.open(path, "rb") if gz else open(path, "rb")) as f:
        yield from LineBlocks(f.read, BLOCK_BYTES, MAX_LINE_BYTES)  # an over-long line skipped


def _section_pieces(path: str) -> Iterator[bytes | None]:
    """The input's bytes in order, None where a section ends: before each line holding one of MARKS that is
    not the first line of its section, and at the end."""
    fed = False  # the current section holds bytes
    for block in _blocks(path):
        pos = 0
        hit = MARKS.search(block)
        found = hit.start() if hit else -1
        while found >= 0:
            line = block.rfind(b"\n", 0, found) + 1
            if line > pos or fed:  # the section so far holds bytes: this line starts the next one
                if line > pos:
                    yield block[pos:line]
                yield None
                pos, fed = line, False
            nl = block.find(b"\n", found)
            hit = MARKS.search(block, nl + 1) if nl >= 0 else None
            found = hit.start() if hit else -1
        if pos < len(block):
            yield block[pos:]
            fed = True
    yield None


def restarts(path: str) -> bool:
    """Whether the input has two section marks or more (MARKS: a restart's `server_args=`, a change without
    a restart; a plain file is searched through a map, without reading it into memory; a gzip file is
    streamed)."""
    try:
        with open(path, "rb") as fh:
            if fh.read(2) == b"\x1f\x8b":
                seen, carry = 0, b""
                with gzip.open(path, "rb") as gz:
                    while block := gz.read(1 << 20):
                        buf = carry + block
                        seen += count_marks(buf)
                        if seen >= 2:
                            return True
                        carry = buf[-(LONGEST_MARK - 1):]  # a mark cut by the block's end is found whole next
                        seen -= count_marks(carry)  # counted again with the next block
                return False
            fh.seek(0)
            try:
                m = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):  # an empty file
                return False
            with m:
                return count_marks(m, enough=2) >= 2
    except (OSError, EOFError, gzip.BadGzipFile):
        return False



def _restarts(r: FileDiagnosis) -> bool:
    """Whether a diagnosed input restarts: from the marks its parallel read counted, else read for them
    (standard input cannot be read again)."""
    if r.source == "-":
        return False
    return r.section_marks >= 2 if r.section_marks is not None else restarts(r.source)


def sections_of(paths: Sequence[str], table: CheckTable, cfg: Config, profile: str, workload: str,
                overrides: dict[str, Any]) -> list[Section]:
    """The startup sections of the inputs, in order (each streamed through its own diagnosis: memory
    stays flat however long the log); consecutive sections whose tracked flags agree as
    guide/changes.detect compares them (a restart with the same arguments, a file without a
    `server_args=` line) are one. A section's arguments are its own over those before it: a change
    without a restart names only the changed ones."""
    raw: list[Section] = []
    for path in paths:
        d: _Recording | None = None
        scanner: Scanner | None = None
        for piece in _section_pieces(path):
            if d is None or scanner is None:
                d = _Recording(table, cfg, profile, workload, overrides)
                scanner = Scanner(d.res, d.cfg.usage_good, d.window.params.queue_band, origin_s=d.origin)
            if piece is not None:
                d.add_chunk(scanner.scan_bytes(piece, final=False))
                continue
            d.add_chunk(scanner.scan_bytes(b"", final=True))
            if d.lines and d.first_t is not None:
                d.finish("section")
                raw.append(Section(d.first_t, {**d.server.args, **overrides}, tuple(d.summaries)))
            d = scanner = None
    merged: list[Section] = []
    for s in raw:
        if merged:
            prev = merged[-1]
            if not s.args or not detect(prev.args, s.args, table):
                merged[-1] = Section(prev.start, {**prev.args, **s.args}, prev.windows + s.windows)
                continue
            s = Section(s.start, {**prev.args, **s.args}, s.windows)
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
            if _restarts(r):
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


def file_changes(r: FileDiagnosis, table: CheckTable, cfg: Config, profile: str, workload: str,
                 overrides: dict[str, Any], *, same_server: bool = False) -> list[dict[str, Any]]:
    """One input's changes (it restarts with other arguments), into its document with the last change's
    verdict; what `render` does per input when the inputs are not read as one server."""
    found: list[dict[str, Any]] = []
    if _restarts(r):
        r.document["changes"] = found = changes_of([r.source], table, cfg, profile, workload, overrides)
    if same_server:
        r.document.setdefault("changes", found)
    if r.document.get("changes"):
        r.document["last_change"] = last_change(r.document["changes"])
    return found


def wrap(fmt: str, head: str, tail: str, found: Sequence[dict[str, Any]]) -> tuple[str, str]:
    """An output's head and tail with the last change's verdict and the changes section, as `render`
    puts them around the inputs' parts."""
    note = last_change(list(found))
    if fmt == "json":
        return head, tail
    if fmt == "markdown":
        return markdown_last(note) + head, tail + markdown_section(found)
    if fmt == "html":
        sec = html_section(found)
        cut = tail.rfind("</body>")
        return html_last(note, head), (tail[:cut] + sec + tail[cut:] if cut >= 0 else tail + sec)
    return (f"== {last_change_text(note)}\n\n" if note else "") + head, tail + text_section(found)


def markdown_last(note: dict[str, Any] | None) -> str:
    """The last change's verdict as the first paragraph."""
    if not note:
        return ""
    return "> **" + md_text(last_change_text(note)) + "**\n\n"


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




def text_section(changes: Sequence[dict[str, Any]]) -> str:
    """The terminal section."""
    if not changes:
        return ""
    out = ["", "== changes (before/after each flag change)"]
    for c in changes:
        out.append(f"  {c['at']}  {c['flag']} {value_text(c['from'])} -> {value_text(c['to'])}: {c['verdict'].upper()}")
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
        out.append(f"| {md_text(c['at'])} | `{c['flag']}` | {md_text(value_text(c['from']))} | {md_text(value_text(c['to']))} "
                   f"| **{c['verdict']}** | {md_text(c['why'])} |")
    return "\n".join(out) + "\n"


def html_section(changes: Sequence[dict[str, Any]]) -> str:
    """An HTML section (every value escaped)."""
    if not changes:
        return ""
    rows = "".join(
        f"<tr><td>{html.escape(str(c['at']))}</td><td><code>{html.escape(str(c['flag']))}</code></td>"
        f"<td>{html.escape(value_text(c['from']))}</td><td>{html.escape(value_text(c['to']))}</td>"
        f"<td><b>{html.escape(str(c['verdict']))}</b></td><td>{html.escape(str(c['why']))}</td></tr>"
        for c in changes)
    return ("<section id=\"changes\"><h2>Changes</h2><div class=\"wide\"><table><tr><th>at</th><th>flag</th>"
            f"<th>from</th><th>to</th><th>verdict</th><th>why</th></tr>{rows}</table></div></section>")


__all__ = [
    "changes_of",
    "html_section",
    "markdown_section",
    "render",
    "restarts",
    "sections_of",
    "text_section",
]
