"""`sglang-tuning-exporter parse`: JSON lines on stdout, counts on stderr, clear errors."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import paths
from sglang_tuning_exporter.cli import main

FIXTURES = paths.FIXTURES / "logs"
SAMPLE = FIXTURES / "037-peakkv-repo-v0518-startup-tail-progressbar.log"
GOLDEN = FIXTURES / "037-peakkv-repo-v0518-startup-tail-progressbar.parse.jsonl"


def test_output_matches_golden(capsys: pytest.CaptureFixture[str], update_golden: bool) -> None:
    """The JSON lines of a real 0.5.18 log match the reviewed golden file."""
    assert main(["parse", str(SAMPLE)]) == 0
    out = capsys.readouterr().out
    if update_golden:
        GOLDEN.write_text(out, encoding="utf-8")
    assert out == GOLDEN.read_text(encoding="utf-8")
    first = json.loads(out.splitlines()[0])
    assert list(first) == ["line", "kind", "time", "rank", "fields"]


def test_gzip_and_stdin_give_the_same_output(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`.gz` input and `-` read the same events as the plain file."""
    raw = SAMPLE.read_bytes()
    gz = tmp_path / "server.log.gz"
    gz.write_bytes(gzip.compress(raw))
    assert main(["parse", str(gz)]) == 0
    from_gz = capsys.readouterr().out
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw)))
    assert main(["parse", "-"]) == 0
    from_stdin = capsys.readouterr().out
    assert from_gz == from_stdin == GOLDEN.read_text(encoding="utf-8")


def test_stats_and_kind_filter(capsys: pytest.CaptureFixture[str]) -> None:
    """--kind keeps one kind; --stats writes the counts on stderr only."""
    assert main(["parse", str(SAMPLE), "--kind", "decode", "--stats"]) == 0
    cap = capsys.readouterr()
    kinds = {json.loads(line)["kind"] for line in cap.out.splitlines()}
    assert kinds == {"decode"} and len(cap.out.splitlines()) == 7
    assert "47 lines, 24 events" in cap.err and "decode=7" in cap.err and "unparsed=0" in cap.err


