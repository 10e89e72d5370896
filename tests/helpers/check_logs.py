"""One log per check of the guide, written in real SGLang line formats (each fires its check), and the
list of them every reader is compared on."""

from __future__ import annotations

from helpers.scenario_logs import LogWriter, steady


def healthy() -> str:
    """0.5.23, everything inside the guide's bands."""
    w = LogWriter("0.5.23").server_args(mem_fraction_static=0.85, schedule_conservativeness=1.0,
                                        schedule_policy="fcfs", enable_metrics=True, chunked_prefill_size=8192)
    w.startup(total=80.0, weights=15.3, kv=57.1, graph=1.1, max_running=1024)
    steady(w, 12, running=200, usage=0.94, queue=600, graph=True, prefill_every=3, new=4000, cached=1200)
    return w.text()


def queue_empty() -> str:
    """0.4.6 (`Decode batch.`, no cuda-graph field): the client never keeps a queue."""
    w = LogWriter("0.4.6")
    return steady(w, 12, running=40, usage=0.3, queue=0, graph=None).text()


def queue_overloaded() -> str:
    """0.5.5 (`Decode batch,` with trailing `, `): the queue sits far above 2000."""
    w = LogWriter("0.5.5")
    return steady(w, 12, running=256, usage=0.95, queue=3500).text()


def queue_over_older_band() -> str:
    """0.4.3: a queue of 700 is inside the newest band (100-2000) but above the older-md band (50-500)."""
    return steady(LogWriter("0.4.3"), 12, running=256, usage=0.95, queue=700, graph=None).text()


def kv_underused() -> str:
    """0.4.10: requests wait while the KV cache is half empty."""
    w = LogWriter("0.4.10").server_args(schedule_conservativeness=1.0)
    return steady(w, 12, running=120, usage=0.55, queue=80).text()


def retractions_old_wording() -> str:
    """0.4.3 wording `Decode out of memory happened.`: 3 retractions a minute."""
    w = LogWriter("0.4.3")
    for i in range(360):
        w.decode(300, 0.99, 150, graph=None)
        if i % 10 == 0:
            w.retract(1)
        w.tick(2)
    return w.text()


def retractions_new_wording() -> str:
    """0.5.23 wording `KV cache pool is full. Retract requests.`: 10 a minute, current 1.1."""
    w = LogWriter("0.5.23").server_args(schedule_conservativeness=1.1)
    for i in range(360):
        w.decode(300, 0.99, 150)
        if i % 3 == 0:
            w.retract(2)
        w.tick(2)
    return w.text()


def headroom_high() -> str:
    """0.5.23: 14 GB left after startup on an 80 GB GPU at mem_fraction_static 0.80."""
    w = LogWriter("0.5.23").server_args(mem_fraction_static=0.80)
    w.startup(total=80.0, weights=15.3, kv=49.6, graph=1.1, available=14.0)
    return steady(w, 3).text()


def headroom_low() -> str:
    """0.5.10: 2 GB left on 80 GB at 0.90."""
    w = LogWriter("0.5.10").server_args(mem_fraction_static=0.90)
    w.startup(total=80.0, weights=15.3, kv=60.0, graph=2.7, available=2.0)
    return steady(w, 3).text()


def headroom_zero_without_summary() -> str:
    """0.4.6: the summary has no available_gpu_mem; the capture leaves 0.07 GB (critical)."""
    w = LogWriter("0.4.6").server_args(mem_fraction_static=0.92)
    w.startup(total=80.0, weights=15.3, kv=63.5, graph=1.13, available=0.07)
    return steady(w, 3, graph=None).text()


def startup_too_small() -> str:
    """0.5.23: weights of 60 GB on an 80 GB GPU at mem_fraction_static 0.70: `Not enough memory`."""
    w = LogWriter("0.5.23").server_args(mem_fraction_static=0.70)
    w.add("Load weight begin. avail mem=80.00 GB")
    w.add("Load weight end. elapsed=61.20 s, type=LlamaForCausalLM, avail mem=20.00 GB, mem usage=60.00 GB.")
    return w.not_enough_memory().text()


def prefill_oom() -> str:
    """0.5.23: SGLang's own `Prefill out of memory` at chunked_prefill_size 8192."""
    w = LogWriter("0.5.23").server_args(chunked_prefill_size=8192)
    steady(w, 2, prefill_every=2)
    return w.prefill_oom().text()


