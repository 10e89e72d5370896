"""Property tests: no input, however broken, makes the parser or reader raise."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.examples import examples
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.sources import logparse
from sglang_tuning_exporter.sources.grammar import Grammar
from sglang_tuning_exporter.sources.logparse import LineClassifier, parse_line
from sglang_tuning_exporter.sources.logreader import EventReader, read_events
from sglang_tuning_exporter.sources.tail import LineSplitter

REAL = [
    "[2025-11-22 23:24:43 DP0 TP0 EP0] Decode batch, #running-req: 1024, #token: 1922048, token usage: 0.62, "
    "pre-allocated usage: 0.00, #prealloc-req: 0, #transfer-req: 0, #retracted-req: 0, cuda graph: True, "
    "gen throughput (token/s): 0.89, #queue-req: 853, ",
    "[2025-06-18 18:11:03] Prefill batch. #new-seq: 14, #new-token: 8192, #cached-token: 0, token usage: 0.92, "
    "#unbootstrapped-req: 0, #queue-req: 105, #transferring-req: 990, input throughput (token/s): 96875.08 ",
    "[2025-03-07 21:49:33 TP13] Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.1474 -> 0.1845",
    "[2025-09-11 10:26:01 TP0] max_total_num_tokens=903439, chunked_prefill_size=8192, max_prefill_tokens=16384, "
    "max_running_requests=3529, context_len=131072, available_gpu_mem=10.26 GB",
    "[2026-09-13 16:10:46] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
    "bs=[1, 2, 4, 8, 12, 16, 24], avail mem=2.04 GB",
    "server_args={'model_path': 'dummy', 'tp_size': 1, 'mem_fraction_static': 0.85}",
    "[2025-06-27 19:02:10] Scheduler hit an exception: Traceback (most recent call last):",
    "new fill batch. #seq: 1. #cached_token: 478. #new_token: 254. #remaining_req: 0. #running_req: 4. "
    "tree_cache_hit_rate: 80.81%.",
]

real_line = st.sampled_from(REAL)


@st.composite
def mangled(draw: st.DrawFn) -> str:
    """A real line, truncated, with junk spliced in."""
    line = draw(real_line)
    cut = draw(st.integers(0, len(line)))
    junk = draw(st.text(max_size=20))
    at = draw(st.integers(0, cut))
    return line[:at] + junk + line[at:cut]


@settings(max_examples=examples(400), deadline=None)
@given(st.text(max_size=400))
def test_arbitrary_text_never_raises(text: str) -> None:
    """Arbitrary unicode: parse_line returns an Event or None."""
    r = parse_line(text, 1)
    assert r is None or isinstance(r, Event)


@settings(max_examples=examples(400), deadline=None)
@given(st.one_of(st.text(max_size=300), mangled()))
def test_handlers_do_not_rely_on_the_safety_net(text: str) -> None:
    """The unguarded dispatch itself does not raise: the catch-all in parse_any hides no bug."""
    for segment in text.split("\r"):
        logparse._parse_clean(segment, 1)


@settings(max_examples=examples(400), deadline=None)
@given(mangled())
def test_truncated_and_spliced_real_lines_never_raise(line: str) -> None:
    """Every prefix of every real line (plus junk) parses or is skipped; fields keep their types."""
    c = LineClassifier()
    e = c.classify(line, 3)
    assert c.stats.lines == 1
    if e is not None:
        assert e.line == 3
        for name in ("num_running_reqs", "num_queue_reqs", "num_used_tokens", "num_retracted_reqs"):
            if name in e.fields:
                assert isinstance(e.fields[name], int)


@settings(max_examples=examples(200), deadline=None)
@given(st.binary(max_size=2000))
def test_binary_garbage_through_splitter_and_reader(data: bytes) -> None:
    """Raw bytes -> lines -> events: no exception, line numbers increase."""
    s = LineSplitter(max_line_bytes=256)
    lines = s.feed(data) + s.flush()
    last = 0
    for e in read_events(lines):
        assert e.line >= last
        last = e.line


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.one_of(real_line, mangled(), st.sampled_from(["  File \"x\", line 1, in f", "", "    x",
                                                                  "RuntimeError: Prefill out of memory."])),
                max_size=30))
def test_reader_on_mixed_streams(lines: list[str]) -> None:
    """Any mix of records and continuation lines: every event points inside the input."""
    r = EventReader()
    out: list[Event] = []
    for line in lines:
        out.extend(r.feed(line))
    out.extend(r.flush())
    assert all(1 <= e.line <= max(1, len(lines)) for e in out)


def test_shortcut_agrees_or_declines() -> None:
    """On real and mangled lines the reader's shortcut either declines or matches parse_line exactly,
    and it does take some of them (else the comparison would prove nothing)."""
    g = Grammar()
    for real in REAL * 2:
        parse_line(real, 1, g)  # teach the layouts (learnt at their second line)
    taken: list[str] = []

    @settings(max_examples=examples(300), deadline=None, database=None)
    @given(st.one_of(real_line, mangled()))
    def check(line: str) -> None:
        fast = g.fast_batch(line, 2)
        assert fast is None or fast == parse_line(line, 2)
        if fast is not None:
            taken.append(line)

    check()
    assert taken


LONG = 60_000
ADVERSARIAL = [
    "x" * LONG + " CUDA out of memory", "a." * LONG + "Error: Prefill out of memory", "x" * LONG + " hit an exception",
    "Capture " * (LONG // 8) + "graph", "x" * LONG + " KV Cache is allocated. K size: 1 GB",
    "Engine startup timings (s): " + "x" * LONG, "Decode batch, " + "#k: 1, " * (LONG // 7), "[" * LONG + " batch",
    "server_args=ServerArgs(" + "(" * LONG, "server_args={" + "'a': [" * (LONG // 6), "[2025-01-01 00:00:00 " + "TP0 " * LONG,
]


def test_long_adversarial_lines_stay_linear() -> None:
    """Complexity guard, not a benchmark: 60k-character lines built to trip regex backtracking parse in
    far less than the seconds a quadratic pattern would need (the bound is 40x a linear run)."""
    import time
    for line in ADVERSARIAL:
        t0 = time.perf_counter()
        parse_line(line, 1)
        r = EventReader()
        r.feed("Scheduler hit an exception: Traceback (most recent call last):")
        r.feed(line)
        r.flush()
        assert time.perf_counter() - t0 < 2.0, line[:40]
