"""The `diagnose` command: formats, exit codes, bad input, parallel chunks, the corpus."""

from __future__ import annotations

import gzip
import io
import itertools
import json
import multiprocessing
import os
import re
import sys
from pathlib import Path

import pytest

from helpers import paths
from helpers.check_logs import ALL_LOGS
from helpers.paths import GOLDEN
from helpers.scenario_logs import LogWriter, steady
from sglang_tuning_exporter.cli import command_parser
from sglang_tuning_exporter.guide.checks import load_table
from sglang_tuning_exporter.guide.config import Config
from sglang_tuning_exporter.offline import diagnose, parallel
from sglang_tuning_exporter.offline.diagnose import Progress, diagnose_source
from sglang_tuning_exporter.sources.logfiles import split_ranges

FIXTURES = paths.FIXTURES / "diagnose"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class TTY(io.StringIO):
    """A text stream that says it is a terminal."""

    def isatty(self) -> bool:
        """Pretend to be a terminal."""
        return True


def run(argv: list[str], stdout: io.StringIO | None = None) -> tuple[int, str, str]:
    """Run `diagnose ARGV`; (exit status, stdout, stderr)."""
    parser, _ = command_parser("diagnose")
    args = parser.parse_args(argv)
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
    assert "SGLang version unknown (>= 0.5.7 by its line formats)" in out
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
    assert code == 0 and doc["profile"] == "upstream-2026" and doc["workload"] == "throughput"
    assert doc["server"]["args"]["schedule_conservativeness"] == 1.0
    # No version line: the release floor from the line formats, `version` stays a release or null.
    assert (doc["server"]["version"], doc["server"]["version_floor"]) == (None, "0.5.7")
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


def test_markdown_code_spans_are_literal(tmp_path: Path) -> None:
    """The change line is a code span, shown literally: its arrow is not HTML-escaped to &gt;."""
    code, out, _ = run([str(retracting_log(tmp_path)), "--format", "markdown"])
    change = next(line for line in out.splitlines() if line.startswith("- **Change:**"))
    assert code == 0 and "->" in change and "&gt;" not in change


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
    (b"[2026-11-28 10:00:00 TP0] max_running_requests is limited to 6 by the frobnicator pool.\nhello\n",
     "1 SGLang log line(s) in 2 lines, none of them read"),
    (b"\x00\x01\x02binary\x00" * 100, "binary data"),
    (b"\x00" * 100_000, "binary data"),
])
def test_bad_input_is_a_clear_message(tmp_path: Path, content: bytes, message: str) -> None:
    """Empty, non-SGLang and binary files: exit 1 with a message, no traceback."""
    p = tmp_path / "bad.log"
    p.write_bytes(content)
    code, out, err = run([str(p)])
    assert code == 1 and message in err and "Traceback" not in err + out


def test_nul_padded_head_after_copytruncate_is_read(tmp_path: Path) -> None:
    """A log whose head is a run of NULs (copytruncate rotation) is diagnosed, not called binary data."""
    plain = retracting_log(tmp_path)
    padded = tmp_path / "padded.log"
    padded.write_bytes(b"\x00" * 20_000 + plain.read_bytes())
    code, out, err = run([str(padded), "--format", "json"])
    assert code == 0 and "binary" not in err
    assert json.loads(out)["status"] == json.loads(run([str(plain), "--format", "json"])[1])["status"] == "critical"


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
    monkeypatch.setattr(diagnose, "MIN_CHUNK_BYTES", 1)  # else the 1 MiB floor leaves two ranges
    monkeypatch.setattr(diagnose, "CHUNK_BYTES", 64 << 10)
    assert len(split_ranges(str(p), p.stat().st_size, 64 << 10)) > 10
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
    ranges = split_ranges(str(p), len(data), 10_000)
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


