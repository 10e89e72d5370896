"""diagnose over restarts: a log's startup sections are streamed (never read whole), and sections whose
tracked flags agree as guide/changes.detect compares them (1, 1.0, "1") are one."""

from __future__ import annotations

import builtins
import gzip
from pathlib import Path
from typing import IO, Any

import pytest

from helpers import change_logs, paths
from helpers.scenario_logs import LogWriter
from sglang_tuning_exporter.guide.changes import Section
from sglang_tuning_exporter.guide.checks import load_table
from sglang_tuning_exporter.guide.config import Config
from sglang_tuning_exporter.offline import changes

TABLE = load_table()
FIX = paths.FIXTURES / "changes"


def _sections(*files: Path) -> list[Section]:
    return changes.sections_of([str(f) for f in files], TABLE, Config(), "docs-2025", "throughput", {})


def _shape(secs: list[Section]) -> list[tuple[Any, ...]]:
    return [(s.start, sorted(s.args.items()), [(w.start, w.end, sorted(w.statuses.items())) for w in s.windows])
            for s in secs]


class _BoundedReads:
    """A file whose every read asks for at most `limit` bytes (a whole read fails the test)."""

    def __init__(self, fh: IO[bytes], limit: int, sizes: list[int]) -> None:
        self._fh, self._limit, self._sizes = fh, limit, sizes

    def read(self, n: int = -1) -> bytes:
        assert 0 <= n <= self._limit, f"read({n}): the input is read whole"
        got = self._fh.read(n)
        self._sizes.append(len(got))
        return got

    def __enter__(self) -> _BoundedReads:
        return self

    def __exit__(self, *exc: object) -> None:
        self._fh.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fh, name)


@pytest.mark.parametrize("block", [64, 333, 4096])
def test_a_restarting_log_is_streamed_not_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     block: int) -> None:
    """Every read of the input is a block, plain or gzip; the sections (arguments, windows, statuses) are
    those of one read of the whole file, however the blocks fall (one starts exactly at a section's
    `server_args=` line)."""
    log = tmp_path / "improved.log"
    text = (FIX / "improved.log").read_bytes()
    at = text.index(b"server_args=", text.index(b"server_args=") + 1)
    at = text.rindex(b"\n", 0, at) + 1  # the second section's first line
    pad = (-at) % block  # blank lines before it put that line at a block's start
    log.write_bytes(text[:at] + b"\n" * pad + text[at:])
    gz = tmp_path / "improved.log.gz"
    gz.write_bytes(gzip.compress(log.read_bytes()))
    whole = _sections(log)
    assert len(whole) == 2 and whole[1].args["schedule_conservativeness"] == 1.3

    sizes: list[int] = []
    real_open, real_gzip_open = builtins.open, gzip.open

    def bounded_open(path: Any, mode: str = "r", *args: Any, **kw: Any) -> Any:
        return _BoundedReads(real_open(path, mode, *args, **kw), block, sizes)

    def bounded_gzip_open(path: Any, mode: str = "rb", *args: Any, **kw: Any) -> Any:
        return _BoundedReads(real_gzip_open(path, mode, *args, **kw), block, sizes)

    monkeypatch.setattr(changes, "BLOCK_BYTES", block)
    monkeypatch.setattr(changes, "open", bounded_open, raising=False)  # the module's own `open`
    assert _shape(_sections(log)) == _shape(whole)
    assert sum(sizes) >= log.stat().st_size > 10 * block
    sizes.clear()
    monkeypatch.setattr(changes.gzip, "open", bounded_gzip_open)
    assert _shape(_sections(gz)) == _shape(whole)
    assert sum(sizes) >= log.stat().st_size  # the gunzipped text, a block at a time


def _restart_log(first: object, second: object) -> str:
    w = LogWriter("0.5.23")
    for value in (first, second):
        w.server_args(schedule_conservativeness=value, chunked_prefill_size=8192)
        for _ in range(200):
            w.decode(200, 0.9, 150)
            w.tick(5)
    return w.text()


@pytest.mark.parametrize(("first", "second"), [(1, 1.0), (1, "1"), (8192, 8192.0)])
def test_numerically_equal_arguments_are_no_restart_with_other_flags(tmp_path: Path, first: object,
                                                                     second: object) -> None:
    log = tmp_path / "x.log"
    log.write_text(_restart_log(first, second), encoding="utf-8")
    assert changes.restarts(str(log))
    (one,) = _sections(log)
    assert len(one.windows) > 1
    assert changes.changes_of([str(log)], TABLE, Config(), "docs-2025", "throughput", {}) == []


