"""The follower under log rotation done the ways logrotate does it, between and during polls (issue 17).

A harness writes numbered lines as a writer would (keeping its own file handle, as SGLang's logging
does), rotates with rename+create, several renames between two polls, or copytruncate, and checks that
every line is read exactly once, in order per file, with the rotations and truncations counted and
anything unreadable counted in `unread_bytes`. Real files in a temp dir, an injected clock, no sleeps.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import IO

from sglang_tuning_exporter.core import limits
from sglang_tuning_exporter.sources.tail import Follower, OsFileSystem


class Writer:
    """An appender that keeps its file handle across renames (it reopens only when told)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.n = 0
        self.fh: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by reopen/close

    def write(self, count: int) -> None:
        for _ in range(count):
            self.fh.write(f"line {self.n:06d} {'x' * 40}\n")
            self.n += 1
        self.fh.flush()

    def reopen(self) -> None:
        self.fh.close()
        self.fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def close(self) -> None:
        self.fh.close()


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _numbers(lines: list[str]) -> list[int]:
    return [int(line.split()[1]) for line in lines]


def _rotate(log: Path, keep: int) -> None:
    """logrotate's rename scheme: log.N-1 -> log.N, ..., log -> log.1."""
    for i in range(keep - 1, 0, -1):
        src = log.with_name(f"{log.name}.{i}")
        if src.exists():
            os.rename(src, log.with_name(f"{log.name}.{i + 1}"))
    os.rename(log, log.with_name(f"{log.name}.1"))


def test_two_rotations_between_polls_lose_no_line(tmp_path: Path) -> None:
    """log -> log.1 -> log.2 and a second log -> log.1 before the next poll: the middle file (never
    opened by us) is found and read, and both rotations are counted."""
    log = tmp_path / "server.log"
    w = Writer(log)
    f = Follower(str(log), from_start=True, clock=Clock())
    w.write(200)
    got = f.poll()
    w.write(100)  # unread tail of the first file
    _rotate(log, 3)
    w.reopen()
    w.write(100)  # the middle file, rotated away before we ever saw it
    _rotate(log, 3)
    w.reopen()
    w.write(200)
    got += f.poll()
    w.close()
    assert _numbers(got) == list(range(600))
    assert f.rotations == 2 and f.unread_bytes == 0


def test_create_rotation_while_the_writer_still_writes_the_old_file(tmp_path: Path) -> None:
    """logrotate `create` without a signal: the writer goes on in the renamed file for a while, then
    reopens. The old file is read until it has been quiet ROTATED_DRAIN_QUIET_S, so nothing is lost."""
    log = tmp_path / "server.log"
    clock = Clock()
    w = Writer(log)
    f = Follower(str(log), from_start=True, clock=clock)
    w.write(100)
    got = f.poll()
    _rotate(log, 2)
    log.write_text("")  # `create`: a new empty file at the path
    for _ in range(30):  # 3 s at 10 polls/s, the writer still in the old file
        w.write(50)
        clock.t += 0.1
        got += f.poll()
    w.reopen()
    w.write(100)
    for _ in range(3):
        clock.t += limits.ROTATED_DRAIN_QUIET_S
        got += f.poll()
    w.close()
    assert _numbers(got) == list(range(1700))
    assert f.rotations == 1 and f.draining == 0  # the quiet old file was closed at last


def test_unterminated_last_line_of_a_rotated_file_comes_when_it_goes_quiet(tmp_path: Path) -> None:
    """The writer may still finish its line in the old file: it is held until the file is quiet."""
    log = tmp_path / "server.log"
    clock = Clock()
    log.write_text("")
    f = Follower(str(log), clock=clock)
    f.poll()
    with open(log, "a", buffering=1) as fh:  # line-buffered: flushed at each newline, and below
        fh.write("late write\nhalf")
        fh.flush()
        os.rename(log, tmp_path / "server.log.1")
        log.write_text("fresh 1\n")
        assert f.poll() == ["late write", "fresh 1"]
        fh.write(" done\n")
        fh.flush()
    assert f.poll() == ["half done"]
    clock.t += limits.ROTATED_DRAIN_QUIET_S
    with open(tmp_path / "server.log.1", "a") as fh:
        fh.write("never finished")
    assert f.poll() == []
    clock.t += limits.ROTATED_DRAIN_QUIET_S
    assert f.poll() == ["never finished"] and f.draining == 0


def _copytruncate(log: Path) -> None:
    shutil.copyfile(log, log.with_name(log.name + ".1"))
    with open(log, "r+") as fh:
        fh.truncate(0)