def prefill_oom_v02() -> str:
    """0.2.13 (no timestamps, `[gpu=0]`): the prefill knob is --max-prefill-tokens."""
    w = LogWriter("0.2.13").server_args(max_prefill_tokens=16384)
    for _ in range(20):
        w.decode(100, 0.8, 50, graph=None)
    return w.prefill_oom().text()


def decode_oom() -> str:
    """0.5.23 DP attention: a CUDA OOM in forward_decode on DP1 at batch 600, cap 1024."""
    w = LogWriter("0.5.23", tp_size=2).server_args(max_running_requests=1024, dp_size=2, enable_dp_attention=True)
    steady(w, 3, running=600, usage=0.97, queue=100, ranks=[{"dp": 0, "tp": 0}, {"dp": 1, "tp": 1}])
    return w.cuda_oom("forward_decode", dp=1, tp=1).text()


def oom_unknown() -> str:
    """0.4.10: a bare torch.OutOfMemoryError without frames."""
    w = LogWriter("0.4.10").server_args(max_running_requests=512)
    steady(w, 3, running=400, usage=0.97, queue=100)
    return w.cuda_oom(None).text()


def cuda_graph_uncovered() -> str:
    """0.5.23: batches of 200-300 run eagerly; graphs captured up to 160, cap 512."""
    w = LogWriter("0.5.23").server_args(cuda_graph_max_bs_decode=160)
    w.startup(max_running=512, capture_bs=[1, 2, 4, 8, 16, 32, 64, 128, 160])
    for i in range(360):
        run = 200 + (i % 11) * 10
        w.decode(run, 0.93, 300, graph=False)
        w.tick(2)
    return w.text()


def cuda_graph_uncovered_v04() -> str:
    """0.4.10 (no server_args): the flag is --cuda-graph-max-bs; queue 0 must not blame the client."""
    w = LogWriter("0.4.10")
    w.startup(max_running=512, capture_bs=[1, 2, 4, 8, 16, 32, 64, 128, 160])
    for i in range(360):
        w.decode(180 + (i % 5) * 10, 0.6, 0, graph=False)
        w.tick(2)
    return w.text()


def ceiling_low() -> str:
    """0.5.16: graphs captured only up to 32 while 2048 requests may run (before any traffic)."""
    w = LogWriter("0.5.16")
    return w.startup(max_running=2048, capture_bs=[1, 2, 4, 8, 16, 24, 32]).text()


def running_capped() -> str:
    """0.5.23: the batch sits at max_running_requests=128 with a queue and half-empty KV cache."""
    w = LogWriter("0.5.23").server_args(max_running_requests=128)
    w.startup(max_running=128)
    return steady(w, 12, running=128, usage=0.5, queue=200).text()


def latency_large_batch() -> str:
    """0.5.23 under the latency recipe: batches of 300."""
    return steady(LogWriter("0.5.23").server_args(max_running_requests=1024), 12, running=300, usage=0.8,
                  queue=0).text()


def lpm_no_reuse() -> str:
    """0.5.23 with --schedule-policy lpm and no prefix hits."""
    w = LogWriter("0.5.23").server_args(schedule_policy="lpm")
    return steady(w, 12, prefill_every=1, new=6000, cached=0).text()


def fcfs_with_reuse() -> str:
    """0.5.9 with fcfs and 70 % of prefill tokens from the prefix cache."""
    w = LogWriter("0.5.9").server_args(schedule_policy="fcfs")
    return steady(w, 12, prefill_every=1, new=3000, cached=7000).text()


def metrics_disabled() -> str:
    """0.5.23 started without --enable-metrics."""
    return steady(LogWriter("0.5.23").server_args(enable_metrics=False), 3).text()


def dp_one_bad_rank() -> str:
    """0.5.23 DP attention (`DPk TPk EPk`): DP2 retracts 6 times a minute, DP0/1/3 are fine."""
    w = LogWriter("0.5.23", tp_size=4).server_args(schedule_conservativeness=1.0, dp_size=4)
    for i in range(360):
        for dp in range(4):
            w.decode(300, 0.97, 400, dp=dp, tp=dp, ep=dp)
            if dp == 2 and i % 5 == 0:
                w.retract(1, dp=dp, tp=dp, ep=dp)
        w.tick(2)
    return w.text()


