"""Scenarios for the stand-in SGLang: the log lines it writes and the /metrics values it serves.

Line formats are SGLang 0.5.23's own (see ../shared/reference/sglang-fixtures/log-lines-rendered.txt
and the corpus): the message text is rendered by `render_*` (pure) and `LogWriter` adds the
`[YYYY-MM-DD HH:MM:SS] ` prefix SGLang's logger prints for a TP=1 server, appending in real time.
"""

from __future__ import annotations

import ast
import datetime as dt
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
MODEL = "Qwen/Qwen2.5-7B-Instruct"


@dataclass(frozen=True)
class CounterRate:
    """A counter of the recorded exposition that grows while the stand-in runs."""

    per_second: float
    step: float = 1.0  # grow in whole steps (e.g. 3 requests per retraction event), like SGLang does


@dataclass(frozen=True)
class Scenario:
    """One SGLang behaviour, as seen in its log and on its /metrics."""

    name: str
    summary: str
    # log side
    decode_cuda_graph: bool = True
    decode_running: int = 187
    decode_queue: int = 412
    decode_token_usage: float = 0.93
    retract_every_ticks: int = 0  # 0 = never; a tick is one Decode line
    retracted_per_event: int = 3
    prefill_oom_at_tick: int = -1  # the tick whose prefill hits SGLang's own "Prefill out of memory"
    available_gpu_mem_gb: float = 6.84
    captured_bs: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112,
                                    120, 128, 136, 144, 152, 160, 168, 176, 184, 192, 200, 208, 216, 224,
                                    232, 240, 248, 256)
    server_args: dict[str, Any] = field(default_factory=dict)
    # metrics side: `name` or `name{label="value"}` (colon spelling) -> value / growth
    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, CounterRate] = field(default_factory=dict)


# Counters a live, healthy 0.5.23 server keeps moving: decode passes run in CUDA graphs, prefill
# computes and hits the cache, tokens are generated. The retraction counter stays still.
_HEALTHY_COUNTERS = {
    'sglang:cuda_graph_passes_total{mode="decode_cuda_graph"}': CounterRate(20.0),
    'sglang:cuda_graph_passes_total{mode="prefill_none"}': CounterRate(2.0),
    'sglang:realtime_tokens_total{mode="decode"}': CounterRate(5300.0),
    'sglang:realtime_tokens_total{mode="prefill_compute"}': CounterRate(8192.0),
    'sglang:realtime_tokens_total{mode="prefill_cache"}': CounterRate(3072.0),
    'sglang:prompt_tokens_total': CounterRate(11264.0),
    'sglang:cached_tokens_total': CounterRate(3072.0),
    'sglang:generation_tokens_total': CounterRate(5300.0),
    'sglang:num_requests_total': CounterRate(10.0),
}


def _observed_at(histogram: str, seconds: float, per_second: float = 10.0) -> dict[str, CounterRate]:
    """A latency histogram of the recorded exposition taking `per_second` requests that each took
    `seconds`: every bucket from the first bound at or above it grows, with _count and _sum."""
    bounds = [b for b in _BUCKETS if b >= seconds]
    grown = {f'{histogram}_bucket{{le="{b!r}"}}': CounterRate(per_second) for b in bounds}
    grown[f'{histogram}_bucket{{le="+Inf"}}'] = CounterRate(per_second)
    grown[f"{histogram}_count"] = CounterRate(per_second)
    grown[f"{histogram}_sum"] = CounterRate(per_second * seconds, step=per_second * seconds)
    return grown


# Every finite bucket bound of 0.5.23's latency histograms (a selector naming one that a histogram lacks
# matches nothing).
_BUCKETS = (0.001, 0.002, 0.004, 0.005, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.05,
            0.06, 0.08, 0.1, 0.2, 0.4, 0.5, 0.6, 0.8, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0,
            30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0,
            900.0, 1000.0, 1200.0, 1400.0, 1600.0, 1800.0, 2000.0, 2400.0, 2500.0, 3000.0)
# What users feel on the healthy server: requests answered (TTFT, ITL, end to end, queue time), so the
# latency signals and panels have data (0.5.23 exports these histograms).
_HEALTHY_LATENCY = {
    **_observed_at("sglang:time_to_first_token_seconds", 0.3),
    **_observed_at("sglang:inter_token_latency_seconds", 0.03),
    **_observed_at("sglang:e2e_request_latency_seconds", 6.0),
    **_observed_at("sglang:queue_time_seconds", 0.05),
}
_HEALTHY_COUNTERS.update(_HEALTHY_LATENCY)