def _oom_straddling_log() -> str:
    """Decode lines around a logged prefill OOM and its re-raise as a traceback of `[rank0]:` lines."""
    w = LogWriter("0.5.23").server_args(schedule_conservativeness=1.0)
    for i in range(400):
        w.decode(100 + i % 50, 0.6, 150)
        w.access()
        if i == 200:
            w.add("Prefill out of memory. Try to lower your batch size.")
            w.raw("Try to allocate 8192 tokens.\nAvaliable tokens: 100")
            w.add("Scheduler hit an exception: Traceback (most recent call last):")
            w.raw('[rank0]:   File "/sglang/srt/managers/scheduler.py", line 2336, in run_scheduler_process\n'
                  "[rank0]:     scheduler.event_loop_overlap()\n"
                  '[rank0]:   File "/sglang/srt/managers/schedule_batch.py", line 99, in prepare_for_extend\n'
                  "[rank0]:     out_cache_loc = self.alloc_token_slots(extend_num_tokens)\n"
                  "[rank0]: RuntimeError: Prefill out of memory. Try to lower your batch size.")
        w.tick(1)
    return w.text()


def test_tracebacks_are_not_cut_between_parallel_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny chunks cut before every record head, never before `[rankN]:` lines; the re-raised OOM in the next
    chunk is linked to the logged one: parallel equals sequential, one prefill OOM, not two or three."""
    p = tmp_path / "oom.log"
    p.write_text(_oom_straddling_log(), encoding="utf-8")
    table = load_table()
    seq = diagnose_source(str(p), table, Config(), "docs-2025", "throughput", {}, jobs=1)
    monkeypatch.setattr(diagnose, "PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr(diagnose, "MIN_CHUNK_BYTES", 1)
    monkeypatch.setattr(diagnose, "CHUNK_BYTES", 300)
    data = p.read_bytes()
    ranges = split_ranges(str(p), len(data), 300)
    assert len(ranges) > 50 and all(data[a:a + 2] != b"[r" for a, _ in ranges)
    par = diagnose_source(str(p), table, Config(), "docs-2025", "throughput", {}, jobs=2)
    assert seq.error is None and par.error is None
    assert par.document["signals"] == seq.document["signals"]
    assert par.document["findings"] == seq.document["findings"]
    assert (par.lines, par.events) == (seq.lines, seq.events)
    oom = next(f for f in seq.document["findings"] if f["check"] == "prefill_oom")
    assert oom["status"] == "critical" and oom["evidence"].startswith("oom_prefill_count=1 ")


def _scan_doc(text: str, *, fast: bool, cuts: list[int] | None = None, via_bytes: bool = False) -> dict[str, object]:
    """Signals, findings and line/event counts of `text` scanned line by line (fast=False: every event
    through the parent's window) or by scan_text (via_bytes: scan_bytes, the C accelerator's entry when
    built) over blocks cut after the given newlines."""
    d = diagnose.Diagnosis(load_table(), Config(), "docs-2025", "throughput", {}, fast=fast)
    sc = diagnose.Scanner(d.res, 0.9, (100.0, 2000.0), fast=fast)
    if not fast:
        d.add_chunk(sc.scan(text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")))
    elif via_bytes:
        data = text.encode("utf-8", "surrogatepass")
        nl = [m.end() for m in re.finditer(b"\n", data)]
        nth = {m.end(): k for k, m in enumerate(re.finditer("\n", text))}
        ends = [nl[nth[c]] for c in cuts or []]  # the same cuts (each after a newline), in bytes
        start = 0
        for c in ends:
            d.add_chunk(sc.scan_bytes(data[start:c], final=False))
            start = c
        d.add_chunk(sc.scan_bytes(data[start:]))
    else:
        start = 0
        for c in cuts or []:
            d.add_chunk(sc.scan_text(text[start:c], final=False))
            start = c
        d.add_chunk(sc.scan_text(text[start:]))
    doc = d.finish("x").document
    return {"signals": doc["signals"], "findings": [(f["check"], f["status"], f["suggested"], f["evidence"])
                                                     for f in doc["findings"]],
            "lines": d.lines, "events": d.events if fast else None}


def _block_logs() -> list[str]:
    """Scenario logs, the traceback log and a busy mixed log with odd lines between the batch lines (and
    without its last newline)."""
    w = LogWriter("0.5.23", tp_size=2)
    for i in range(600):
        w.access()
        w.decode(100 + i % 90, 0.5 + (i % 40) / 100, i % 300, graph=i % 5 != 0, dp=i % 2, tp=i % 2)
        if i % 3 == 0:
            w.prefill(3000, 900, 0.7, 120, i % 200, dp=i % 2, tp=i % 2)
            w.access()
        if i % 17 == 0:
            w.raw('[2025-03-01 10:00:00] INFO: 1.2.3.4:5 - "GET /x HTTP/1.1" 200 OK HTTP/1.1')  # HTTP twice
            w.retract(2)  # an event in the same gap: the access-only count must not skip it
            w.add("Cache flushed successfully!")
            w.add("Scheduler.run_batch sleep 180.0s")
        if i % 29 == 0:
            w.add("Prefill batch, #new-seq: 1, #new-token: 5, #cached-token: 0, token usage: 0.10, "
                  "#running-req: 3, #queue-req: 0 \r] Decode batch, #running-req: 7, #token: 9, token usage: "
                  "0.20, gen throughput (token/s): 3.00, #queue-req: 1")
            w.raw("] Decode batch, #running-req: 7 (no stamp)\n\x1b[32m[2025-03-01 10:00:00 TP0] Decode batch, "
                  "#running-req: 1, #token: 2, token usage: 0.30, gen throughput (token/s): 1.00, #queue-req: 5")
        if i % 41 == 0:
            w.retract(1)
        w.tick(1)
    return [make() for make in ALL_LOGS] + [_oom_straddling_log(), w.text(), w.text()[:-1], _tp_retraction_log(),
                                            _release_floor_log()]


def _release_floor_log() -> str:
    """The release is known only from a retraction line's `#new_tokens_gained` (>= 0.5.7: the default
    schedule policy, hence the fcfs-with-reuse check, depends on it), and the reuse that check needs is
    in the first windows only: however the retraction is read, the floor holds for every window."""
    w = LogWriter("0.5.23")
    for i in range(1800):
        w.decode(100, 0.6, 10, graph=None)
        if i % 5 == 0:
            w.prefill(1000, 3000 if i < 900 else 10, 0.6, 100, 10)
        if i == 3:
            w.retract(1)
        w.tick(1)
    return w.text()


def _tp_retraction_log() -> str:
    """Retractions printed by every TP rank of a replica (counted once each), two in one second with one
    value, prints without rank tags, a TP rank alone: the de-duplication diagnose's scanner does while
    summing retractions read in C must equal the window's, wherever blocks are cut."""
    w = LogWriter("0.5.23", tp_size=2)
    for i in range(300):
        w.decode(100 + i % 90, 0.6, i % 300, dp=i % 2, tp=0)
        if i % 3 == 0:
            for tp in (0, 1):
                w.retract(1 + i % 2, dp=0, tp=tp)
        if i % 5 == 0:
            for tp in (0, 1, 0, 1):
                w.retract(2, dp=1, tp=tp)
        if i % 7 == 0:
            w.retract(3)
            w.retract(1, dp=0, tp=1)
        if i % 2:
            w.tick(1)
    return w.text()


