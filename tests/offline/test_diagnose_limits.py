"""`diagnose` on hostile inputs: a gzip bomb of NULs and over-long lines are read in time linear in the
input and memory bounded by a block and the line limit (an over-long line is skipped and counted), with
the C accelerator and without (diagnose's scanner; .ci/run runs this file both ways)."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pytest

from helpers.scenario_logs import LogWriter, steady
from sglang_tuning_exporter.guide.checks import load_table
from sglang_tuning_exporter.guide.config import Config
from sglang_tuning_exporter.offline import diagnose, scanner
from sglang_tuning_exporter.offline.diagnose import diagnose_source

CAP = 4096


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the byte strings handed to the scanner, with a small line limit."""
    monkeypatch.setattr(scanner, "MAX_LINE_BYTES", CAP)
    sizes: list[int] = []
    real = scanner.Scanner.scan_bytes

    def counted(self: scanner.Scanner, data: Any, **kw: Any) -> scanner.ChunkResult:
        sizes.append(len(data) - kw.get("start", 0))
        return real(self, data, **kw)

    monkeypatch.setattr(scanner.Scanner, "scan_bytes", counted)
    return sizes


def _diagnose(path: Path, jobs: int = 1) -> diagnose.FileDiagnosis:
    return diagnose_source(str(path), load_table(), Config(), "docs-2025", "throughput", {}, jobs=jobs)


def test_a_gzip_bomb_of_nuls_is_read_in_linear_time_and_bounded_memory(tmp_path: Path, handed: list[int]) -> None:
    """64 MiB of NULs (one endless line) in a small .gz: no buffer larger than a block and a line
    (it used to grow block after block: 4 GiB took more than 300 s) and one clear error."""
    bomb = tmp_path / "bomb.log.gz"
    with gzip.open(bomb, "wb", compresslevel=1) as fh:
        zeros = b"\x00" * (1 << 20)
        for _ in range(64):
            fh.write(zeros)
    r = _diagnose(bomb)
    assert max(handed) <= diagnose.BLOCK_BYTES + CAP, max(handed)
    assert sum(handed) <= 2 * diagnose.BLOCK_BYTES  # the bomb's bytes are never handed on
    assert r.error is not None and "over-long" in r.error, r.error


def _log_with_long_lines(tmp_path: Path) -> tuple[Path, str]:
    w = LogWriter("0.5.23")
    steady(w, 6, running=200, usage=0.9, queue=300)
    lines = w.text().split("\n")
    mid = len(lines) // 2
    lines[mid:mid] = ["x" * (3 * CAP), lines[mid] + "y" * (2 * CAP), "\x00" * (5 << 20)]
    path = tmp_path / "long.log"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path, w.text()


@pytest.mark.parametrize("jobs", [1, 2])
def test_over_long_lines_are_skipped_and_counted(tmp_path: Path, handed: list[int], jobs: int,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Three lines past the limit (one of 5 MiB): skipped and counted, the rest of the log read as
    without them, serially and in parallel ranges."""
    if jobs > 1:
        monkeypatch.setattr(diagnose, "PARALLEL_MIN_BYTES", 1)
        monkeypatch.setattr(diagnose, "MIN_CHUNK_BYTES", 1)
        monkeypatch.setattr(diagnose, "CHUNK_BYTES", 64 << 10)
    path, clean_text = _log_with_long_lines(tmp_path)
    clean = tmp_path / "clean.log"
    clean.write_text(clean_text, encoding="utf-8")
    r = _diagnose(path, jobs)
    assert r.error is None, r.error
    assert r.document["input"]["oversized_lines"] == 3
    assert r.document["signals"] == _diagnose(clean, jobs).document["signals"]


def test_the_c_and_python_readers_skip_the_same_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Differential: the scanner with and without the accelerator counts the same over-long lines."""
    monkeypatch.setattr(scanner, "MAX_LINE_BYTES", CAP)
    path, _ = _log_with_long_lines(tmp_path)
    data = path.read_bytes()
    got = []
    for scan in (scanner.SCAN, None):
        monkeypatch.setattr(scanner, "SCAN", scan)
        res = scanner.Scanner(600.0, 0.9).scan_bytes(data)
        got.append((res.oversized, res.lines, res.unparsed, res.nul_lines))
    assert got[0] == got[1] and got[0][0] == 3


@pytest.mark.parametrize("fmt", ["text", "json", "markdown", "html"])
def test_many_inputs_are_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    """Each input's part is written as it is read: at most two diagnoses alive at once however many
    inputs (all were kept to the end: 10,000 small logs took 1.26 GB), the output as before."""
    import gc
    import io
    import weakref

    from sglang_tuning_exporter.cli import command_parser
    from sglang_tuning_exporter.offline import formats

    w = LogWriter("0.5.23")
    steady(w, 2, running=200, usage=0.9, queue=300)
    paths = []
    for i in range(12):
        p = tmp_path / f"{i:02d}.log"
        p.write_text(w.text(), encoding="utf-8")
        paths.append(str(p))
    (tmp_path / "bad.log").write_bytes(b"")
    paths.insert(3, str(tmp_path / "bad.log"))
    alive: list[weakref.ref[diagnose.FileDiagnosis]] = []
    most = 0
    real = diagnose.diagnose_source

    def tracked(*a: Any, **kw: Any) -> diagnose.FileDiagnosis:
        nonlocal most
        gc.collect()
        most = max(most, sum(r() is not None for r in alive))
        r = real(*a, **kw)
        alive.append(weakref.ref(r))
        return r

    monkeypatch.setattr(diagnose, "diagnose_source", tracked)
    out, err = io.StringIO(), io.StringIO()
    args = command_parser("diagnose")[0].parse_args(["--format", fmt, *paths])
    gc.freeze()  # what the session made before is not this test's garbage: each collect walks only the run's
    try:
        code = diagnose.run(args, stdout=out, stderr=err)
    finally:
        gc.unfreeze()
    assert code == 1 and "bad.log: empty input" in err.getvalue()
    assert most <= 2, most
    monkeypatch.setattr(diagnose, "diagnose_source", real)
    table, cfg, profile, workload, overrides = diagnose._setup(args)
    good = [real(p, table, cfg, profile, workload, overrides) for p in paths if "bad" not in p]
    want = formats.render(good, fmt, table=table)
    assert out.getvalue() == want + ("" if want.endswith("\n") else "\n")
