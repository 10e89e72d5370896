"""Pure SGLang log-line parser: one line of text in, one typed Event (or None) out.

Lines are parsed by structure, not by one regex per release: a prefix (timestamp, rank tags,
docker-compose / Ray / custom logging decorations), a recognised head (`Decode batch`, `Prefill
batch`, `KV cache pool is full`, `Load weight end`, ...), then `key: value` / `key=value` pairs.
Known keys get the canonical names of interfaces.md; unknown keys are kept under a normalised name,
so a field added by a future release is carried through rather than lost. No I/O, no clock.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from sglang_tuning_exporter.core import events as ev
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.core.redact import redact_text
from sglang_tuning_exporter.sources.grammar import Grammar
from sglang_tuning_exporter.sources.logline import (
    ANSI,
    BATCH_KEYS,
    PARTIAL,
    STD_PREFIX,
    UNPARSED,
    ParseResult,
    Unparsed,
    auto_value,
    derive_token_usage,
    make_event,
    read_pairs,
)
from sglang_tuning_exporter.sources.logmessages import (
    capacity_line,
    capture_line,
    config_off_line,
    dsv4_line,
    error_line,
    init_dist_line,
    kv_cache_line,
    load_weight_line,
    memory_pool_end_line,
    oom_line,
    prefill_graph_off_line,
    retract_line,
    server_args_line,
    summary_line,
    timings_line,
    version_line,
)
from sglang_tuning_exporter.sources.logsettings import forced_line, runtime_update_line

# ---------------------------------------------------------------------------------------------
# Handlers: each returns an Event, None (not its line) or UNPARSED (its head, unreadable body).
# ---------------------------------------------------------------------------------------------
DECODE_HEAD, PREFILL_HEAD, FILL_HEAD_V01 = "Decode batch", "Prefill batch", "new fill batch. "
_BATCH_HEAD = re.compile(r"(Decode|Prefill) batch(?: \[(\d+)\])?(?:\(mixed #running-req: (\d+)\))?[.,](?: |$)")


def _batch(s: str, n: int, g: Grammar | None) -> ParseResult:
    p = s.find(DECODE_HEAD)
    if p < 0:
        p = s.find(PREFILL_HEAD)
        if p < 0:
            p = s.find(FILL_HEAD_V01)
            return _fill_batch_v01(s, n, p) if p >= 0 else None
    m = _BATCH_HEAD.match(s, p)
    if m is None:
        return None
    kind = ev.DECODE if m.group(1) == "Decode" else ev.PREFILL
    body_at = m.end()
    mixed = m.group(3)
    if mixed is None and g is not None:
        # Fast path: a layout this reader has learnt.
        for layout in g.layouts[kind]:
            lm = layout.rx.fullmatch(s, body_at)
            if lm is not None:
                try:
                    f = layout.fields(lm.groups())
                except (ValueError, KeyError):
                    break
                if layout.extra:
                    f.update(layout.extra)
                if layout.derive_usage:
                    derive_token_usage(f)
                if m.group(2):
                    f = {"forward_iter": int(m.group(2)), **f}
                return g.event(n, kind, s[:p], f)
    fields: dict[str, Any] = {}
    if m.group(2):
        fields["forward_iter"] = int(m.group(2))
    if m.group(3):
        fields["num_running_reqs"] = int(m.group(3))
        fields["mixed_chunk"] = True
    body = s[body_at:].rstrip().rstrip(",")
    raw_keys: list[str] = []
    bad = read_pairs(body, ", ", BATCH_KEYS, fields, raw_keys)
    known = sum(1 for k in fields if k not in ("forward_iter", "mixed_chunk"))
    if not known:
        return UNPARSED
    if "token_usage" not in fields:
        derive_token_usage(fields)
    if bad:
        fields[PARTIAL] = bad
    elif mixed is None and g is not None and len(set(raw_keys)) == len(raw_keys):
        g.learn(kind, raw_keys)
    if g is not None:
        return g.event(n, kind, s[:p], fields)
    return make_event(n, kind, s[:p], fields)


def _fill_batch_v01(s: str, n: int, p: int) -> ParseResult:
    body = s[p + len(FILL_HEAD_V01):].rstrip().rstrip(".")
    fields: dict[str, Any] = {}
    bad = read_pairs(body, ". ", BATCH_KEYS, fields)
    if not fields:
        return UNPARSED
    if bad:
        fields[PARTIAL] = bad
    return make_event(n, ev.PREFILL, s[:p], fields)


def _status_v01(s: str, n: int) -> ParseResult:
    # v0.1.14 decode status line: `#running-req: 3, #token: 1442, token usage: 0.18, #queue-req: 0`
    p = s.find("#running-req: ")
    if p < 0 or "#queue-req" not in s:
        return None
    fields: dict[str, Any] = {}
    bad = read_pairs(s[p:].rstrip().rstrip(","), ", ", BATCH_KEYS, fields)
    if "num_running_reqs" not in fields:
        return UNPARSED
    if bad:
        fields[PARTIAL] = bad
    return make_event(n, ev.DECODE, s[:p], fields)


def declared_reader(spec: ev.KindSpec) -> Callable[[str, int], ParseResult]:
    """The handler of a kind declared with a pattern (core/events.KindSpec): its named groups are the fields
    (numbers as numbers), the text before the match the prefix."""
    rx, kind = re.compile(spec.pattern or ""), spec.name

    def read(s: str, n: int) -> ParseResult:
        m = rx.search(s)
        if m is None:
            return None
        return make_event(n, kind, s[:m.start()],
                          {k: auto_value(v) for k, v in m.groupdict().items() if v is not None})

    return read


# Cheap substring gates, tried in order; each handler re-checks its own head precisely. The kinds declared
# with a pattern come first: their expression is the whole rule.
_DISPATCH: tuple[tuple[str, Callable[[str, int], ParseResult]], ...] = (
    *((spec.gate, declared_reader(spec)) for spec in ev.SPECS.values() if spec.pattern is not None),
    ("etract", retract_line),
    ("#running-req", _status_v01),
    ("emory", oom_line),
    ("OOM", oom_line),
    ("aborted request ", oom_line),
    ("Memory pool end", memory_pool_end_line),
    ("Load weight", load_weight_line),
    # Post-capture cuts and graph gaps before the generic `Post-capture KV sizing:` startup line.
    ("Post-capture KV sizing: max_running_requests", summary_line),
    ("Post-capture KV sizing: decode CUDA graph", capacity_line),
    ("KV ", kv_cache_line),
    ("Capture ", capture_line),
    ("prefill CUDA graph", prefill_graph_off_line),
    ("draft cuda graph because", prefill_graph_off_line),
    ("isabled ", config_off_line),
    ("max_", summary_line),
    ("Config updated via", runtime_update_line),
    ("server args updated", runtime_update_line),
    ("Updating ", runtime_update_line),
    ("Max running requests", summary_line),
    ("KV pool holds", capacity_line),
    ("Mamba Cache", capacity_line),
    ("sliding window memory pool", capacity_line),
    ("isabled", forced_line),
    ("adjusted", forced_line),
    ("Rounding --chunked", forced_line),
    ("without radix", forced_line),
    ("disabling radix", forced_line),
    ("--chunked-prefill-size -1", forced_line),
    ("turn off --chunked", forced_line),
    ("forced as chunk cache", forced_line),
    ("SWA ring: ", forced_line),
    ("Expanding multimodal decode CUDA graph", forced_line),
    ("server_args", server_args_line),
    ("xception", error_line),
    ("Traceback", error_line),
    ("sigquit", error_line),
    ("DSv4", dsv4_line),
    ("DSV4", dsv4_line),
    ("torch distributed", init_dist_line),
    ("startup timings", timings_line),
    ("sglang", version_line),
    ("SGLang", version_line),
)


# A line with SGLang's own prefix that speaks of capacity (CAPACITY_WORDS) and that no rule reads is counted
# as unparsed, never dropped silently: a message a new release added shows in `parse --stats`, diagnose and
# the sidecar's unparsed counter. UNREAD_MARKERS are the substrings such a line holds (the C reader hands
# every line holding one back to Python); the words are the release audit's filter (scripts/audit_release.py).
UNREAD_MARKERS = ("isabled", "apped", "educed", "reset to", "unning request", "unning_request", "amba", "hunked",
                  "liding window", "ontext length", "ontext-length", "ontext_length", "ontext override", " pool")
CAPACITY_WORDS = re.compile(
    r"(?i)max[_ -]running[_ -]requests|max_total_num_tokens|chunked[_ -]prefill|out of memory|\bretract"
    r"|mem[_-]fraction|(?:memory|token|kv|state|mamba|swa) pool|kv cache (?:is|pool|capacity|size)|mamba[_ ](?:cache|state)"
    r"|state cache|sliding window memory|pool sizes?\b|context[_ -]length|\bcapped\b|\breduced\b|\breset to\b"
    r"|cuda[ _-]graph.{0,40}disabl|disabl.{0,40}cuda[ _-]graph|radix cache.{0,30}disabl|context override")


def dispatch_markers() -> tuple[str, ...]:
    """Substrings of which a line must hold one for _parse_clean to return anything (the batch heads,
    every dispatch gate and UNREAD_MARKERS): the C accelerator skips lines holding none of them."""
    return (DECODE_HEAD, PREFILL_HEAD, FILL_HEAD_V01, *(marker for marker, _ in _DISPATCH), *UNREAD_MARKERS)


def _unread(s: str) -> ParseResult:
    """UNPARSED for a line of SGLang's own prefix that speaks of capacity; None for other chatter."""
    if not any(marker in s for marker in UNREAD_MARKERS):  # the cheap test first: most chatter stops here
        return None
    m = STD_PREFIX.match(s)
    if m is None or CAPACITY_WORDS.search(s, m.end()) is None:
        return None
    return UNPARSED


