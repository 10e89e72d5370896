"""Recorded scenarios of the conformance suite: each a log (and where it applies an SGLang /metrics
history) with the verdicts and signal values every evaluator must give at its end (docs/signals.md)."""

from __future__ import annotations

import calendar
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from helpers.check_logs import KV_REDUCED, MAMBA_CAP, SWA_POOL
from helpers.scenario_logs import LogWriter

START = 1_767_261_600.0  # 2026-01-01 10:00:00 UTC


@dataclass(frozen=True)
class Scenario:
    """One recorded situation and what its end must read as."""

    name: str
    lines: list[str]
    # check -> status at the log's end (the worst rank); checks not named are not compared.
    statuses: dict[str, str]
    # signal -> value at the end (worst rank), compared within `rel` (relative) or `abs_tol`.
    signals: dict[str, float]
    # rank (as a label dict) -> check -> status, for topologies where the rank matters.
    rank_statuses: dict[str, dict[str, str]] = field(default_factory=dict)
    rel: float = 0.05
    # SGLang /metrics history: (seconds after START, exposition text); empty: log only.
    metrics: list[tuple[float, str]] = field(default_factory=list)
    # Split point for "a sidecar started mid-log without --from-start" (index into lines).
    sidecar_starts_at: int | None = None
    # What the evaluators reading only the log (diagnose, a replay) say instead: check -> words their
    # `unknown` evidence must hold (the scenario's /metrics carries what the log cannot).
    log_only: dict[str, str] = field(default_factory=dict)


# Checks a healthy server passes too: every evaluator must read them as ok.
HEALTHY_TOO = {c: "ok" for c in ("queue_overloaded", "gpu_mem_headroom_low", "startup_mem_fraction_too_small",
                                 "startup_headroom_oom", "prefill_oom", "decode_oom", "oom_unknown_phase",
                                 "decode_graph_capture_oom", "prefill_graph_capture_oom",
                                 "cuda_graph_uncovered", "cuda_graph_ceiling_low", "running_capped",
                                 "metrics_disabled", "context_exceeds_kv_pool")}


def _startup(w: LogWriter, **kw: object) -> None:
    w.server_args(mem_fraction_static=0.88, schedule_conservativeness=1.0, max_running_requests=256,
                  cuda_graph_max_bs=256, enable_metrics=True)
    w.startup(available=6.5, max_running=256, capture_bs=[1, 2, 4, 8, 16, 32, 64, 128, 256], **kw)  # type: ignore[arg-type]


def steady(w: LogWriter, minutes: float, *, retract_every_s: float | None, tp_ranks: int = 1,
           dp: int | None = None, hot_dp: int | None = None, step_s: float = 2.0,
           queue: int = 300, usage: float = 0.95, running: int = 200) -> None:
    """Decode lines every `step_s`; retractions every `retract_every_s` printed by every TP rank."""
    next_retract = retract_every_s
    elapsed = 0.0
    dps: list[int | None] = [dp] if hot_dp is None else [0, 1]
    while elapsed < minutes * 60:
        for d in dps:
            rank = {} if d is None else {"dp": d}
            w.decode(running, usage, queue, True, **rank)
        if next_retract is not None and elapsed >= next_retract:
            for d in dps:
                if hot_dp is not None and d != hot_dp:
                    continue
                for tp in range(tp_ranks):
                    rank = {"tp": tp} if d is None else {"dp": d, "tp": tp}
                    w.retract(1, **rank)
            next_retract += retract_every_s  # type: ignore[operator]
        w.tick(step_s)
        elapsed += step_s


def _writer(**kw: object) -> LogWriter:
    return LogWriter(start=START, **kw)  # type: ignore[arg-type]


def healthy() -> Scenario:
    w = _writer()
    _startup(w)
    steady(w, 33, retract_every_s=120)  # ends mid-window: the last window is not a whole bucket
    return Scenario("healthy", w.lines, {"retractions_frequent": "ok", "gpu_mem_headroom_high": "ok",
                                         "queue_empty": "ok", "kv_underused": "ok", **HEALTHY_TOO},
                    {"retractions_per_minute": 0.5, "available_gpu_mem_gb": 6.5, "queue_empty_ratio": 0.0})


