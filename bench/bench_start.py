"""Benchmark: `diagnose` as a whole process, the way a person runs it.

Run on demand:  python bench/bench_start.py [--lines 1000000] [--repeat 5] [--keep]

1. Start-up: `diagnose` of a 100-line log versus `python3 -c "import argparse, json, re"` (the same
   interpreter, bytecode compiled and cached first: this bench unsets PYTHONDONTWRITEBYTECODE for its
   children and runs compileall on the package). Target: within 4x.
2. Throughput: `diagnose` of a --lines log (bench_diagnose's decode generator, the worst case) as a whole
   process versus a whole process running the naive one-regex-per-line loop over the same file.
   Target: >= 1.5x.
Each timing is the best of --repeat runs (this machine's timings wander); prints seconds and ratios.
"""

from __future__ import annotations

import argparse
import compileall
import inspect
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_diagnose import NAIVE_ONE, best_of, clean_up, generate, naive_one

import sglang_tuning_exporter

# The naive loop as its own process: bench_diagnose's naive_one itself, with nothing imported but re, sys and
# pathlib (importing bench_diagnose would import the package and time that too).
NAIVE_SCRIPT = (f"from __future__ import annotations\nimport re, sys\nfrom pathlib import Path\n"
                f"NAIVE_ONE = re.compile({NAIVE_ONE.pattern!r})\n{inspect.getsource(naive_one)}\n"
                "print(naive_one(Path(sys.argv[1])))\n")


def child_env() -> dict[str, str]:
    """The caller's environment, bytecode caching on (a real install writes and reads .pyc files)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def best(argv: list[str], repeat: int) -> float:
    """The best wall time of `repeat` runs of `argv` (stdout discarded; a failure stops the bench)."""
    def run() -> None:
        proc = subprocess.run(argv, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
        if proc.returncode not in (0, 3):
            raise SystemExit(f"{argv[:4]} exited {proc.returncode}: {proc.stderr.decode()[-400:]}")
    return best_of(run, repeat)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--keep", action="store_true", help="keep the generated logs")
    args = ap.parse_args()
    py = sys.executable
    compileall.compile_dir(str(Path(sglang_tuning_exporter.__file__).parent), quiet=1)
    tmp = Path(tempfile.mkdtemp(prefix="bench-start-"))
    small, big = tmp / "small.log", tmp / "big.log"
    generate(small, 100)
    generate(big, args.lines)
    diagnose = [py, "-m", "sglang_tuning_exporter", "diagnose"]
    best([*diagnose, str(small)], 1)  # warm: the first run writes any .pyc still missing
    imports = best([py, "-c", "import argparse, json, re"], args.repeat)
    start = best([*diagnose, str(small)], args.repeat)
    print(f"start-up: import argparse, json, re {imports * 1000:.0f} ms; diagnose of 100 lines "
          f"{start * 1000:.0f} ms: {start / imports:.2f}x (target <= 4x)")
    naive = best([py, "-c", NAIVE_SCRIPT, str(big)], max(1, args.repeat // 2))
    whole = best([*diagnose, "--format", "json", str(big)], max(1, args.repeat // 2))
    print(f"whole process, {args.lines:,} lines: naive one-regex loop {naive:.2f} s; diagnose {whole:.2f} s: "
          f"{naive / whole:.2f}x (target >= 1.5x)")
    clean_up(tmp, args.keep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
