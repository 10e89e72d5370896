"""Benchmark the `serve` sidecar: CPU and memory under load, and /metrics latency at 64 ranks.

Runs the real `sglang-tuning-exporter serve` as a child process against
  * a log growing at --rate lines/s (Decode/Prefill lines of 64 DP ranks, a few retractions), and
  * a stand-in SGLang (/metrics = the real 0.5.23 exposition, /server_info) scraped every second,
while this process scrapes the sidecar's own /metrics every second like Prometheus would.
Prints CPU seconds per minute, % of one core, peak RSS and /metrics response times.

    python bench/bench_sidecar.py              # one minute
    python bench/bench_sidecar.py --seconds 15 # shorter
Targets (docs/sidecar.md): < 2 % of one core, < 80 MB RSS, /metrics < 10 ms at 64 ranks.

Soak (memory and CPU over time, not a timed test; run on demand):

    python bench/bench_sidecar.py --soak                   # 10 minutes, 2000 lines/s, 64 ranks
    python bench/bench_sidecar.py --soak --soak-minutes 3  # shorter
    python bench/bench_sidecar.py --soak --tracemalloc 25  # also: which allocation sites grow

prints RSS and CPU every --soak-every seconds and at the end, the RSS slope over the second half,
and (with --tracemalloc N) the N source lines whose live allocations grew most between the first
sample after warm-up and the end. Target: RSS < 80 MB at the default 10-minute window.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from helpers.netutil import announced_port  # noqa: E402  (the tests' helper: how serve announces its port)

METRICS = (ROOT / "tests" / "fixtures" / "metrics" / "sglang-0.5.23-metrics.txt").read_bytes()
SERVER_INFO = (ROOT / "tests" / "fixtures" / "sglang-0.5.23-server_info-toplevel.json").read_bytes()
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> float:
    """Resident set size in MB, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def log_line(i: int, ranks: int) -> str:
    """One SGLang 0.5.2x log line for rank i % ranks (mostly Decode, some Prefill, rare retractions)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    dp = i % ranks
    prefix = f"[{stamp} DP{dp} TP0]"
    running = 100 + (i * 7) % 200
    queue = (i * 13) % 900
    usage = 0.6 + ((i * 11) % 39) / 100
    if i % 997 == 0:
        return (f"{prefix} KV cache pool is full. Retract requests. #retracted_reqs: 2, #new_tokens_gained: 3000, "
                f"#new_token_ratio: 0.4000 -> 0.5000")
    if i % 5 == 0:
        return (f"{prefix} Prefill batch, #new-seq: 3, #new-token: 2400, #cached-token: 800, token usage: {usage:.2f}, "
                f"#running-req: {running}, #queue-req: {queue}, #pending-token: 0, cuda graph: False, "
                f"input throughput (token/s): 9000.00")
    return (f"{prefix} Decode batch, #running-req: {running}, #token: {int(usage * 400000)}, token usage: {usage:.2f}, "
            f"cuda graph: {running <= 256}, gen throughput (token/s): {running * 21.5:.2f}, #queue-req: {queue}")


class StandIn:
    """SGLang stand-in on 127.0.0.1: /metrics and /server_info."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = {"/metrics": METRICS, "/server_info": SERVER_INFO}.get(self.path)
                self.send_response(200 if body else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


def writer(path: Path, rate: int, ranks: int, stop: threading.Event, counter: list[int]) -> None:
    """Append `rate` lines per second in 10 batches per second."""
    batch = max(1, rate // 10)
    i = 0
    next_t = time.monotonic()
    with path.open("a", buffering=1 << 16) as f:
        while not stop.is_set():
            f.write("\n".join(log_line(i + k, ranks) for k in range(batch)) + "\n")
            f.flush()
            i += batch
            counter[0] = i
            next_t += 0.1
            stop.wait(max(0.0, next_t - time.monotonic()))


# Runs `python -m sglang_tuning_exporter ARGS` with tracemalloc on; SIGUSR1 dumps a snapshot to
# $BENCH_TRACEMALLOC_OUT.<n> (the bench reads them afterwards: nothing of the package is imported here).
TRACED_CHILD = """
import os, runpy, signal, sys, tracemalloc
tracemalloc.start(int(os.environ["BENCH_TRACEMALLOC_FRAMES"]))
out, n = os.environ["BENCH_TRACEMALLOC_OUT"], [0]
def dump(*_):
    n[0] += 1
    tracemalloc.take_snapshot().dump(f"{out}.{n[0]:03d}")
    open(f"{out}.{n[0]:03d}.done", "w").close()
signal.signal(signal.SIGUSR1, dump)
sys.argv[0] = "sglang_tuning_exporter"
runpy.run_module("sglang_tuning_exporter", run_name="__main__", alter_sys=True)
"""


def start_serve(log: Path, standin: StandIn, ranks: int, window: str | None,
                trace_out: str | None = None) -> tuple[subprocess.Popen[str], int]:
    """Start `serve` on the log and the stand-in; returns the process and its port (stderr drained)."""
    serve_args = ["serve", "--web.listen-address", "127.0.0.1:0", "--sglang.log-file", str(log),
                  "--sglang.url", standin.url, "--sglang.scrape-interval", "1s",
                  "--ranks.max", str(max(256, ranks * 2))]
    if window:
        serve_args += ["--window", window]
    env = dict(os.environ, SGLANG_TUNING_LOG_LEVEL="info")
    if trace_out:
        env.update(BENCH_TRACEMALLOC_OUT=trace_out, BENCH_TRACEMALLOC_FRAMES="1")
        cmd = [sys.executable, "-c", TRACED_CHILD, *serve_args]
    else:
        cmd = [sys.executable, "-m", "sglang_tuning_exporter", *serve_args]
    child = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    assert child.stderr is not None
    port = announced_port(child.stderr)
    if port is None:
        child.kill()
        raise SystemExit("serve did not start")
    errors = child.stderr
    threading.Thread(target=lambda: [None for _ in errors], daemon=True).start()  # drain
    return child, port


def stop_serve(child: subprocess.Popen[str]) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    child.terminate()
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        child.kill()


def take_snapshot(child: subprocess.Popen[str], trace_out: str, timeout_s: float = 60.0) -> str | None:
    """Ask the traced child for a tracemalloc snapshot; the file's path, or None when none came."""
    before = set(glob.glob(trace_out + ".*.done"))
    child.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        new = set(glob.glob(trace_out + ".*.done")) - before
        if new:
            return min(new).removesuffix(".done")
        time.sleep(0.2)
    return None


def print_growth(first: str, last: str, top: int) -> None:
    """The source lines whose live allocations grew most between two snapshots (bench-side, no package import)."""
    keep = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib*")]
    old = tracemalloc.Snapshot.load(first).filter_traces(keep)
    new = tracemalloc.Snapshot.load(last).filter_traces(keep)
    total_old = sum(s.size for s in old.statistics("filename"))
    total_new = sum(s.size for s in new.statistics("filename"))
    print(f"tracemalloc         traced Python heap {total_old / 2**20:.1f} -> {total_new / 2**20:.1f} MB; "
          f"top {top} growing lines (size now, growth, blocks now):")
    for stat in new.compare_to(old, "lineno")[:top]:
        frame = stat.traceback[0]
        name = frame.filename.split("site-packages/")[-1].split("exporter/")[-1]
        print(f"  {name}:{frame.lineno:<5} {stat.size / 1024:9.0f} KiB  {stat.size_diff / 1024:+9.0f} KiB  "
              f"{stat.count:8d}")


def soak(args: argparse.Namespace) -> int:
    """--soak: RSS and CPU of serve over --soak-minutes at --rate lines/s, sampled every --soak-every s."""
    standin = StandIn()
    samples: list[tuple[float, float, float, int]] = []  # (t since start, RSS MB, CPU s, lines written)
    snapshots: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "sglang.log"
        log.write_text("")
        trace_out = str(Path(tmp) / "heap") if args.tracemalloc else None
        child, port = start_serve(log, standin, args.ranks, args.window, trace_out)
        url = f"http://127.0.0.1:{port}/metrics"
        stop = threading.Event()
        written = [0]
        w = threading.Thread(target=writer, args=(log, args.rate, args.ranks, stop, written), daemon=True)
        body = b""
        t0 = time.monotonic()
        w.start()
        print(f"soak: {args.rate} lines/s over {args.ranks} ranks for {args.soak_minutes:g} min, window "
              f"{args.window or 'default (10m)'}; our /metrics scraped every {args.metrics_every:g} s")
        print(f"{'t (s)':>7} {'RSS MB':>7} {'CPU %':>6} {'lines/s':>8}")
        try:
            next_scrape = next_sample = t0
            end = t0 + args.soak_minutes * 60
            while True:
                now = time.monotonic()
                if now >= next_scrape:
                    body = urllib.request.urlopen(url, timeout=10).read()
                    next_scrape += args.metrics_every
                if now >= next_sample or now >= end:
                    samples.append((now - t0, rss_mb(child.pid), cpu_seconds(child.pid), written[0]))
                    if len(samples) > 1:
                        (ta, _, ca, la), (tb, rb, cb, lb) = samples[-2], samples[-1]
                        print(f"{tb:7.0f} {rb:7.1f} {100 * (cb - ca) / (tb - ta):6.2f} "
                              f"{(lb - la) / (tb - ta):8.0f}", flush=True)
                    else:
                        print(f"{0:7.0f} {samples[0][1]:7.1f}", flush=True)
                    if trace_out and not snapshots and now - t0 >= args.warmup:
                        snap = take_snapshot(child, trace_out)
                        snapshots += [snap] if snap else []
                    next_sample += args.soak_every
                if now >= end:
                    break
                time.sleep(min(0.5, max(0.0, end - now)))
            body = urllib.request.urlopen(url, timeout=10).read()  # the state at the end, for the summary
            if trace_out:
                snap = take_snapshot(child, trace_out)
                snapshots += [snap] if snap else []
            stop.set()
            if len(snapshots) == 2:
                print_growth(snapshots[0], snapshots[1], args.tracemalloc)
        finally:
            stop.set()
            stop_serve(child)
            standin.server.shutdown()
    text = body.decode()
    tracked = re.search(r"^sglang_tuning_tracked_ranks (\S+)", text, re.M)
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    rss = [s[1] for s in samples]
    (ta, _, ca, la), (tb, rb, cb, lb) = samples[0], samples[-1]
    half = [s for s in samples if s[0] >= tb / 2]
    slope = (half[-1][1] - half[0][1]) / max(1e-9, (half[-1][0] - half[0][0]) / 60) if len(half) > 1 else 0.0
    print(f"duration            {tb:.0f} s, {lb - la} lines ({(lb - la) / tb:.0f}/s), {args.ranks} ranks in log; "
          f"tracked ranks {tracked.group(1) if tracked else '?'}, /metrics {series} series")
    last = [s for s in samples if s[0] >= tb - 60]
    last_slope = ((last[-1][1] - last[0][1]) / max(1e-9, (last[-1][0] - last[0][0]) / 60)
                  if len(last) > 1 else 0.0)
    print(f"RSS                 end {rb:.1f} MB, peak {max(rss):.1f} MB, first {rss[0]:.1f} MB; "
          f"second half {slope:+.2f} MB/min, last minute {last_slope:+.2f} MB/min (target < 80 MB; "
          f"flat only once the window is full)")
    print(f"CPU                 {100 * (cb - ca) / tb:.2f} % of one core over the run"
          + (" (tracemalloc on: CPU and RSS inflated)" if trace_out else ""))
    return 0


def main() -> int:
    """Run the benchmark and print the figures."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0, help="measured duration (default 60)")
    ap.add_argument("--rate", type=int, default=1000, help="log lines per second (default 1000)")
    ap.add_argument("--ranks", type=int, default=64, help="DP ranks in the log (default 64)")
    ap.add_argument("--warmup", type=float, default=5.0,
                    help="seconds before measuring (default 5); --soak --tracemalloc: when the first snapshot is taken")
    ap.add_argument("--metrics-every", type=float, default=15.0,
                    help="how often our /metrics is scraped during the CPU measurement (default 15 s)")
    ap.add_argument("--latency-samples", type=int, default=30, help="/metrics requests timed at the end")
    ap.add_argument("--window", default=None,
                    help="serve --window (default: serve's 10m; e.g. 1m fills the window, 60 buckets per rank, "
                         "within the run: the steady-state cost of signals)")
    ap.add_argument("--soak", action="store_true",
                    help="soak mode: RSS/CPU over time at 2000 lines/s (unless --rate is given)")
    ap.add_argument("--soak-minutes", type=float, default=10.0, help="soak duration in minutes (default 10)")
    ap.add_argument("--soak-every", type=float, default=15.0, help="soak: seconds between RSS samples (default 15)")
    ap.add_argument("--tracemalloc", type=int, default=0, metavar="N",
                    help="soak: run serve under tracemalloc and print the N most-growing source lines")
    args = ap.parse_args()
    if args.soak:
        if "--rate" not in sys.argv[1:]:
            args.rate = 2000
        return soak(args)

    standin = StandIn()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "sglang.log"
        log.write_text("")
        child, port = start_serve(log, standin, args.ranks, args.window)
        url = f"http://127.0.0.1:{port}/metrics"
        stop = threading.Event()
        written = [0]
        w = threading.Thread(target=writer, args=(log, args.rate, args.ranks, stop, written), daemon=True)
        w.start()
        try:
            time.sleep(args.warmup)
            cpu0, t0, lines0 = cpu_seconds(child.pid), time.monotonic(), written[0]
            peak_rss = 0.0
            next_scrape = t0
            while time.monotonic() - t0 < args.seconds:
                if time.monotonic() >= next_scrape:  # Prometheus scraping us
                    urllib.request.urlopen(url, timeout=10).read()
                    next_scrape += args.metrics_every
                peak_rss = max(peak_rss, rss_mb(child.pid))
                time.sleep(0.5)
            cpu1, t1, lines1 = cpu_seconds(child.pid), time.monotonic(), written[0]
            stop.set()  # quiet log: time /metrics alone, with the state at full size
            time.sleep(1.5)
            latencies: list[float] = []
            size = 0
            idle0, idle_t0 = cpu_seconds(child.pid), time.monotonic()
            time.sleep(3.0)  # the loop's own CPU while idle, subtracted below
            idle_rate = (cpu_seconds(child.pid) - idle0) / (time.monotonic() - idle_t0)
            cpu_l0, lat_t0 = cpu_seconds(child.pid), time.monotonic()
            for _ in range(args.latency_samples):
                start = time.perf_counter()
                with urllib.request.urlopen(url, timeout=10) as resp:
                    body = resp.read()
                latencies.append((time.perf_counter() - start) * 1000)
                size = len(body)
                time.sleep(0.05)
            busy = cpu_seconds(child.pid) - cpu_l0 - idle_rate * (time.monotonic() - lat_t0)
            cpu_per_scrape = max(0.0, busy) / args.latency_samples
            text = body.decode()
        finally:
            stop.set()
            stop_serve(child)
            standin.server.shutdown()
    wall = t1 - t0
    cpu = cpu1 - cpu0
    tracked = re.search(r"^sglang_tuning_tracked_ranks (\S+)", text, re.M)
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    lat = sorted(latencies)
    print(f"duration            {wall:.1f} s measured after {args.warmup:.0f} s warm-up")
    print(f"log lines written   {lines1 - lines0} ({(lines1 - lines0) / wall:.0f}/s), ranks in log {args.ranks}")
    print(f"tracked ranks       {tracked.group(1) if tracked else '?'}; /metrics {series} series, {size / 1024:.0f} KiB")
    print(f"CPU                 {cpu / wall * 60:.2f} CPU-seconds per minute = {100 * cpu / wall:.2f} % of one core")
    print(f"CPU, log quiet      {100 * idle_rate:.2f} % of one core (SGLang scrape + evaluations only)")
    print(f"peak RSS            {peak_rss:.1f} MB")
    print(f"/metrics scraped    every {args.metrics_every:g} s during the CPU measurement; SGLang scraped every 1 s")
    print(f"/metrics over HTTP  p50 {statistics.median(lat):.2f} ms, p95 {lat[int(0.95 * (len(lat) - 1))]:.2f} ms, "
          f"max {lat[-1]:.2f} ms ({len(lat)} scrapes, log quiet; sidecar CPU per scrape "
          f"~{cpu_per_scrape * 1000:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