_BASE_ARGS: dict[str, Any] = {
    "model_path": MODEL, "served_model_name": MODEL, "mem_fraction_static": 0.85,
    "schedule_conservativeness": 1.0, "chunked_prefill_size": 8192, "max_running_requests": 4096,
    "cuda_graph_max_bs_decode": 256, "schedule_policy": "fcfs",
}

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("healthy", "queue in the 100-2000 band, KV usage 0.93, every decode batch in a CUDA graph, "
             "no retraction, 6.84 GB headroom",
             server_args=dict(_BASE_ARGS), counters=dict(_HEALTHY_COUNTERS)),
    Scenario("retraction_storm", "KV cache full: 3 requests retracted every 4 decode lines, i.e. every 2 s "
             "(30 events, 90 requests a minute)", decode_token_usage=0.99, retract_every_ticks=4,
             server_args={**_BASE_ARGS, "schedule_conservativeness": 0.3},
             gauges={"sglang:token_usage": 0.99, "sglang:new_token_ratio": 0.5127},
             counters={**_HEALTHY_COUNTERS,
                       "sglang:num_retracted_requests_total": CounterRate(1.5, step=3.0),
                       "sglang:num_retracted_input_tokens_total": CounterRate(2304.0, step=4608.0)}),
    Scenario("memory_headroom_low", "only 1.20 GB left for activations after weights, KV cache and "
             "CUDA graphs", available_gpu_mem_gb=1.2,
             server_args={**_BASE_ARGS, "mem_fraction_static": 0.92},
             gauges={"sglang:startup_available_gpu_memory_gb": 1.2},
             counters=dict(_HEALTHY_COUNTERS)),
    Scenario("memory_headroom_high", "21.50 GB left unused for activations: the KV cache could be larger",
             available_gpu_mem_gb=21.5, server_args={**_BASE_ARGS, "mem_fraction_static": 0.7},
             gauges={"sglang:startup_available_gpu_memory_gb": 21.5},
             counters=dict(_HEALTHY_COUNTERS)),
    Scenario("prefill_oom", "a prefill batch of 8192 new tokens does not fit the KV pool: SGLang's "
             "RuntimeError 'Prefill out of memory' (the stand-in keeps serving, as after a supervisor restart)",
             prefill_oom_at_tick=8, server_args=dict(_BASE_ARGS), counters=dict(_HEALTHY_COUNTERS)),
    # The healthy server restarted with a larger --mem-fraction-static whose KV pool leaves prefill no room:
    # SGLang's prefill OOM 4 s (8 Decode lines) after the restart (the "did the change help?" case).
    Scenario("memory_raised_oom", "restarted with --mem-fraction-static 0.95 (was 0.85); a prefill then "
             "runs out of memory", prefill_oom_at_tick=8,
             server_args={**_BASE_ARGS, "mem_fraction_static": 0.95}, counters=dict(_HEALTHY_COUNTERS)),
    # The Done-when of issue 25: the retraction storm's server restarted with --schedule-conservativeness 1.3:
    # no retraction any more, but every first token now takes 0.7 s instead of 0.3 s (p95 0.39 s -> 0.79 s).
    Scenario("conservative_slow_ttft", "restarted with --schedule-conservativeness 1.3 (was 0.3): retractions "
             "stop, but the time to first token rises from 0.3 s to 0.7 s",
             server_args={**_BASE_ARGS, "schedule_conservativeness": 1.3},
             counters={**{k: v for k, v in _HEALTHY_COUNTERS.items() if "time_to_first_token" not in k},
                       **_observed_at("sglang:time_to_first_token_seconds", 0.7)}),
    Scenario("cuda_graph_uncovered", "CUDA graphs captured up to bs 32 while decode runs 187 requests: "
             "every decode batch runs eagerly", decode_cuda_graph=False,
             captured_bs=(1, 2, 4, 8, 12, 16, 24, 32),
             server_args={**_BASE_ARGS, "cuda_graph_max_bs_decode": 32},
             counters={**{k: v for k, v in _HEALTHY_COUNTERS.items() if "decode_cuda_graph" not in k},
                       'sglang:cuda_graph_passes_total{mode="decode_none"}': CounterRate(20.0)}),
)}


def server_args_line(args: dict[str, Any]) -> str:
    """The 0.5.23 `server_args={...}` startup message with `args` merged into the recorded one."""
    text = (DATA / "sglang-0.5.23-server_args-logline.txt").read_text(encoding="utf-8").strip()
    recorded = ast.literal_eval(text[len("server_args="):])
    recorded.update(args)
    return "server_args=" + repr(recorded)


def startup_messages(s: Scenario) -> list[str]:
    """The startup messages of a 0.5.23 server (load, KV pool, graphs, summary), for scenario `s`."""
    mem = s.available_gpu_mem_gb
    bs = ", ".join(str(b) for b in s.captured_bs)
    mrr = int(s.server_args.get("max_running_requests") or 4096)
    chunk = int(s.server_args.get("chunked_prefill_size") or 8192)
    return [
        server_args_line(s.server_args),
        "Load weight begin. avail mem=78.84 GB",
        "Load weight end. elapsed=21.40 s, type=Qwen2ForCausalLM, avail mem=59.30 GB, mem usage=15.27 GB.",
        "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 421888, K size: 24.15 GB, V size: 24.15 GB",
        f"Memory pool end. avail mem={mem + 1.12:.2f} GB",
        f"Capture cuda graph begin. This can take up to several minutes. avail mem={mem + 1.12:.2f} GB",
        f"Capture cuda graph bs [{bs}]",
        f"Capture cuda graph end. Time elapsed: 14.80 s. mem usage=1.12 GB. avail mem={mem:.2f} GB.",
        f"max_total_num_tokens=421888, chunked_prefill_size={chunk}, max_prefill_tokens=16384, "
        f"max_running_requests={mrr}, context_len=32768, available_gpu_mem={mem:.2f} GB",
    ]


