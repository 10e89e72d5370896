"""`diagnose FILE...|-`: read whole SGLang logs offline and print the guide's findings.

The sidecar's pipeline run over a file on the log's own clock: blocks of bytes -> the event reader
(the C accelerator's drop-in parses, converts and sums the Decode/Prefill lines it reads) ->
observations -> a window per range (offline/scanner) -> its buckets and the other events merged in order
into the signals window -> the advisor, evaluated window by window (each (check, rank) reports its worst
window; the JSON's signals are the last one's).  Large plain files are cut before `[<digit>` record heads
(logfiles.split_ranges, never inside a traceback), scanned in a process pool and merged in order.
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast

from sglang_tuning_exporter.core.exit_codes import EXIT_FINDINGS, EXIT_OK, EXIT_RUNTIME, EXIT_USAGE
from sglang_tuning_exporter.core.flags import add_flag, add_guide_flags
from sglang_tuning_exporter.core.model import STATUS_CODE
from sglang_tuning_exporter.guide import settings
from sglang_tuning_exporter.guide.checks import CheckTable, TableError, load_table
from sglang_tuning_exporter.guide.config import Config, ConfigError, load_config, parse_server_arg_overrides
from sglang_tuning_exporter.offline import changes as diagnose_changes
from sglang_tuning_exporter.offline import formats as diagnose_formats
from sglang_tuning_exporter.offline.diagnosis import (
    ClockSetBack,
    Diagnosis,
    FileDiagnosis,
    last_log_time,
)
from sglang_tuning_exporter.offline.scanner import ChunkResult, Scanner
from sglang_tuning_exporter.sources.filekind import special_file
from sglang_tuning_exporter.sources.logfiles import LineBlocks, sniff, split_ranges
from sglang_tuning_exporter.sources.tail import InputError

FORMATS = ("text", "json", "markdown", "html")
PARALLEL_MIN_BYTES = 16 << 20  # plain files at least this big are scanned in a process pool
CHUNK_BYTES = 32 << 20  # the most a worker maps at once
MIN_CHUNK_BYTES = 1 << 20
BLOCK_BYTES = 1 << 20  # text scanned at once by the sequential reader of plain files
PROGRESS_MIN_BYTES = 64 << 20


# --- reading ------------------------------------------------------------------------------------
class Progress:
    """A one-line progress bar on stderr (only when it is a terminal and the input is large)."""

    def __init__(self, total: int, label: str, stream: IO[str], enabled: bool) -> None:
        self.total, self.label, self.stream, self.enabled = total, label, stream, enabled
        self._last = 0.0

    def update(self, done: int) -> None:
        """Redraw at most ten times a second."""
        if not self.enabled or self.total <= 0:
            return
        now = time.monotonic()
        if now - self._last < 0.1 and done < self.total:
            return
        self._last = now
        frac = min(1.0, done / self.total)
        bar = "#" * int(frac * 30)
        self.stream.write(f"\r{self.label} [{bar:<30}] {frac * 100:5.1f}%")
        self.stream.flush()

    def close(self) -> None:
        """Clear the line."""
        if self.enabled:
            self.stream.write("\r" + " " * (len(self.label) + 42) + "\r")
            self.stream.flush()


def diagnose_source(source: str, table: CheckTable, cfg: Config, profile: str, workload: str,
                    server_overrides: dict[str, Any], *, jobs: int | None = None,
                    progress_stream: IO[str] | None = None) -> FileDiagnosis:
    """Diagnose one input (path or '-'); errors are returned in `error`, never raised."""
    t0 = time.perf_counter()
    stream = progress_stream if progress_stream is not None else sys.stderr
    try:
        size, kind = 0, "stream"
        if source != "-":
            if os.path.isdir(source):
                raise InputError(f"{source}: is a directory, not a log file")
            if not os.path.exists(source):
                raise InputError(f"{source}: no such file")
            if not os.access(source, os.R_OK):
                raise InputError(f"{source}: cannot read: permission denied")
            why = special_file(source)
            if why is not None:  # /dev/zero would be read for ever, a FIFO blocks without a writer
                raise InputError(f"{source}: {why}")
            size = os.path.getsize(source)
            kind = sniff(source)
            if kind == "binary":
                raise InputError(f"{source}: binary data, not a text log")
        # Standard input cannot be read twice to find its end: its grid is the live one (slower on
        # very long inputs, the same last window).
        d = Diagnosis(table, cfg, profile, workload, server_overrides,
                      end_hint=None if source == "-" else last_log_time(source, kind), live_grid=source == "-")
        tty = bool(getattr(stream, "isatty", lambda: False)())
        progress = Progress(size, os.path.basename(source), stream, tty and size >= PROGRESS_MIN_BYTES)
        workers = jobs if jobs is not None else (os.cpu_count() or 1)
        plain = kind == "text"
        try:
            if plain and size >= PARALLEL_MIN_BYTES and workers > 1:
                _run_parallel(source, size, d, workers, progress)
            else:
                _run_sequential(source, plain, d, progress)
        except ClockSetBack:
            # The fast paths take stamps as written; a clock set back needs the log clock's re-anchoring
            # (timeparse.LogClock), which every line gets on the full path: read it again that way.
            d = Diagnosis(table, cfg, profile, workload, server_overrides, live_grid=True, fast=False)
            _run_sequential(source, plain, d, progress, fast=False)
        progress.close()
        if plain and os.path.getsize(source) < size:
            # Truncated (copytruncate?) while being read: what was read is a partial report.
            raise InputError(f"{source}: truncated while being read ({size} bytes at the start, "
                             f"{os.path.getsize(source)} now): the report would be partial; diagnose a copy")
    except InputError as exc:
        return FileDiagnosis(source=source, error=str(exc), elapsed_s=time.perf_counter() - t0)
    except (OSError, EOFError) as exc:
        return FileDiagnosis(source=source, error=f"{source}: read failed: {exc}", elapsed_s=time.perf_counter() - t0)
    if d.lines == 0:
        return FileDiagnosis(source=source, error=f"{source}: empty input (no lines)", lines=0,
                             elapsed_s=time.perf_counter() - t0)
    if d.nul * 2 > d.lines:
        return FileDiagnosis(source=source, error=f"{source}: binary data, not a text log", lines=d.lines,
                             elapsed_s=time.perf_counter() - t0)
    if d.fast + d.events == 0 and d.unparsed:  # SGLang's lines, none of them read: say so, never "not SGLang"
        return FileDiagnosis(source=source, error=f"{source}: {d.unparsed} SGLang log line(s) in {d.lines} lines, "
                             "none of them read (a message this parser does not know; `parse --stats` lists them)",
                             lines=d.lines, elapsed_s=time.perf_counter() - t0)
    if d.fast + d.events == 0:  # no line was an SGLang event or a fast-path sample
        skipped = f" ({d.oversized} over-long, skipped)" if d.oversized else ""
        return FileDiagnosis(source=source, error=f"{source}: no SGLang log lines found in {d.lines} lines{skipped}",
                             lines=d.lines, elapsed_s=time.perf_counter() - t0)
    out = d.finish(source)
    out.elapsed_s = time.perf_counter() - t0
    return out


def _stdin_bytes() -> IO[bytes]:
    """stdin, gunzipped when it starts with the gzip magic (`zcat` is not needed)."""
    raw = sys.stdin.buffer
    head = raw.peek(2)[:2] if hasattr(raw, "peek") else b""
    return cast(IO[bytes], gzip.GzipFile(fileobj=raw, mode="rb")) if head == b"\x1f\x8b" else raw


def _run_sequential(source: str, plain: bool, d: Diagnosis, progress: Progress, *, fast: bool = True) -> None:
    """Every input form through the one read path: blocks of bytes cut after their last newline."""
    scanner = Scanner(d.res, d.cfg.usage_good, d.window.params.queue_band, fast=fast, origin_s=d.origin)
    if source == "-":
        _run_blocks(_stdin_bytes(), d, scanner, progress)
        return
    with (open(source, "rb") if plain else gzip.open(source, "rb")) as fh:
        _run_blocks(cast(IO[bytes], fh), d, scanner, progress)


def _run_blocks(fh: IO[bytes], d: Diagnosis, scanner: Scanner, progress: Progress) -> None:
    """Blocks of text cut after their last newline, as the parallel workers read a range (an over-long
    line skipped and counted: logfiles.LineBlocks)."""
    blocks = LineBlocks(fh.read, BLOCK_BYTES, scanner.max_line_bytes)
    for block in blocks:
        d.add_chunk(scanner.scan_bytes(block, final=False))
        progress.update(blocks.bytes_read)
    d.oversized += blocks.oversized
    d.add_chunk(scanner.scan_bytes(b"", final=True))


def _run_parallel(source: str, size: int, d: Diagnosis, workers: int, progress: Progress) -> None:
    """Ranges of a large plain file on `workers` processes (offline/parallel.py, imported only here: a
    diagnose on one job never loads multiprocessing)."""
    from sglang_tuning_exporter.offline import parallel

    chunk = max(MIN_CHUNK_BYTES, min(CHUNK_BYTES, size // (workers * 4) or CHUNK_BYTES))
    low, high = d.window.params.queue_band
    jobs = [(source, a, b, d.res, d.cfg.usage_good, low, high, None, d.origin, None)
            for a, b in split_ranges(source, size, chunk)]
    parallel.run_ranges(source, jobs, d, workers, progress.update)


# --- command ------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The diagnose flags."""
    parser.add_argument("files", nargs="+", metavar="FILE", help="SGLang log files (plain or .gz), or - for stdin")
    add_flag(parser, "--format", default="text", choices=FORMATS, help="output format")
    add_flag(parser, "--fail-on", default=None, choices=("warning", "critical"),
             help="exit 3 when a finding at or above this level is present (for CI)")
    add_flag(parser, "--output", default=None, metavar="FILE", help="write the report here instead of stdout")
    add_flag(parser, "--jobs", default=None, type=int, metavar="N",
             help="worker processes for large plain files (default: every core)")
    add_flag(parser, "--same-server", default=False, action="store_true",
             help="the files are one server's logs in time order: judge the flag changes across them")
    add_flag(parser, "--color", default="auto", choices=("auto", "always", "never"),
             help="colour the text table (auto: only on a terminal)")
    add_guide_flags(parser)


