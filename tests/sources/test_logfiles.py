"""Differential tests: the block reader, the batch shortcut and the parallel reader against the
general path (every line through parse_any, one at a time), on real logs and generated ones."""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.mixed_logs import POOL, mixed_log
from helpers.paths import FIXTURES
from sglang_tuning_exporter.core.events import KINDS, Event
from sglang_tuning_exporter.sources.logfiles import (
    map_file_parallel,
    may_hold_long_line,
    read_file_events,
    read_file_parallel,
    split_ranges,
)
from sglang_tuning_exporter.sources.logparse import ParseStats, parse_line
from sglang_tuning_exporter.sources.logreader import EventReader, read_events, scan_text
from sglang_tuning_exporter.sources.tail import LineSplitter, open_input


def reference(data: bytes, max_line_bytes: int = 1 << 20) -> tuple[list[Event], ParseStats]:
    """The general path: lines cut by LineSplitter, each offered to the reader's `_take` (parse_any),
    access lines skipped outside multi-line records exactly as the reader does; no shortcut."""
    split = LineSplitter(max_line_bytes)
    lines = split.feed(data) + split.flush()
    r = EventReader()
    out: list[Event] = []
    for n, line in enumerate(lines, 1):
        if r._block is None and "HTTP/1." in line:
            continue
        r._take(line, n, out)
    out.extend(r.flush())
    r.stats.lines = len(lines)
    r.stats.truncated = split.truncated
    return out, r.stats


def _same(got: list[Event], want: list[Event]) -> None:
    assert [e.to_json_dict() for e in got] == [e.to_json_dict() for e in want]
    assert got == want


def _check_file(path: Path, *, max_line_bytes: int = 1 << 20, chunk_bytes: int = 256) -> None:
    want, want_stats = reference(path.read_bytes(), max_line_bytes)
    r = EventReader()
    _same(list(read_file_events(str(path), reader=r, max_line_bytes=max_line_bytes, block_bytes=4096)), want)
    assert r.stats.as_dict() == want_stats.as_dict()
    stats = ParseStats()
    got = list(read_file_parallel(str(path), 2, stats=stats, max_line_bytes=max_line_bytes, chunk_bytes=chunk_bytes))
    _same(got, want)
    assert stats.as_dict() == want_stats.as_dict()
    # Events from the workers carry the module's own kind strings (callers test them with `is`).
    assert all(e.kind is next(k for k in KINDS if k == e.kind) for e in got)


def test_project_fixture_logs_read_identically() -> None:
    """Every carried corpus excerpt: block reader and parallel reader equal the general path."""
    logs = sorted((FIXTURES / "logs").glob("*.log"))
    assert len(logs) >= 15
    for path in logs:
        _check_file(path, chunk_bytes=1024)


def test_shared_corpus_and_rendered_release_lines_read_identically(shared_dir: Path) -> None:
    """The whole shared corpus and the 45 releases' rendered lines, through every reader."""
    paths = sorted((shared_dir / "corpus" / "logs").glob("*.log"))
    paths.append(shared_dir / "reference" / "sglang-fixtures" / "log-lines-rendered.txt")
    for path in paths:
        _check_file(path, chunk_bytes=2048)


def test_old_chunked_reader_agrees_with_the_block_reader() -> None:
    """read_events over open_input (the reader's other entry) gives the same events."""
    path = FIXTURES / "logs" / "039-gb200-scripts-pd-decode-4dp-cr-progress-noise.log"
    with open_input(str(path)) as lines:
        old = list(read_events(lines))
    _same(list(read_file_events(str(path))), old)




def _write(data: bytes) -> tuple[tempfile.TemporaryDirectory[str], Path]:
    tmp = tempfile.TemporaryDirectory()
    path = Path(tmp.name, "x.log")
    path.write_bytes(data)
    return tmp, path


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixed_log(), st.sampled_from([64, 300, 1 << 20]), st.sampled_from([7, 128, 4096]))
def test_block_reader_equals_general_path_on_generated_logs(data: bytes, max_line: int, block: int) -> None:
    """read_file_events (any block size, any line limit) = the general path, events and statistics."""
    want, want_stats = reference(data, max_line)
    tmp, path = _write(data)
    with tmp:
        r = EventReader()
        got = list(read_file_events(str(path), reader=r, max_line_bytes=max_line, block_bytes=block))
    _same(got, want)
    assert r.stats.as_dict() == want_stats.as_dict()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixed_log(min_lines=20))
def test_parallel_reader_equals_general_path_on_generated_logs(data: bytes) -> None:
    """read_file_parallel with tiny ranges: same events, order, line numbers and statistics."""
    want, want_stats = reference(data)
    tmp, path = _write(data)
    with tmp:
        assert len(split_ranges(str(path), len(data), 64)) > 1 or data.find(b"\n[2", 63) < 0
        stats = ParseStats()
        got = list(read_file_parallel(str(path), 2, stats=stats, chunk_bytes=64))
    _same(got, want)
    assert stats.as_dict() == want_stats.as_dict()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(POOL), max_size=40))
