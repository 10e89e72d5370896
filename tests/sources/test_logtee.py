"""logtee: the rotating tee of the deploy files keeps the log handoff bounded, never splits a line, and the
sidecar's follower reads every line across its rotations."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_tuning_exporter.sources import logtee
from sglang_tuning_exporter.sources.tail import Follower

LINE = b"[2025-01-12 10:11:12 TP0] Decode batch. #running-req: 233, #token: 370959, token usage: 0.82\n"


def _sizes(path: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(path.parent.glob(path.name + "*"))}


def test_rotation_bounds_the_files_and_keeps_whole_lines(tmp_path: Path) -> None:
    """After 1000 lines with a 1000-byte limit and 2 backups: 3 files, each under limit + one line, each
    holding whole lines only; the newest lines are in the live file."""
    path = tmp_path / "sglang.log"
    writer = logtee.RotatingWriter(str(path), max_bytes=1000, backups=2)
    lines = [LINE.replace(b"233", str(i).encode()) for i in range(1000)]
    assert logtee.copy(lines, writer, None) == 1000
    writer.close()
    sizes = _sizes(path)
    assert set(sizes) == {"sglang.log", "sglang.log.1", "sglang.log.2"}
    assert all(size < 1000 + len(LINE) + 4 for size in sizes.values()), sizes
    for name in sizes:
        data = (tmp_path / name).read_bytes()
        assert data.endswith(b"\n") or not data
        assert all(part.startswith(b"[2025-") for part in data.splitlines())
    assert path.read_bytes().splitlines()[-1] == lines[-1].rstrip(b"\n")
    assert writer.rotations > 50


def test_a_partial_line_is_never_rotated_away(tmp_path: Path) -> None:
    """A line without its newline yet (EOF mid-line) stays in the live file; rotation waits for a line end."""
    path = tmp_path / "x.log"
    writer = logtee.RotatingWriter(str(path), max_bytes=10, backups=1)
    writer.write_line(b"0123456789abcdef")  # over the limit, but no newline: no rotation
    assert writer.rotations == 0
    writer.write_line(b"\n")
    assert writer.rotations == 1 and (tmp_path / "x.log.1").read_bytes() == b"0123456789abcdef\n"
    writer.close()


def test_follower_reads_every_line_across_rotations(tmp_path: Path) -> None:
    """The sidecar's Follower, polled between writes, sees each line exactly once while logtee rotates."""
    path = tmp_path / "sglang.log"
    writer = logtee.RotatingWriter(str(path), max_bytes=600, backups=1)
    follower = Follower(str(path), from_start=True, clock=lambda: 0.0)
    seen: list[str] = []
    sent: list[str] = []
    for i in range(300):
        line = f"[2025-01-12 10:11:12 TP0] line {i} " + "x" * (i % 40)
        sent.append(line)
        writer.write_line(line.encode() + b"\n")
        if i % 3 == 0:  # the writer may rotate between two polls
            seen += follower.poll()
    seen += follower.poll()
    writer.close()
    assert seen == sent
    assert follower.rotations == writer.rotations > 20


def test_echo_to_stdout_survives_a_closed_reader(tmp_path: Path) -> None:
    """Output is copied to stdout; if stdout breaks, the file still gets every line."""
    class Broken(io.BytesIO):
        def write(self, data: bytes) -> int:  # type: ignore[override]
            raise BrokenPipeError

    out = io.BytesIO()
    writer = logtee.RotatingWriter(str(tmp_path / "a.log"), 10_000, 1)
    assert logtee.copy([b"a\n", b"b\n"], writer, out) == 2 and out.getvalue() == b"a\nb\n"
    writer2 = logtee.RotatingWriter(str(tmp_path / "b.log"), 10_000, 1)
    assert logtee.copy([b"a\n", b"b\n"], writer2, Broken()) == 2
    writer.close()
    writer2.close()
    assert (tmp_path / "b.log").read_bytes() == b"a\nb\n"


@pytest.mark.parametrize("args", [["--max-bytes", "0"], ["--backups", "0"]])
def test_bad_limits_are_a_usage_error(tmp_path: Path, args: list[str]) -> None:
    """Zero limits exit 2 with a message, before anything is read."""
    assert logtee.main([str(tmp_path / "l.log"), *args]) == 2


def test_runs_as_a_standalone_script_in_a_pipe(tmp_path: Path) -> None:
    """As the deploy files run it: `... | python3 logtee.py FILE --max-bytes N`, by path, outside the
    package (the SGLang image has only the file), exit 0 at EOF, stdout a copy of the input."""
    script = tmp_path / "opt" / "logtee.py"
    script.parent.mkdir()
    script.write_bytes(Path(logtee.__file__).read_bytes())
    data = b"".join(LINE for _ in range(50))
    proc = subprocess.run([sys.executable, "-I", str(script), str(tmp_path / "s.log"), "--max-bytes", "2000"],
                          input=data, capture_output=True, timeout=60, check=False, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == data
    assert (tmp_path / "s.log.1").read_bytes() + (tmp_path / "s.log").read_bytes() == data[-(
        len((tmp_path / "s.log.1").read_bytes()) + len((tmp_path / "s.log").read_bytes())):]
