"""Benchmark: what a large SGLang /metrics costs the sidecar's loop (issue 23).

Builds a synthetic exposition under the 16 MiB body cap with --samples samples of families the
sidecar reads (default 250,000: past the 200,000 sample cap, over ~3900 DP ranks x 64 TP ranks, far
past --ranks.max), then times, over --rounds scrapes of a real `build_sidecar` (real advisor, the
HTTP getter faked to hand the body over at once):
  * job:  the scrape job (parse + interpret + the rank cap), which `serve` runs in a thread of its own;
  * loop: what the loop does with the job's outcome (state, window, counters);
  * tick: the longest tick of a loop ticking every 10 ms while the jobs run in threads (ThreadJobs),
    i.e. how long the log goes unread at worst, GIL contention with the job included.

    python bench/bench_scrape.py                 # 250,000 samples, 3 rounds
    python bench/bench_scrape.py --samples 50000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "exporter"))

from sglang_tuning_exporter.sidecar.jobs import ThreadJobs  # noqa: E402
from sglang_tuning_exporter.sidecar.serve import build_sidecar  # noqa: E402
from sglang_tuning_exporter.sidecar.serveconfig import add_serve_flags, build_config  # noqa: E402

FAMILIES = ("num_queue_reqs", "num_running_reqs", "token_usage", "gen_throughput")


def exposition(samples: int) -> bytes:
    """`samples` lines of four gauge families, one label set per (DP, TP) rank."""
    return "".join(f'sglang:{FAMILIES[i % 4]}{{dp_rank="{i // 4 // 64}",tp_rank="{i // 4 % 64}"}} {i % 100}.5\n'
                   for i in range(samples)).encode()


def main() -> int:
    """Print job, loop and tick times."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=250_000, help="wanted samples in the exposition")
    ap.add_argument("--rounds", type=int, default=3, help="scrapes timed")
    args = ap.parse_args()
    body = exposition(args.samples)
    info = b'{"version": "0.5.23", "tp_size": 64}'
    p = argparse.ArgumentParser()
    add_serve_flags(p)
    cfg = build_config(p.parse_args(["--sglang.url", "http://sglang:30000", "--sglang.scrape-interval", "1s"]))

    def get(url: str, timeout: float) -> bytes:
        return body if url.endswith("/metrics") else info

    print(f"exposition: {args.samples} samples, {len(body) / 2 ** 20:.1f} MiB")
    sc = build_sidecar(cfg, http_get=get)
    sc.tick(0.0)  # server info, a first scrape (counter baselines)
    jobs, loops = [], []
    for i in range(args.rounds):
        t0 = time.perf_counter()
        scraped = sc._scrape_work(float(i + 1))()
        t1 = time.perf_counter()
        sc._apply_scrape(scraped, float(i + 1))
        t2 = time.perf_counter()
        jobs.append(t1 - t0)
        loops.append(t2 - t1)
    print(f"job  (off the loop): median {statistics.median(jobs):.2f} s  ({', '.join(f'{x:.2f}' for x in jobs)})")
    print(f"loop (applying it):  median {statistics.median(loops) * 1000:.0f} ms  "
          f"({', '.join(f'{x * 1000:.0f}' for x in loops)})")

    wake = threading.Event()
    done: list[float] = []

    def counted(url: str, timeout: float) -> bytes:
        if url.endswith("/metrics"):
            done.append(time.monotonic())
        return get(url, timeout)

    sc = build_sidecar(cfg, http_get=counted)
    sc.jobs = ThreadJobs(notify=wake.set)
    longest, start = 0.0, time.monotonic()
    while len(done) <= args.rounds and time.monotonic() - start < 600:
        t0 = time.monotonic()
        sc.tick(time.time(), t0)
        longest = max(longest, time.monotonic() - t0)
        wake.wait(0.01)
        wake.clear()
    print(f"tick (loop every 10 ms, {len(done) - 1} scrapes in threads): longest {longest * 1000:.0f} ms over "
          f"{time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