def test_copytruncate_with_regrowth_past_our_offset_is_detected_and_the_copy_read(tmp_path: Path) -> None:
    """copytruncate every few seconds while the writer appends (O_APPEND): after the truncation the
    file grows past our old offset before we poll. The bytes before our offset no longer match what
    we read: that is a truncation (not a continuation mid-line), the lines written between our last
    read and the copy are read from the copy, and the file is read again from its start."""
    log = tmp_path / "server.log"
    w = Writer(log)
    f = Follower(str(log), from_start=True, clock=Clock())
    got: list[str] = []
    for _ in range(12):  # 12 cycles of: lines we read, lines we miss before the copy, regrowth
        w.write(300)
        got += f.poll()
        w.write(200)
        _copytruncate(log)
        w.write(500)  # more than what we had read: the size is past our offset again
    got += f.poll()
    w.close()
    assert _numbers(got) == list(range(12_000))
    assert f.truncations == 12 and f.unread_bytes == 0


def test_truncation_without_a_copy_is_counted_with_what_was_lost(tmp_path: Path) -> None:
    """Truncated (no copy kept) and regrown: detected by the bytes before our offset, read from the
    start; the partial line we held is counted unread."""
    log = tmp_path / "server.log"
    log.write_text("")
    f = Follower(str(log), clock=Clock())
    f.poll()
    with open(log, "a") as fh:
        fh.write("a" * 50 + "\n" + "partial")
    assert f.poll() == ["a" * 50]
    with open(log, "w") as fh:
        fh.write("b" * 80 + "\n")
    assert f.poll() == ["b" * 80]
    assert f.truncations == 1 and f.unread_bytes == len("partial")


def test_a_compressed_middle_rotation_is_counted_unread(tmp_path: Path) -> None:
    """A file rotated and compressed before we saw it cannot be followed: its size is counted."""
    import gzip

    log = tmp_path / "server.log"
    log.write_text("")
    f = Follower(str(log), clock=Clock())
    f.poll()
    os.rename(log, tmp_path / "server.log.2")
    with gzip.open(tmp_path / "server.log.1.gz", "wb") as gz:
        gz.write(b"lost line\n" * 100)
    log.write_text("new\n")
    assert f.poll() == ["new"]
    assert f.rotations == 2 and f.unread_bytes == (tmp_path / "server.log.1.gz").stat().st_size


class _DeniedFs(OsFileSystem):
    """The file is there, but opening it is refused (as chmod 000 would for a non-root sidecar)."""

    def open(self, path: str) -> IO[bytes]:
        raise PermissionError(13, "Permission denied", path)


def test_unreadable_log_is_permission_denied_not_not_found(tmp_path: Path) -> None:
    """The sidecar says the log cannot be read (reason permission_denied), not that it is missing."""
    import argparse

    from sglang_tuning_exporter.sidecar.collector import BuildInfo, build_families, encode_text
    from sglang_tuning_exporter.sidecar.engine import Advisor
    from sglang_tuning_exporter.sidecar.serve import build_sidecar, log_input_for
    from sglang_tuning_exporter.sidecar.serveconfig import add_serve_flags, build_config
    from sglang_tuning_exporter.sources.logreader import EventReader

    log = tmp_path / "server.log"
    log.write_text("x\n")
    follower = Follower(str(log), fs=_DeniedFs(), clock=Clock())
    p = argparse.ArgumentParser()
    add_serve_flags(p)
    cfg = build_config(p.parse_args(["--sglang.log-file", str(log)]))
    advisor = Advisor(window=None, evaluate=None, document=None, to_observations=None)
    sc = build_sidecar(cfg, timer=lambda: 0.0, advisor=advisor, log_input=log_input_for(follower, EventReader()))
    sc.tick(0.0)
    st = sc.state.snapshot(0.0).sources["log"]
    assert st.up is False and "Permission denied" in st.detail and "not found" not in st.detail
    text = encode_text(build_families(sc.state.snapshot(0.0), BuildInfo("t", "3"))).decode()
    assert 'sglang_tuning_source_failures_total{source="log",reason="permission_denied"} 1.0' in text
    assert "sglang_tuning_log_unread_bytes_total 0.0" in text


def test_copytruncate_nul_hole_skips_the_nuls_and_reads_the_next_line(tmp_path: Path) -> None:
    """A writer without O_APPEND goes on at its old offset after copytruncate, so the file starts with a
    run of NULs: it is skipped and the line after it read (it used to be lost with the NULs, counted as
    one over-long line), at every truncation."""
    log = tmp_path / "server.log"
    clock = Clock()
    fh = open(log, "wb")  # noqa: SIM115 - a plain (not O_APPEND) writer, closed below
    try:
        fh.write(b"".join(f"line {i:06d} {'x' * 40}\n".encode() for i in range(100)))
        fh.flush()
        f = Follower(str(log), from_start=True, clock=clock, max_line_bytes=1024)
        assert _numbers(f.poll()) == list(range(100))
        n = 100
        for _ in range(3):
            shutil.copy(log, log.with_name("server.log.1"))
            os.truncate(log, 0)
            clock.t += 1.0
            for _ in range(2):  # the writer's offset is past the truncation: a hole of NULs before it
                fh.write(f"line {n:06d} {'x' * 40}\n".encode())
                n += 1
            fh.flush()
            assert _numbers(f.poll()) == [n - 2, n - 1]
        assert f.truncated_lines == 0 and f.truncations == 3
    finally:
        fh.close()