def storm() -> Scenario:
    w = _writer()
    _startup(w)
    steady(w, 25, retract_every_s=10)  # ends mid-window
    return Scenario("retraction_storm", w.lines, {"retractions_frequent": "critical"},
                    {"retractions_per_minute": 6.0})


def tp4() -> Scenario:
    w = _writer(tp_size=4)
    _startup(w)
    steady(w, 20, retract_every_s=20, tp_ranks=4)
    return Scenario("tp4_every_rank_prints", w.lines, {"retractions_frequent": "warning"},
                    {"retractions_per_minute": 3.0})


def dp_hot_rank() -> Scenario:
    w = _writer()
    _startup(w)
    steady(w, 20, retract_every_s=20, hot_dp=1)
    return Scenario("dp_attention_one_hot_rank", w.lines, {"retractions_frequent": "warning"},
                    {"retractions_per_minute": 3.0},
                    rank_statuses={"dp=1": {"retractions_frequent": "warning"},
                                   "dp=0": {"retractions_frequent": "ok"}})


def restart_new_args() -> Scenario:
    w = _writer()
    w.server_args(mem_fraction_static=0.8, schedule_conservativeness=1.0, max_running_requests=256,
                  cuda_graph_max_bs=256, enable_metrics=True)
    w.startup(available=13.5, max_running=256, capture_bs=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    steady(w, 15, retract_every_s=None)
    w.tick(120)
    _startup(w)  # restarted with --mem-fraction-static 0.88: 6.5 GB left
    steady(w, 15, retract_every_s=None)
    return Scenario("restart_with_new_args", w.lines, {"gpu_mem_headroom_high": "ok"},
                    {"available_gpu_mem_gb": 6.5})


def sidecar_restart() -> Scenario:
    w = _writer()
    w.server_args(mem_fraction_static=0.8, schedule_conservativeness=1.0, max_running_requests=256,
                  cuda_graph_max_bs=256, enable_metrics=True)
    w.startup(available=13.5, max_running=256, capture_bs=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    steady(w, 10, retract_every_s=None)
    split = len(w.lines)
    steady(w, 20, retract_every_s=30)
    return Scenario("sidecar_restart", w.lines, {"gpu_mem_headroom_high": "warning", "retractions_frequent": "warning"},
                    {"available_gpu_mem_gb": 13.5, "retractions_per_minute": 2.0}, sidecar_starts_at=split)


def clock_jump() -> Scenario:
    w = _writer()
    # A cut-off first line (its date lost its first digit) and a line from 1970 in the middle.
    w.raw("026-01-01 09:59:59 TP0] Decode batch, #running-req: 200, #token: 400000, token usage: 0.95, "
          "cuda graph: True, gen throughput (token/s): 4594.01, #queue-req: 300")
    _startup(w)
    steady(w, 10, retract_every_s=30)
    w.raw("[1970-01-01 00:00:07] Decode batch, #running-req: 200, #token: 400000, token usage: 0.95, "
          "cuda graph: True, gen throughput (token/s): 4594.01, #queue-req: 300")
    w.now -= 3600  # the machine's clock is set back an hour
    steady(w, 20, retract_every_s=30)
    return Scenario("clock_jump", w.lines, {"retractions_frequent": "warning"}, {"retractions_per_minute": 2.0},
                    rel=0.1)


def replayed_history() -> Scenario:
    w = _writer()
    _startup(w)
    steady(w, 120, retract_every_s=120, step_s=5.0)
    return Scenario("replayed_history", w.lines, {"retractions_frequent": "ok"}, {"retractions_per_minute": 0.5})


def log_only() -> Scenario:
    w = _writer(version="0.5.10")
    _startup(w)
    steady(w, 30, retract_every_s=40, queue=0, usage=0.5)  # alerts wait their `for` (15 min here)
    return Scenario("log_only_old_release", w.lines, {"retractions_frequent": "warning", "queue_empty": "warning"},
                    {"retractions_per_minute": 1.5, "queue_empty_ratio": 1.0})


def _metrics_text(retracted: float, queue: float, usage: float) -> str:
    labels = 'engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
    return (f"# TYPE sglang:num_retracted_requests_total counter\n"
            f"sglang:num_retracted_requests_total{{{labels}}} {retracted}\n"
            f"# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{{{labels}}} {queue}\n"
            f"# TYPE sglang:token_usage gauge\nsglang:token_usage{{{labels}}} {usage}\n"
            f"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{{{labels}}} 200\n")


def metrics_only() -> Scenario:
    # 3 retracted requests a minute, scraped every 15 s for 20 minutes.
    history = [(t, _metrics_text(float(3 * t // 60), 300, 0.95)) for t in range(0, 20 * 60 + 1, 15)]
    return Scenario("metrics_only", [], {"retractions_frequent": "warning", "queue_empty": "ok"},
                    {"retractions_per_minute": 3.0, "queue_empty_ratio": 0.0}, metrics=history)


# Failures written from SGLang 0.5.23's own format strings: each is read by its evidence, not by the
# generic order (issue 22).
_NO_RUNTIME_OOM = {"prefill_oom": "ok", "decode_oom": "ok", "oom_unknown_phase": "ok"}


def default_oom_prefill() -> Scenario:
    """Page size 1: the phase-less `Out of memory.` message, then the traceback through alloc_for_extend."""
    w = _writer()
    _startup(w)
    steady(w, 12, retract_every_s=None)
    w.default_oom("prefill").tick(120).sigquit()
    return Scenario("default_oom_prefill", w.lines, {"prefill_oom": "critical", "oom_unknown_phase": "ok",
                                                     "decode_oom": "ok", "startup_headroom_oom": "ok"},
                    {"oom_prefill_count": 1.0, "oom_unknown_count": 0.0})


def request_slots_oom() -> Scenario:
    """`alloc_req_slots runs out of memory` raised inside alloc_for_extend: --max-running-requests down."""
    w = _writer()
    _startup(w)
    steady(w, 12, retract_every_s=None)
    w.req_slots_oom().tick(120).sigquit()
    return Scenario("request_slots_oom", w.lines, {"decode_oom": "critical", "prefill_oom": "ok",
                                                   "oom_unknown_phase": "ok"}, {"oom_decode_count": 1.0})


def _failed_capture(graph: str) -> LogWriter:
    w = _writer()
    w.server_args(mem_fraction_static=0.88, cuda_graph_max_bs_decode=512, cuda_graph_max_bs_prefill=4096,
                  enable_metrics=True)
    w.add("Load weight begin. avail mem=79.19 GB")
    w.add("Load weight end. elapsed=21.40 s, type=Qwen2ForCausalLM, avail mem=63.89 GB, mem usage=15.30 GB.")
    w.add("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 700000, K size: 28.00 GB, V size: 28.00 GB")
    w.add("Memory pool end. avail mem=7.80 GB")
    w.tick(90)
    return w.graph_capture_oom(graph).tick(120).sigquit()


def decode_graph_capture_failed() -> Scenario:
    """Start-up `Capture cuda graph failed: CUDA out of memory`: the decode graph's ceiling, never a runtime
    OOM nor the generic headroom failure."""
    return Scenario("decode_graph_capture_failed", _failed_capture("decode").lines,
                    {"decode_graph_capture_oom": "critical", "prefill_graph_capture_oom": "ok",
                     "startup_headroom_oom": "ok", **_NO_RUNTIME_OOM},
                    {"oom_graph_decode_count": 1.0, "oom_capture_count": 0.0})


def prefill_graph_capture_failed() -> Scenario:
    """Start-up `Capture prefill CUDA graph failed:`: the prefill graph's ceiling, not --chunked-prefill-size."""
    return Scenario("prefill_graph_capture_failed", _failed_capture("prefill").lines,
                    {"prefill_graph_capture_oom": "critical", "decode_graph_capture_oom": "ok",
                     "startup_headroom_oom": "ok", **_NO_RUNTIME_OOM},
                    {"oom_graph_prefill_count": 1.0})


def graphs_off_by_deepep() -> Scenario:
    """`Cuda graph is disabled because deepep_mode=`normal`` (logged before `server_args=`), then every Decode
    line `cuda graph: False`: the graph checks are not judged (no graph flag can help), every evaluator."""
    w = _writer()
    w.add("WARNING moe_hook.py:384: Cuda graph is disabled because deepep_mode=`normal`")
    _startup(w)
    for _ in range(12 * 30):
        w.decode(300, 0.95, 300, False)
        w.tick(2.0)
    return Scenario("graphs_off_by_deepep", w.lines, {"cuda_graph_uncovered": "unknown",
                                                      "cuda_graph_ceiling_low": "unknown"},
                    {"cuda_graph_off": 2.0, "cuda_graph_miss_ratio": 1.0})


def _hybrid_decode(w: LogWriter, minutes: float, running: int, queue: int, full: float, mamba: float) -> None:
    for _ in range(int(minutes * 30)):
        w.add(f"Decode batch, #running-req: {running}, #full token: {int(full * 500000)}, full token usage: {full:.2f}, "
              f"mamba num: {int(mamba * 30)}, mamba usage: {mamba:.2f}, cuda graph: True, "
              f"gen throughput (token/s): 310.00, #queue-req: {queue}")
        w.tick(2.0)


def mamba_capped() -> Scenario:
    """SGLang's mamba state pool caps the batch at 6 while 40 wait: the state pool's check, never the cap's."""
    w = _writer()
    w.server_args(mem_fraction_static=0.88, max_running_requests=128, cuda_graph_max_bs=8, enable_metrics=True)
    w.add(MAMBA_CAP.format(cap=6, size=30, ratio=5))
    w.startup(available=6.5, max_running=6, capture_bs=[1, 2, 4, 8])
    _hybrid_decode(w, 20, running=6, queue=40, full=0.12, mamba=0.40)
    return Scenario("mamba_state_caps_running", w.lines,
                    {"running_capped_by_mamba": "warning", "running_capped": "ok", "kv_underused": "ok",
                     "running_capped_by_kv": "ok", "mamba_pool_full": "ok"},
                    {"running_capped_ratio": 1.0, "mamba_bound_ratio": 0.0})


def kv_cut_cap() -> Scenario:
    """SGLang cut the requested 128 to 50 for lack of KV: the KV pool's check, never the cap's."""
    w = _writer()
    w.server_args(mem_fraction_static=0.8, max_running_requests=128, cuda_graph_max_bs=64, enable_metrics=True)
    w.add(KV_REDUCED.format(asked=128, got=50))
    w.startup(available=6.5, max_running=50, capture_bs=[1, 2, 4, 8, 16, 32, 64])
    steady(w, 20, retract_every_s=None, queue=40, usage=0.6, running=50)
    return Scenario("kv_pool_cuts_the_cap", w.lines,
                    {"running_capped_by_kv": "warning", "running_capped": "ok", "kv_underused": "ok",
                     "running_capped_by_mamba": "ok"},
                    {"running_capped_ratio": 1.0})


def swa_pool_binds() -> Scenario:
    """A sliding-window model whose SWA pool is full while the full pool has room, on a pool smaller than one
    context-length request: the SWA pool's check and the context check, not the scheduler's."""
    w = _writer()
    w.server_args(mem_fraction_static=0.88, max_running_requests=256, cuda_graph_max_bs=256, enable_metrics=True,
                  swa_full_tokens_ratio=0.5)
    w.add(SWA_POOL.format(full=30000, swa=15000))
    w.startup(available=6.5, max_running=256, max_total=30000, capture_bs=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    for _ in range(20 * 30):
        w.add("Decode batch, #running-req: 120, #full token: 12000, full token usage: 0.40, #swa token: 14550, "
              "swa token usage: 0.97, cuda graph: True, gen throughput (token/s): 310.00, #queue-req: 50")
        w.tick(2.0)
    return Scenario("swa_pool_binds", w.lines,
                    {"swa_pool_full": "warning", "context_exceeds_kv_pool": "warning", "kv_underused": "ok",
                     "running_capped": "ok", "mamba_pool_full": "ok"},
                    {"swa_bound_ratio": 1.0, "kv_pool_context_ratio": 0.9155})


# SGLang's latency histograms (issue 25): a 0.5.23 server whose /metrics carries TTFT, ITL, E2E and queue-time
# buckets, the running gauge and the prefill token counter, beside its log. Every request of a histogram takes
# the same time, so each quantile is PromQL's interpolation inside that time's bucket.
_LATENCY_BOUNDS = (0.01, 0.02, 0.04, 0.06, 0.1, 0.2, 0.4, 0.6, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0)
_TOKENIZER = 'engine_type="unified",model_name="m"'
# The scheduler's series with the rank labels SGLang 0.5.23 puts on them at TP=1; its log's lines carry no
# rank prefix: the sidecar reads both as one rank (docs/sidecar.md, "One server, one rank").
_SCHEDULER = 'engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
LATENCY_CHECKS = ("latency_high_batch_large", "latency_queue_dominates", "ttft_long_prompts")
# diagnose and a replay read a log: no histogram, so no latency verdict (advisor.LATENCY_UNSEEN).
_UNSEEN = {c: "SGLang's latency histograms were not read" for c in LATENCY_CHECKS}


def _histogram(name: str, labels: str, seconds: float, requests: int) -> str:
    """`requests` requests of `seconds` each, as SGLang's cumulative buckets (+Inf, _count and _sum)."""
    lines = [f"# TYPE {name} histogram"]
    for b in (*_LATENCY_BOUNDS, float("inf")):
        le = "+Inf" if b == float("inf") else repr(b)
        lines.append(f'{name}_bucket{{{labels},le="{le}"}} {requests if b >= seconds else 0}')
    lines += [f"{name}_count{{{labels}}} {requests}", f"{name}_sum{{{labels}}} {requests * seconds!r}"]
    return "\n".join(lines) + "\n"


def _latency_metrics(t: float, *, ttft: float, itl: float, e2e: float, queue_time: float, running: int,
                     tokens_per_request: int, per_s: float = 2.0) -> str:
    n = int(per_s * t)
    return (_histogram("sglang:time_to_first_token_seconds", _TOKENIZER + ',is_streaming="true"', ttft, n)
            + _histogram("sglang:inter_token_latency_seconds", _TOKENIZER, itl, n * 100)
            + _histogram("sglang:e2e_request_latency_seconds", _TOKENIZER + ',is_streaming="true"', e2e, n)
            + _histogram("sglang:queue_time_seconds", _SCHEDULER, queue_time, n)
            + f"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{{{_SCHEDULER}}} {running}\n"
            + "# TYPE sglang:realtime_tokens_total counter\n"
            + f'sglang:realtime_tokens_total{{{_SCHEDULER},mode="prefill_compute"}} {n * tokens_per_request}\n')


def _latency(name: str, statuses: dict[str, str], signals: dict[str, float], *, running: int, queue: int,
             **latency: float) -> Scenario:
    """22 minutes of Decode and Prefill lines (the prefill's new tokens are the log's, as a sidecar with a log
    counts them), SGLang's /metrics scraped every 15 s; 2 requests a second."""
    w = _writer()
    _startup(w)
    for _ in range(22 * 30):
        w.decode(running, 0.95, queue, True)
        w.prefill(4 * int(latency["tokens_per_request"]), 0, 0.95, running, queue)  # 4 requests in 2 s
        w.tick(2.0)
    history = [(float(t), _latency_metrics(float(t), running=running, **latency))  # type: ignore[arg-type]
               for t in range(0, 22 * 60 + 1, 15)]
    return Scenario(name, w.lines, statuses, signals, metrics=history, log_only=_UNSEEN)


def latency_slow_tokens_large_batch() -> Scenario:
    """ITL 0.3 s at a batch of 200: lower --max-running-requests. TTFT is high too, but the prompts are short
    (500 new tokens a request) and the queue time is short: neither of the other two latency checks applies."""
    return _latency("latency_slow_tokens_large_batch",
                    {"latency_high_batch_large": "critical", "ttft_long_prompts": "ok", "latency_queue_dominates": "ok"},
                    {"itl_p95_seconds": 0.39, "ttft_p95_seconds": 3.9, "prefill_tokens_per_request": 500.0},
                    running=200, queue=300, ttft=3.0, itl=0.3, e2e=6.0, queue_time=0.05, tokens_per_request=500)


def latency_queued() -> Scenario:
    """Requests wait 5 s of a 5 s median end-to-end latency: the client or capacity. TTFT is high with long
    prompts, but that check is suppressed while the queue dominates (the queue, not the chunk, delays it)."""
    return _latency("latency_queued",
                    {"latency_queue_dominates": "critical", "ttft_long_prompts": "ok", "latency_high_batch_large": "ok"},
                    {"queue_time_share": 1.0, "queue_time_p50_seconds": 5.0, "ttft_p95_seconds": 5.9},
                    running=200, queue=1500, ttft=5.5, itl=0.03, e2e=5.5, queue_time=5.0, tokens_per_request=4096)


def latency_long_prompts() -> Scenario:
    """TTFT 3 s with 4096 new prompt tokens a request: raise --chunked-prefill-size. ITL is high too, but at a
    batch of 32 the batch is not the cause."""
    return _latency("latency_long_prompts",
                    {"ttft_long_prompts": "warning", "latency_high_batch_large": "ok", "latency_queue_dominates": "ok"},
                    {"ttft_p95_seconds": 3.9, "prefill_tokens_per_request": 4096.0, "itl_p95_seconds": 0.39},
                    running=32, queue=300, ttft=3.0, itl=0.3, e2e=6.0, queue_time=0.05, tokens_per_request=4096)


def _pool_metrics_text(full: float, swa: float, mamba: float, mamba_slots: tuple[float, float]) -> str:
    """SGLang 0.5.23's scheduler gauges of a hybrid model: the per-pool usages (a pool the model lacks at 0),
    mamba state slots (used, available), 40 waiting behind 6 running; token usage is the fullest pool."""
    labels = 'engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
    gauges = {"num_queue_reqs": 40, "num_running_reqs": 6, "token_usage": max(full, swa, mamba),
              "full_token_usage": full, "swa_token_usage": swa, "mamba_usage": mamba,
              "mamba_used_tokens": mamba_slots[0], "mamba_available_tokens": mamba_slots[1]}
    return "".join(f"# TYPE sglang:{name} gauge\nsglang:{name}{{{labels}}} {value}\n" for name, value in gauges.items())


def mamba_pool_metrics_only() -> Scenario:
    """No log: SGLang's /metrics of a mamba model whose state pool is full (0.98) while the full-attention pool
    is at 0.35 and 40 wait. The sidecar reads the per-pool gauges as the log's Decode lines; the native rule
    reads the same gauges."""
    history = [(t, _pool_metrics_text(0.35, 0.0, 0.98, (196, 4))) for t in range(0, 20 * 60 + 1, 15)]
    return Scenario("mamba_pool_metrics_only", [], {"mamba_pool_full": "warning", "kv_underused": "ok"},
                    {"mamba_bound_ratio": 1.0, "full_usage_mean": 0.35, "mamba_cache_size_seen": 200.0},
                    metrics=history)


def swa_pool_metrics_only() -> Scenario:
    """No log: a sliding-window model's SWA pool at 0.97 while the full pool is at 0.40 and 40 wait; its mamba
    gauge, exported at 0 (no such pool), judges the mamba check ok on every evaluator."""
    history = [(t, _pool_metrics_text(0.40, 0.97, 0.0, (0, 0))) for t in range(0, 20 * 60 + 1, 15)]
    return Scenario("swa_pool_metrics_only", [], {"swa_pool_full": "warning", "mamba_pool_full": "ok"},
                    {"swa_bound_ratio": 1.0, "swa_usage_mean": 0.97, "full_usage_mean": 0.40}, metrics=history)


ALL: list[Callable[[], Scenario]] = [healthy, storm, tp4, dp_hot_rank, restart_new_args, sidecar_restart,
                                     clock_jump, replayed_history, log_only, metrics_only, default_oom_prefill,
                                     request_slots_oom, decode_graph_capture_failed, prefill_graph_capture_failed,
                                     graphs_off_by_deepep, mamba_capped, kv_cut_cap, swa_pool_binds,
                                     latency_slow_tokens_large_batch, latency_queued, latency_long_prompts,
                                     mamba_pool_metrics_only, swa_pool_metrics_only]


def stamp_of(line: str, last: float) -> float:
    """A line's own stamp (seconds), or `last` when it has none readable (for the live feeder)."""
    if line.startswith("[") and len(line) > 20 and line[5] == "-" and line[11] == " ":
        try:
            return float(calendar.timegm(time.strptime(line[1:20], "%Y-%m-%d %H:%M:%S")))
        except ValueError:
            return last
    return last
