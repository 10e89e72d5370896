"""diagnose's parallel path: ranges of one large plain file scanned by worker processes, merged in file
order. Its own module so that a one-job diagnose never imports multiprocessing or concurrent.futures."""

from __future__ import annotations

import itertools
import multiprocessing
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from sglang_tuning_exporter.offline.diagnosis import Diagnosis
from sglang_tuning_exporter.offline.scanner import ChunkResult, ScanJob, scan_range
from sglang_tuning_exporter.sources.logrecords import DEDUP_DISTANCE
from sglang_tuning_exporter.sources.tail import InputError


def run_ranges(source: str, jobs: Sequence[ScanJob], d: Diagnosis, workers: int,
               progress: Callable[[int], None]) -> None:
    """Scan `jobs` (ranges of `source`) on `workers` processes into `d`, in file order; `progress` gets
    each merged range's end offset."""
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    last_oom: tuple[int, str] | None = None  # absolute line and message of the last OOM merged so far
    before: bool | None = None  # a start seen and no batch yet, as a sequential read knows it here
    # An executor, not a Pool: a worker that dies (SIGBUS on a mapped file truncated meanwhile) is an
    # error here, where a Pool would wait for its lost task for ever.
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        for job, res in zip(jobs, _results(pool, jobs, source, 2 * workers), strict=True):
            off = d.line_offset
            blind = res.blind_check
            if (last_oom is not None and blind is not None and blind + off - last_oom[0] < DEDUP_DISTANCE) \
                    or (before and res.blind_init is not None):
                # A traceback re-raising an OOM of an earlier range, or a phase-less OOM after a start an
                # earlier range saw: scan this range again knowing both (the OOM numbered relative to the
                # range), as a sequential read does.
                known = (last_oom[0] - off, last_oom[1]) if last_oom is not None else None
                res = scan_range((*job[:7], known, job[8], before))
            if res.before_batches is not None:
                before = res.before_batches
            if res.last_oom is not None:
                last_oom = (res.last_oom[0] + off, res.last_oom[1])
            d.add_chunk(res)
            progress(job[2])


def _results(pool: ProcessPoolExecutor, jobs: Sequence[ScanJob], source: str, ahead: int) -> Iterator[ChunkResult]:
    """The ranges' results in file order, at most `ahead` of them in flight (memory stays flat however
    long the file: a slow merge never lets finished ranges pile up)."""
    todo = iter(jobs)
    try:
        # Inside the try: a worker may die before the last of the first jobs is submitted.
        pending = deque(pool.submit(scan_range, job) for job in itertools.islice(todo, ahead))
        while pending:
            res = pending.popleft().result()
            nxt = next(todo, None)
            if nxt is not None:
                pending.append(pool.submit(scan_range, nxt))
            yield res
    except BrokenProcessPool as exc:
        raise InputError(f"{source}: a reader process died ({exc}): the file was truncated while being read, or "
                         "the process was killed (out of memory?)") from None
