"""The follower and offline input: real files in a temp dir, explicit poll(), no sleeps."""

from __future__ import annotations

import gzip
import io
import os
from pathlib import Path

import pytest

from sglang_tuning_exporter.core import limits
from sglang_tuning_exporter.sources.tail import Follower, InputError, LineSplitter, open_input


def _append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8", newline="") as f:
        f.write(text)


def test_starts_at_end_by_default_and_buffers_partial_lines(tmp_path: Path) -> None:
    """Existing content is skipped; a line is returned only once its newline arrives."""
    log = tmp_path / "server.log"
    log.write_text("old 1\nold 2\n")
    f = Follower(str(log), clock=lambda: 42.0)
    assert f.poll() == [] and f.exists
    _append(log, "new 1\nnew ")
    assert f.poll() == ["new 1"]
    assert f.poll() == []
    _append(log, "2\r 50%\rdone\n")
    assert f.poll() == ["new 2\r 50%\rdone"]  # \r is not a line break
    assert f.last_data_at == 42.0


def test_from_start_reads_existing_content(tmp_path: Path) -> None:
    """from_start=True returns what is already there."""
    log = tmp_path / "server.log"
    log.write_text("a\nb\n")
    assert Follower(str(log), from_start=True).poll() == ["a", "b"]


def test_rotation_drains_old_file_then_reads_new_from_start(tmp_path: Path) -> None:
    """Rename + create: the old file's tail comes first, then the new file; the old file's unterminated
    last line once the old file has been quiet a while (its writer may still finish it)."""
    log = tmp_path / "server.log"
    log.write_text("")
    now = [0.0]
    f = Follower(str(log), clock=lambda: now[0])
    f.poll()
    _append(log, "before\n")
    assert f.poll() == ["before"]
    _append(log, "late write\nunterminated")
    os.rename(log, tmp_path / "server.log.1")
    log.write_text("fresh 1\n")
    assert f.poll() == ["late write", "fresh 1"]
    assert f.rotations == 1 and f.truncations == 0
    _append(log, "fresh 2\n")
    now[0] += limits.ROTATED_DRAIN_QUIET_S
    assert f.poll() == ["unterminated", "fresh 2"]


def test_truncation_restarts_at_zero_and_is_counted(tmp_path: Path) -> None:
    """copytruncate-style: size below our offset on the same inode -> read from 0."""
    log = tmp_path / "server.log"
    log.write_text("")
    f = Follower(str(log))
    f.poll()
    _append(log, "one long line of text\ntwo\n")
    assert f.poll() == ["one long line of text", "two"]
    with open(log, "w") as fh:
        fh.write("x\n")
    assert f.poll() == ["x"]
    assert f.truncations == 1 and f.rotations == 0
    assert f.offset == 2


def test_missing_file_then_appearing_is_read_from_its_start(tmp_path: Path) -> None:
    """Not there yet: exists is False; when it appears its whole content is read."""
    log = tmp_path / "later.log"
    f = Follower(str(log))
    assert f.poll() == [] and not f.exists
    log.write_text("first\nsecond\n")
    assert f.poll() == ["first", "second"] and f.exists


def test_file_disappearing_then_recreated(tmp_path: Path) -> None:
    """Deleted: exists False, no error; a new file at the path is followed as a rotation."""
    log = tmp_path / "server.log"
    log.write_text("")
    f = Follower(str(log))
    f.poll()
    _append(log, "last words\n")
    os.unlink(log)
    assert f.poll() == ["last words"] and not f.exists
    assert f.poll() == []
    log.write_text("reborn\n")
    assert f.poll() == ["reborn"] and f.exists and f.rotations == 1


def test_overlong_line_is_cut_and_counted(tmp_path: Path) -> None:
    """A 10 MB line never sits whole in memory: its head is kept, the rest dropped, counted once."""
    log = tmp_path / "server.log"
    log.write_text("")
    f = Follower(str(log), max_line_bytes=1024)
    f.poll()
    chunk = "x" * 65536
    with open(log, "a") as fh:
        for _ in range(160):  # 10 MiB without a newline
            fh.write(chunk)
    lines = f.poll()
    assert lines == ["x" * 1024] and f.truncated_lines == 1
    assert f._splitter.pending == 0
    _append(log, "tail of the giant\nnormal\n")
    assert f.poll() == ["normal"] and f.truncated_lines == 1