# 0.5.23 srt/mem_cache/allocation.py: logger.error(msg) then raise RuntimeError(msg); the scheduler's
# handler logs the traceback. Frames abridged to the ones that name the phase.
_PREFILL_OOM = ("Prefill out of memory. Try to lower your batch size.\n"
                "Try to allocate 8192 tokens.\n"
                "Available tokens: 4096 (available_size=1024 + evictable_size=3072)\n")
_PREFILL_OOM_TRACEBACK = (
    "Scheduler hit an exception: Traceback (most recent call last):\n"
    '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 3120, in run_scheduler_process\n'
    "    scheduler.event_loop_overlap()\n"
    '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 1187, in event_loop_overlap\n'
    "    batch = self.get_next_batch_to_run()\n"
    '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2004, in get_new_batch_prefill\n'
    "    new_batch.prepare_for_extend()\n"
    '  File "/sgl-workspace/sglang/python/sglang/srt/mem_cache/allocation.py", line 212, in alloc_paged_token_slots_extend\n'
    "    raise RuntimeError(error_msg)\n"
    f"RuntimeError: {_PREFILL_OOM}")


def tick_messages(s: Scenario, tick: int) -> list[str]:
    """The messages SGLang logs during decode tick `tick` (0-based) of scenario `s` (may span lines)."""
    out: list[str] = []
    if tick == s.prefill_oom_at_tick:
        out += [_PREFILL_OOM, _PREFILL_OOM_TRACEBACK]
    if tick % 4 == 0:
        out.append(f"Prefill batch, #new-seq: 6, #new-token: 8192, #cached-token: 3072, token usage: "
                   f"{s.decode_token_usage:.2f}, #running-req: {s.decode_running - 6}, #queue-req: "
                   f"{s.decode_queue}, #pending-token: 0, cuda graph: False, input throughput (token/s): 8192.00")
    if s.retract_every_ticks and tick % s.retract_every_ticks == s.retract_every_ticks - 1:
        out.append(f"KV cache pool is full. Retract requests. #retracted_reqs: {s.retracted_per_event}, "
                   "#new_tokens_gained: 4608, #new_token_ratio: 0.3811 -> 0.5127")
    used = round(s.decode_token_usage * 421888)
    out.append(f"Decode batch, #running-req: {s.decode_running}, #token: {used}, token usage: "
               f"{s.decode_token_usage:.2f}, cuda graph: {s.decode_cuda_graph}, gen throughput (token/s): "
               f"{5321.0 + (tick % 7) * 3.17:.2f}, #queue-req: {s.decode_queue}")
    return out


def with_prefix(message: str, when: dt.datetime) -> str:
    """SGLang's logger prefix for a TP=1 server: `[YYYY-MM-DD HH:MM:SS] message`."""
    return f"[{when:%Y-%m-%d %H:%M:%S}] {message}"


class LogWriter:
    """Appends a scenario's log to a file in real time (startup once, then one tick per interval)."""

    def __init__(self, path: Path, scenario: Scenario, *, interval_s: float = 0.5,
                 now: Callable[[], dt.datetime] = dt.datetime.now) -> None:
        self.path = path
        self.scenario = scenario
        self.interval_s = interval_s
        self._now = now
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # a restart and the next tick never interleave
        self.ticks = 0

    def _append(self, messages: list[str]) -> None:
        when = self._now()
        with self.path.open("a", encoding="utf-8") as f:
            f.write("".join(with_prefix(m, when) + "\n" for m in messages))
            f.flush()
            os.fsync(f.fileno())

    def write_startup(self) -> None:
        """Append the startup messages."""
        self._append(startup_messages(self.scenario))

    def write_tick(self) -> None:
        """Append the next tick's messages."""
        with self._lock:
            self._append(tick_messages(self.scenario, self.ticks))
            self.ticks += 1

    def restart(self, scenario: Scenario) -> None:
        """The server restarted (appending to the same log) as `scenario`: its startup section with the new
        server_args, then its ticks counted from 0 again."""
        with self._lock:
            self.scenario = scenario
            self.ticks = 0
            self._append(startup_messages(scenario))

    def _run(self) -> None:
        self.write_startup()
        while not self._stop.wait(self.interval_s):
            self.write_tick()

    def start(self) -> None:
        """Write in a background thread until `stop()`."""
        self._thread = threading.Thread(target=self._run, name="scenario-log", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop writing (the file stays)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