def startup_capture_oom(mem_fraction: float | None = 0.93) -> str:
    """0.5.23 incident: a torch OOM while capturing CUDA graphs at start-up (before the first batch)."""
    w = LogWriter("0.5.23").server_args(mem_fraction_static=mem_fraction, enable_metrics=True)
    w.add("Load weight begin. avail mem=78.50 GB")
    w.add("Load weight end. elapsed=21.40 s, type=Qwen2ForCausalLM, avail mem=63.20 GB, mem usage=15.30 GB.")
    w.add("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 700000, K size: 28.00 GB, V size: 28.00 GB")
    w.add("Memory pool end. avail mem=6.60 GB")
    w.add("Capture target decode CUDA graph begin. backend=flashinfer, num_tokens_per_req=1, avail mem=6.40 GB")
    return w.capture_oom().text()


def startup_workspace_oom(mem_fraction: float | None = 0.93) -> str:
    """0.5.23 incident: a torch OOM in a constructor (an attention workspace) before the first batch, not a
    graph capture: the headroom the static fraction leaves is too small."""
    w = LogWriter("0.5.23").server_args(mem_fraction_static=mem_fraction, enable_metrics=True)
    w.add("Load weight begin. avail mem=78.50 GB")
    w.add("Load weight end. elapsed=21.40 s, type=Qwen2ForCausalLM, avail mem=63.20 GB, mem usage=15.30 GB.")
    w.add("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 700000, K size: 28.00 GB, V size: 28.00 GB")
    w.add("Memory pool end. avail mem=6.60 GB")
    w.add("Scheduler hit an exception: Traceback (most recent call last):")
    return w.raw('  File "/sgl/python/sglang/srt/managers/scheduler.py", line 3329, in run_scheduler_process\n'
                 "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)\n"
                 '  File "/sgl/python/sglang/srt/model_executor/model_runner.py", line 1110, in init_attention_backends\n'
                 "    self.attn_backend = self._get_attention_backend()\n"
                 '  File "/sgl/python/sglang/srt/layers/attention/flashinfer_backend.py", line 120, in __init__\n'
                 "    self.workspace_buffer = torch.empty(size, dtype=torch.uint8, device=device)\n"
                 "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.25 GiB. GPU 0 has a total "
                 "capacity of 79.19 GiB of which 412.00 MiB is free.").sigquit().text()


def decode_graph_capture_oom(ceiling: int | None = 512) -> str:
    """0.5.23: `Capture cuda graph failed: CUDA out of memory` at start-up (decode graphs up to 512)."""
    args: dict[str, object] = {"mem_fraction_static": 0.88, "enable_metrics": True}
    if ceiling is not None:
        args["cuda_graph_max_bs_decode"] = ceiling
    w = LogWriter("0.5.23").server_args(**args)
    w.add("Load weight begin. avail mem=79.19 GB")
    w.add("Load weight end. elapsed=21.40 s, type=Qwen2ForCausalLM, avail mem=63.89 GB, mem usage=15.30 GB.")
    w.add("Memory pool end. avail mem=7.80 GB")
    w.add("Capture target decode CUDA graph begin. backend=flashinfer, num_tokens_per_req=1, avail mem=7.60 GB")
    return w.graph_capture_oom("decode").sigquit().text()


def prefill_graph_capture_oom() -> str:
    """0.5.23: `Capture prefill CUDA graph failed: CUDA out of memory` at start-up (prefill ceiling 4096)."""
    w = LogWriter("0.5.23").server_args(mem_fraction_static=0.88, chunked_prefill_size=8192,
                                        cuda_graph_max_bs_prefill=4096)
    w.add("Load weight begin. avail mem=79.19 GB")
    return w.graph_capture_oom("prefill").sigquit().text()


def default_oom(phase: str = "prefill") -> str:
    """0.5.23, page size 1: `Out of memory. Try to lower your batch size.` then the traceback through
    alloc_for_extend (prefill) or alloc_for_decode (decode)."""
    w = LogWriter("0.5.23").server_args(chunked_prefill_size=8192, max_running_requests=1024)
    steady(w, 3, running=600, usage=0.97, queue=100, prefill_every=2)
    return w.default_oom(phase).sigquit().text()


def request_slots_oom() -> str:
    """0.5.23: `alloc_req_slots runs out of memory` raised while building a prefill batch, cap 1024."""
    w = LogWriter("0.5.23").server_args(chunked_prefill_size=8192, max_running_requests=1024)
    steady(w, 3, running=600, usage=0.97, queue=100, prefill_every=2)
    return w.req_slots_oom().sigquit().text()


