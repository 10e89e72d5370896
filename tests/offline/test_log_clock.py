"""The log clock against outliers, in `diagnose` (fast and full path) and the sidecar's conversion alike
(docs/signals.md, "Clocks"): two hosts' lines interleaved, one line stamped 2099."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from helpers.scenario_logs import LogWriter
from sglang_tuning_exporter.guide.checks import load_table
from sglang_tuning_exporter.guide.config import Config
from sglang_tuning_exporter.offline.diagnose import diagnose_source
from sglang_tuning_exporter.pipeline.observations import EventConverter
from sglang_tuning_exporter.sources.logreader import EventReader

MINUTES = 20


def interleaved_log(ahead_s: float = 700.0, seed: int = 3) -> str:
    """Host A (retracting 6 times a minute) and host B (its clock `ahead_s` ahead, no retractions)
    written into one log in runs of 1-5 lines, 20 minutes long."""
    a, b = LogWriter("0.5.23"), LogWriter("0.5.23", start=LogWriter().start + ahead_s)
    for i in range(MINUTES * 30):  # a line every 2 s each
        a.decode(300, 0.99, 150)
        if i % 5 == 0:
            a.retract(1)
        b.decode(100, 0.5, 150)
        a.tick(2)
        b.tick(2)
    rnd = random.Random(seed)
    out: list[str] = []
    ia = ib = 0
    while ia < len(a.lines) or ib < len(b.lines):
        n = rnd.randint(1, 5)
        out += a.lines[ia:ia + n]
        ia += n
        n = rnd.randint(1, 5)
        out += b.lines[ib:ib + n]
        ib += n
    return "\n".join(out) + "\n"


def _diagnosed(path: Path, jobs: int = 1) -> dict[str, Any]:
    r = diagnose_source(str(path), load_table(), Config(), "docs-2025", "throughput", {}, jobs=jobs)
    assert r.error is None, r.error
    return r.document


def _span_s(doc: dict[str, Any]) -> float:
    from sglang_tuning_exporter.core.timeparse import event_seconds

    w = doc["window"]
    start, end = (event_seconds(w[k].rstrip("Z")) for k in ("start", "end"))
    assert start is not None and end is not None
    return end - start


def _retractions_per_minute(doc: dict[str, Any]) -> float:
    got = doc["signals"]["retractions_per_minute"]
    assert isinstance(got, float), doc["signals"]
    return got


def test_interleaved_hosts_keep_twenty_minutes_and_the_retraction_rate(tmp_path: Path) -> None:
    """Before: each run of the other host moved the clock 700 s on, 20 minutes read as days and the
    storm (6 a minute) as none in the last window."""
    log = tmp_path / "two-hosts.log"
    log.write_text(interleaved_log(), encoding="utf-8")
    doc = _diagnosed(log)
    assert _span_s(doc) < MINUTES * 60 + 2 * 700, doc["window"]
    assert 4.0 <= _retractions_per_minute(doc) <= 8.0


def test_interleaved_hosts_read_alike_by_the_sidecar_and_diagnose(tmp_path: Path) -> None:
    """The sidecar's conversion times the log as diagnose does (which reads it again on the full path:
    the clock moved back once), serially and in parallel ranges."""
    from sglang_tuning_exporter.core.timeparse import event_seconds

    text = interleaved_log()
    conv = EventConverter()
    reader = EventReader()
    times = [o.time for e in [*reader.feed_lines(text.split("\n")[:-1]), *reader.flush()] for o in conv.convert(e)]
    assert max(times) - min(times) < MINUTES * 60 + 2 * 700
    log = tmp_path / "two-hosts.log"
    log.write_text(text, encoding="utf-8")
    for jobs in (1, 2):
        doc = _diagnosed(log, jobs)
        assert event_seconds(doc["window"]["end"].rstrip("Z")) == int(max(times)), jobs


def test_one_line_stamped_2099_does_not_move_the_clock(tmp_path: Path) -> None:
    w = LogWriter("0.5.23")
    for i in range(300):
        w.decode(300, 0.9, 150)
        if i == 150:
            w.lines.append(w.lines[-1].replace(w.lines[-1][1:5], "2099", 1))
        w.tick(2)
    log = tmp_path / "stray.log"
    log.write_text("\n".join(w.lines) + "\n", encoding="utf-8")
    for jobs in (1, 2):
        doc = _diagnosed(log, jobs)
        assert doc["window"]["end"].startswith("2025-"), doc["window"]
        assert _span_s(doc) < 700


def _stray_and_gap_log() -> str:
    """An idle gap of 20 minutes, a stray line an hour back, one in 2099, lines of another host's clock."""
    w = LogWriter("0.5.23")
    for i in range(400):
        w.decode(300, 0.9, 150)
        if i % 7 == 0:
            w.retract(1)
        if i == 100:
            w.tick(1200)
        if i in (150, 151):
            w.lines.append(w.lines[-1].replace(w.lines[-1][1:5], "2099", 1))
        if i == 200:
            w.tick(-3600)
            w.decode(1, 0.1, 1).retract(1)
            w.tick(3600)
        if i in (250, 252, 253):
            w.tick(900)
            w.decode(2, 0.2, 2)
            w.tick(-900)
        w.tick(2)
    return "\n".join(w.lines) + "\n"