def _parse_clean(s: str, n: int, g: Grammar | None = None) -> ParseResult:
    if "batch" in s:
        r = _batch(s, n, g)
        if r is not None:
            return r
    if "HTTP/1." in s:
        return None  # uvicorn access line: the commonest line in a busy log, never an event
    for marker, handler in _DISPATCH:
        if marker in s:
            r = handler(s, n)
            if r is not None:
                return r
    return _unread(s) if s[:1] == "[" else None


_NOTHING: Final[tuple[ParseResult, bool]] = (None, False)


def parse_any(text: str, line_no: int, grammar: Grammar | None = None) -> tuple[ParseResult, bool]:
    """Like parse_line, but also says UNPARSED (recognised head, unreadable body) and whether the
    event came from a line with malformed pieces (truncated or mangled: counted, still used)."""
    if "HTTP/1." in text and "\r" not in text:
        return _NOTHING  # uvicorn access line: rejected before any other work
    try:
        s = text[:-1] if text[-1:] == "\n" else text
        if "\x1b" in s:
            s = ANSI.sub("", s)
        if "\r" in s:
            # Progress bars redraw with \r: the record is the last fragment that holds one.
            r: ParseResult = None
            for seg in reversed(s.split("\r")):
                r = _parse_clean(seg, line_no, grammar)
                if r is not None:
                    break
        else:
            r = _parse_clean(s, line_no, grammar)
    except Exception:  # never let one odd line stop a reader
        return UNPARSED, False
    if r.__class__ is Event and PARTIAL in r.fields:
        del r.fields[PARTIAL]
        return r, True
    return r, False