def init_oom_without_frames() -> str:
    """A bare CUDA OOM line stating the figures (about 1 % of a 139.8 GiB GPU free), no frames."""
    w = LogWriter("0.5.23").server_args(max_running_requests=512)
    steady(w, 3, running=400, usage=0.97, queue=100)
    w.add("Scheduler hit an exception: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. "
          "GPU 0 has a total capacity of 139.80 GiB of which 1.90 GiB is free.")
    return w.sigquit().text()


def pd_decode_busy() -> str:
    """0.5.23 PD decode node (pre-allocated/prealloc/transfer fields, `DPk TPk EPk`) behind a busy
    HTTP front: mostly access lines, speculative and PD Decode lines, Prefill lines."""
    w = LogWriter("0.5.23", tp_size=2)
    for i in range(900):
        for _ in range(3):
            w.access()
        dp = i % 2
        w.add(f"Decode batch, #running-req: {100 + i % 50}, #token: 90000, token usage: 0.{50 + i % 40}, "
              f"pre-allocated usage: 0.00, #prealloc-req: 0, #transfer-req: 0, #retracted-req: 0, "
              f"cuda graph: {i % 3 != 0}, gen throughput (token/s): 1082.11, #queue-req: {i % 7}", dp=dp, tp=dp, ep=dp)
        if i % 4 == 0:
            w.add("Decode batch, #running-req: 24, #token: 233600, token usage: 0.66, accept len: 3.05, "
                  "accept rate: 0.68, cuda graph: True, gen throughput (token/s): 239.06, #queue-req: 2",
                  dp=dp, tp=dp, ep=dp)
            w.prefill(3000, 900, 0.7, 120, 4, dp=dp, tp=dp, ep=dp)
        w.tick(1)
    return w.text()


# SGLang 0.5.23's own capacity messages (mem_cache/kv_cache_configurator.py, managers/tp_worker.py,
# mem_cache/memory_pool.py, model_executor/pool_configurator.py, arg_groups/speculative_hook.py), filled in.
MAMBA_CAP = ("max_running_requests is capped to {cap} by the mamba state cache (max_mamba_cache_size={size}, {ratio} "
             "state slots per request). To raise it: increase --mamba-full-memory-ratio or --max-mamba-cache-size, or "
             "halve the state size with --mamba-ssm-dtype bfloat16.")
KV_REDUCED = ("max_running_requests was reduced from the requested {asked} to {got} (per dp worker) due to the "
              "available KV cache capacity.")
KV_BELOW_CONTEXT = ("KV pool holds {tokens} tokens, fewer than --context-length {context}. One full-length request "
                    "cannot fit, so long requests will be refused or truncated at serving time. Lower "
                    "--context-length, raise --mem-fraction-static, or free memory taken before the pool is sized.")
MAMBA_ALLOCATED = ("Mamba Cache is allocated. max_mamba_cache_size: {size}, conv_state size: 0.01GB, "
                   "ssm_state size: 0.50GB ")
SWA_POOL = "Use sliding window memory pool. full_layer_tokens={full}, swa_layer_tokens={swa}"
SPEC_DEFAULT = ("Max running requests is reset to 48 for speculative decoding. You can override this by explicitly "
                "setting --max-running-requests.")


def _hybrid(w: LogWriter, minutes: float, *, running: int, queue: int, full: float, mamba: float | None = None,
            swa: float | None = None) -> LogWriter:
    """Decode lines of a hybrid model (0.5.23's pool_stats_observer layout: full, then SWA, then mamba)."""
    for _ in range(int(minutes * 30)):
        pools = f"#full token: {int(full * 500000)}, full token usage: {full:.2f}, "
        if swa is not None:
            pools += f"#swa token: {int(swa * 400000)}, swa token usage: {swa:.2f}, "
        if mamba is not None:
            pools += f"mamba num: {int(mamba * 64)}, mamba usage: {mamba:.2f}, "
        w.add(f"Decode batch, #running-req: {running}, {pools}cuda graph: True, gen throughput (token/s): 310.00, "
              f"#queue-req: {queue}")
        w.tick(2)
    return w


