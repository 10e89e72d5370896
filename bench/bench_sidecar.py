"""Benchmark the `serve` sidecar: CPU and memory under load, and /metrics latency at 64 ranks.

Runs the real `sglang-tuning-exporter serve` as a child process against
  * a log growing at --rate lines/s (Decode/Prefill lines of 64 DP ranks, a few retractions), and
  * a stand-in SGLang (/metrics = the real 0.5.23 exposition, /server_info) scraped every second,
while this process scrapes the sidecar's own /metrics every second like Prometheus would.
Prints CPU seconds per minute, % of one core, peak RSS and /metrics response times.

    python bench/bench_sidecar.py              # one minute
    python bench/bench_sidecar.py --seconds 15 # shorter
Targets (docs/sidecar.md): < 2 % of one core, < 80 MB RSS, /metrics < 10 ms at 64 ranks.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from netutil import announced_port  # noqa: E402  (the tests' helper: how serve announces its port)

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


def main() -> int:
    """Run the benchmark and print the figures."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0, help="measured duration (default 60)")
    ap.add_argument("--rate", type=int, default=1000, help="log lines per second (default 1000)")
    ap.add_argument("--ranks", type=int, default=64, help="DP ranks in the log (default 64)")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds before measuring (default 5)")
    ap.add_argument("--metrics-every", type=float, default=15.0,
                    help="how often our /metrics is scraped during the CPU measurement (default 15 s)")
    ap.add_argument("--latency-samples", type=int, default=30, help="/metrics requests timed at the end")
    ap.add_argument("--window", default=None,
                    help="serve --window (default: serve's 10m; e.g. 1m fills the window, 60 buckets per rank, "
                         "within the run: the steady-state cost of signals)")
    args = ap.parse_args()

    standin = StandIn()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "sglang.log"
        log.write_text("")
        cmd = [sys.executable, "-m", "sglang_tuning_exporter", "serve", "--web.listen-address", "127.0.0.1:0",
               "--sglang.log-file", str(log), "--sglang.url", standin.url, "--sglang.scrape-interval", "1s",
               "--ranks.max", str(max(256, args.ranks * 2))]
        if args.window:
            cmd += ["--window", args.window]
        env = dict(os.environ, SGLANG_TUNING_LOG_LEVEL="info")
        child = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
        assert child.stderr is not None
        port = announced_port(child.stderr)
        if port is None:
            child.kill()
            print("serve did not start", file=sys.stderr)
            return 1
        errors = child.stderr
        threading.Thread(target=lambda: [None for _ in errors], daemon=True).start()  # drain
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
            child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
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