def test_splitter_undecodable_bytes_and_split_characters() -> None:
    """Bad UTF-8 becomes U+FFFD; a multi-byte character split across reads is decoded whole."""
    s = LineSplitter()
    assert s.feed(b"caf\xc3") == []
    assert s.feed(b"\xa9 \xff ok\n") == ["café \ufffd ok"]
    assert s.flush() == []
    assert s.feed(b"no newline") == [] and s.flush() == ["no newline"]


def test_open_input_plain_gzip_and_stdin(tmp_path: Path) -> None:
    """Plain and gzip files (detected by content) and stdin give the same lines, \\r kept in lines."""
    text = b"a\r b\nc\n"
    plain = tmp_path / "x.log"
    plain.write_bytes(text)
    gz = tmp_path / "x.log.gz"
    gz.write_bytes(gzip.compress(text))
    renamed = tmp_path / "rotated.1"
    renamed.write_bytes(gzip.compress(text))
    for p in (plain, gz, renamed):
        with open_input(str(p)) as lines:
            assert list(lines) == ["a\r b", "c"]
    from sglang_tuning_exporter.sources.tail import InputLines
    assert list(InputLines("-", stdin=io.BytesIO(text))) == ["a\r b", "c"]


def test_open_input_errors_are_clear(tmp_path: Path) -> None:
    """Missing file, a directory, corrupt gzip: InputError with the path in the message."""
    with pytest.raises(InputError, match="no such file"):
        open_input(str(tmp_path / "missing.log"))
    with pytest.raises(InputError, match="is a directory"):
        open_input(str(tmp_path))
    bad = tmp_path / "bad.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(InputError, match="read failed"), open_input(str(bad)) as lines:
        list(lines)


def test_stream_follower_reads_a_pipe_without_blocking() -> None:
    """stdin-style following: partial lines wait, nothing blocks, EOF flushes the last line."""
    from sglang_tuning_exporter.sources.tail import StreamFollower
    r, w = os.pipe()
    try:
        f = StreamFollower(r, clock=lambda: 7.0)
        assert f.poll() == []  # nothing written yet: returns at once
        os.write(w, b"one\ntw")
        assert f.poll() == ["one"]
        os.write(w, b"o\nthree")
        assert f.poll() == ["two"]
        os.close(w)
        w = -1
        assert f.poll() == ["three"] and f.eof and f.last_data_at == 7.0
        assert f.poll() == []
        assert not os.get_blocking(r)
        f.close()
        assert os.get_blocking(r)  # the stream's own mode is given back (a shell's terminal stays usable)
    finally:
        if w >= 0:
            os.close(w)
        os.close(r)


def test_follower_refuses_a_gzip_log_at_start(tmp_path: Path) -> None:
    """A compressed log is not followed as text (it used to yield its compressed bytes as lines)."""
    log = tmp_path / "server.log.gz"
    log.write_bytes(gzip.compress(b"[2026-01-01 10:00:00] Decode batch, #running-req: 1\n" * 50))
    f = Follower(str(log), from_start=True)
    assert f.poll() == [] and f.problem is not None
    assert f.problem[0] == "read_error" and "gzip" in f.problem[1]


def test_follower_refuses_a_device_at_open_and_after_rotation(tmp_path: Path) -> None:
    """A log path that becomes /dev/zero (a symlink swapped in at rotation) is not read (it used to be
    read for ever, a core burnt); reading resumes when a regular file is back."""
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero here")
    log = tmp_path / "server.log"
    log.write_text("a\n")
    f = Follower(str(log), from_start=True)
    assert f.poll() == ["a"]
    log.rename(tmp_path / "server.log.1")
    os.symlink("/dev/zero", log)
    assert f.poll() == [] and f.offset == 0
    assert f.problem is not None and "device" in f.problem[1]
    log.unlink()
    log.write_text("b\n")
    assert f.poll() == ["b"] and f.problem is None
    assert Follower("/dev/zero", from_start=True).poll() == []
