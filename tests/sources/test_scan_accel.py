"""The C accelerator (`_scan`) against the pure-Python reader it stands in for.

Per line the contract is: skip only what the Python parser turns into nothing, emit exactly the
Event parse_line returns, or hand the line back. Over whole inputs: the reader with and without the
accelerator gives the same events, line numbers and statistics (corpus, fixtures, generated logs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.examples import examples
from helpers.mixed_logs import POOL, mixed_log
from helpers.paths import FIXTURES
from sglang_tuning_exporter.core import events as ev
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.sources import accel, logreader
from sglang_tuning_exporter.sources.logfiles import read_file_events
from sglang_tuning_exporter.sources.logline import BATCH_KEYS, to_bool, to_ratio
from sglang_tuning_exporter.sources.logparse import parse_any, parse_line
from sglang_tuning_exporter.sources.logreader import EventReader

SCAN = accel.SCAN
needs_scan = pytest.mark.skipif(SCAN is None, reason="the C accelerator is not built here (no compiler at "
                                                      "install time) or SGLANG_TUNING_PURE_PYTHON is set")


def one(line: str, n: int = 7) -> tuple[str, Event | None]:
    """What the accelerator does with one line: ('skip'|'emit'|'stop', event)."""
    assert SCAN is not None
    out: list[Event] = []
    stop, _, nd, np_, nr = SCAN.scan_buffer(line.encode("utf-8", "surrogatepass") + b"\n", 0, n, out)
    if stop == 0:
        assert not out
        return "stop", None
    if out:
        assert len(out) == 1 and nd + np_ + nr == 1
        return "emit", out[0]
    return "skip", None


def holds_contract(line: str, n: int = 7) -> str:
    """Check the per-line contract against the pure-Python parser; returns the outcome."""
    what, e = one(line, n)
    if what == "emit":
        want = parse_line(line, n)
        assert e == want, line
        kinds = {k: k for k in (ev.DECODE, ev.PREFILL, ev.RETRACT)}
        assert e is not None and e.kind is kinds[e.kind]  # the parser's own constants: callers test with `is`
        assert e.to_json_dict() == want.to_json_dict()  # type: ignore[union-attr]
    elif what == "skip":
        assert "HTTP/1." in line or parse_any(line, n)[0] is None, line
    return what


def read_both(data: bytes, tmp_path: Path, block: int = 4096) -> None:
    """The reader over bytes (read_file_events) and over str lines (feed_lines), accelerated and not."""
    path = tmp_path / "x.log"
    path.write_bytes(data)
    results = []
    for scan in (SCAN, None):
        saved = logreader.SCAN
        logreader.SCAN = scan
        try:
            r1 = EventReader()
            by_bytes = [e.to_json_dict() for e in read_file_events(str(path), reader=r1, block_bytes=block)]
            r2 = EventReader()
            text = data.decode("utf-8", "replace")
            lines = text.split("\n")
            if text.endswith("\n"):
                lines.pop()
            by_lines = [e.to_json_dict() for e in r2.feed_lines(lines) + r2.flush()]
        finally:
            logreader.SCAN = saved
        results.append((by_bytes, r1.stats.as_dict(), by_lines, r2.stats.as_dict()))
    assert results[0] == results[1]


# --- real logs ----------------------------------------------------------------------------------
@needs_scan
def test_reader_with_and_without_accelerator_on_project_fixtures(tmp_path: Path) -> None:
    """Every carried log excerpt: identical events and statistics, bytes and str entries."""
    logs = sorted((FIXTURES / "logs").glob("*.log"))
    assert len(logs) >= 15
    for path in logs:
        read_both(path.read_bytes(), tmp_path, block=1024)


@needs_scan
def test_reader_with_and_without_accelerator_on_shared_corpus(shared_dir: Path, tmp_path: Path) -> None:
    """The shared corpus and the 45 releases' rendered lines."""
    paths = sorted((shared_dir / "corpus" / "logs").glob("*.log"))
    paths.append(shared_dir / "reference" / "sglang-fixtures" / "log-lines-rendered.txt")
    emitted = 0
    for path in paths:
        read_both(path.read_bytes(), tmp_path)
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").split("\n"), 1):
            emitted += holds_contract(line, n) == "emit"
    assert emitted > 100  # the accelerator really reads real lines, not only declines them