def test_scan_text_equals_line_by_line_parse(lines: list[str]) -> None:
    """scan_text over whole lines = the general path; single batch lines equal parse_line."""
    text = "\n".join(p.replace("{r}", "1") for p in lines)
    events, stats = scan_text(text)
    want, want_stats = reference(text.encode("utf-8", "surrogatepass"))
    _same(events, want)
    assert stats.as_dict() == want_stats.as_dict()
    for e in events:
        if e.kind in ("decode", "prefill") and e.fields.get("num_queue_reqs") is not None:
            line = text.split("\n")[e.line - 1]
            if "\r" not in line and "\x1b" not in line:
                assert e == parse_line(line, e.line)


def test_reraised_oom_in_the_next_range_is_linked_like_a_sequential_read() -> None:
    """An OOM logged at the end of one range and re-raised at the start of the next: one incident."""
    head = "[2025-06-27 19:02:10 TP0] Decode batch, #running-req: 1, #token: 2, token usage: 0.00, " \
           "cuda graph: True, gen throughput (token/s): 1.00, #queue-req: 0\n"
    oom = ("[2025-06-27 19:02:11 TP0] Prefill out of memory. Try to lower your batch size.\n"
           "Try to allocate 8192 tokens.\n")
    reraise = ("[2025-06-27 19:02:11 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
               '  File "/s/schedule_batch.py", line 99, in prepare_for_extend\n'
               "RuntimeError: Prefill out of memory. Try to lower your batch size.\n")
    data = (head * 40 + oom + reraise + head * 40).encode()
    cut = data.index(b"[2025-06-27 19:02:11 TP0] Scheduler")
    chunk = cut - 5  # the first range ends inside the OOM record, so the next starts at the re-raise
    tmp, path = _write(data)
    with tmp:
        assert [a for a, _ in split_ranges(str(path), len(data), chunk)][:2] == [0, cut]
        stats = ParseStats()
        got = list(read_file_parallel(str(path), 2, stats=stats, chunk_bytes=chunk))
    want, want_stats = reference(data)
    _same(got, want)
    linked = [e for e in got if e.kind == "error"]
    assert len(linked) == 1 and linked[0].fields["same_as_line"] == 41
    assert stats.as_dict() == want_stats.as_dict()


def test_split_ranges_cut_only_before_record_heads() -> None:
    """Ranges cover the file without gaps and each starts at a `[<digit>` line (or the file start)."""
    data = b"".join(b"[2025-01-01 00:00:00] line %d\n  continuation\n" % i for i in range(500))
    tmp, path = _write(data)
    with tmp:
        ranges = split_ranges(str(path), len(data), 1000)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(data) and len(ranges) > 5
    for (_, b), (a, _) in itertools.pairwise(ranges):
        assert a == b and data[a:a + 2] == b"[2" and data[a - 1:a] == b"\n"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=30), st.integers(1, 30))
def test_long_line_check_never_misses(lengths: list[int], limit: int) -> None:
    """The C-level check says True whenever a line is longer than the limit."""
    block = b"".join(b"x" * n + b"\n" for n in lengths)
    if max(lengths) > limit:
        assert may_hold_long_line(block, limit)


def test_unreadable_input_is_a_clear_error(tmp_path: Path) -> None:
    """A missing file raises InputError with the path, from both file readers."""
    from sglang_tuning_exporter.sources.tail import InputError
    with pytest.raises(InputError, match="no such file"):
        list(read_file_events(str(tmp_path / "missing.log")))
    with pytest.raises(InputError, match="no such file"):
        list(read_file_parallel(str(tmp_path / "missing.log"), 2))


def test_generated_bench_log_reads_identically(tmp_path: Path) -> None:
    """The benchmark's generated mixed log (20k lines), sequential and parallel, = the general path."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_parse", FIXTURES.parent.parent / "bench" / "bench_parse.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    path = tmp_path / "bench.log"
    bench.generate(path, 20_000)
    _check_file(path, chunk_bytes=256 << 10)


def kinds_and_lines(events: Iterator[Event]) -> list[tuple[int, str]]:
    """A reducer run in the workers (module level, so it is sent by name)."""
    return [(e.line, e.kind) for e in events]


def test_map_file_parallel_reduces_in_workers_in_file_order(tmp_path: Path) -> None:
    """Results come one per range, in file order; together they cover exactly the sequential events."""
    path = tmp_path / "x.log"
    path.write_bytes((FIXTURES / "logs" / "039-gb200-scripts-pd-decode-4dp-cr-progress-noise.log").read_bytes() * 3)
    want = [(e.line, e.kind) for e in read_file_events(str(path))]
    stats = ParseStats()
    parts = list(map_file_parallel(str(path), kinds_and_lines, 2, stats=stats, chunk_bytes=4096))
    assert len(parts) > 3
    assert [x for part in parts for x in part] == want
    assert stats.lines == path.read_bytes().count(b"\n")