def _setup(args: argparse.Namespace) -> tuple[CheckTable, Config, str, str, dict[str, Any]]:
    problems: list[str] = []
    try:
        table = load_table()
    except TableError as exc:
        raise ConfigError(exc.problems) from None
    cfg = Config()
    try:
        cfg = load_config(args.config, table)
    except ConfigError as exc:
        problems.extend(exc.problems)
    profile, workload = settings.resolve(table, cfg, profile=args.guide_profile, workload=args.workload)
    if profile not in table.profiles:
        problems.append(f"--guide-profile: unknown profile {profile!r} (known: {', '.join(table.profiles)})")
    overrides, arg_problems = parse_server_arg_overrides(list(args.server_arg or []))
    problems.extend(arg_problems)
    if args.jobs is not None and args.jobs < 1:
        problems.append("--jobs: must be at least 1")
    if problems:
        raise ConfigError(problems)
    return table, cfg, profile, workload, {**cfg.server_args, **overrides}


def run(args: argparse.Namespace, *, stdout: IO[str] | None = None, stderr: IO[str] | None = None) -> int:
    """Run diagnose; exit status per interfaces.md (0 ok, 1 runtime, 2 usage, 3 --fail-on)."""
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    try:
        table, cfg, profile, workload, overrides = _setup(args)
    except ConfigError as exc:
        err.write("sglang-tuning-exporter diagnose: configuration error:\n")
        for p in exc.problems:
            err.write(f"  - {p}\n")
        return EXIT_USAGE
    if args.files.count("-") > 1:
        err.write("sglang-tuning-exporter diagnose: stdin (-) can be read only once\n")
        return EXIT_USAGE
    color = args.color == "always" or (args.color == "auto" and args.output is None
                                       and bool(getattr(out, "isatty", lambda: False)()))
    same_server = bool(getattr(args, "same_server", False))
    if same_server and len(args.files) > 1:
        return _run_as_one_server(args, out, err, table, cfg, profile, workload, overrides, color)
    # Each input's part is written as it is read (a spool on disk), none kept: memory stays flat in the
    # number of inputs (10,000 small logs took 1.26 GB).
    fmt = args.format
    shape = diagnose_formats.Output(fmt, 2)  # several inputs' parts; one good input is written alone
    found: list[dict[str, Any]] = []
    failed = fire = False
    good, worst = 0, "ok"
    only: FileDiagnosis | None = None  # the first good input, while it may be the only one
    rows: list[str] = []  # HTML: the summary's row of each input (a line each; the parts are spooled)
    with tempfile.TemporaryFile("w+", encoding="utf-8") as spool:
        for source in args.files:
            r = diagnose_source(source, table, cfg, profile, workload, overrides, jobs=args.jobs,
                                progress_stream=err)
            if r.error:
                failed = True
                err.write(f"sglang-tuning-exporter diagnose: {r.error}\n")
                continue
            found.extend(diagnose_changes.file_changes(r, table, cfg, profile, workload, overrides,
                                                       same_server=same_server))
            if good:
                spool.write(shape.sep)
            spool.write(shape.part(r, table, color=color, index=good + 1))
            if fmt == "html":
                rows.append(diagnose_formats.summary_row(r, good + 1))
            good += 1
            only = r if good == 1 else None
            worst = diagnose_formats.worst_status([{"status": worst}, r.document])
            fire = fire or bool(args.fail_on and any(
                STATUS_CODE[f.status] >= STATUS_CODE[args.fail_on] for f in r.findings))
        if good and not _write_output(args, out, err, fmt, found, spool, only, table, color, worst,
                                      diagnose_formats.summary_html(rows)):
            return EXIT_RUNTIME
    if failed:
        return EXIT_RUNTIME
    return EXIT_FINDINGS if fire else EXIT_OK