def test_unknown_kind_and_bad_limit_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    """A mistyped --kind exits 2 naming the known kinds (not an empty, successful output); all problems listed."""
    assert main(["parse", str(SAMPLE), "--kind", "decoded", "--max-line-bytes", "0"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and "unknown kind 'decoded'" in cap.err and "decode, prefill" in cap.err
    assert "--max-line-bytes must be positive" in cap.err
    assert main(["parse", str(SAMPLE), "--kind", "cuda_graph_capture"]) == 0


def test_every_emitted_kind_is_known(capsys: pytest.CaptureFixture[str]) -> None:
    """The kinds of a real log are all in events.KINDS, so --kind accepts every kind the parser emits."""
    from sglang_tuning_exporter.core.events import KINDS
    assert main(["parse", str(SAMPLE)]) == 0
    kinds = {json.loads(line)["kind"] for line in capsys.readouterr().out.splitlines()}
    assert kinds and kinds <= set(KINDS)


def test_unparsed_lines_are_reported_even_without_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A recognised head that cannot be read is announced on stderr, never dropped silently."""
    log = tmp_path / "x.log"
    log.write_text("[2025-01-01 00:00:00 TP0] Decode batch, nonsense\n")
    assert main(["parse", str(log)]) == 0
    cap = capsys.readouterr()
    assert cap.out == "" and "1 line(s) with a recognised head could not be parsed (first at line 1)" in cap.err


def test_missing_file_exit_1_without_traceback(tmp_path: Path) -> None:
    """A missing file: one clear line on stderr, exit status 1, no Python traceback."""
    proc = subprocess.run([sys.executable, "-m", "sglang_tuning_exporter", "parse", str(tmp_path / "nope.log")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "no such file" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_binary_input_is_refused_in_one_line(tmp_path: Path) -> None:
    """Random bytes (NULs, or mostly no UTF-8): one line saying the file is no text log, exit 1 (it
    used to print nothing and exit 0)."""
    junk = tmp_path / "junk.bin"
    junk.write_bytes(bytes(range(256)) * 64 + b"\n\x00\xff Decode batch, #running-req: \xff\n")
    noise = tmp_path / "noise.bin"
    noise.write_bytes(bytes(range(128, 256)) * 64)
    for path in (junk, noise):
        proc = subprocess.run([sys.executable, "-m", "sglang_tuning_exporter", "parse", str(path), "--stats"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.strip().count("\n") == 0 and "binary data, not a text log" in proc.stderr
        assert proc.stdout == ""


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_fifo_or_device_is_refused_at_once(tmp_path: Path) -> None:
    """A named pipe without a writer used to block for ever; a device was read for ever."""
    fifo = tmp_path / "p.log"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/zero"):
        for cmd in ("parse", "diagnose"):
            proc = subprocess.run([sys.executable, "-m", "sglang_tuning_exporter", cmd, path],
                                  capture_output=True, text=True, timeout=60)
            assert proc.returncode == 1, (cmd, path, proc.stderr)
            assert proc.stderr.strip().count("\n") == 0 and "not a log file" in proc.stderr, proc.stderr


def test_nan_printed_by_the_server_becomes_null(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`gen throughput (token/s): nan` must not produce invalid JSON (NaN)."""
    log = tmp_path / "x.log"
    log.write_text("[2025-01-01 00:00:00] Decode batch, #running-req: 1, #token: 2, token usage: 0.00, "
                   "cuda graph: True, gen throughput (token/s): nan, #queue-req: 0\n")
    assert main(["parse", str(log)]) == 0
    out = capsys.readouterr().out
    obj = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert obj["fields"]["gen_throughput"] is None and obj["fields"]["num_running_reqs"] == 1


def test_values_json_has_no_type_for_are_written_as_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`server_args=` may hold a set (ast.literal_eval): `parse` writes it as text instead of crashing."""
    log = tmp_path / "s.log"
    log.write_text("server_args=ServerArgs(model_path='m', tp_size=2, x={1, 2})\n", encoding="utf-8")
    assert main(["parse", str(log)]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    fields = json.loads(line)["fields"]
    assert fields["tp_size"] == 2 and fields["x"] == "{1, 2}"


def test_output_is_byte_identical_with_and_without_the_accelerator() -> None:
    """The docs promise the same `parse` output either way, key order included (an `npu graph:` line's
    graph_backend used to come after cuda_graph in Python and last in C)."""
    import os

    from sglang_tuning_exporter.sources import accel

    sample = FIXTURES / "021-sglkernelnpu608-ep-accept-len-npu-graph.log"
    outs = []
    for pure in ("", "1"):
        env = {**os.environ, accel.ENV_DISABLE: pure}
        proc = subprocess.run([sys.executable, "-m", "sglang_tuning_exporter", "parse", str(sample)],
                              capture_output=True, text=True, timeout=60, env=env)
        assert proc.returncode == 0, proc.stderr
        outs.append(proc.stdout)
    assert outs[0] and outs[0] == outs[1]
    assert '"cuda_graph": true, "gen_throughput": 239.06, "num_queue_reqs": 2, "graph_backend": "npu"' in outs[1]


def test_stats_count_implausible_stamps(tmp_path: Path) -> None:
    """`parse --stats` counts the stamps the evaluators take at a neighbour's time."""
    import subprocess
    import sys

    log = tmp_path / "x.log"
    line = ("] Decode batch, #running-req: 2, #token: 4, token usage: 0.50, cuda graph: True, "
            "gen throughput (token/s): 1.00, #queue-req: 0")
    log.write_text(f"[2026-01-01 10:00:00{line}\n[1970-01-01 00:00:07{line}\n[2026-01-01 10:00:02{line}\n")
    proc = subprocess.run([sys.executable, "-m", "sglang_tuning_exporter", "parse", "--stats", str(log)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "implausible_times=1" in proc.stderr, proc.stderr