@needs_scan
def test_accelerator_reads_the_common_lines_itself() -> None:
    """The lines it exists for are emitted or skipped in C, never handed back."""
    decode = POOL[0].replace("{r}", "2")
    prefill = POOL[2].replace("{r}", "0")
    assert holds_contract(decode) == "emit"
    assert holds_contract(prefill) == "emit"
    assert holds_contract(POOL[12]) == "skip"  # access line
    assert holds_contract(POOL[8].replace("{r}", "1")) == "emit"  # `Decode batch [N],`
    assert holds_contract("[2025-11-22 23:24:43 DP1] Cache flushed successfully!") == "skip"
    for i in (13, 16, 20, 24, 25, 30):  # access line, stray continuation lines, chatter
        assert holds_contract(POOL[i].replace("{r}", "1")) == "skip", POOL[i]
    # Lines for the general parser: other heads, odd values, other prefixes, colours, progress bars.
    assert holds_contract(POOL[14].replace("{r}", "1")) == "emit"  # SGLang's retraction line
    for i in (3, 5, 6, 7, 9, 10, 11, 15, 18, 21, 22, 23, 26, 27, 29, 31, 32):
        assert holds_contract(POOL[i].replace("{r}", "1")) == "stop", POOL[i]
    # The buffer and bucket scanners read them to the end themselves (a scanner handing every line back
    # to Python would pass every with/without comparison).
    assert SCAN is not None
    retract = POOL[14].replace("{r}", "1")
    data = "\n".join((decode, POOL[12], prefill, retract)).encode() + b"\n"
    out: list[Event] = []
    stop, line, nd, np_, nr = SCAN.scan_buffer(data, 0, 1, out)
    assert (stop, line, nd, np_, nr) == (len(data), 5, 1, 1, 1)
    assert out == [parse_line(decode, 1), parse_line(prefill, 3), parse_line(retract, 4)]
    groups: tuple[dict[object, object], dict[object, object]] = ({}, {})
    out = []
    stop, line, nd, np_, nr, last_t = SCAN.scan_buckets(data, 0, 1, out, groups[0], groups[1], 600.0, 0.9, 100.0,
                                                        2000.0)
    assert (stop, line, nd, np_, nr) == (len(data), 5, 1, 1, 1) and last_t is not None
    assert len(groups[0]) == len(groups[1]) == 1 and out == [parse_line(retract, 4)]  # batch lines summed


