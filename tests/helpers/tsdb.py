"""A real time-series database filled with a written history, for the tests that query one: OpenMetrics
files backfilled into TSDB blocks by the real promtool (`tsdb create-blocks-from openmetrics`) and served
by a real Prometheus, or imported into a real VictoriaMetrics; each on loopback, on a free port, always
stopped. Used by the conformance suite, the fleet report tests and the VictoriaMetrics run.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest
import requests

from helpers.netutil import free_port, stop_process, wait_ready

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
VICTORIA_METRICS = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"


def missing_prometheus() -> str | None:
    """Why a backfilled Prometheus cannot run here (a missing Debian binary), or None."""
    missing = [p for p in (PROMETHEUS, PROMTOOL) if not Path(p).exists()]
    return f"not installed: {', '.join(missing)} (Debian package prometheus)" if missing else None


def build_blocks(files: list[Path], data_dir: Path, parallel: int = 2) -> None:
    """Turn each OpenMetrics file into TSDB blocks with the real promtool."""
    data_dir.mkdir(parents=True, exist_ok=True)
    pending = list(files)
    running: list[tuple[subprocess.Popen[bytes], Path]] = []
    while pending or running:
        while pending and len(running) < parallel:
            f = pending.pop(0)
            proc = subprocess.Popen([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", "-q", str(f),
                                     str(data_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            running.append((proc, f))
        proc, f = running.pop(0)
        _, err = proc.communicate(timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"promtool failed on {f}: {err.decode(errors='replace')[:500]}")


@contextlib.contextmanager
def _on_loopback(name: str, argv: Callable[[int, Path], list[str]], ready_path: str, *,
                 ready_timeout_s: float = 60.0) -> Iterator[str]:
    """Start `argv(port, scratch dir)` on a free loopback port, wait for `ready_path`; yields the base URL and
    always stops the process (its log and scratch files go with it)."""
    scratch = Path(tempfile.mkdtemp(prefix=f"tsdb-{name}-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = scratch / f"{name}.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(argv(port, scratch), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(proc, url + ready_path, log_path, name=name, timeout_s=ready_timeout_s)
        yield url
    finally:
        stop_process(proc, 20.0)
        log.close()
        shutil.rmtree(scratch, ignore_errors=True)


def running_prometheus(data_dir: Path, *, lookback: str = "5m", ready_timeout_s: float = 60.0,
                       rule_files: Sequence[Path] = (), evaluation_interval: str = "1m"
                       ) -> contextlib.AbstractContextManager[str]:
    """The real Prometheus on `data_dir` (no scrapes, nothing expires), evaluating `rule_files` every
    `evaluation_interval`; yields its URL."""
    def argv(port: int, scratch: Path) -> list[str]:
        cfg = scratch / "prometheus.yml"
        rules = "".join(f"\n  - {f}" for f in rule_files)
        cfg.write_text(f"global:\n  scrape_interval: 1m\n  evaluation_interval: {evaluation_interval}\n"
                       + (f"rule_files:{rules}\n" if rules else ""), encoding="utf-8")
        return [PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={data_dir}",
                f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=36500d",
                f"--query.lookback-delta={lookback}", "--log.level=warn"]
    return _on_loopback("prometheus", argv, "/-/ready", ready_timeout_s=ready_timeout_s)


def running_victoria_metrics(data_dir: Path) -> contextlib.AbstractContextManager[str]:
    """VictoriaMetrics on `data_dir` with Prometheus' 5-minute lookback and no query cache; yields its URL."""
    def argv(port: int, _scratch: Path) -> list[str]:
        return [VICTORIA_METRICS, f"-storageDataPath={data_dir}", f"-httpListenAddr=127.0.0.1:{port}",
                "-retentionPeriod=100y", "-search.maxStalenessInterval=5m", "-search.latencyOffset=0s",
                "-search.disableCache", "-loggerLevel=ERROR"]
    return _on_loopback("victoria-metrics", argv, "/health")


Series = Sequence[tuple[str, Sequence[tuple[float, float]]]]  # (`name{labels}`, [(time s, value)])


def write_openmetrics(path: Path, families: Mapping[tuple[str, str], Series]) -> list[Path]:
    """An OpenMetrics file for `promtool tsdb create-blocks-from openmetrics`: each (family, type) with its
    series, values at 12 significant digits, times in whole seconds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for (family, kind), series in families.items():
            f.write(f"# TYPE {family} {kind}\n")
            for head, values in series:
                f.writelines(f"{head} {v:.12g} {t:.0f}\n" for t, v in values)
        f.write("# EOF\n")
    return [path]


@contextlib.contextmanager
def backfilled_prometheus(write: Callable[[Path], list[Path]], root: Path) -> Iterator[str]:
    """A real Prometheus serving the OpenMetrics files `write(folder)` writes (skips without the binaries);
    the files are removed once in blocks. Yields its URL."""
    reason = missing_prometheus()
    if reason:
        pytest.skip(reason)
    files = write(root / "om")
    build_blocks(files, root / "data")
    shutil.rmtree(root / "om", ignore_errors=True)
    with running_prometheus(root / "data") as url:
        yield url


def _prometheus_text(om_file: Path) -> Iterator[bytes]:
    """OpenMetrics samples (timestamps in seconds) as Prometheus text lines (milliseconds) for /api/v1/import."""
    with om_file.open("rb") as f:
        for line in f:
            if line.startswith(b"#") or not line.strip():
                continue
            head, value, ts = line.rsplit(b" ", 2)
            yield b"%s %s %d\n" % (head, value, int(float(ts)) * 1000)


@contextlib.contextmanager
def backfilled_victoria_metrics(write: Callable[[Path], list[Path]], root: Path) -> Iterator[str]:
    """VictoriaMetrics holding the same OpenMetrics files, imported through its Prometheus-text API (skips
    without the binary). Yields its URL."""
    if not Path(VICTORIA_METRICS).exists():
        pytest.skip("victoria-metrics not installed (Debian package victoria-metrics)")
    files = write(root / "om")
    with running_victoria_metrics(root / "data") as url:
        for f in files:
            resp = requests.post(url + "/api/v1/import/prometheus", data=b"".join(_prometheus_text(f)), timeout=120)
            assert resp.status_code == 204, resp.text[:300]
        assert requests.get(url + "/internal/force_flush", timeout=30).status_code == 200
        yield url
