"""Benchmark of `report` against a real Prometheus: N servers x D days of synthetic history.

For each fleet size: write OpenMetrics history (tests/helpers/fleet_history.py), build TSDB blocks with promtool,
start Prometheus on loopback, run the report (json and html) and print its wall time and query count.
The query count must be the same for every fleet size. Run on demand:

    python bench/bench_report.py                 # 100 and 1000 servers x 7 days at 15-minute resolution
    python bench/bench_report.py --sizes 200 --days 1 --step 300
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from helpers import fleet_history as fh
from helpers.tsdb import build_blocks, running_prometheus
from sglang_tuning_exporter.fleet import report


def cli_main(argv: list[str]) -> int:
    """`sglang-tuning-exporter report ARGV` without loading the other subcommands."""
    parser = argparse.ArgumentParser(prog="report")
    report.add_arguments(parser)
    return report.run(parser.parse_args(argv[1:]))


def wait_compacted(url: str, quiet_s: float = 65.0, limit_s: float = 900.0) -> float:
    """Wait until Prometheus has merged the imported 2-hour blocks (block count unchanged for `quiet_s`).

    A production Prometheus queries compacted blocks; timing the report during the start-up compaction
    would measure the compaction.
    """
    t0 = time.monotonic()
    last, since = -1.0, time.monotonic()
    while time.monotonic() - t0 < limit_s:
        text = requests.get(url + "/metrics", timeout=10).text
        found = re.search(r"^prometheus_tsdb_blocks_loaded (\S+)$", text, re.M)
        blocks = float(found.group(1)) if found else -1.0
        if blocks != last:
            last, since = blocks, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
        time.sleep(5)  # a benchmark waiting on a real process, not a test
    return time.monotonic() - t0


def run_once(n: int, days: float, step: int, keep: bool, repeat: int) -> dict[str, float]:
    """Generate, load and report on one fleet size; returns the timings."""
    root = Path(tempfile.mkdtemp(prefix=f"bench-report-{n}-"))
    out: dict[str, float] = {"instances": n}
    try:
        t = time.perf_counter()
        files = fh.write_history(fh.fleet(n), fh.HISTORY_END, days * 86400, step, root / "om")
        out["generate_s"] = time.perf_counter() - t
        print(f"[{n}] generated {len(files)} files in {out['generate_s']:.1f} s", file=sys.stderr, flush=True)
        out["openmetrics_mb"] = sum(f.stat().st_size for f in files) / 1e6
        t = time.perf_counter()
        build_blocks(files, root / "data")
        out["blocks_s"] = time.perf_counter() - t
        print(f"[{n}] promtool blocks in {out['blocks_s']:.1f} s", file=sys.stderr, flush=True)
        shutil.rmtree(root / "om")
        # Samples every `step` seconds: the lookback must reach the previous sample.
        with running_prometheus(root / "data", lookback=f"{max(300, step + 60)}s", ready_timeout_s=300) as url:
            out["compaction_wait_s"] = wait_compacted(url)
            print(f"[{n}] waited {out['compaction_wait_s']:.0f} s for start-up compaction", file=sys.stderr, flush=True)
            for fmt in ("json", "html"):
                dest = root / f"report.{fmt}"
                times: list[float] = []
                for _ in range(repeat):
                    t = time.perf_counter()
                    code = cli_main(["report", "--prometheus.url", url, "--range", f"{days:g}d",
                                     "--end", str(fh.HISTORY_END), "--resolution", f"{step}s", "--format", fmt,
                                     "--output", str(dest), "--prometheus.timeout", "300s"])
                    times.append(time.perf_counter() - t)
                    if code != 0:
                        raise SystemExit(f"report failed with exit {code}")
                out[f"{fmt}_best_s"], out[f"{fmt}_median_s"] = min(times), statistics.median(times)
                print(f"[{n}] report --format {fmt}: {', '.join(f'{x:.1f}' for x in times)} s",
                      file=sys.stderr, flush=True)
                text = dest.read_text(encoding="utf-8")
                if fmt == "json":
                    doc = json.loads(text)
                    out["queries_json"] = doc["queries"]
                    out["mistuned"] = doc["summary"]["by_status"]["warning"] + doc["summary"]["by_status"]["critical"]
                else:
                    found = re.search(r"(\d+) PromQL queries", text)
                    out["queries_html"] = int(found.group(1)) if found else -1
                    out["html_kb"] = len(text) / 1e3
    finally:
        if keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> None:
    """Parse options, run each size, print a table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100,1000", help="comma-separated fleet sizes (>= 20)")
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--step", type=int, default=900, help="sample resolution of the history, seconds")
    ap.add_argument("--keep", action="store_true", help="keep the data directories")
    ap.add_argument("--repeat", type=int, default=3, help="report runs per format (best and median printed)")
    a = ap.parse_args()
    rows = [run_once(int(n), a.days, a.step, a.keep, a.repeat) for n in a.sizes.split(",")]
    cols = ["instances", "openmetrics_mb", "generate_s", "blocks_s", "json_best_s", "json_median_s",
            "html_best_s", "html_median_s",
            "queries_json", "queries_html", "mistuned", "html_kb"]
    print(f"history: {a.days:g} days at {a.step} s resolution; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")
    print(" ".join(f"{c:>14}" for c in cols))
    for r in rows:
        print(" ".join(f"{r.get(c, float('nan')):>14.1f}" if isinstance(r.get(c), float) else f"{r.get(c, ''):>14}"
                       for c in cols))
    counts = {r["queries_json"] for r in rows}
    print("query count independent of fleet size:", "yes" if len(counts) == 1 else f"NO {sorted(counts)}")


if __name__ == "__main__":
    main()