# --- generated lines ----------------------------------------------------------------------------
_NUMBERISH = st.one_of(
    st.integers(-10**20, 10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(0, 25).flatmap(lambda p: st.decimals(allow_nan=False, allow_infinity=False, places=p)).map(str),
    st.from_regex(r"-?[0-9]{1,20}(\.[0-9]{0,24})?%?", fullmatch=True),
    st.sampled_from(["True", "False", "true", "", " 5", "5 ", "1e5", "nan", "inf", "+3", "0x10", "1_000", "٣"]),
)


@st.composite
def batch_line(draw: st.DrawFn) -> str:
    """Decode/Prefill lines with SGLang's prefix made of known keys, odd keys and odd values."""
    frac = draw(st.sampled_from(["", ".5", ".123456", ".1234567", "."]))
    tags = draw(st.lists(st.sampled_from(["DP0", "TP12", "EP3", "PP1", "ATTN_CP2", "MOE_DP1", "FOO1", "DP", "tp1"]),
                         max_size=4))
    prefix = f"[2025-11-22 23:24:43{frac}{''.join(' ' + t for t in tags)}] "
    head = draw(st.sampled_from(["Decode batch, ", "Prefill batch, ", "Decode batch. ", "Decode batch [42], ",
                                 "Prefill batch [x], ", "Decode batch(mixed #running-req: 3), ", "Decode batch,"]))
    keys = draw(st.lists(st.one_of(st.sampled_from(sorted(BATCH_KEYS)), st.sampled_from(["note", " #token", "x"])),
                         min_size=0, max_size=14))
    pairs = [f"{k}: {draw(_NUMBERISH)}" for k in keys]
    tail = draw(st.sampled_from(["", ", ", ",", " ", "\n", ",  ", ", , ", "\r", "\x1b[0m", "é"]))
    return prefix + head + ", ".join(pairs) + tail


_PLAIN = {int: st.from_regex(r"-?[0-9]{1,17}", fullmatch=True),
          float: st.from_regex(r"-?[0-9]{1,9}(\.[0-9]{1,9})?", fullmatch=True),
          to_bool: st.sampled_from(["True", "False"]),
          to_ratio: st.from_regex(r"[0-9]{1,3}\.[0-9]{1,4}%?", fullmatch=True)}


@st.composite
def plain_batch_line(draw: st.DrawFn) -> str:
    """Well-formed lines of known keys and plain values, in any order: what the accelerator reads."""
    frac = draw(st.sampled_from(["", ".5", ".123456"]))
    tags = draw(st.lists(st.sampled_from(["DP0", "TP12", "EP3", "PP1", "ATTN_CP2", "MOE_DP1"]), max_size=4))
    head = draw(st.sampled_from(["Decode batch, ", "Prefill batch, ", "Decode batch. ", "Prefill batch [7], "]))
    keys = draw(st.lists(st.sampled_from(sorted(BATCH_KEYS)), min_size=1, max_size=14))
    pairs = [f"{k}: {draw(_PLAIN[BATCH_KEYS[k][1]])}" for k in keys]
    tail = draw(st.sampled_from(["", ", ", ",", " ", "\n"]))
    return f"[2025-11-22 23:24:43{frac}{''.join(' ' + t for t in tags)}] " + head + ", ".join(pairs) + tail


@st.composite
def retract_line(draw: st.DrawFn) -> str:
    """Retraction lines, standard and odd (other spellings, missing or extra keys, odd ratios, tails)."""
    head = draw(st.sampled_from(["KV cache pool is full. Retract requests. ", "KV cache pool is full. Retract requests.",
                                 "Decode out of memory happened. ", "kv cache pool is full. retract requests. "]))
    keys = draw(st.lists(st.sampled_from(["#retracted_reqs", "#new_tokens_gained", "#mamba_num_gained",
                                          "#aborted_retracted_reqs", "#other"]), max_size=4))
    pairs = [f"{k}: {draw(_NUMBERISH)}" for k in keys]
    ratio = draw(st.sampled_from(["", "#new_token_ratio: 0.3811 -> 0.5127", "#new_token_ratio: 1. -> 2",
                                  "#new_token_ratio: 0.5 -> 0.6 then", "#new_token_ratio: x -> 1"]))
    body = ", ".join(pairs + ([ratio] if ratio else []))
    tail = draw(st.sampled_from(["", ", ", " ", "\n", " batch"]))
    return f"[2025-11-22 23:24:43 DP1 TP1] {head}{body}{tail}"


@needs_scan
@settings(max_examples=examples(600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(retract_line())
def test_generated_retraction_lines_hold_the_contract(line: str) -> None:
    holds_contract(line)


@needs_scan
@settings(max_examples=examples(1000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch_line())
def test_generated_odd_batch_lines_hold_the_contract(line: str) -> None:
    holds_contract(line)


@needs_scan
def test_generated_plain_batch_lines_are_read_in_c_exactly() -> None:
    """Well-formed lines: the accelerator reads (almost) all of them, each exactly as parse_line."""
    outcomes: list[str] = []

    @settings(max_examples=examples(1500), deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(plain_batch_line())
    def check(line: str) -> None:
        outcomes.append(holds_contract(line))

    check()
    # Only `%` ratios go back to Python.
    assert outcomes.count("emit") > 0.6 * len(outcomes), outcomes.count("emit")


@needs_scan
@settings(max_examples=examples(400), deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_holds_the_contract(line: str) -> None:
    holds_contract(line)


@needs_scan
@settings(max_examples=examples(800), deadline=None)
@given(st.from_regex(r"-?[0-9]{1,19}(\.[0-9]{1,23})?", fullmatch=True))
def test_decimal_values_read_exactly_as_python_float(text: str) -> None:
    """The C number reader (exact fast path, CPython's reader past 15 digits) = float() and int()."""
    line = (f"[2025-11-22 23:24:43 DP0] Decode batch, token usage: {text}, #queue-req: {text.split('.')[0]}")
    what, e = one(line)
    want = parse_line(line, 7)
    if what == "emit":
        assert e is not None and want is not None
        assert repr(e.fields["token_usage"]) == repr(want.fields["token_usage"]) == repr(float(text))
        assert e.fields["num_queue_reqs"] == int(text.split(".")[0])
    else:
        assert what == "stop" and len(text.replace("-", "").replace(".", "")) > 18


@needs_scan
@settings(max_examples=examples(200), deadline=None)
@given(st.binary(max_size=400), st.integers(0, 5))
def test_arbitrary_bytes_never_crash_the_buffer_scan(data: bytes, pos: int) -> None:
    assert SCAN is not None
    out: list[Event] = []
    stop, nxt, nd, np_, nr = SCAN.scan_buffer(data, pos, 1, out)
    assert min(pos, len(data)) <= stop <= len(data)
    assert len(out) == nd + np_ + nr and nxt >= 1


@needs_scan
@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(mixed_log(), st.sampled_from([7, 128, 4096]))
def test_generated_logs_read_identically(tmp_path: Path, data: bytes, block: int) -> None:
    read_both(data, tmp_path, block)


# --- switching it off ---------------------------------------------------------------------------
def test_accelerator_can_be_turned_off() -> None:
    """SGLANG_TUNING_PURE_PYTHON=1 runs the pure-Python reader (what a build without a compiler gets)."""
    assert accel.load(disabled=True) is None
    env = {**os.environ, accel.ENV_DISABLE: "1"}
    code = "from sglang_tuning_exporter.sources import accel, logreader; print(accel.SCAN, logreader.SCAN)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None", "None"]


@needs_scan
def test_configure_rejects_bad_tables() -> None:
    """Bad tables fail loudly at configure time, and a good configuration is restored."""
    assert SCAN is not None
    with pytest.raises(ValueError):
        SCAN.configure(Event, ("decode",), [], [], ("a", "b", "c"), (), ())
    with pytest.raises(ValueError):
        accel_keys = [("é", "x", 0, None)]
        SCAN.configure(Event, ("decode", "prefill"), accel_keys, [], ("a", "b", "c"),
                       ("p", "q", "r", "s"), ("dp", "pp", "tp", "ep", "attn_cp", "moe_dp"))
    with pytest.raises(RuntimeError):
        SCAN.scan_buffer(b"x\n", 0, 1, [])
    accel.configure(SCAN)
    assert holds_contract(POOL[1].replace("{r}", "0")) == "emit"


def test_a_stale_build_falls_back_to_python_and_says_so(monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """A `_scan` built from another version of _scan.c (an entry point missing, or a configure taking
    other arguments) is not used: the reader runs pure Python and a warning says to rebuild."""
    if accel.SCAN is None:
        pytest.skip("the C accelerator is not built (or SGLANG_TUNING_PURE_PYTHON is set)")
    from sglang_tuning_exporter.sources import _scan

    def old_configure(*args: object) -> None:
        raise TypeError("configure() takes 6 positional arguments but 7 were given")

    with caplog.at_level("WARNING", logger="sglang_tuning_exporter.sources.accel"):
        monkeypatch.setattr(_scan, "configure", old_configure)
        assert accel.load(disabled=False) is None
        monkeypatch.undo()
        monkeypatch.delattr(_scan, "scan_buckets")
        assert accel.load(disabled=False) is None
    assert [r.getMessage().count("rebuild") for r in caplog.records] == [1, 1], caplog.text
    assert "7 were given" in caplog.records[0].getMessage() and "no scan_buckets" in caplog.records[1].getMessage()
    monkeypatch.undo()
    assert accel.load(disabled=False) is _scan  # the current build is taken again


def test_a_build_from_another_source_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A `_scan` whose entry points all exist but was built before _scan.c changed (a scan_buckets taking 15
    arguments where the reader now hands 17: a TypeError on the first block) is refused by the digest
    setup.py builds into it, and the warning says to rebuild."""
    if accel.SCAN is None:
        pytest.skip("the C accelerator is not built (or SGLANG_TUNING_PURE_PYTHON is set)")
    from sglang_tuning_exporter.sources import _scan

    assert accel.source_digest() == _scan.SOURCE  # setup.py built the digest of this very source in
    with caplog.at_level("WARNING", logger="sglang_tuning_exporter.sources.accel"):
        monkeypatch.setattr(_scan, "SOURCE", "0123456789abcdef")
        assert accel.load(disabled=False) is None
    assert "0123456789abcdef" in caplog.text and "rebuild" in caplog.text