def mamba_capped() -> str:
    """0.5.23 hybrid (Qwen3-Next): the mamba state pool caps running requests at 6 while 40 wait."""
    w = LogWriter("0.5.23").server_args(model_path="Qwen/Qwen3-Next-80B-A3B-Instruct", max_running_requests=128)
    w.add(MAMBA_ALLOCATED.format(size=30))
    w.add(MAMBA_CAP.format(cap=6, size=30, ratio=5))
    w.startup(max_running=6)
    return _hybrid(w, 12, running=6, queue=40, full=0.12, mamba=0.40).text()


def mamba_full_decode_only() -> str:
    """0.5.23 hybrid, log joined after start-up: only Decode lines show the state pool full."""
    return _hybrid(LogWriter("0.5.23"), 12, running=64, queue=30, full=0.35, mamba=0.98).text()


def kv_reduced() -> str:
    """0.5.23: --max-running-requests 128 cut to 50 for lack of KV; the batch sits at 50 with a queue."""
    w = LogWriter("0.5.23").server_args(max_running_requests=128, mem_fraction_static=0.8)
    w.add(KV_REDUCED.format(asked=128, got=50))
    w.startup(max_running=50, available=14.0, kv=4.0, weights=60.0, total=80.0, max_total=100)
    return steady(w, 12, running=50, usage=0.6, queue=40).text()


def context_below_pool() -> str:
    """0.5.23: the KV pool holds 30000 tokens, fewer than --context-length 131072."""
    w = LogWriter("0.5.23").server_args(context_length=131072)
    w.startup(max_total=30000)
    w.add(KV_BELOW_CONTEXT.format(tokens=30000, context=131072))
    return w.text()


def swa_full() -> str:
    """0.5.23 SWA model (gpt-oss): the sliding-window pool is full while the full pool has room."""
    w = LogWriter("0.5.23").server_args(model_path="openai/gpt-oss-120b", swa_full_tokens_ratio=0.5)
    w.add(SWA_POOL.format(full=500000, swa=250000))
    w.startup(max_running=256)
    return _hybrid(w, 12, running=120, queue=50, full=0.40, swa=0.97).text()


def speculative_default_cap() -> str:
    """0.5.23 with EAGLE: SGLang resets the cap to 48 itself (before the server_args line); the batch sits there."""
    w = LogWriter("0.5.23")
    w.add(SPEC_DEFAULT)
    w.server_args(speculative_algorithm="EAGLE", max_running_requests=48)
    w.startup(max_running=48)
    return steady(w, 12, running=48, usage=0.5, queue=200).text()


def weights_leave_no_memory() -> str:
    """0.5.23: the weights leave no memory under --mem-fraction-static=0.7; SGLang's own minimum is 0.812."""
    w = LogWriter("0.5.23").server_args(mem_fraction_static=0.7)
    w.add("Load weight begin. avail mem=79.10 GB")
    w.add("ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.7. Raise "
          "--mem-fraction-static above 0.812 (minimum viable = 1 - available/pre = 0.8113). If using speculative "
          "decoding, draft weights are now counted.")
    return w.text()


def mamba_state_too_small() -> str:
    """0.5.23 hybrid: the state pool cannot serve one request at start-up."""
    w = LogWriter("0.5.23").server_args(mem_fraction_static=0.8)
    w.add("Load weight begin. avail mem=79.10 GB")
    w.add("Load weight end. elapsed=21.40 s, type=Qwen3NextForCausalLM, avail mem=30.00 GB, mem usage=49.10 GB.")
    w.add("RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
          "max_mamba_cache_size=2, mamba_ratio=3, resulting max_num_reqs=0. Try: (1) reduce --max-running-requests, "
          "(2) increase --mem-fraction-static, or (3) use GPUs with more memory.")
    return w.text()


ALL_LOGS = [pd_decode_busy, healthy, queue_empty, queue_overloaded, kv_underused, retractions_old_wording, retractions_new_wording,
            headroom_high, headroom_low, headroom_zero_without_summary, startup_too_small, prefill_oom,
            prefill_oom_v02, decode_oom, oom_unknown, cuda_graph_uncovered, cuda_graph_uncovered_v04, ceiling_low,
            running_capped, latency_large_batch, lpm_no_reuse, fcfs_with_reuse, metrics_disabled, dp_one_bad_rank,
            startup_workspace_oom, decode_graph_capture_oom, prefill_graph_capture_oom, default_oom,
            request_slots_oom, mamba_capped, mamba_full_decode_only, kv_reduced,
            context_below_pool, swa_full, speculative_default_cap]
