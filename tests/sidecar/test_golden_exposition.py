"""Golden /metrics expositions of the sidecar: logs only, metrics only, and both (fixed clock).

Rewrite with `pytest --update-golden` after a reviewed change; every golden is linted by promtool.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers.paths import FIXTURES, GOLDEN
from helpers.recorded_sglang import recorded_sglang
from sglang_tuning_exporter.sidecar.collector import BuildInfo
from sglang_tuning_exporter.sidecar.engine import Sidecar
from sglang_tuning_exporter.sidecar.serve import build_sidecar, log_input_for, make_web
from sglang_tuning_exporter.sidecar.serveconfig import add_serve_flags, build_config
from sglang_tuning_exporter.sources.logreader import EventReader

FIX = FIXTURES
BUILD = BuildInfo("0.0.0-golden", "3.x", "0000000")
T0 = 1_790_208_000.0  # 2026-09-24T00:00:00Z (after the log: live, a stamp far ahead of the wall clock is refused)
LOG = FIX / "logs" / "sidecar-golden.log"
METRICS = (FIX / "metrics" / "sglang-0.5.23-metrics.txt").read_text()
RANK_LABELS = 'engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
# Second scrape: 2 more retracted requests, 10 more eager decode passes, 40 more graph passes.
METRICS_LATER = (METRICS
                 .replace(f"sglang:num_retracted_requests_total{{{RANK_LABELS}}} 3.0",
                          f"sglang:num_retracted_requests_total{{{RANK_LABELS}}} 5.0")
                 .replace('mode="decode_none",model_name="Qwen/Qwen2.5-7B-Instruct",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 50.0',
                          'mode="decode_none",model_name="Qwen/Qwen2.5-7B-Instruct",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 60.0')
                 .replace('mode="decode_cuda_graph",model_name="Qwen/Qwen2.5-7B-Instruct",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 950.0',
                          'mode="decode_cuda_graph",model_name="Qwen/Qwen2.5-7B-Instruct",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 990.0'))
SERVER_INFO = (FIX / "sglang-0.5.23-server_info-toplevel.json").read_bytes()


class ListFollower:
    """Hands out a file's lines in batches, like tail.Follower reading a growing file."""

    def __init__(self, lines: list[str], batches: int) -> None:
        size = -(-len(lines) // batches)
        self.batches = [lines[i:i + size] for i in range(0, len(lines), size)]
        self.rotations = 0
        self.truncations = 0
        self.exists = True

    def poll(self) -> list[str]:
        return self.batches.pop(0) if self.batches else []


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_serve_flags(p)
    return p.parse_args(list(argv))


def _sidecar(mode: str) -> Sidecar:
    argv = ["--sglang.scrape-interval", "15s"]
    if mode in ("logs", "both"):
        argv += ["--sglang.log-file", str(LOG), "--from-start"]
    if mode in ("metrics", "both"):
        argv += ["--sglang.url", "http://127.0.0.1:30000"]
    cfg = build_config(_args(*argv))
    log_input = None
    if mode in ("logs", "both"):
        log_input = log_input_for(ListFollower(LOG.read_text().splitlines(), 2), EventReader())
    return build_sidecar(cfg, timer=lambda: 0.0, http_get=recorded_sglang([METRICS, METRICS_LATER], SERVER_INFO),
                         log_input=log_input)


def _exposition(mode: str) -> str:
    sc = _sidecar(mode)
    for t in (T0, T0 + 15.0, T0 + 30.0):
        sc.tick(t)
    cfg = build_config(_args("--sglang.url", "http://x:1"))
    return make_web(cfg, sc, clock=lambda: T0 + 30.0, build=BUILD,
                    process_metrics=False).handle("GET", "/metrics").body.decode()


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["logs", "metrics", "both"])
def test_golden_exposition(mode: str, update_golden: bool, tmp_path: Path) -> None:
    """The exposition equals the reviewed golden file and passes `promtool check metrics`."""
    text = _exposition(mode)
    golden = GOLDEN / f"sidecar-{mode}.prom"
    if update_golden:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.is_file(), f"missing {golden}: run pytest --update-golden"
    assert text == golden.read_text()
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed")
    proc = subprocess.run(["promtool", "check", "metrics"], input=golden.read_bytes(), capture_output=True,
                          timeout=30)
    assert proc.returncode == 0, (proc.stdout + proc.stderr).decode()


def _parsed(mode: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = (GOLDEN / f"sidecar-{mode}.prom").read_text()
    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def _value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float | None:
    found = [v for (n, lab), v in samples.items() if n == name and set(labels.items()) <= set(lab)]
    return sum(found) if found else None


def test_goldens_say_which_sources_they_have() -> None:
    """Each mode's golden states its sources (enabled/up) and carries that source's data."""
    logs, metrics, both = (_parsed(m) for m in ("logs", "metrics", "both"))
    assert _value(logs, "sglang_tuning_source_enabled", source="metrics") == 0.0
    # log-only: no `up` (a 0 would read as "SGLang is down"); source_up says which source works
    assert _value(logs, "sglang_tuning_up") is None
    assert _value(logs, "sglang_tuning_source_up", source="log") == 1.0
    assert _value(logs, "sglang_tuning_log_lines_total", kind="decode")
    assert _value(metrics, "sglang_tuning_source_enabled", source="log") == 0.0
    assert _value(metrics, "sglang_tuning_up") == 1.0
    assert _value(metrics, "sglang_tuning_sglang_endpoint_info", endpoint="/server_info") == 1.0
    assert _value(metrics, "sglang_tuning_log_lines_total") is None
    assert _value(both, "sglang_tuning_up") == 1.0 and _value(both, "sglang_tuning_log_lines_total", kind="decode")
    assert _value(metrics, "sglang_tuning_build_info", version=BUILD.version, revision="0000000") == 1.0
    # metrics-only: the 2 retracted requests and 10 eager passes seen between scrapes
    assert _value(metrics, "sglang_tuning_retracted_requests_total") == 2.0
    assert _value(metrics, "sglang_tuning_decode_samples_total", cuda_graph="false") == 10.0
    # both: the log is up, so the scrape's counter deltas are not counted a second time
    assert _value(both, "sglang_tuning_decode_samples_total", cuda_graph="false") == 2.0