# A startup summary glued after another message (a paste that lost a newline):
# `... avail mem=6.95 GB max_total_num_tokens=2980168, ...`. Only after a character that ends a value
# (never `]` or `: `, which end a prefix: there the summary is the line's one message).
_GLUED_SUMMARY = re.compile(r"[A-Za-z0-9.)] ?(?=max_total_num_tokens?=)")
GLUE_GATE = "max_total_num_token"  # substring every glued line holds (a cheap test before glue_point)


def glue_point(text: str) -> int:
    """Where a second message glued onto the line starts, or -1 (see _GLUED_SUMMARY)."""
    m = _GLUED_SUMMARY.search(text)
    if m is None or not text[:m.start()].strip():
        return -1
    return m.end()


def parse_line(text: str, line_no: int, grammar: Grammar | None = None) -> Event | None:
    """One log line -> the Event it carries, or None. Pure; never raises. Without a grammar nothing is
    learnt or remembered; a reader passes its own (faster, same result)."""
    r = parse_any(text, line_no, grammar)[0]
    return r if isinstance(r, Event) else None


# ---------------------------------------------------------------------------------------------
# Statistics.
# ---------------------------------------------------------------------------------------------
@dataclass
class ParseStats:
    """Counts kept while classifying lines: by kind, unparsed (with examples), partial."""

    lines: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    unparsed: int = 0
    implausible_times: int = 0  # stamps taken at a neighbour's time (core/timeparse.LogClock)
    partial: int = 0
    truncated: int = 0
    unparsed_examples: list[tuple[int, str]] = field(default_factory=list)
    max_examples: int = 20

    def note_unparsed(self, line_no: int, text: str) -> None:
        """Count a line with a recognised head and an unreadable body; keep the first few as examples."""
        self.unparsed += 1
        if len(self.unparsed_examples) < self.max_examples:
            # Redacted before the cut: a cut could split a credential the rule would no longer see.
            self.unparsed_examples.append((line_no, redact_text(text.rstrip("\n"))[:300]))

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        return {"lines": self.lines, "events": sum(self.by_kind.values()), "by_kind": dict(sorted(self.by_kind.items())),
                "unparsed": self.unparsed, "implausible_times": self.implausible_times, "partial": self.partial, "truncated": self.truncated,
                "unparsed_examples": [{"line": n, "text": t} for n, t in self.unparsed_examples]}


