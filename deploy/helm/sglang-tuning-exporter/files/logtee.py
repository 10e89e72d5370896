"""`tee` with size-based rotation: the log handoff from SGLang to the sidecar that cannot fill a disk.

    python3 -m sglang.launch_server ... 2>&1 | python3 logtee.py /logs/sglang.log --max-bytes 100000000

Copies stdin to stdout (so `kubectl logs` / `docker compose logs` still show SGLang) and to FILE; when
FILE reaches --max-bytes at a line end it becomes FILE.1 (FILE.1 -> FILE.2 ... up to --backups) and a
new FILE starts, so the volume never holds more than (backups + 1) * max-bytes plus one line. One
writer process renames, so no line is split across files or lost; the sidecar's follower drains the
renamed file, then reads the new one (tail.py). SGLang's own `SGLANG_LOGGING_CONFIG_PATH` with a
RotatingFileHandler is the other way (docs/deploy.md says why it is not the default).

Standard library only and a single file: the deploy files run it with the SGLang image's Python
(the Kubernetes example mounts it from a ConfigMap, docker-compose from this repository).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from typing import BinaryIO

DEFAULT_MAX_BYTES = 100_000_000
DEFAULT_BACKUPS = 1


class RotatingWriter:
    """Appends lines to `path`, rotating at a line end once the file holds `max_bytes` or more."""

    def __init__(self, path: str, max_bytes: int, backups: int) -> None:
        if max_bytes < 1 or backups < 1:
            raise ValueError("max_bytes and backups must be at least 1")
        self.path, self.max_bytes, self.backups = path, max_bytes, backups
        self.rotations = 0
        self._file: BinaryIO = open(path, "ab")  # noqa: SIM115 - held open across writes
        self._size = self._file.tell()

    def write_line(self, line: bytes) -> None:
        """Write one line (with its newline, if any); rotate after it when the file is full."""
        self._file.write(line)
        self._file.flush()  # the follower reads as lines arrive, as with PYTHONUNBUFFERED
        self._size += len(line)
        if self._size >= self.max_bytes and line.endswith(b"\n"):
            self.rotate()

    def rotate(self) -> None:
        """FILE.(n-1) -> FILE.n ... FILE -> FILE.1; then a new, empty FILE."""
        self._file.close()
        for n in range(self.backups - 1, 0, -1):
            if os.path.exists(f"{self.path}.{n}"):
                os.replace(f"{self.path}.{n}", f"{self.path}.{n + 1}")
        os.replace(self.path, f"{self.path}.1")
        self._file = open(self.path, "ab")  # noqa: SIM115
        self._size = 0
        self.rotations += 1

    def close(self) -> None:
        """Close the current file."""
        self._file.close()


def copy(lines: Iterable[bytes], writer: RotatingWriter, echo: BinaryIO | None) -> int:
    """Copy every line to the writer (and to `echo`); the number of lines."""
    n = 0
    for line in lines:
        if echo is not None:
            try:
                echo.write(line)
                echo.flush()
            except (BrokenPipeError, OSError):
                echo = None  # nobody reads stdout any more: keep feeding the file
        writer.write_line(line)
        n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    """Command line; exit 0 at the end of input, 2 on a usage error."""
    ap = argparse.ArgumentParser(prog="logtee", description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES, help="rotate at this size")
    ap.add_argument("--backups", type=int, default=DEFAULT_BACKUPS, help="rotated files kept")
    ap.add_argument("--no-stdout", action="store_true", help="do not copy to stdout")
    args = ap.parse_args(argv)
    try:
        writer = RotatingWriter(args.file, args.max_bytes, args.backups)
    except (ValueError, OSError) as exc:
        print(f"logtee: {exc}", file=sys.stderr)
        return 2
    try:
        copy(sys.stdin.buffer, writer, None if args.no_stdout else sys.stdout.buffer)
    finally:
        writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