def test_a_changed_value_is_still_a_change(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text(_restart_log(1, 1.3), encoding="utf-8")
    assert [s.args["schedule_conservativeness"] for s in _sections(log)] == [1, 1.3]
    (c,) = changes.changes_of([str(log)], TABLE, Config(), "docs-2025", "throughput", {})
    assert (c["flag"], c["from"], c["to"]) == ("--schedule-conservativeness", 1, 1.3)


def test_a_change_without_a_restart_is_a_change(tmp_path: Path) -> None:
    """SGLang's `Config updated via context override: {...}` (POST /set_internal_state) starts a section:
    the changed argument is judged like a restart's, source `log`; the other arguments carry over."""
    log = tmp_path / "x.log"
    log.write_text(change_logs.runtime_update(), encoding="utf-8")
    assert changes.restarts(str(log))
    first, second = _sections(log)
    assert (first.args["pp_max_micro_batch_size"], second.args["pp_max_micro_batch_size"]) == (8, 4)
    assert second.args["mem_fraction_static"] == first.args["mem_fraction_static"]
    (c,) = changes.changes_of([str(log)], TABLE, Config(), "docs-2025", "throughput", {})
    assert (c["flag"], c["from"], c["to"], c["source"]) == ("--pp-max-micro-batch-size", 8, 4, "log")
    assert c["verdict"] in ("no_change", "improved", "worse", "inconclusive") and c["before"]["start"]


@pytest.mark.parametrize(("marks", "want"), [
    ([], False), (["server_args="], False), (["server_args=", "server_args="], True),
    (["Config updated via context override: "], False),
    (["server_args=", "Global server args updated! "], True),
    (["Global server args updated! ", "Config updated via context override: "], True),
    (["server_args", "server args updated! "], False),  # near misses are no marks
])
@pytest.mark.parametrize("gz", [False, True])
def test_restarts_counts_the_marks_of_every_word(tmp_path: Path, marks: list[str], want: bool, gz: bool) -> None:
    """Two marks of any words make a restart log, wherever they sit (a gzip block boundary between them,
    the last at the very end); one does not."""
    filler = b"[2025-01-01 00:00:00] Decode batch, #running-req: 1, #queue-req: 0\n" * 20000  # > 1 MiB
    data = b"".join(filler + m.encode() for m in marks) + filler
    if marks:
        data = data[:-len(filler)] + b"\n" if len(marks) > 1 else data  # the last mark ends the file
    log = tmp_path / "x.log"
    log.write_bytes(gzip.compress(data) if gz else data)
    assert changes.restarts(str(log)) is want


@pytest.mark.parametrize("second", [1, 1.3, None])
def test_a_parallel_read_counts_the_marks_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 second: float | None) -> None:
    """The workers count the section marks of their ranges while the parent merges: whether the input
    restarts is known without another pass over the file (a second of the 1M-line benchmark's), the same
    answer and the same changes as that pass gives."""
    from sglang_tuning_exporter.offline import diagnose

    log = tmp_path / "x.log"
    text = _restart_log(1, second if second is not None else 1)
    if second is None:  # one startup only
        text = text[:text.index("server_args=", text.index("server_args=") + 1)].rsplit("\n", 1)[0] + "\n"
    log.write_text(text, encoding="utf-8")
    monkeypatch.setattr(diagnose, "PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr(diagnose, "MIN_CHUNK_BYTES", 1)
    monkeypatch.setattr(diagnose, "CHUNK_BYTES", 4096)
    r = diagnose.diagnose_source(str(log), TABLE, Config(), "docs-2025", "throughput", {}, jobs=2)
    assert r.error is None and r.section_marks == text.count("server_args=")
    want = changes.changes_of([str(log)], TABLE, Config(), "docs-2025", "throughput", {}) if second else []

    def no_second_pass(path: str) -> bool:
        raise AssertionError("read the file again for its marks")

    monkeypatch.setattr(changes, "restarts", no_second_pass)
    assert changes.file_changes(r, TABLE, Config(), "docs-2025", "throughput", {}) == want
    assert bool(want) is (second == 1.3)