class LineClassifier:
    """parse_line plus statistics: what was recognised, what carried a head but could not be read.
    Owns the grammar it learns from its lines (a classifier's, never shared)."""

    def __init__(self) -> None:
        self.stats = ParseStats()
        self.grammar = Grammar()

    def classify(self, text: str, line_no: int) -> Event | None:
        """Parse one line and count the outcome."""
        st = self.stats
        st.lines += 1
        r, partial = parse_any(text, line_no, self.grammar)
        if r is None:
            return None
        if isinstance(r, Unparsed):
            st.note_unparsed(line_no, text)
            return None
        if partial:
            st.partial += 1
        st.by_kind[r.kind] += 1
        return r

    def count(self, event: Event) -> None:
        """Count an event produced outside classify (e.g. a traceback finished by the reader)."""
        self.stats.by_kind[event.kind] += 1


def capture_event(e: Event) -> Event | None:
    """The `cuda_graph_capture` companion of a capture line that lists its batch sizes."""
    sizes = e.fields.get("batch_sizes")
    if e.kind != ev.STARTUP_MEMORY or not isinstance(sizes, list) or not sizes:
        return None
    graph = str(e.fields.get("graph", "")).lower()
    if str(e.fields.get("stage", "")).startswith("prefill_graph") or "draft" in graph or "verify" in graph:
        return None  # only the target model's decode graph bounds `cuda graph: True` on Decode lines
    fields: dict[str, Any] = {"batch_sizes": sizes, "max_bs": max(sizes)}
    if "graph" in e.fields:
        fields["graph"] = e.fields["graph"]
    return Event(e.line, ev.CUDA_GRAPH_CAPTURE, e.time, dict(e.rank), fields)
