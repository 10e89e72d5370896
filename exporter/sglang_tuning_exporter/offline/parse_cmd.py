"""`sglang-tuning-exporter parse FILE|-`: every recognised event of a log as JSON lines."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any, TextIO

from sglang_tuning_exporter.core.events import KINDS
from sglang_tuning_exporter.core.timeparse import LogClock
from sglang_tuning_exporter.sources.logfiles import read_file_events, sniff
from sglang_tuning_exporter.sources.logparse import ParseStats
from sglang_tuning_exporter.sources.logreader import EventReader
from sglang_tuning_exporter.sources.tail import MAX_LINE_BYTES, InputError

_PROG = "sglang-tuning-exporter parse"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of the `parse` subcommand."""
    parser.add_argument("file", metavar="FILE|-", help="log file (plain or gzip) or - for standard input")
    parser.add_argument("--stats", action="store_true",
                        help="print counts by kind, unparsed and truncated lines on stderr")
    parser.add_argument("--kind", action="append", metavar="KIND",
                        help="only print events of this kind (repeatable), e.g. --kind decode")
    parser.add_argument("--max-line-bytes", type=int, default=MAX_LINE_BYTES, metavar="N",
                        help="cut longer lines to N bytes, counted as truncated (default: %(default)s)")


def format_stats(stats: ParseStats) -> str:
    """The human summary written on stderr."""
    d = stats.as_dict()
    kinds = ", ".join(f"{k}={v}" for k, v in d["by_kind"].items()) or "none"
    lines = [f"{d['lines']} lines, {d['events']} events ({kinds}); "
             f"unparsed={d['unparsed']} partial={d['partial']} truncated={d['truncated']} "
             f"implausible_times={d['implausible_times']}"]
    for ex in d["unparsed_examples"][:5]:
        lines.append(f"  unparsed line {ex['line']}: {ex['text'][:160]}")
    return "\n".join(lines)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def event_json(obj: dict[str, Any]) -> str:
    """One JSON line; a `nan`/`inf` printed by the server becomes null (JSON has no NaN), and a value
    JSON has no type for (a set or bytes in `server_args=`) its text."""
    try:
        return json.dumps(obj, allow_nan=False, default=str)
    except ValueError:
        return json.dumps(_finite(obj), default=str)


def write_events(path: str, out: TextIO, *, kinds: set[str] | None = None,
                 max_line_bytes: int = MAX_LINE_BYTES) -> ParseStats:
    """Parse `path` and write its events to `out`; returns the statistics. Raises InputError."""
    if path != "-" and os.path.isfile(path) and sniff(path) == "binary":
        raise InputError(f"{path}: binary data, not a text log")
    reader = EventReader()
    clock = LogClock()  # counts the stamps the evaluators would take at a neighbour's time
    write = out.write
    for e in read_file_events(path, reader=reader, max_line_bytes=max_line_bytes):
        clock.take(e.time)
        if kinds is None or e.kind in kinds:
            write(event_json(e.to_json_dict()) + "\n")
    clock.settle()  # a stamp still held at the end (a last stray line) is an outlier too
    reader.stats.implausible_times = clock.implausible
    return reader.stats


def run(args: argparse.Namespace) -> int:
    """Run `parse`; 0 on success, 1 when the input cannot be read."""
    problems: list[str] = []
    if args.max_line_bytes < 1:
        problems.append("--max-line-bytes must be positive")
    # A mistyped kind would otherwise print nothing and look like a log without such events.
    problems.extend(f"--kind: unknown kind {k!r} (known: {', '.join(KINDS)})"
                    for k in (args.kind or []) if k not in KINDS)
    if problems:
        for problem in problems:
            print(f"{_PROG}: {problem}", file=sys.stderr)
        return 2
    kinds = set(args.kind) if args.kind else None
    try:
        stats = write_events(args.file, sys.stdout, kinds=kinds, max_line_bytes=args.max_line_bytes)
    except InputError as exc:
        print(f"{_PROG}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.flush()
    if args.stats:
        print(format_stats(stats), file=sys.stderr)
    elif stats.unparsed:
        # Lines with a known head that could not be read are never dropped silently.
        print(f"{_PROG}: {stats.unparsed} line(s) with a recognised head could not be parsed "
              f"(first at line {stats.unparsed_examples[0][0]}); use --stats for details", file=sys.stderr)
    return 0
