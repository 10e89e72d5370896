"""Benchmark: `diagnose` of a large SGLang log versus naive one-regex-per-field extraction.

Run on demand:  python bench/bench_diagnose.py [--lines 2000000] [--jobs N] [--repeat 3] [--keep] [--log decode|mixed]

--log decode: our generator (84 % Decode lines, the worst case for diagnose);
--log mixed: the parser benchmark's generator (bench/bench_parse.py: 70 % access lines).
Baselines on either log: the one-regex-per-line Decode field loop, a regex per field, and the parser
benchmark's naive two-field loop (the strictest: it extracts least).  Each timing is the best of
--repeat runs (this machine's timings wander); prints seconds and the ratios (naive / diagnose).
The target is >= 1.5 against the one-regex-per-line loops.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sglang_tuning_exporter.guide.checks import load_table
from sglang_tuning_exporter.guide.config import Config
from sglang_tuning_exporter.offline.diagnose import diagnose_source

STARTUP = [
    "[{ts}] server_args=ServerArgs(model_path='Qwen/Qwen2.5-7B-Instruct', mem_fraction_static=0.88, "
    "max_running_requests=None, chunked_prefill_size=8192, schedule_policy='fcfs', "
    "schedule_conservativeness=1.0, cuda_graph_max_bs=None, dp_size=4, tp_size=1, enable_metrics=False)",
    "[{ts} DP{dp} TP0] Load weight begin. avail mem=78.50 GB",
    "[{ts} DP{dp} TP0] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail mem=63.20 GB, "
    "mem usage=15.30 GB.",
    "[{ts} DP{dp} TP0] KV Cache is allocated. #tokens: 421888, K size: 24.15 GB, V size: 24.15 GB",
    "[{ts} DP{dp} TP0] Memory pool end. avail mem=14.10 GB",
    "[{ts} DP{dp} TP0] Capture cuda graph end. Time elapsed: 14.80 s. mem usage=1.12 GB. avail mem=12.98 GB.",
    "[{ts} DP{dp} TP0] max_total_num_tokens=421888, chunked_prefill_size=8192, max_prefill_tokens=16384, "
    "max_running_requests=4096, context_len=32768, available_gpu_mem=12.98 GB",
]


def generate(path: Path, lines: int, seed: int = 7) -> None:
    """Write a realistic 0.5-era log: startup per DP rank, then Decode/Prefill/retract/access lines."""
    rnd = random.Random(seed)
    t = 1_736_676_000.0
    with path.open("w", encoding="utf-8") as fh:
        n = 0
        for dp in range(4):
            for tmpl in STARTUP[1:] if dp else STARTUP:
                fh.write(tmpl.format(ts=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)), dp=dp) + "\n")
                n += 1
        while n < lines:
            t += 0.25
            ts = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))
            dp = rnd.randrange(4)
            r = rnd.random()
            if r < 0.84:
                run = rnd.randrange(60, 400)
                fh.write(f"[{ts} DP{dp} TP0] Decode batch, #running-req: {run}, #token: {run * 1500}, "
                         f"token usage: {rnd.uniform(0.5, 1.0):.2f}, cuda graph: {run <= 256}, "
                         f"gen throughput (token/s): {rnd.uniform(2000, 6000):.2f}, "
                         f"#queue-req: {rnd.randrange(0, 3000)}, \n")
            elif r < 0.96:
                fh.write(f"[{ts} DP{dp} TP0] Prefill batch, #new-seq: 6, #new-token: {rnd.randrange(1000, 9000)}, "
                         f"#cached-token: {rnd.randrange(0, 4000)}, token usage: {rnd.uniform(0.5, 1.0):.2f}, "
                         f"#running-req: 181, #queue-req: {rnd.randrange(0, 3000)}, \n")
            elif r < 0.995:
                fh.write(f'[{ts}] INFO:     127.0.0.1:{rnd.randrange(30000, 60000)} - "POST /generate HTTP/1.1" 200 OK\n')
            else:
                fh.write(f"[{ts} DP{dp} TP0] KV cache pool is full. Retract requests. #retracted_reqs: 1, "
                         f"#new_tokens_gained: 4608, #new_token_ratio: 0.3811 -> 0.5127\n")
            n += 1


# The naive baseline: a plain loop running ONE regex per line that extracts the fields diagnose needs
# from a Decode line (time, ranks, running, usage, graph, throughput, queue).
NAIVE_ONE = re.compile(r"^\[([0-9-]+ [0-9:]+)((?: [A-Z_]+\d+)*)\] Decode batch.*?#running-req: (\d+), "
                       r".*?token usage: ([0-9.]+), .*?(?:cuda graph: (\w+), )?.*?gen throughput \(token/s\): "
                       r"([0-9.]+), #queue-req: (\d+)")
# A more naive one: one regex per field.
NAIVE = [re.compile(p) for p in (
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", r"DP(\d+)", r"TP(\d+)", r"#running-req: (\d+)", r"#token: (\d+)",
    r"token usage: ([0-9.]+)", r"cuda graph: (\w+)", r"gen throughput \(token/s\): ([0-9.]+)",
    r"#queue-req: (\d+)", r"#new-token: (\d+)", r"#cached-token: (\d+)", r"#retracted_reqs: (\d+)")]


def naive_one(path: Path) -> int:
    """One regex per line extracting the Decode fields (the baseline); returns the lines matched."""
    found = 0
    search = NAIVE_ONE.search
    with path.open(encoding="utf-8", errors="replace", newline="\n") as fh:
        for line in fh:
            m = search(line)
            if m:
                int(m.group(3))
                int(m.group(7))
                found += 1
    return found


def naive(path: Path) -> int:
    """Apply one regex per field to every line; returns the fields found."""
    found = 0
    with path.open(encoding="utf-8", errors="replace", newline="\n") as fh:
        for line in fh:
            fields = {}
            for p in NAIVE:
                m = p.search(line)
                if m:
                    fields[p.pattern] = m.group(1)
            found += len(fields)
    return found


def best_of(run: Callable[[], object], repeat: int) -> float:
    """The best wall time of `repeat` runs of `run` (this machine's timings wander)."""
    times = []
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return min(times)


def clean_up(tmp: Path, keep: bool) -> None:
    """Remove the generated logs and their folder, unless they are to be kept (then say where)."""
    if keep:
        print(f"logs kept in {tmp}")
        return
    for p in tmp.iterdir():
        p.unlink()
    tmp.rmdir()


def main() -> int:
    """Generate (or reuse) the log, time both, print the figures."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lines", type=int, default=2_000_000)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the generated log")
    ap.add_argument("--log", choices=("decode", "mixed"), default="decode")
    ap.add_argument("--repeat", type=int, default=3, help="best of this many runs of each timing")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-diagnose-"))
    log = tmp / "sglang.log"
    t0 = time.perf_counter()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_parse  # the parser benchmark's generator and its naive two-field regex

    if a.log == "mixed":
        bench_parse.generate(log, a.lines)
    else:
        generate(log, a.lines)
    print(f"generated {a.lines} lines, {log.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - t0:.1f} s")

    def best(run: Callable[[], object]) -> float:
        return best_of(run, a.repeat)

    def two_field() -> None:
        search = bench_parse.NAIVE.search
        with log.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                m = search(line)
                if m:
                    int(m.group(1))
                    int(m.group(2))

    t_naive = best(lambda: naive_one(log))
    print(f"naive one-regex-per-line extraction: {t_naive:.2f} s ({t_naive / a.lines * 1e6:.2f} us/line)")
    t_fields = best(lambda: naive(log))
    print(f"naive one-regex-per-field extraction: {t_fields:.2f} s ({t_fields / a.lines * 1e6:.2f} us/line)")
    t_two = best(two_field)
    print(f"naive two-field regex of bench_parse.py: {t_two:.2f} s ({t_two / a.lines * 1e6:.2f} us/line)")
    table = load_table()
    results = []

    def run_diagnose() -> None:
        results[:] = [diagnose_source(str(log), table, Config(), table.default_profile(), "throughput", {},
                                        jobs=a.jobs)]

    t_diag = best(run_diagnose)
    res = results[-1]
    if res.error:
        print("diagnose failed:", res.error)
        return 1
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rss_worker = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"diagnose (jobs={a.jobs or os.cpu_count()}): {t_diag:.2f} s ({t_diag / a.lines * 1e6:.2f} us/line), "
          f"{res.fast_lines} fast-path lines, {res.events} events, {res.evaluations} windows, "
          f"max RSS {rss:.0f} MB (largest worker {rss_worker:.0f} MB)")
    print(f"ratio naive-one-regex-per-line / diagnose: {t_naive / t_diag:.2f} (target >= 1.5)")
    print(f"ratio naive-one-regex-per-field / diagnose: {t_fields / t_diag:.2f}")
    print(f"ratio bench_parse two-field naive / diagnose: {t_two / t_diag:.2f} (target >= 1.5)")
    firing = [f for f in res.findings if f.status in ("warning", "critical")]
    print(f"findings firing: {sorted({f.check for f in firing})}")
    clean_up(tmp, a.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
