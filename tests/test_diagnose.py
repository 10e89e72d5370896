"""The `diagnose` command: formats, exit codes, bad input, parallel chunks, the corpus."""

from __future__ import annotations

import gzip
import io
import itertools
import json
import re
import sys
from pathlib import Path

import pytest

from scenario_logs import LogWriter, steady
from sglang_tuning_exporter import diagnose
from sglang_tuning_exporter.checks import load_table
from sglang_tuning_exporter.cli import build_parser
from sglang_tuning_exporter.config import Config
from sglang_tuning_exporter.diagnose import Progress, diagnose_source, split_points

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "diagnose"
GOLDEN = Path(__file__).resolve().parent / "golden"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class TTY(io.StringIO):
    """A text stream that says it is a terminal."""

    def isatty(self) -> bool:
        """Pretend to be a terminal."""
        return True


def run(argv: list[str], stdout: io.StringIO | None = None) -> tuple[int, str, str]:
    """Run `diagnose ARGV`; (exit status, stdout, stderr)."""
    parser, _ = build_parser()
    args = parser.parse_args(["diagnose", *argv])
    out = stdout if stdout is not None else io.StringIO()
    err = io.StringIO()
    code = diagnose.run(args, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def retracting_log(tmp_path: Path, name: str = "r.log") -> Path:
    """0.5.23 log with 10 retractions a minute (critical) and a model name needing escaping."""
    w = LogWriter("0.5.23").server_args(schedule_conservativeness=1.0, served_model_name="<script>x</script>")
    for i in range(360):
        w.decode(300, 0.99, 150)
        if i % 3 == 0:
            w.retract(1)
        w.tick(2)
    p = tmp_path / name
    p.write_text(w.text(), encoding="utf-8")
    return p


def kv_log(tmp_path: Path) -> Path:
    """A log whose only finding is a warning (kv_underused)."""
    w = LogWriter("0.5.23").server_args(schedule_conservativeness=1.0, enable_metrics=True, schedule_policy="fcfs")
    steady(w, 12, running=120, usage=0.55, queue=150)
    p = tmp_path / "kv.log"
    p.write_text(w.text(), encoding="utf-8")
    return p


def test_text_output_table_and_flag_change(tmp_path: Path) -> None:
    """A table of checks, then each finding with evidence and the exact flag change; no colour off a TTY."""
    code, out, _ = run([str(retracting_log(tmp_path))])
    assert code == 0
    assert "CHECK" in out and "retractions_frequent" in out
    assert "increase --schedule-conservativeness: 1 -> 1.3" in out
    assert "evidence:" in out and "trade-off:" in out
    assert not ANSI.search(out)


def test_colour_only_on_a_terminal(tmp_path: Path) -> None:
    """Status colours when stdout is a TTY (or --color always)."""
    code, out, _ = run([str(retracting_log(tmp_path))], stdout=TTY())
    assert code == 0 and ANSI.search(out)
    _, out, _ = run([str(retracting_log(tmp_path)), "--color", "never"], stdout=TTY())
    assert not ANSI.search(out)


def test_json_schema_single_and_multiple(tmp_path: Path) -> None:
    """One file: the interfaces.md document; several: {"sources": [...]}."""
    a = retracting_log(tmp_path, "a.log")
    code, out, _ = run([str(a), "--format", "json"])
    doc = json.loads(out)
    assert code == 0 and doc["profile"] == "docs-2025" and doc["workload"] == "throughput"
    assert doc["server"]["args"]["schedule_conservativeness"] == 1.0
    assert set(doc["window"]) == {"start", "end"} and doc["window"]["start"].startswith("2025-03-01T10:00")
    f = next(x for x in doc["findings"] if x["check"] == "retractions_frequent")
    assert (f["status"], f["flag"], f["action"], f["current"], f["suggested"]) == \
        ("critical", "--schedule-conservativeness", "increase", 1.0, 1.3)
    assert "retractions_per_minute" in doc["signals"]
    code, out, _ = run([str(a), str(kv_log(tmp_path)), "--format", "json"])
    both = json.loads(out)
    assert code == 0 and len(both["sources"]) == 2 and both["status"] == "critical"


def test_markdown_output(tmp_path: Path) -> None:
    """Markdown: a table and one section per finding, HTML from the log escaped."""
    code, out, _ = run([str(retracting_log(tmp_path)), "--format", "markdown"])
    assert code == 0 and "| `retractions_frequent` | **critical** |" in out
    assert "### CRITICAL: `retractions_frequent`" in out


def test_html_is_self_contained_and_escaped(tmp_path: Path) -> None:
    """One page: no external assets, no script, everything escaped, inline SVG charts."""
    code, out, _ = run([str(retracting_log(tmp_path)), "--format", "html"])
    assert code == 0 and out.startswith("<!DOCTYPE html>")
    assert "<script" not in out and "&lt;script&gt;" in out
    assert not re.search(r"(src|href)=", out)
    assert out.count("<svg") >= 3 and "<polyline" in out


def test_fail_on_levels(tmp_path: Path) -> None:
    """--fail-on: exit 3 at or above the level; a warning does not fail --fail-on critical."""
    assert run([str(retracting_log(tmp_path)), "--fail-on", "critical"])[0] == 3
    kv = str(kv_log(tmp_path))
    assert run([kv, "--fail-on", "warning"])[0] == 3
    assert run([kv, "--fail-on", "critical"])[0] == 0


@pytest.mark.parametrize(("content", "message"), [
    (b"", "empty input"),
    (b"hello\nworld\n", "no SGLang log lines"),
    (b"\x00\x01\x02binary\x00" * 100, "binary data"),
])
def test_bad_input_is_a_clear_message(tmp_path: Path, content: bytes, message: str) -> None:
    """Empty, non-SGLang and binary files: exit 1 with a message, no traceback."""
    p = tmp_path / "bad.log"
    p.write_bytes(content)
    code, out, err = run([str(p)])
    assert code == 1 and message in err and "Traceback" not in err + out


def test_missing_file_and_directory(tmp_path: Path) -> None:
    """A missing path or a directory: exit 1 with the path named."""
    code, _, err = run([str(tmp_path / "nope.log")])
    assert code == 1 and "no such file" in err
    code, _, err = run([str(tmp_path)])
    assert code == 1 and "is a directory" in err


def test_truncated_gzip(tmp_path: Path) -> None:
    """A .gz cut short: exit 1, read failure named."""
    data = gzip.compress(retracting_log(tmp_path).read_bytes())
    p = tmp_path / "cut.log.gz"
    p.write_bytes(data[: len(data) // 2])
    code, _, err = run([str(p)])
    assert code == 1 and "cut.log.gz" in err and "Traceback" not in err


def test_gzip_and_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A .gz file and `-` (stdin) give the same verdict as the plain file."""
    plain = retracting_log(tmp_path)
    gz = tmp_path / "r.log.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    code, out, _ = run([str(gz), "--format", "json"])
    assert code == 0 and json.loads(out)["status"] == "critical"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(plain.read_bytes()))))
    code, out, _ = run(["-", "--format", "json"])
    assert code == 0 and json.loads(out)["status"] == "critical"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(gz.read_bytes()))))
    code, out, _ = run(["-", "--format", "json"])
    assert code == 0 and json.loads(out)["status"] == "critical"


def test_config_errors_exit_2(tmp_path: Path) -> None:
    """A bad --config or unknown profile: exit 2, every problem listed."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("window_s: -5\nbogus: 1\n", encoding="utf-8")
    code, _, err = run([str(retracting_log(tmp_path)), "--config", str(cfg)])
    assert code == 2 and "window_s" in err and "bogus" in err
    code, _, err = run([str(retracting_log(tmp_path)), "--guide-profile", "v99"])
    assert code == 2 and "unknown profile" in err
    code, _, err = run([str(retracting_log(tmp_path)), "--server-arg", "novalue"])
    assert code == 2 and "KEY=VALUE" in err


def test_log_without_timestamps_says_so(tmp_path: Path) -> None:
    """A log with no timestamps is timed by line order, and the output says so."""
    w = LogWriter("0.2.13")
    for _ in range(30):
        w.decode(100, 0.5, 0, graph=None)
    p = tmp_path / "v02.log"
    p.write_text(w.text(), encoding="utf-8")
    code, out, _ = run([str(p)])
    assert code == 0 and "line order" in out


def test_parallel_chunks_match_sequential(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Split at line boundaries into chunks scanned by a pool: same findings and signals as one pass."""
    w = LogWriter("0.5.23", tp_size=2).server_args(schedule_conservativeness=1.0)
    w.startup(max_running=512, capture_bs=[1, 2, 4, 8, 16, 32, 64, 128, 160], dp=0, tp=0)
    for i in range(3000):
        for dp in range(2):
            w.decode(100 + (i % 200), 0.5 + (i % 50) / 100, i % 300, graph=(i % 200) < 160, dp=dp, tp=dp)
        if i % 7 == 0:
            w.prefill(4000, 1000, 0.9, 100, 50, dp=0, tp=0)
        if i % 40 == 0:
            w.retract(1, dp=1, tp=1)
        if i % 50 == 0:
            w.access()
        w.tick(1)
    p = tmp_path / "big.log"
    p.write_text(w.text(), encoding="utf-8")
    table = load_table()
    seq = diagnose_source(str(p), table, Config(), "docs-2025", "throughput", {}, jobs=1)
    monkeypatch.setattr(diagnose, "PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr(diagnose, "CHUNK_BYTES", 64 << 10)
    par = diagnose_source(str(p), table, Config(), "docs-2025", "throughput", {}, jobs=2)
    assert seq.error is None and par.error is None
    assert par.document["signals"] == seq.document["signals"]
    assert par.document["findings"] == seq.document["findings"]
    assert par.lines == seq.lines == len(w.lines)


def test_split_points_cover_the_file_at_line_starts(tmp_path: Path) -> None:
    """Ranges are contiguous, cover every byte and start at line starts."""
    p = tmp_path / "x.log"
    data = b"".join(b"[2025-01-01 00:00:00] line %d\n  continuation\n" % i for i in range(5000))
    p.write_bytes(data)
    ranges = split_points(str(p), len(data), 10_000)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    assert all(data[s:s + 1] == b"[" for s, _ in ranges)


def test_progress_only_on_a_terminal() -> None:
    """The bar draws on a TTY and stays silent otherwise."""
    tty, plain = TTY(), io.StringIO()
    Progress(100, "x", tty, True).update(50)
    Progress(100, "x", plain, False).update(50)
    assert "50.0%" in tty.getvalue() and plain.getvalue() == ""


def test_golden_text_for_a_real_startup_excerpt(update_golden: bool) -> None:
    """A real 0.5.18 startup tail (corpus 037): the text report is stable."""
    code, out, _ = run([str(FIXTURES / "037-peakkv-repo-v0518-startup-tail-progressbar.log")])
    assert code == 0
    out = out.replace(str(FIXTURES), "FIXTURES")
    golden = GOLDEN / "diagnose-037.txt"
    if update_golden:
        golden.write_text(out, encoding="utf-8")
    assert out == golden.read_text(encoding="utf-8")


def test_real_retraction_burst_on_tp16(tmp_path: Path) -> None:
    """Corpus 003: `Decode out of memory happened.` on many TP ranks of one replica counts once per event."""
    code, out, _ = run([str(FIXTURES / "003-sglang4184-decode-oom-retract-tp16-dsr1.log"), "--format", "json"])
    doc = json.loads(out)
    f = next(x for x in doc["findings"] if x["check"] == "retractions_frequent")
    assert code == 0 and f["status"] in ("warning", "critical") and f["suggested"] == 1.3


def test_every_corpus_log_diagnoses(shared_dir: Path) -> None:
    """diagnose runs without error on every real log of the shared corpus."""
    logs = sorted((shared_dir / "corpus" / "logs").glob("*.log"))
    assert logs
    for log in logs:
        code, out, err = run([str(log), "--format", "json"])
        assert code == 0, (log.name, err)
        assert json.loads(out)["findings"], log.name


def test_output_file(tmp_path: Path) -> None:
    """--output writes the report to a file and nothing to stdout; an unwritable path is exit 1."""
    target = tmp_path / "report.md"
    code, out, _ = run([str(retracting_log(tmp_path)), "--format", "markdown", "--output", str(target)])
    assert code == 0 and out == "" and "retractions_frequent" in target.read_text(encoding="utf-8")
    code, _, err = run([str(retracting_log(tmp_path)), "--output", str(tmp_path / "no" / "such" / "dir.txt")])
    assert code == 1 and "cannot write" in err
