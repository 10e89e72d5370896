"""Differential tests: the block reader and the batch shortcut against the
general path (every line through parse_any, one at a time), on real logs and generated ones."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.examples import examples
from helpers.mixed_logs import POOL, mixed_log
from helpers.paths import FIXTURES
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.sources.logfiles import (
    may_hold_long_line,
    read_file_events,
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


def _check_file(path: Path, *, max_line_bytes: int = 1 << 20) -> None:
    want, want_stats = reference(path.read_bytes(), max_line_bytes)
    r = EventReader()
    _same(list(read_file_events(str(path), reader=r, max_line_bytes=max_line_bytes, block_bytes=4096)), want)
    assert r.stats.as_dict() == want_stats.as_dict()


def test_project_fixture_logs_read_identically() -> None:
    """Every carried corpus excerpt: the block reader equals the general path."""
    logs = sorted((FIXTURES / "logs").glob("*.log"))
    assert len(logs) >= 15
    for path in logs:
        _check_file(path)


def test_shared_corpus_and_rendered_release_lines_read_identically(shared_dir: Path) -> None:
    """The whole shared corpus and the 45 releases' rendered lines, through every reader."""
    paths = sorted((shared_dir / "corpus" / "logs").glob("*.log"))
    paths.append(shared_dir / "reference" / "sglang-fixtures" / "log-lines-rendered.txt")
    for path in paths:
        _check_file(path)


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


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
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


@settings(max_examples=examples(200), deadline=None)
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


def test_split_ranges_cut_only_before_record_heads() -> None:
    """Ranges cover the file without gaps and each starts at a `[<digit>` line (or the file start)."""
    data = b"".join(b"[2025-01-01 00:00:00] line %d\n  continuation\n" % i for i in range(500))
    tmp, path = _write(data)
    with tmp:
        ranges = split_ranges(str(path), len(data), 1000)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(data) and len(ranges) > 5
    for (_, b), (a, _) in itertools.pairwise(ranges):
        assert a == b and data[a:a + 2] == b"[2" and data[a - 1:a] == b"\n"


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=30), st.integers(1, 30))
def test_long_line_check_never_misses(lengths: list[int], limit: int) -> None:
    """The C-level check says True whenever a line is longer than the limit."""
    block = b"".join(b"x" * n + b"\n" for n in lengths)
    if max(lengths) > limit:
        assert may_hold_long_line(block, limit)


def test_unreadable_input_is_a_clear_error(tmp_path: Path) -> None:
    """A missing file raises InputError with the path."""
    from sglang_tuning_exporter.sources.tail import InputError
    with pytest.raises(InputError, match="no such file"):
        list(read_file_events(str(tmp_path / "missing.log")))


def test_generated_bench_log_reads_identically(tmp_path: Path) -> None:
    """The benchmark's generated mixed log (20k lines) = the general path."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_parse", FIXTURES.parent.parent / "bench" / "bench_parse.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    path = tmp_path / "bench.log"
    bench.generate(path, 20_000)
    _check_file(path)


