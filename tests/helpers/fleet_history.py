"""Synthetic fleet history for the report: OpenMetrics files for `promtool tsdb create-blocks-from openmetrics`
(helpers/tsdb.py turns them into blocks and starts a real Prometheus, or VictoriaMetrics, on them).

The fleet is mostly healthy servers, plus a fixed set of known mis-tuned ones whose instance names the tests
assert on. Values are deterministic functions of (instance, time), so a history can be written in 2-hour
slices (one promtool block each, which keeps promtool from re-reading one huge file per block).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from sglang_tuning_exporter.core.catalog import GIB
from sglang_tuning_exporter.fleet.queries import RULE_DECODE_SAMPLES, RULE_RETRACTIONS

BLOCK_S = 7200
# A fixed end keeps the generated data, and the report on it, the same from run to run.
HISTORY_END = 1_793_491_200.0  # 2026-11-01T00:00:00Z
MODEL_A = "meta-llama/Llama-3.1-8B-Instruct"
MODEL_B = "Qwen/Qwen2.5-72B-Instruct"


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """One synthetic server: how it behaves and how it is exposed (our sidecar or SGLang's own metrics)."""

    instance: str
    scenario: str = "healthy"
    source: str = "sidecar"  # sidecar | sglang: | sglang_
    model_name: str = MODEL_A
    version: str = "0.5.23"
    dp_ranks: int = 1
    storm_rank: int | None = None  # with dp_ranks > 1: only this DP rank retracts
    queue: float = 500.0
    usage: float = 0.94
    retractions_per_min: float = 0.05
    graph_miss_ratio: float = 0.0
    batch_without_graph: float = 0.0
    available_gpu_gb: float = 6.5
    gpu_total_gb: float = 79.3
    prefix_hit: float = 0.3
    running_share: float = 0.6  # running requests as a share of max_running_requests
    recorded_only: bool = False  # counters kept only as the alert engineer's recording rules (long-term store)
    args: dict[str, float] = field(default_factory=dict)
    # the sidecar's windowed latency quantiles it exports (sglang_tuning_signal_seconds), e.g. {"ttft_p95": 0.8}
    latency: dict[str, float] = field(default_factory=dict)
    # SGLang's own latency histograms (source sglang: / sglang_): latency -> seconds every request takes, 10
    # requests a second, e.g. {"ttft": 0.8}
    histograms: dict[str, float] = field(default_factory=dict)


HISTOGRAM_FAMILIES = {"ttft": "time_to_first_token_seconds", "itl": "inter_token_latency_seconds",
                      "e2e": "e2e_request_latency_seconds", "queue_time": "queue_time_seconds"}
HISTOGRAM_BOUNDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


def histogram_p95(seconds: float) -> float:
    """What histogram_quantile(0.95, ...) reads when every request takes `seconds`: 95 % into its bucket."""
    hi = next(b for b in HISTOGRAM_BOUNDS if b >= seconds)
    lo = max((b for b in HISTOGRAM_BOUNDS if b < hi), default=0.0)
    return lo + 0.95 * (hi - lo)


BASE_ARGS = {"mem_fraction_static": 0.88, "schedule_conservativeness": 1.0, "chunked_prefill_size": 8192.0,
             "max_running_requests": 1024.0, "cuda_graph_max_bs": 256.0, "tp_size": 1.0, "port": 30000.0}

# instance name -> (check that must fire, flag it must name or None for a client-side remedy, action)
KNOWN_MISTUNED: dict[str, tuple[str, str | None, str]] = {
    "10.9.0.1:9470": ("retractions_frequent", "--schedule-conservativeness", "increase"),
    "10.9.0.2:9470": ("gpu_mem_headroom_high", "--mem-fraction-static", "increase"),
    "10.9.0.3:9470": ("queue_empty", None, ""),
    "10.9.0.4:9470": ("cuda_graph_uncovered", "--cuda-graph-max-bs", "increase"),
    "10.9.0.5:9470": ("kv_underused", "--schedule-conservativeness", "decrease"),
    "10.9.0.6:9470": ("gpu_mem_headroom_high", "--mem-fraction-static", "increase"),
    "10.9.0.7:9470": ("retractions_frequent", "--schedule-conservativeness", "increase"),
    "10.9.0.8:9470": ("retractions_frequent", "--schedule-conservativeness", "increase"),
    "10.9.1.1:30000": ("retractions_frequent", "--schedule-conservativeness", "increase"),
}
RECORDED_ONLY = "10.9.0.8:9470"
DRIFT_INSTANCE = "10.9.0.6:9470"


def _special() -> list[InstanceSpec]:
    a = dict(BASE_ARGS)
    return [
        InstanceSpec("10.9.0.1:9470", "retraction_storm", usage=0.99, retractions_per_min=6.0, args=a),
        InstanceSpec("10.9.0.2:9470", "headroom_high", model_name=MODEL_B, available_gpu_gb=14.0,
                     args={**a, "tp_size": 4.0}),
        InstanceSpec("10.9.0.3:9470", "queue_empty", queue=0.0, usage=0.35, retractions_per_min=0.0, running_share=0.1,
                     args=a),
        InstanceSpec("10.9.0.4:9470", "cuda_graph_misses", version="0.5.9", graph_miss_ratio=0.35,
                     batch_without_graph=300.0, args={**a, "cuda_graph_max_bs": 160.0, "max_running_requests": 512.0}),
        InstanceSpec("10.9.0.5:9470", "kv_underused", queue=400.0, usage=0.6, retractions_per_min=0.0, args=a),
        InstanceSpec("10.9.0.6:9470", "drift_mem_fraction", available_gpu_gb=12.8,
                     args={**a, "mem_fraction_static": 0.80}),
        InstanceSpec("10.9.0.7:9470", "dp_rank_storm", dp_ranks=2, storm_rank=1, args=a),
        InstanceSpec(RECORDED_ONLY, "recorded_storm", usage=0.99, retractions_per_min=6.0, recorded_only=True, args=a),
        InstanceSpec("10.9.1.1:30000", "retraction_storm_raw", source="sglang:", usage=0.99, retractions_per_min=6.0),
    ]


def fleet(n: int) -> list[InstanceSpec]:
    """`n` servers (n >= 20): the known mis-tuned ones, then healthy ones across models and sources."""
    specs = _special()
    i = 0
    while len(specs) < n:
        source = ("sglang:", "sglang_")[i % 2] if i % 10 == 9 else "sidecar"
        model = MODEL_B if i % 5 == 4 else MODEL_A
        port = 9470 if source == "sidecar" else 30000
        args = {**BASE_ARGS, "tp_size": 4.0} if model == MODEL_B else dict(BASE_ARGS)
        specs.append(InstanceSpec(f"10.0.{i // 250}.{i % 250}:{port}", source=source, model_name=model,
                                  queue=300.0 + (i * 37) % 600, usage=0.92 + ((i * 13) % 6) / 100,
                                  args=args if source == "sidecar" else {}))
        i += 1
    return specs


def _noise(i: int, k: int) -> float:
    """Deterministic pseudo-noise in [-1, 1) from an instance and step index."""
    return ((k * 2654435761 + i * 40503 + 12345) % 2000) / 1000.0 - 1.0


def _labels(spec: InstanceSpec, dp: int | None, extra: str = "") -> str:
    rank = f',dp_rank="{dp}"' if dp is not None else ""
    if spec.source == "sidecar":
        base = (f'instance="{spec.instance}",job="sglang-tuning",model_name="{spec.model_name}",'
                f'pp_rank="0",tp_rank="0",moe_ep_rank="0"{rank}')
    else:
        base = (f'instance="{spec.instance}",job="sglang",model_name="{spec.model_name}",engine_type="unified",'
                f'pp_rank="0",tp_rank="0",moe_ep_rank="0"{rank}')
    return base + ("," + extra if extra else "")


def _ranks(spec: InstanceSpec) -> list[int | None]:
    return list(range(spec.dp_ranks)) if spec.dp_ranks > 1 else [None]


def _retr_rate(spec: InstanceSpec, dp: int | None) -> float:
    if spec.storm_rank is not None:
        return 6.0 if dp == spec.storm_rank else 0.0
    return spec.retractions_per_min


class _Writer:
    """Writes OpenMetrics families and timestamped samples to a text stream."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def family(self, name: str, kind: str) -> None:
        """Start a metric family (its samples must follow contiguously)."""
        self.out.write(f"# TYPE {name} {kind}\n")

    def emit(self, sample: str, labels: str, values: list[tuple[float, float]]) -> None:
        """One series' samples, in time order."""
        self.out.writelines(f"{sample}{{{labels}}} {v:.12g} {t:.0f}\n" for t, v in values)


def _queue(s: InstanceSpec, idx: int, times: list[float]) -> list[tuple[float, float]]:
    return [(t, max(0.0, round(s.queue * (1 + 0.3 * _noise(idx, int(t) // 60))))) for t in times]


def _usage(s: InstanceSpec, idx: int, times: list[float]) -> list[tuple[float, float]]:
    return [(t, min(1.0, round(s.usage + 0.02 * _noise(idx + 7, int(t) // 60), 3))) for t in times]


def _running(s: InstanceSpec, idx: int, times: list[float]) -> list[tuple[float, float]]:
    cap = s.args.get("max_running_requests", 1024.0)
    level = cap * s.running_share
    return [(t, float(min(cap, round(level * (1 + 0.1 * _noise(idx + 3, int(t) // 60)))))) for t in times]


def write_slice(specs: list[InstanceSpec], times: list[float], start: float, out: TextIO) -> None:
    """Write one OpenMetrics document (families contiguous, each series in time order) for `times`."""
    w = _Writer(out)
    slow = [t for t in times if int(t) % 1800 == 0] or times[:1]  # constants: every 30 min is plenty
    for prefix in ("sglang:", "sglang_"):
        raw = [s for s in specs if s.source == prefix]
        if raw:
            _write_sglang(w, prefix, raw, times, slow, start)
    sidecar = [s for s in specs if s.source == "sidecar"]
    if sidecar:
        _write_sidecar(w, sidecar, times, slow, start)
    out.write("# EOF\n")


def _write_sglang(w: _Writer, prefix: str, specs: list[InstanceSpec], times: list[float], slow: list[float],
                  start: float) -> None:
    w.family(prefix + "num_queue_reqs", "gauge")
    for idx, s in enumerate(specs):
        for dp in _ranks(s):
            w.emit(prefix + "num_queue_reqs", _labels(s, dp), _queue(s, idx, times))
    w.family(prefix + "token_usage", "gauge")
    for idx, s in enumerate(specs):
        for dp in _ranks(s):
            w.emit(prefix + "token_usage", _labels(s, dp), _usage(s, idx, times))
    w.family(prefix + "num_running_reqs", "gauge")
    for idx, s in enumerate(specs):
        for dp in _ranks(s):
            w.emit(prefix + "num_running_reqs", _labels(s, dp), _running(s, idx, times))
    w.family(prefix + "num_retracted_requests", "counter")
    for s in specs:
        for dp in _ranks(s):
            w.emit(prefix + "num_retracted_requests_total", _labels(s, dp),
                   [(t, float(int(_retr_rate(s, dp) * (t - start) / 60))) for t in times])
    w.family(prefix + "cuda_graph_passes", "counter")
    for s in specs:
        for dp in _ranks(s):
            for mode, share in (("decode_cuda_graph", 1 - s.graph_miss_ratio), ("decode_none", s.graph_miss_ratio)):
                w.emit(prefix + "cuda_graph_passes_total", _labels(s, dp, f'mode="{mode}"'),
                       [(t, float(int(share * 20 * (t - start)))) for t in times])
    for metric, attr in (("startup_available_gpu_memory_gb", "available_gpu_gb"),):
        w.family(prefix + metric, "gauge")
        for s in specs:
            for dp in _ranks(s):
                w.emit(prefix + metric, _labels(s, dp), [(t, getattr(s, attr)) for t in slow])
    w.family(prefix + "max_running_requests", "gauge")
    for s in specs:
        for dp in _ranks(s):
            w.emit(prefix + "max_running_requests", _labels(s, dp), [(t, 1024.0) for t in slow])
    for lat, family in HISTOGRAM_FAMILIES.items():
        timed = [s for s in specs if lat in s.histograms]
        if not timed:
            continue
        name = prefix + family
        count = [(t, 10.0 * (t - start)) for t in times]  # the tokenizer's: no DP rank
        w.family(name + "_count", "unknown")
        for s in timed:
            w.emit(name + "_count", _labels(s, None), count)
        w.family(name + "_bucket", "unknown")
        for s in timed:
            for le in (*HISTOGRAM_BOUNDS, float("inf")):
                bound = "+Inf" if le == float("inf") else repr(le)
                w.emit(name + "_bucket", _labels(s, None, f'le="{bound}"'),
                       [(t, n if le >= s.histograms[lat] else 0.0) for t, n in count])


def _write_recorded(w: _Writer, specs: list[InstanceSpec], times: list[float]) -> None:
    """Series of alerts/recording.rules.yaml (per-second rates), as a long-term store keeps them."""
    w.family(RULE_RETRACTIONS, "gauge")
    for s in specs:
        for dp in _ranks(s):
            w.emit(RULE_RETRACTIONS, _rule_labels(s, dp),
                   [(t, _retr_rate(s, dp) / 60) for t in times])
    w.family(RULE_DECODE_SAMPLES, "gauge")
    for s in specs:
        for dp in _ranks(s):
            for graph, share in (("true", 1 - s.graph_miss_ratio), ("false", s.graph_miss_ratio)):
                w.emit(RULE_DECODE_SAMPLES, _rule_labels(s, dp, f'cuda_graph="{graph}"'),
                       [(t, share * 0.5) for t in times])


def _rule_labels(s: InstanceSpec, dp: int | None, extra: str = "") -> str:
    rank = f',dp_rank="{dp}"' if dp is not None else ""
    return f'job="sglang-tuning",instance="{s.instance}",model_name="{s.model_name}"{rank}' + ("," + extra if extra else "")


def _write_sidecar(w: _Writer, specs: list[InstanceSpec], times: list[float], slow: list[float],
                   start: float) -> None:
    p = "sglang_tuning_"
    w.family(p + "queue_requests", "gauge")
    for idx, s in enumerate(specs):
        for dp in _ranks(s):
            w.emit(p + "queue_requests", _labels(s, dp), _queue(s, idx, times))
    w.family(p + "token_usage_ratio", "gauge")
    for idx, s in enumerate(specs):
        for dp in _ranks(s):
            w.emit(p + "token_usage_ratio", _labels(s, dp), _usage(s, idx, times))
    w.family(p + "running_requests", "gauge")
    for idx, s in enumerate(specs):
        for dp in _ranks(s):
            w.emit(p + "running_requests", _labels(s, dp), _running(s, idx, times))
    w.family(p + "retractions", "counter")
    for s in specs:
        for dp in _ranks(s):
            rate = _retr_rate(s, dp)
            if not s.recorded_only:
                w.emit(p + "retractions_total", _labels(s, dp), [(t, float(int(rate * (t - start) / 60))) for t in times])
    recorded = [s for s in specs if s.recorded_only]
    if recorded:
        _write_recorded(w, recorded, times)
    w.family(p + "decode_samples", "counter")
    for s in specs:
        if s.recorded_only:
            continue
        for dp in _ranks(s):
            for graph, share in (("true", 1 - s.graph_miss_ratio), ("false", s.graph_miss_ratio)):
                if share > 0:
                    w.emit(p + "decode_samples_total", _labels(s, dp, f'cuda_graph="{graph}"'),
                           [(t, float(int(share * 0.5 * (t - start)))) for t in times])
    w.family(p + "decode_batch_size_without_graph", "gauge")
    for s in specs:
        if s.batch_without_graph:
            for dp in _ranks(s):
                w.emit(p + "decode_batch_size_without_graph", _labels(s, dp),
                       [(t, s.batch_without_graph) for t in times])
    w.family(p + "prefill_tokens", "counter")
    for s in specs:
        for dp in _ranks(s):
            for src, share in (("cached", s.prefix_hit), ("new", 1 - s.prefix_hit)):
                w.emit(p + "prefill_tokens_total", _labels(s, dp, f'source="{src}"'),
                       [(t, float(int(share * 900 * (t - start)))) for t in times])
    for metric, attr in (("available_gpu_memory_bytes", "available_gpu_gb"), ("gpu_memory_total_bytes", "gpu_total_gb")):
        w.family(p + metric, "gauge")
        for s in specs:
            for dp in _ranks(s):
                w.emit(p + metric, _labels(s, dp), [(t, getattr(s, attr) * GIB) for t in slow])
    for metric, arg, default in (("max_running_requests", "max_running_requests", 1024.0),
                                 ("cuda_graph_max_batch_size", "cuda_graph_max_bs", 256.0)):
        w.family(p + metric, "gauge")
        for s in specs:
            for dp in _ranks(s):
                w.emit(p + metric, _labels(s, dp), [(t, s.args.get(arg, default)) for t in slow])
    w.family(p + "signal_seconds", "gauge")
    for s in specs:
        for signal, v in sorted(s.latency.items()):
            for dp in _ranks(s):
                w.emit(p + "signal_seconds", _labels(s, dp, f'signal="{signal}"'), [(t, v) for t in times])
    w.family(p + "server_arg", "gauge")
    for s in specs:
        for arg, v in sorted(s.args.items()):
            w.emit(p + "server_arg", f'instance="{s.instance}",job="sglang-tuning",arg="{arg}"', [(t, v) for t in slow])
    w.family(p + "server_info", "gauge")
    for s in specs:
        w.emit(p + "server_info", f'instance="{s.instance}",job="sglang-tuning",version="{s.version}",'
                                  f'model_name="{s.model_name}",schedule_policy="fcfs"', [(t, 1.0) for t in slow])


def write_history(specs: list[InstanceSpec], end: float, length_s: float, step_s: float, out_dir: Path) -> list[Path]:
    """Write the history ending at `end` as one OpenMetrics file per 2-hour block; returns the files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    start = end - length_s
    first = int(start // step_s * step_s)
    all_times = [float(t) for t in range(first, int(end) + 1, int(step_s))]
    files: list[Path] = []
    block_start = int(first // BLOCK_S * BLOCK_S)
    while block_start <= end:
        times = [t for t in all_times if block_start <= t < block_start + BLOCK_S]
        if times:
            path = out_dir / f"history-{block_start}.om"
            with path.open("w", encoding="utf-8") as fh:
                write_slice(specs, times, start, fh)
            files.append(path)
        block_start += BLOCK_S
    return files


def main() -> None:
    """Write a small history to ./fleet-history (manual exploration)."""
    out = Path(os.environ.get("OUT", "fleet-history"))
    write_history(fleet(200), HISTORY_END, 86400, 300, out)


if __name__ == "__main__":
    main()


def write_segments(segments: list[tuple[list[InstanceSpec], float, float]], step_s: float,
                   out_dir: Path) -> list[Path]:
    """A history in which servers change: each segment is (specs, start, end) with samples every `step_s` in
    [start, end); its counters start from 0 at `start` (a restart). One OpenMetrics file per segment and 2-hour
    block (the blocks overlap in time where segments share one; Prometheus merges overlapping blocks)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    for k, (specs, t0, t1) in enumerate(segments):
        times = [float(t) for t in range(int(t0), int(t1), int(step_s))]
        for block in sorted({int(t // BLOCK_S * BLOCK_S) for t in times}):
            part = [t for t in times if block <= t < block + BLOCK_S]
            path = out_dir / f"segment{k}-{block}.om"
            with path.open("w", encoding="utf-8") as fh:
                write_slice(specs, part, t0, fh)
            files.append(path)
    return files