BLOCK_LOGS = _block_logs()


@pytest.mark.parametrize("text", BLOCK_LOGS, ids=[f"log{i}" for i in range(len(BLOCK_LOGS))])
def test_block_scan_agrees_with_the_full_parser(text: str) -> None:
    """The range's own intake (the accelerator's bucket sums, or without it the event reader's lines
    through the sidecar's conversion into the range's window) equals every event through the parent's
    window, whole and cut into blocks anywhere at line ends (records left open across blocks)."""
    full = {**_scan_doc(text, fast=False), "events": None}  # the accelerator sums lines it would emit
    assert {**_scan_doc(text, fast=True), "events": None} == full
    assert {**_scan_doc(text, fast=True, via_bytes=True), "events": None} == full
    for step in (7, 113):
        _assert_cut_alike(text, full, step)


@pytest.mark.slow  # every log cut at every line: two thirds of the time of the test above (make test-fast skips it)
@pytest.mark.parametrize("text", BLOCK_LOGS, ids=[f"log{i}" for i in range(len(BLOCK_LOGS))])
def test_block_scan_agrees_cut_at_every_line(text: str) -> None:
    """As above, with a block boundary after every line."""
    _assert_cut_alike(text, {**_scan_doc(text, fast=False), "events": None}, 1)


def _assert_cut_alike(text: str, full: dict[str, object], step: int) -> None:
    """The block scan of `text` cut after every `step`-th line (as text, and as bytes) equals `full`."""
    ends = [m.end() for m in re.finditer("\n", text)]
    assert {**_scan_doc(text, fast=True, cuts=ends[step - 1:-1:step]), "events": None} == full, step
    got = _scan_doc(text, fast=True, cuts=ends[step - 1:-1:step], via_bytes=True)
    assert {**got, "events": None} == full, step