def test_the_c_reader_hands_off_clock_stamps_as_the_python_one(monkeypatch: Any) -> None:
    """Differential: diagnose's scanner with the C accelerator and without it gives the same signals and
    the same decision to read again on the full path (the C side states the tolerance both ways)."""
    import pytest

    from sglang_tuning_exporter.offline import scanner as scanner_mod
    from sglang_tuning_exporter.offline.diagnosis import ClockSetBack, Diagnosis
    from sglang_tuning_exporter.offline.scanner import Scanner

    if scanner_mod.SCAN is None:
        pytest.skip("the C accelerator is not built here or turned off")
    for text in (_stray_and_gap_log(), interleaved_log(), interleaved_log(ahead_s=-900.0, seed=5)):
        outcomes = []
        for scan in (scanner_mod.SCAN, None):
            monkeypatch.setattr(scanner_mod, "SCAN", scan)
            d = Diagnosis(load_table(), Config(), "docs-2025", "throughput", {})
            sc = Scanner(d.res, 0.9, (100.0, 2000.0))
            data = text.encode()
            try:
                cut = data.index(b"\n", len(data) // 2) + 1
                d.add_chunk(sc.scan_bytes(data[:cut], final=False))
                d.add_chunk(sc.scan_bytes(data[cut:]))
            except ClockSetBack:
                outcomes.append("again")
                continue
            doc = d.finish("x").document
            outcomes.append((doc["signals"], doc["window"], d.fast > 0 if scan else None))
        assert outcomes[0] == "again" or outcomes[0][2], "the C reader read no line itself"
        assert outcomes[0] == outcomes[1] or outcomes[0][:2] == outcomes[1][:2]


def test_diagnose_reports_the_outlier_stamps_in_every_format(tmp_path: Path) -> None:
    """Before: the JSON `input` and the text/Markdown/HTML headers said nothing of the stamps the log
    clock took at a neighbour's time."""
    from sglang_tuning_exporter.offline import formats

    log = tmp_path / "stray.log"
    log.write_text(_stray_and_gap_log(), encoding="utf-8")
    for jobs in (1, 2):
        r = diagnose_source(str(log), load_table(), Config(), "docs-2025", "throughput", {}, jobs=jobs)
        inp = r.document["input"]
        # Two lines in 2099 (held, then settled), the two lines an hour back, the 3 lines 900 s ahead.
        assert inp["implausible_times"] == 7, (jobs, inp)
        assert inp["implausible_time_example"].startswith("2099-"), inp
        for fmt in ("text", "markdown", "html"):
            text = formats.render([r], fmt, table=load_table())
            assert "7 timestamps far off the log&#x27;s clock (e.g. 2099-" in text if fmt == "html" else \
                "7 timestamps far off the log's clock (e.g. 2099-" in text, fmt
    clean = tmp_path / "clean.log"
    clean.write_text(interleaved_log(ahead_s=0.0), encoding="utf-8")
    r = diagnose_source(str(clean), load_table(), Config(), "docs-2025", "throughput", {})
    assert r.document["input"]["implausible_times"] == 0
    assert "far off the log's clock" not in formats.file_text(r, load_table())


def _stray_first_log() -> str:
    """The first line stamped 2099, then 10 minutes of lines on the log's own clock (a retraction a minute)."""
    w = LogWriter("0.5.23")
    for i in range(300):
        w.decode(300, 0.9, 150)
        if i % 30 == 0:
            w.retract(1)
        w.tick(2)
    first = w.lines[0]
    w.lines.insert(0, first.replace(first[1:5], "2099", 1))
    return "\n".join(w.lines) + "\n"


def test_a_first_stamp_the_next_ones_contradict_is_no_anchor(tmp_path: Path) -> None:
    """Before: a first line stamped 2099 anchored the clock, and the lines after it (three agreeing: the
    clock 'set back') were shifted onto 2099. The majority wins: the log is timed by its own clock."""
    from sglang_tuning_exporter.core.timeparse import event_seconds

    text = _stray_first_log()
    log = tmp_path / "stray-first.log"
    log.write_text(text, encoding="utf-8")
    for jobs in (1, 2):
        doc = _diagnosed(log, jobs)
        assert doc["window"]["end"].startswith("2025-"), (jobs, doc["window"])
        assert _span_s(doc) < 700, (jobs, doc["window"])
        assert 0.8 <= _retractions_per_minute(doc) <= 1.2, jobs
    conv = EventConverter()
    reader = EventReader()
    # The sidecar's way: a batch of lines read, converted at once (the first stamps are read ahead).
    times = [o.time for o in conv.convert_batch([*reader.feed_lines(text.split("\n")[:-1]), *reader.flush()])]
    year_2030 = event_seconds("2030-01-01T00:00:00")
    assert year_2030 is not None and max(times[1:]) < year_2030
    assert conv.implausible_times >= 1
