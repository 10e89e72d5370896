"""Benchmark of the log reader against a naive regex loop and mtail, on a generated mixed log.

Run on demand (not a test):  python bench/bench_parse.py [--lines 2000000] [--keep FILE]

Prints lines/s for
  (a) ours: logfiles.read_file_events (64 KiB blocks, one core), producing full Event objects for
      every recognised line,
  (b) naive: one regex per line in a plain Python loop, extracting #running-req and #queue-req
      (ints) and building nothing,
  (c) mtail --one_shot with an equivalent two-field program (when /usr/bin/mtail is installed),
all from the same run on the same file, each in a fresh process so peak RSS (getrusage) is its own
; ours is also run on a file 10x smaller to
show memory does not grow with the log.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MTAIL = "/usr/bin/mtail"
NAIVE = re.compile(r"#running-req: (\d+).*#queue-req: (\d+)")
MTAIL_PROG = """\
gauge running_req
gauge queue_req
/#running-req: (\\d+).*#queue-req: (\\d+)/ {
  running_req = $1
  queue_req = $2
}
"""

# Share of each line type. A busy online server writes one uvicorn access line per request; the
# scheduler writes one Prefill line per prefill batch (several requests) and one Decode line every
# 40 decode steps per DP rank; retractions are rare; the rest is other chatter.
MIX = (("access", 0.70), ("prefill", 0.17), ("decode", 0.08), ("retract", 0.005), ("other", 0.045))
OTHER = (
    "Cache flushed successfully!",
    "Scheduler.run_batch sleep 180.0s",
    "Using default chat sampling params from model generation config: {'temperature': 0.6}",
    "Endpoint '/get_model_info' is deprecated and will be removed in a future version.",
)


def generate(path: Path, n: int, seed: int = 7) -> None:
    """Write n lines of a realistic mixed SGLang log (4 DP ranks, PD decode fields, prefixes)."""
    rnd = random.Random(seed)
    kinds = [k for k, _ in MIX]
    weights = [w for _, w in MIX]
    t = 1_760_000_000
    with open(path, "w", encoding="utf-8") as f:
        buf: list[str] = []
        for i in range(n):
            if i % 37 == 0:
                t += 1
            ts = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))
            dp = rnd.randrange(4)
            kind = rnd.choices(kinds, weights)[0]
            if kind == "access":
                line = (f'[{ts}] INFO:     10.0.{dp}.{rnd.randrange(256)}:{rnd.randrange(20000, 60000)} - '
                        f'"POST /v1/chat/completions HTTP/1.1" 200 OK')
            elif kind == "prefill":
                line = (f"[{ts} DP{dp} TP{dp} EP{dp}] Prefill batch, #new-seq: {rnd.randrange(1, 9)}, "
                        f"#new-token: {rnd.randrange(1, 16384)}, #cached-token: {rnd.randrange(0, 8192)}, "
                        f"token usage: {rnd.random():.2f}, #running-req: {rnd.randrange(0, 512)}, "
                        f"#queue-req: {rnd.randrange(0, 900)}, #pending-token: 0, cuda graph: False, "
                        f"input throughput (token/s): {rnd.random() * 20000:.2f}")
            elif kind == "decode":
                line = (f"[{ts} DP{dp} TP{dp} EP{dp}] Decode batch, #running-req: {rnd.randrange(1, 1024)}, "
                        f"#token: {rnd.randrange(1, 2_000_000)}, token usage: {rnd.random():.2f}, "
                        f"pre-allocated usage: 0.00, #prealloc-req: 0, #transfer-req: 0, #retracted-req: 0, "
                        f"cuda graph: {rnd.random() < 0.9}, gen throughput (token/s): {rnd.random() * 9000:.2f}, "
                        f"#queue-req: {rnd.randrange(0, 900)}")
            elif kind == "retract":
                line = (f"[{ts} DP{dp} TP{dp} EP{dp}] KV cache pool is full. Retract requests. "
                        f"#retracted_reqs: {rnd.randrange(1, 4)}, #new_tokens_gained: {rnd.randrange(1, 9000)}, "
                        f"#new_token_ratio: 0.3811 -> 0.5127")
            else:
                line = f"[{ts} DP{dp} TP{dp} EP{dp}] {rnd.choice(OTHER)}"
            buf.append(line)
            if len(buf) >= 10000:
                f.write("\n".join(buf) + "\n")
                buf.clear()
        if buf:
            f.write("\n".join(buf) + "\n")


def _maxrss_mb(who: int = resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024.0  # Linux reports KiB


def _cpu_seconds() -> float:
    """User + system time of this process and its finished children (the pool's workers)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        ru = resource.getrusage(who)
        total += ru.ru_utime + ru.ru_stime
    return total


def worker(kind: str, path: str) -> dict[str, Any]:
    """Run one variant in this process and report lines, events, seconds and peak RSS."""
    lines = events = 0
    if kind.startswith("ours"):
        # Imported before the clock starts: the figure is the reading, not the interpreter's start-up.
        from sglang_tuning_exporter.sources.logfiles import read_file_events
        from sglang_tuning_exporter.sources.logreader import EventReader
    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    if kind == "ours":
        reader = EventReader()
        for _e in read_file_events(path, reader=reader):
            events += 1
        lines = reader.stats.lines
    else:
        search = NAIVE.search
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                lines += 1
                m = search(line)
                if m:
                    int(m.group(1))
                    int(m.group(2))
                    events += 1
    seconds = time.perf_counter() - t0
    rss = max(_maxrss_mb(), _maxrss_mb(resource.RUSAGE_CHILDREN))
    cpu = _cpu_seconds() - cpu0
    return {"variant": kind.partition(":")[0], "lines": lines, "events": events, "seconds": seconds,
            "maxrss_mb": rss, "cpu": cpu}


def run_worker(kind: str, path: Path) -> dict[str, Any]:
    """The variant in a fresh interpreter, so its peak RSS is its own."""
    out = subprocess.run([sys.executable, __file__, "--worker", kind, str(path)], check=True,
                         capture_output=True, text=True)
    return dict(json.loads(out.stdout))


def run_mtail(path: Path, n: int) -> dict[str, Any] | None:
    """mtail --one_shot with the two-field program; None when mtail is not installed."""
    if not os.access(MTAIL, os.X_OK):
        return None
    with tempfile.TemporaryDirectory() as progs:
        Path(progs, "sglang.mtail").write_text(MTAIL_PROG)
        before = _maxrss_mb(resource.RUSAGE_CHILDREN)
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run([MTAIL, "--one_shot", "--one_shot_format", "prometheus", "--progs", progs,
                               "--logs", str(path), "--logtostderr"], capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        rss = _maxrss_mb(resource.RUSAGE_CHILDREN)
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
    if proc.returncode != 0 or "queue_req" not in proc.stdout:
        print(f"mtail failed (exit {proc.returncode}): {proc.stderr[-500:]}", file=sys.stderr)
        return None
    return {"variant": "mtail", "lines": n, "events": None, "seconds": seconds, "cpu": cpu,
            "maxrss_mb": rss if rss > before else None}


def micro() -> list[tuple[str, float]]:
    """Per-line costs (best of 5) of the pieces the rates are made of, in microseconds."""
    import timeit

    from sglang_tuning_exporter.sources.grammar import Grammar
    from sglang_tuning_exporter.sources.logparse import parse_line
    access = '[2025-10-09 08:53:21] INFO:     10.0.2.7:41234 - "POST /v1/chat/completions HTTP/1.1" 200 OK'
    other = "[2025-10-09 08:53:21 DP2 TP2 EP2] Scheduler.run_batch sleep 180.0s"
    decode = ("[2025-10-09 08:53:21 DP2 TP2 EP2] Decode batch, #running-req: 405, #token: 1365109, "
              "token usage: 0.05, pre-allocated usage: 0.00, #prealloc-req: 0, #transfer-req: 0, "
              "#retracted-req: 0, cuda graph: True, gen throughput (token/s): 847.17, #queue-req: 596")
    g = Grammar()  # a reader's: learns the layout at its second line
    parse_line(decode, 1, g)
    parse_line(decode, 1, g)
    cases = [("parse_line, uvicorn access line (rejected)", lambda: parse_line(access, 1)),
             ("parse_line, other chatter (rejected)", lambda: parse_line(other, 1)),
             ("parse_line, Decode line (full event, nothing learnt)", lambda: parse_line(decode, 1)),
             ("parse_line, Decode line (full event, a reader's grammar)", lambda: parse_line(decode, 1, g)),
             ("reader shortcut, Decode line (full event)", lambda: g.fast_batch(decode, 1)),
             ("naive regex search, Decode line", lambda: NAIVE.search(decode))]
    n = 20000
    return [(label, min(timeit.repeat(f, number=n, repeat=5)) / n * 1e6) for label, f in cases]


def main() -> int:
    """Generate, run the three variants, print the figures."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=2_000_000, help="lines in the generated log")
    ap.add_argument("--keep", metavar="FILE", help="also copy the generated log to FILE")
    ap.add_argument("--worker", nargs=2, metavar=("KIND", "FILE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp, "bench.log")
        small = Path(tmp, "bench-small.log")
        generate(big, args.lines)
        generate(small, max(1, args.lines // 10))
        if args.keep:
            shutil.copy(big, args.keep)
        size_mb = big.stat().st_size / 1e6
        load = os.getloadavg()[0]
        print(f"log: {args.lines:,} lines, {size_mb:.0f} MB; mix " +
              ", ".join(f"{k} {w:.1%}" for k, w in MIX))
        results = [run_worker("ours", big), run_worker("naive", big)]
        m = run_mtail(big, args.lines)
        if m is not None:
            results.append(m)
        small_ours = run_worker("ours", small)
    ours = results[0]
    print(f"load average before the runs: {load:.1f}, after: {os.getloadavg()[0]:.1f}")
    print(f"{'variant':8} {'lines/s':>12} {'seconds':>8} {'cpu s':>6} {'events':>10} {'peak RSS MB':>12} "
          f"{'ours / this':>11}")
    for r in results:
        rate = r["lines"] / r["seconds"]
        ratios = f"{(ours['lines'] / ours['seconds']) / rate:10.2f}x"
        events = "-" if r["events"] is None else f"{r['events']:,}"
        rss = "-" if r["maxrss_mb"] is None else f"{r['maxrss_mb']:.0f}"
        cpu = "-" if r.get("cpu") is None else f"{r['cpu']:.2f}"
        print(f"{r['variant']:8} {rate:12,.0f} {r['seconds']:8.2f} {cpu:>6} {events:>10} {rss:>12} {ratios}")
    print(f"ours peak RSS: {small_ours['maxrss_mb']:.0f} MB at {small_ours['lines']:,} lines, "
          f"{ours['maxrss_mb']:.0f} MB at {ours['lines']:,} lines")
    if m is None:
        print("mtail: not installed, skipped")
    for label, us in micro():
        print(f"{label:45} {us:6.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