def test_block_scan_on_the_corpus(shared_dir: Path) -> None:
    """The range's own intake equals every event through the parent's window on every real log of the
    shared corpus (with the accelerator and without)."""
    logs = sorted((shared_dir / "corpus" / "logs").glob("*.log"))
    assert logs
    for log in logs:
        text = log.read_text(encoding="utf-8", errors="replace")
        full = {**_scan_doc(text, fast=False), "events": None}
        assert {**_scan_doc(text, fast=True, via_bytes=True), "events": None} == full, log.name


def _decode_log(path: Path, n: int) -> tuple[Path, int]:
    """A plain Decode log of n lines at `path` (and its line count)."""
    w = LogWriter("0.5.23")
    for i in range(n):
        w.decode(100, 0.5, i % 300)
        w.tick(1)
    path.write_text(w.text(), encoding="utf-8")
    return path, len(w.lines)


def _small_ranges(monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    """Any file goes the parallel way, cut into ranges of about `chunk` bytes."""
    monkeypatch.setattr(diagnose, "PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr(diagnose, "MIN_CHUNK_BYTES", 1)
    monkeypatch.setattr(diagnose, "CHUNK_BYTES", chunk)


def _reader_dies(job: object) -> None:
    os._exit(7)  # a worker killed mid-range (e.g. SIGBUS on a mapped file truncated meanwhile)


def test_a_dead_reader_process_is_an_error_not_a_hang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The parallel path maps ranges of the file: a worker that dies gives a clear error, not a pool
    waiting for ever on its lost task."""
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("needs the fork start method (the patched worker must reach the children)")
    p, _ = _decode_log(tmp_path / "dies.log", 400)
    _small_ranges(monkeypatch, 4 << 10)
    monkeypatch.setattr(parallel, "scan_range", _reader_dies)
    got = diagnose_source(str(p), load_table(), Config(), "docs-2025", "throughput", {}, jobs=2)
    assert got.error is not None and "reader process died" in got.error and "truncated" in got.error


def test_a_file_shrunk_after_the_split_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A log truncated (rotated by copytruncate) between the split into ranges and their mapping: never
    an uncaught exception, and never a partial report given as the whole: an error naming the truncation
    (the command exits non-zero)."""
    p, _ = _decode_log(tmp_path / "shrinks.log", 2000)
    real = diagnose.split_ranges

    def split_then_truncate(path: str, size: int, chunk: int) -> list[tuple[int, int]]:
        ranges = real(path, size, chunk)
        with open(path, "r+b") as fh:
            fh.truncate(size // 2)
        return ranges

    monkeypatch.setattr(diagnose, "split_ranges", split_then_truncate)
    _small_ranges(monkeypatch, 16 << 10)
    got = diagnose_source(str(p), load_table(), Config(), "docs-2025", "throughput", {}, jobs=2)
    assert got.error is not None and "truncated while being read" in got.error


def test_a_file_truncated_during_a_sequential_read_is_an_error(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`--jobs 1`: the file cut to half after its first block was read -> an error, not exit 0."""
    p, _ = _decode_log(tmp_path / "shrinks.log", 4000)
    real = diagnose.Diagnosis.add_chunk
    cut = [False]

    def add_then_truncate(self: diagnose.Diagnosis, res: object) -> None:
        real(self, res)  # type: ignore[arg-type]
        if not cut[0]:
            cut[0] = True
            with open(p, "r+b") as fh:
                fh.truncate(p.stat().st_size // 2)

    monkeypatch.setattr(diagnose.Diagnosis, "add_chunk", add_then_truncate)
    monkeypatch.setattr(diagnose, "BLOCK_BYTES", 16 << 10)
    got = diagnose_source(str(p), load_table(), Config(), "docs-2025", "throughput", {}, jobs=1)
    assert got.error is not None and "truncated while being read" in got.error


def test_a_device_is_not_read_for_ever() -> None:
    """`diagnose /dev/zero` ends at once with an error (it used to spin for ever)."""
    code, _, err = run(["/dev/zero"])
    assert code == 1 and "a device, not a log file" in err


def test_a_cut_off_first_line_costs_what_the_data_costs(tmp_path: Path) -> None:
    """A first line whose date lost its first digit (`025-06-23 ...`, read as year 25) is taken at its
    neighbour's time: a handful of windows, not three million (the old cost of an 8-line file)."""
    line = ("Decode batch, #running-req: 200, #token: 400000, token usage: 0.95, cuda graph: True, "
            "gen throughput (token/s): 4594.01, #queue-req: 300")
    log = tmp_path / "cut.log"
    log.write_text(f"025-06-23 18:55:20 TP0] {line}\n" +
                   "".join(f"[2025-06-23 18:55:{21 + i} TP0] {line}\n" for i in range(7)), encoding="utf-8")
    res = diagnose.diagnose_source(str(log), load_table(), Config(), "upstream-2026", "throughput", {}, jobs=1)
    assert res.error is None, res.error
    assert res.evaluations <= 3, res.evaluations
    assert res.document["window"]["start"].startswith("2025-06-23"), res.document["window"]


def test_findings_of_different_windows_carry_the_plans_one_value(tmp_path: Path) -> None:
    """Issue #24: retractions fire in the first 10 min (raise --schedule-conservativeness to 1.3) and an
    underused KV cache in the next (lower it to 0.3): one value for the flag in the plan and in both
    findings, the dissenting one told to judge again after the plan's step."""
    w = LogWriter().server_args(schedule_conservativeness=1.0, max_running_requests=4096).startup()
    for i in range(300):
        w.decode(200, 0.99, 400)
        if i % 4 == 0:
            w.retract(3)
        w.tick(2.0)
    steady(w, 10, running=200, usage=0.5, queue=400)
    log = tmp_path / "two.log"
    log.write_text(w.text(), encoding="utf-8")
    code, out, err = run([str(log), "--format", "json", "--jobs", "1"])
    assert code == 0, err
    doc = json.loads(out)
    fired = {f["check"]: f for f in doc["findings"] if f["status"] in ("warning", "critical")}
    assert {"retractions_frequent", "kv_underused"} <= set(fired)
    step = next(s for s in doc["plan"] if s["flag"] == "--schedule-conservativeness")
    assert step["to"] == 1.3
    assert fired["retractions_frequent"]["suggested"] == fired["kv_underused"]["suggested"] == 1.3
    assert "judge it again" in fired["kv_underused"]["evidence"]


def test_a_start_in_an_earlier_chunk_reaches_a_frameless_oom_in_a_later_one(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The start (`server_args=`, `Load weight`) in one parallel range, a frameless CUDA OOM before any batch in
    a later one: that range is scanned again knowing the start, so parallel equals sequential (a start-up
    headroom failure sized from torch's figures, not an OOM of unknown phase)."""
    lines = ["[2026-01-01 10:00:00] server_args={'model_path': 'm', 'mem_fraction_static': 0.9}",
             "[2026-01-01 10:00:00] Load weight begin. avail mem=139.80 GB"]
    lines += [f'[2026-01-01 10:00:01] INFO:     10.0.0.1:4000 - "GET /health HTTP/1.1" 200 OK {i}' for i in range(40)]
    lines.append("[2026-01-01 10:00:02 TP0] Scheduler hit an exception: torch.OutOfMemoryError: CUDA out of memory. "
                 "Tried to allocate 3.50 GiB. GPU 0 has a total capacity of 139.80 GiB of which 1.90 GiB is free.")
    p = tmp_path / "init.log"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    table = load_table()
    seq = diagnose_source(str(p), table, Config(), "upstream-2026", "throughput", {}, jobs=1)
    monkeypatch.setattr(diagnose, "PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr(diagnose, "MIN_CHUNK_BYTES", 1)
    monkeypatch.setattr(diagnose, "CHUNK_BYTES", 300)
    assert len(split_ranges(str(p), p.stat().st_size, 300)) > 5
    par = diagnose_source(str(p), table, Config(), "upstream-2026", "throughput", {}, jobs=2)
    assert seq.error is None and par.error is None
    assert par.document["findings"] == seq.document["findings"]
    fired = {f["check"] for f in seq.document["findings"] if f["status"] in ("warning", "critical")}
    assert "startup_headroom_oom" in fired and "oom_unknown_phase" not in fired