def _write_output(args: argparse.Namespace, out: IO[str], err: IO[str], fmt: str, found: list[dict[str, Any]],
                  spool: IO[str], only: FileDiagnosis | None, table: CheckTable, color: bool, worst: str,
                  summary: str = "") -> bool:
    """The output (file or `out`): head, the summary of several inputs (HTML), the spooled parts (or the
    only input's, alone), tail."""
    shape = diagnose_formats.Output(fmt, 1 if only is not None else 2)
    head, tail = diagnose_changes.wrap(fmt, shape.head, shape.tail(worst), found)
    try:
        dest = open(args.output, "w", encoding="utf-8") if args.output else None  # noqa: SIM115 - closed below
    except OSError as exc:
        err.write(f"sglang-tuning-exporter diagnose: cannot write {args.output}: {exc.strerror or exc}\n")
        return False
    w = dest if dest is not None else out
    last = ""
    try:
        for piece in _pieces(head + (summary if only is None else ""), spool, only, shape, table, color, tail):
            if piece:
                w.write(piece)
                last = piece
        if dest is None and not last.endswith("\n"):
            w.write("\n")
    except OSError as exc:
        if dest is None:
            raise  # standard output: the command line's one "I/O error" line
        err.write(f"sglang-tuning-exporter diagnose: cannot write {args.output}: {exc.strerror or exc}\n")
        return False
    finally:
        if dest is not None:
            dest.close()
    return True


