#!/usr/bin/env python3
"""Replay a recorded SGLang log into a file line by line, so the stack can be seen without a GPU.

Used by the `demo` profile of docker-compose.yml: it appends examples/recorded.log to the log volume
the sidecar tails, one line every --interval seconds, and starts over when it reaches the end
(after truncating the file with --truncate-on-loop, which exercises the sidecar's truncation handling).
Standard library only: it runs in the sidecar image.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TextIO


def replay(lines: Iterable[str], out: TextIO, interval: float, sleep: Callable[[float], None]) -> int:
    """Append each line (newline-terminated) and flush, pausing `interval` seconds between lines."""
    count = 0
    for line in lines:
        out.write(line if line.endswith("\n") else line + "\n")
        out.flush()
        count += 1
        if interval > 0:
            sleep(interval)
    return count


def main(argv: Sequence[str] | None = None, sleep: Callable[[float], None] = time.sleep) -> int:
    """Command line: exit 0 when done, 2 on a usage problem (missing input)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, type=Path, help="recorded SGLang log to replay")
    parser.add_argument("--output", required=True, type=Path, help="log file the sidecar tails")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between lines (default 0.5)")
    parser.add_argument("--loop", action="store_true", help="start over at the end, forever")
    parser.add_argument("--truncate-on-loop", action="store_true",
                        help="truncate the output before each new pass (like a log rotated by copytruncate)")
    args = parser.parse_args(argv)
    if not args.input.is_file():
        print(f"replay: --input {args.input} is not a readable file", file=sys.stderr)
        return 2
    if args.interval < 0:
        print("replay: --interval must be >= 0", file=sys.stderr)
        return 2
    lines = args.input.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    if not lines:
        print(f"replay: --input {args.input} is empty", file=sys.stderr)
        return 2
    args.output.parent.mkdir(parents=True, exist_ok=True)
    first = True
    while first or args.loop:
        mode = "w" if (args.truncate_on_loop and not first) else "a"
        with args.output.open(mode, encoding="utf-8") as out:
            n = replay(lines, out, args.interval, sleep)
        print(f"replay: wrote {n} lines to {args.output}", file=sys.stderr, flush=True)
        first = False
    return 0


if __name__ == "__main__":
    sys.exit(main())