def _pieces(head: str, spool: IO[str], only: FileDiagnosis | None, shape: diagnose_formats.Output,
            table: CheckTable, color: bool, tail: str) -> Iterator[str]:
    yield head
    if only is not None:
        yield shape.part(only, table, color=color)
    else:
        spool.seek(0)
        while block := spool.read(1 << 20):
            yield block
    yield tail


def _run_as_one_server(args: argparse.Namespace, out: IO[str], err: IO[str], table: CheckTable, cfg: Config,
                       profile: str, workload: str, overrides: dict[str, Any], color: bool) -> int:
    """`--same-server` over several inputs: their changes are read across them, so all are kept."""
    results = [diagnose_source(source, table, cfg, profile, workload, overrides, jobs=args.jobs,
                               progress_stream=err) for source in args.files]
    failed = [r for r in results if r.error]
    for r in failed:
        err.write(f"sglang-tuning-exporter diagnose: {r.error}\n")
    good = [r for r in results if not r.error]
    if good:
        text = diagnose_changes.render(good, args.format, table=table, color=color, cfg=cfg, profile=profile,
                                       workload=workload, overrides=overrides, same_server=True)
        if args.output:
            try:
                Path(args.output).write_text(text, encoding="utf-8")
            except OSError as exc:
                err.write(f"sglang-tuning-exporter diagnose: cannot write {args.output}: {exc.strerror or exc}\n")
                return EXIT_RUNTIME
        else:
            out.write(text)
            if not text.endswith("\n"):
                out.write("\n")
    if failed:
        return EXIT_RUNTIME
    if args.fail_on:
        level = STATUS_CODE[args.fail_on]
        if any(STATUS_CODE[f.status] >= level for r in good for f in r.findings):
            return EXIT_FINDINGS
    return EXIT_OK


__all__ = ["ChunkResult", "Diagnosis", "FileDiagnosis", "Scanner", "add_arguments", "diagnose_source",
           "run"]
