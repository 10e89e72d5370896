"""The pure line parser: every format of sglang-logs.md and the corpus, prefixes, keys, statistics."""

from __future__ import annotations

import ast
import functools
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.paths import FIXTURES, ROOT
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.core.timeparse import event_seconds, has_date
from sglang_tuning_exporter.sources.logline import auto_value, normalise_key
from sglang_tuning_exporter.sources.logparse import LineClassifier, capture_event, parse_line
from sglang_tuning_exporter.sources.logreader import read_events

# (line, kind, time, rank, fields that must be present with these values)
CASES: list[tuple[str, str, str | None, dict[str, int], dict[str, Any]]] = [
    # Decode, every head and separator
    ("#running-req: 187, #token: 392174, token usage: 0.93, #queue-req: 412", "decode", None, {},
     {"num_running_reqs": 187, "num_used_tokens": 392174, "token_usage": 0.93, "num_queue_reqs": 412}),
    ("[gpu_id=0] Decode batch. #running-req: 187, #token: 392174, token usage: 0.93, "
     "gen throughput (token/s): 5321.00, #queue-req: 412", "decode", None, {},
     {"gen_throughput": 5321.0, "num_queue_reqs": 412}),
    ("[04:40:55 TP0] Decode batch. #running-req: 2, #token: 4078, token usage: 0.00, "
     "gen throughput (token/s): 447.31, #queue-req: 0", "decode", "04:40:55", {"tp": 0},
     {"num_running_reqs": 2, "token_usage": 0.0}),
    ("[2025-04-01 10:00:00 TP0] Decode batch. #running-req: 187, #token: 392174, token usage: 0.93, "
     "gen throughput (token/s): 5321.00, largest-len: 0, #queue-req: 412, ", "decode", "2025-04-01T10:00:00",
     {"tp": 0}, {"largest_len": 0, "num_queue_reqs": 412}),
    ("[2025-10-01 10:00:00] Decode batch [123457], #running-req: 187, #token: 392174, token usage: 0.93, "
     "cuda graph: True, gen throughput (token/s): 5321.00, #queue-req: 412, ", "decode", "2025-10-01T10:00:00",
     {}, {"forward_iter": 123457, "cuda_graph": True, "num_queue_reqs": 412}),
    ("[2026-10-30 01:04:05.123 DP1 TP0] Decode batch, #running-req: 187, #full token: 120331, "
     "full token usage: 0.57, #swa token: 392174, swa token usage: 0.93, cuda graph: False, "
     "gen throughput (token/s): 5321.00, #queue-req: 412", "decode", "2026-10-30T01:04:05.123",
     {"dp": 1, "tp": 0}, {"num_full_tokens": 120331, "swa_token_usage": 0.93, "token_usage": 0.93,
                          "cuda_graph": False}),
    ("[2026-10-30 01:04:05] Decode batch, #running-req: 187, #full token: 392174, full token usage: 0.93, "
     "mamba num: 190, mamba usage: 0.74, cuda graph: True, gen throughput (token/s): 5321.00, #queue-req: 412",
     "decode", "2026-10-30T01:04:05", {}, {"mamba_num": 190, "mamba_usage": 0.74, "token_usage": 0.93}),
    ("[2026-10-30 01:04:05 TP0] Decode batch, #running-req: 5, #gpu token: 20800, gpu token usage: 0.29, "
     "#cpu token: 100, cpu token usage: 0.01, cuda graph: True, gen throughput (token/s): 1.0, #queue-req: 0",
     "decode", "2026-10-30T01:04:05", {"tp": 0}, {"num_gpu_tokens": 20800, "num_cpu_tokens": 100,
                                                   "token_usage": 0.29}),
    ("[2026-07-21 15:00:13 TP0 EP0] Decode batch, #running-req: 24, #token: 233600, token usage: 0.66, "
     "accept len: 3.05, accept rate: 0.68, npu graph: True, gen throughput (token/s): 239.06, #queue-req: 2",
     "decode", "2026-07-21T15:00:13", {"tp": 0, "ep": 0},
     {"accept_len": 3.05, "accept_rate": 0.68, "cuda_graph": True, "graph_backend": "npu"}),
    ("[2026-10-30 01:04:05 PP1 TP3] Decode batch, #running-req: 187, #token: 392174, token usage: 0.93, "
     "pre-allocated usage: 0.10, #prealloc-req: 5, #transfer-req: 7, #host-receive-req: 2, #retracted-req: 1, "
     "cpu graph: False, gen throughput (token/s): 5321.00, #queue-req: 412", "decode", "2026-10-30T01:04:05",
     {"pp": 1, "tp": 3}, {"pre_allocated_usage": 0.1, "num_prealloc_reqs": 5, "num_transfer_reqs": 7,
                          "num_host_receive_reqs": 2, "num_retracted_reqs": 1, "graph_backend": "cpu"}),
    # future fields and suffixes are kept under normalised names
    ("[2026-10-30 01:04:05] Decode batch, #running-req: 1, #token: 2, token usage: 0.00, cuda graph: True, "
     "gen throughput (token/s): 3.13, #queue-req: 0, est. decode TFLOPS/s (per GPU): 12.50, "
     "fwd occupancy: 45.20%, fwd+idle occupancy: 50.00%, timestamp: 2025-07-18T15:32:54.159394",
     "decode", "2026-10-30T01:04:05", {},
     {"est_decode_tflops_s_per_gpu": 12.5, "fwd_occupancy": 0.452, "fwd_idle_occupancy": 0.5,
      "timestamp": "2025-07-18T15:32:54.159394"}),
    # Prefill, every release
    ("new fill batch. #seq: 6. #cached_token: 3072. #new_token: 8192. #remaining_req: 406. #running_req: 181. "
     "tree_cache_hit_rate: 27.27%.", "prefill", None, {},
     {"num_new_seqs": 6, "num_cached_tokens": 3072, "num_new_tokens": 8192, "num_queue_reqs": 406,
      "num_running_reqs": 181, "cache_hit_rate": 0.2727}),
    ("[gpu=0] Prefill batch. #new-seq: 6, #new-token: 8192, #cached-token: 3072, cache hit rate: 12.89%, "
     "#running-req: 181, #queue-req: 406", "prefill", None, {}, {"cache_hit_rate": 0.1289}),
    ("[12:00:01 DP1 TP0] Prefill batch(mixed #running-req: 181). #new-seq: 6, #new-token: 8192, "
     "#cached-token: 3072, cache hit rate: 27.27%, token usage: 0.93, #queue-req: 406", "prefill", "12:00:01",
     {"dp": 1, "tp": 0}, {"num_running_reqs": 181, "mixed_chunk": True, "token_usage": 0.93}),
    ("[2025-06-18 18:11:03] Prefill batch. #new-seq: 14, #new-token: 8192, #cached-token: 0, token usage: 0.92, "
     "#unbootstrapped-req: 0, #queue-req: 105, #transferring-req: 990, input throughput (token/s): 96875.08 ",
     "prefill", "2025-06-18T18:11:03", {},
     {"num_unbootstrapped_reqs": 0, "num_transferring_reqs": 990, "input_throughput": 96875.08}),
    ("[2026-10-30 01:04:05 TP0] Prefill batch [123458], #new-seq: 6, #new-token: 8192, #cached-token: 3072, "
     "token usage: 0.93, #running-req: 181, #queue-req: 412, #pending-token: 0, #bootstrap-req: 3, "
     "#inflight-req: 2, #optimistic-req: 0, #replay-token: 9, cuda graph: False, "
     "input throughput (token/s): 8192.00", "prefill", "2026-10-30T01:04:05", {"tp": 0},
     {"forward_iter": 123458, "num_pending_tokens": 0, "num_bootstrap_reqs": 3, "num_inflight_reqs": 2,
      "num_optimistic_reqs": 0, "num_replay_tokens": 9, "cuda_graph": False, "input_throughput": 8192.0}),
    # Retraction, both wordings, any capitalisation
    ("decode out of memory happened, #retracted_reqs: 1, #new_token_ratio: 0.9998 -> 1.0000", "retract", None,
     {}, {"num_retracted_reqs": 1, "new_token_ratio_before": 0.9998, "new_token_ratio_after": 1.0}),
    ("[2025-03-07 21:49:33 TP13] Decode out of memory happened. #retracted_reqs: 1, "
     "#new_token_ratio: 0.1474 -> 0.1845", "retract", "2025-03-07T21:49:33", {"tp": 13},
     {"num_retracted_reqs": 1, "new_token_ratio_after": 0.1845}),
    ("[2026-10-30 01:04:05 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 3, "
     "#new_tokens_gained: 4608, #mamba_num_gained: 14, #new_token_ratio: 0.3811 -> 0.5127", "retract",
     "2026-10-30T01:04:05", {"tp": 0},
     {"num_retracted_reqs": 3, "num_new_tokens_gained": 4608, "num_mamba_num_gained": 14,
      "new_token_ratio_before": 0.3811}),
    ("KV CACHE POOL IS FULL. RETRACT REQUESTS. #retracted_reqs: 2, #new_token_ratio: 0.5 -> 0.6", "retract",
     None, {}, {"num_retracted_reqs": 2}),
    # Startup memory and capacity
    ("[2025-03-04 00:36:47 TP0] Load weight begin. avail mem=77.18 GB", "startup_memory",
     "2025-03-04T00:36:47", {"tp": 0}, {"stage": "load_weight_begin", "avail_mem_gb": 77.18}),
    ("[2026-10-30 01:04:05] Load weight end. elapsed=21.40 s, type=Qwen2ForCausalLM, quant=fp8, fmt=e4m3, "
     "avail mem=59.30 GB, mem usage=15.27 GB.", "startup_memory", "2026-10-30T01:04:05", {},
     {"stage": "load_weight_end", "elapsed_s": 21.4, "quant": "fp8", "avail_mem_gb": 59.3, "mem_usage_gb": 15.27}),
    ("Load weight end. Committed real weights after CUDA graph capture in 3.50 s (capture overlap window 1.25 s, "
     "startup overlap total 4.00 s)", "startup_memory", None, {},
     {"stage": "load_weight_commit", "elapsed_s": 3.5, "capture_overlap_window_s": 1.25}),
    ("KV Cache is allocated. K size: 24.15 GB, V size: 24.15 GB.", "startup_memory", None, {},
     {"stage": "kv_cache_allocated", "k_size_gb": 24.15, "v_size_gb": 24.15}),
    ("[2025-11-22 23:05:07 DP0 TP0 EP0] KV Cache is allocated. #tokens: 3122368, KV size: 102.18 GB",
     "startup_memory", "2025-11-22T23:05:07", {"dp": 0, "tp": 0, "ep": 0},
     {"stage": "kv_cache_allocated", "kv_tokens": 3122368, "kv_size_gb": 102.18}),
    ("draft KV Cache VA upper bound. dtype: torch.bfloat16, #tokens: 421888, K size: 24.15 GB, V size: 24.15 GB",
     "startup_memory", None, {}, {"stage": "kv_cache_va_upper_bound", "pool": "draft", "kv_tokens": 421888}),
    ("Post-capture KV sizing: KV cache allocated. dtype: torch.bfloat16, #tokens: 421888, KV size: 48.30 GB, "
     "avail mem=6.10 GB", "startup_memory", None, {},
     {"stage": "post_capture_kv_allocated", "kv_size_gb": 48.3, "avail_mem_gb": 6.1}),
    ("[gpu_id=0] Memory pool end. avail mem=6.84 GB", "startup_memory", None, {},
     {"stage": "memory_pool_end", "avail_mem_gb": 6.84}),
    ("Capture cuda graph begin. This can take up to several minutes.", "startup_memory", None, {},
     {"stage": "cuda_graph_begin"}),
    ("[2025-03-07 09:31:43 TP6] Capture cuda graph end. Time elapsed: 391.00 s", "startup_memory",
     "2025-03-07T09:31:43", {"tp": 6}, {"stage": "cuda_graph_end", "elapsed_s": 391.0}),
    ("Capture cuda graph end. Time elapsed: 17.13 s. mem usage=0.89 GB. avail mem=10.26 GB.", "startup_memory",
     None, {}, {"elapsed_s": 17.13, "mem_usage_gb": 0.89, "avail_mem_gb": 10.26}),
    ("Capture target decode CUDA graph end. bs=[1, 2, 4, 8, 256], elapsed=14.80 s, mem usage=1.12 GB, "
     "avail mem=6.84 GB.", "startup_memory", None, {},
     {"stage": "cuda_graph_end", "graph": "target decode CUDA", "batch_sizes": [1, 2, 4, 8, 256],
      "avail_mem_gb": 6.84}),
    ("Capture target prefill CUDA graph begin. backend=full, num_tokens=8192, avail mem=2.04 GB", "startup_memory",
     None, {}, {"stage": "prefill_graph_begin", "num_tokens": 8192}),
    ("[2025-08-11 17:17:03] max_total_num_tokens=665690, chunked_prefill_size=8192, max_prefill_tokens=16384, "
     "max_running_requests=4096, context_len=65536, available_gpu_mem=13.50 GB", "startup_memory",
     "2025-08-11T17:17:03", {},
     {"stage": "summary", "max_total_num_tokens": 665690, "chunked_prefill_size": 8192,
      "max_running_requests": 4096, "context_len": 65536, "available_gpu_mem_gb": 13.5}),
    ("Rank 0: max_total_num_token=421888, max_prefill_num_token=16384, context_len=32768, ", "startup_memory",
     None, {"tp": 0}, {"max_total_num_tokens": 421888, "max_prefill_tokens": 16384}),
    ("[2026-10-30 01:04:05] max_total_num_tokens=1, chunked_prefill_size=2, max_prefill_tokens=3, "
     "max_running_requests=4, context_len=5, available_cpu_mem=6.00 GB", "startup_memory", "2026-10-30T01:04:05",
     {}, {"available_cpu_mem_gb": 6.0}),
    # glued after a progress bar, no newline in between
    ("Capturing batches (bs=1 avail_mem=10.28 GB): 100%|██████████| 23/23 [00:16<00:00,  1.42it/s]"
     "[2025-09-11 10:26:01 TP0] max_total_num_tokens=903439, chunked_prefill_size=8192, max_prefill_tokens=16384, "
     "max_running_requests=3529, context_len=131072, available_gpu_mem=10.26 GB", "startup_memory",
     "2025-09-11T10:26:01", {"tp": 0}, {"max_total_num_tokens": 903439, "available_gpu_mem_gb": 10.26}),
    ("[2026-01-01 00:00:00 TP0] max_running_requests was reduced from requested 4096 to 2048",
     "max_running_reduced", "2026-01-01T00:00:00", {"tp": 0}, {"requested": 4096, "reduced_to": 2048}),
    ("[2026-09-13 16:10:47] Engine startup timings (s): load_weight=1.10, kv_cache_allocation=0.02, "
     "cuda_graph={prefill=4.19, decode=0.85}, tokenizer_e2e=18.15", "startup_timings", "2026-09-13T16:10:47",
     {}, {"load_weight_s": 1.1, "cuda_graph_s": {"prefill": 4.19, "decode": 0.85}}),
    # OOM by phase
    ("[2026-01-01 00:00:00 TP0] Prefill out of memory. Try to lower your batch size.", "oom",
     "2026-01-01T00:00:00", {"tp": 0}, {"phase": "prefill"}),
    ("Decode out of memory. This should never happen.", "oom", None, {}, {"phase": "decode"}),
    ("Prefill out of memory. This should nerver happen.", "oom", None, {}, {"phase": "prefill"}),
    ("[2026-01-01 00:00:00] Out of memory. Try to lower your batch size.", "oom", "2026-01-01T00:00:00", {},
     {"phase": "unknown"}),
    ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", "oom", None, {},
     {"phase": "startup", "exception": "RuntimeError", "reason": "mem_fraction_static_too_small"}),
    ("Exception: Capture cuda graph failed: CUDA out of memory.", "oom", None, {}, {"phase": "startup"}),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has 79 GiB", "oom", None, {},
     {"phase": "unknown", "exception": "torch.OutOfMemoryError", "tried_to_allocate_gb": 0.5}),
    ("[2026-01-01 00:00:00 TP0] retract_decode: aborted last request abc due to OOM", "oom",
     "2026-01-01T00:00:00", {"tp": 0}, {"phase": "decode"}),
    # managers/schedule_batch.py (0.5.22+) `retract_decode: aborted request %s: %s`, both of SGLang's messages
    ("[2026-01-01 00:00:00 TP0] retract_decode: aborted request abc: Retraction host KV pool exhausted. Aborting "
     "the request.", "oom", "2026-01-01T00:00:00", {"tp": 0}, {"phase": "decode"}),
    ("[2026-01-01 00:00:00 TP0] retract_decode: aborted request abc: Retracted under decode memory pressure "
     "without a KV backup. Retry later.", "oom", "2026-01-01T00:00:00", {"tp": 0}, {"phase": "decode"}),
    ("alloc_req_slots runs out of memory. Please set a smaller number for `--max-running-requests`. ",
     "oom", None, {}, {"pool": "req_to_token"}),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.25 GiB. GPU 3 has a total capacity of "
     "79.19 GiB of which 412.00 MiB is free. Including non-PyTorch memory, this process has 78.77 GiB memory in use.",
     "oom", None, {}, {"gpu": 3, "gpu_total_gb": 79.19, "gpu_free_gb": 0.4023, "tried_to_allocate_gb": 1.25}),
    ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacty of "
     "23.65 GiB of which 6.06 MiB is free.", "oom", None, {}, {"gpu_total_gb": 23.65, "gpu_free_gb": 0.0059}),
    # late 2026: managers/cuda_graph_warner.py, capture lines with num_tokens_per_bs / num_tokens lists
    ("[2026-11-02 09:01:11 TP0] CUDA graph disabled for 15 consecutive decode steps. This may cause significant "
     "throughput degradation. Check if batch size is within CUDA graph capture range.", "cuda_graph_disabled",
     "2026-11-02T09:01:11", {"tp": 0}, {"consecutive_steps": 15}),
    ("[2026-11-02 09:00:41 TP1] Disable prefill CUDA graph because some layers do not apply Standard GQA",
     "startup_memory", "2026-11-02T09:00:41", {"tp": 1},
     {"stage": "prefill_graph_disabled", "reason": "some layers do not apply Standard GQA"}),
    ("[2026-11-02 09:00:54 TP0] Capture target prefill CUDA graph begin. backend=breakable, "
     "num_tokens=[64, 128, 256, 512], avail mem=12.80 GB", "startup_memory", "2026-11-02T09:00:54", {"tp": 0},
     {"stage": "prefill_graph_begin", "num_tokens": [64, 128, 256, 512], "backend": "breakable",
      "avail_mem_gb": 12.8}),
    ("[2026-11-02 09:00:50 TP0] Capture target verify CUDA graph begin. backend=full, num_tokens_per_bs=4, "
     "bs=[1, 2, 4, 8], avail mem=13.20 GB", "startup_memory", "2026-11-02T09:00:50", {"tp": 0},
     {"stage": "cuda_graph_begin", "graph": "target verify CUDA", "num_tokens_per_bs": 4, "batch_sizes": [1, 2, 4, 8]}),
    ("[2026-11-02 09:00:52 TP0] Capture draft extend CUDA graph end. bs=[1, 2, 4], elapsed=1.00 s, mem usage=0.10 GB, "
     "avail mem=12.90 GB.", "startup_memory", "2026-11-02T09:00:52", {"tp": 0},
     {"stage": "cuda_graph_end", "graph": "draft extend CUDA", "batch_sizes": [1, 2, 4], "mem_usage_gb": 0.1}),
    # errors
    ("[2025-06-27 19:02:10 TP0] Scheduler hit an exception: Traceback (most recent call last):", "error",
     "2025-06-27T19:02:10", {"tp": 0}, {"error": "Scheduler hit an exception"}),
    ("Exception in ControllerMulti:", "error", None, {}, {"error": "Exception in ControllerMulti"}),
    # server ready, version
    ("[2026-09-13 16:10:48] The server is fired up and ready to roll!", "server_ready", "2026-09-13T16:10:48",
     {}, {}),
    ("[2026-01-01 00:00:00] sglang version: 0.5.23", "version", "2026-01-01T00:00:00", {}, {"version": "0.5.23"}),
    ("Successfully installed sglang==0.4.6.post1", "version", None, {}, {"version": "0.4.6.post1"}),
]


@pytest.mark.parametrize(("line", "kind", "time", "rank", "fields"), CASES,
                         ids=[f"{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_formats(line: str, kind: str, time: str | None, rank: dict[str, int], fields: dict[str, Any]) -> None:
    """Each documented format gives the right kind, time, ranks and canonical fields."""
    e = parse_line(line, 7)
    assert e is not None, line
    assert (e.line, e.kind, e.time, e.rank) == (7, kind, time, rank)
    for k, v in fields.items():
        assert e.fields.get(k) == (pytest.approx(v) if isinstance(v, float) else v), k


PREFIXES = [
    ("[2025-01-12 10:11:12 DP0 TP0] ", "2025-01-12T10:11:12", {"dp": 0, "tp": 0}),
    ("[2025-01-12 10:11:12.345 TP0 EP0] ", "2025-01-12T10:11:12.345", {"tp": 0, "ep": 0}),
    ("[2025-01-12 10:11:12 DP2 PP1 ATTN_CP1 MOE_DP3 TP4 EP5] ", "2025-01-12T10:11:12",
     {"dp": 2, "pp": 1, "attn_cp": 1, "moe_dp": 3, "tp": 4, "ep": 5}),
    ("[2025-01-12 10:11:12 TP4 DP2 EP5 PP1] ", "2025-01-12T10:11:12", {"dp": 2, "pp": 1, "tp": 4, "ep": 5}),
    ("[10:11:12 TP0] ", "10:11:12", {"tp": 0}),
    ("2025-01-12 10:11:12 TP0] ", "2025-01-12T10:11:12", {"tp": 0}),
    ("sglang  | [2025-01-12 10:11:12 TP0] ", "2025-01-12T10:11:12", {"tp": 0}),
    ("sglang-decode-1  | [2025-01-12 10:11:12] ", "2025-01-12T10:11:12", {}),
    ("(SGLangEngine pid=41820) [2025-01-12 10:11:12 TP0] ", "2025-01-12T10:11:12", {"tp": 0}),
    ("(SGLangEngine pid=41820, ip=10.0.0.7) [2025-01-12 10:11:12 DP3 TP3] ", "2025-01-12T10:11:12",
     {"dp": 3, "tp": 3}),
    ("[2025-01-12 10:11:12][scheduler.py:1234][INFO]: ", "2025-01-12T10:11:12", {}),
    ("[2025-01-12 10:11:12,345][TP7][scheduler.py:1234][INFO]: ", "2025-01-12T10:11:12.345", {"tp": 7}),
    ("2025-10-29 02:27:35 INFO 8900 [ DP15 TP15 EP15 scheduler_metrics_mixin.py:222] ", "2025-10-29T02:27:35",
     {"dp": 15, "tp": 15, "ep": 15}),
    ("2025-10-29 02:27:35 INFO 8894 [ DP9 TP9 EP9 scheduler_metrics_mixin.py:222] ", "2025-10-29T02:27:35",
     {"dp": 9, "tp": 9, "ep": 9}),
    ("\x1b[32m[2025-01-12 10:11:12 TP1]\x1b[0m ", "2025-01-12T10:11:12", {"tp": 1}),
    ("", None, {}),
]
BODY = ("Decode batch, #running-req: 233, #token: 370959, token usage: 0.82, cuda graph: True, "
        "gen throughput (token/s): 4594.01, #queue-req: 317")


@pytest.mark.parametrize(("prefix", "time", "rank"), PREFIXES, ids=[repr(p[0][:30]) for p in PREFIXES])
def test_prefixes(prefix: str, time: str | None, rank: dict[str, int]) -> None:
    """Timestamps (with/without date or ms) and rank tags are read through every known decoration."""
    e = parse_line(prefix + BODY + "\n", 1)
    assert e is not None
    assert (e.kind, e.time, e.rank) == ("decode", time, rank)
    assert e.fields == {"num_running_reqs": 233, "num_used_tokens": 370959, "token_usage": 0.82,
                        "cuda_graph": True, "gen_throughput": 4594.01, "num_queue_reqs": 317}


def test_interfaces_example_exactly() -> None:
    """The `parse` output object of interfaces.md, byte for byte in content."""
    e = parse_line("[2025-01-12 10:11:12 DP0 TP0] " + BODY, 12)
    assert e is not None
    assert e.to_json_dict() == {
        "line": 12, "kind": "decode", "time": "2025-01-12T10:11:12", "rank": {"dp": 0, "tp": 0},
        "fields": {"num_running_reqs": 233, "num_used_tokens": 370959, "token_usage": 0.82, "cuda_graph": True,
                   "gen_throughput": 4594.01, "num_queue_reqs": 317}}


def test_carriage_return_takes_the_fragment_with_a_record() -> None:
    """A batch line after a \\r progress bar is kept; a bare progress bar is no event."""
    bar = "Capturing batches (bs=8 avail_mem=1.97 GB):  43%|████▎     | 3/7 [00:00<00:00, 25.37it/s]"
    e = parse_line(bar + "\r" + bar + "\r[2025-01-12 10:11:12 TP0] " + BODY, 3)
    assert e is not None and e.kind == "decode" and e.rank == {"tp": 0}
    assert e.fields["num_queue_reqs"] == 317
    e2 = parse_line("[2025-01-12 10:11:12 TP0] " + BODY + "\r  0%|          | 0/7 [00:00<?, ?it/s]", 4)
    assert e2 is not None and e2.fields["num_queue_reqs"] == 317
    assert parse_line("\r" + bar + "\r" + bar, 5) is None


def test_uninteresting_lines_give_nothing() -> None:
    """Access logs, warnings, glog lines and prose are not events."""
    for line in [
        '[2025-05-14 09:31:43] INFO:     127.0.0.1:20504 - "POST /v1/completions HTTP/1.1" 200 OK',
        'INFO:     127.0.0.1:40192 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
        "I1122 18:06:31.248193 709109 transfer_engine.cpp:91] Transfer Engine parseHostNameWithPort.",
        "[2025-11-22 23:15:42 DP0 TP0 EP0] Scheduler.run_batch sleep 180.0s",
        "[2025-03-04 00:36:46 TP0] sglang is using nccl==2.21.5",
        "Decode batch size is configured elsewhere",
        "", "\n", "]]]]", "[", "#", "=",
    ]:
        assert parse_line(line, 1) is None, line


def test_unknown_key_rule() -> None:
    """Lower-case, leading # -> num_, other non-alphanumeric runs -> _."""
    assert normalise_key("#new-req") == "num_new_req"
    assert normalise_key("waiting-image-req") == "waiting_image_req"
    assert normalise_key("est. prefill TFLOPS/s (per GPU)") == "est_prefill_tflops_s_per_gpu"
    assert normalise_key("  Fancy   Key!! ") == "fancy_key"


def test_values() -> None:
    """Numbers are numbers, True/False booleans, percentages ratios, text stays text."""
    assert auto_value("12") == 12 and isinstance(auto_value("12"), int)
    assert auto_value("0.93") == 0.93
    assert auto_value("12.89%") == 0.1289
    assert auto_value("True") is True and auto_value("False") is False
    assert auto_value("torch.bfloat16") == "torch.bfloat16"
    assert auto_value("1.2.3") == "1.2.3"


def test_new_field_in_a_future_release_is_kept() -> None:
    """A key we do not know yet is carried, numeric."""
    e = parse_line("Prefill batch, #new-seq: 1, #new-token: 5, #cached-token: 0, token usage: 0.00, "
                   "#running-req: 0, #queue-req: 0, #spec-draft-req: 4, kv offload ratio: 0.25", 1)
    assert e is not None
    assert e.fields["num_spec_draft_req"] == 4 and e.fields["kv_offload_ratio"] == 0.25


def test_classifier_counts_unparsed_and_partial() -> None:
    """A known head with an unreadable body is counted unparsed; a truncated line partial, still used."""
    c = LineClassifier()
    assert c.classify("[2025-01-01 00:00:00 TP0] Decode batch, garbage without pairs", 1) is None
    assert c.classify("KV cache pool is full. Retract requests. #new_token_ratio: 0.1 -> 0.2", 2) is None
    assert c.classify("server_args=ServerArgs(", 3) is None
    e = c.classify("[2025-01-01 00:00:00 TP0] Decode batch, #running-req: 4, #token: 12, tok", 4)
    assert e is not None and e.fields == {"num_running_reqs": 4, "num_used_tokens": 12}
    assert c.classify('INFO:     127.0.0.1:1 - "GET / HTTP/1.1" 200 OK', 5) is None
    d = c.stats.as_dict()
    assert (d["lines"], d["unparsed"], d["partial"], d["by_kind"]) == (5, 3, 1, {"decode": 1})
    assert [x["line"] for x in d["unparsed_examples"]] == [1, 2, 3]


def test_non_numeric_value_of_a_numeric_field_is_partial_not_a_string() -> None:
    """`#queue-req: abc` does not become a string field that would break arithmetic downstream."""
    c = LineClassifier()
    e = c.classify("Decode batch, #running-req: 4, #queue-req: abc", 1)
    assert e is not None and "num_queue_reqs" not in e.fields and c.stats.partial == 1


@pytest.mark.parametrize("text", ["server_args=ServerArgs(model_path='a\\d', tp_size=2)",
                                  "server_args={'model_path': 'a\\d', 'tp_size': 2}"])
def test_server_args_with_a_stray_backslash_read_without_warnings(text: str) -> None:
    """A logged value with an invalid escape (`'a\\d'`) is read, and no compiler warning reaches stderr."""
    import warnings

    from sglang_tuning_exporter.sources.serverargs import parse_server_args

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = parse_server_args(text)
    assert args == {"model_path": "a\\d", "tp_size": 2}
    assert [str(w.message) for w in caught] == []


def test_server_args_dict_form_from_real_0_5_23_line() -> None:
    """The real 0.5.23 `server_args={...}` line: every key, Python values."""
    text = (FIXTURES / "logs" / "sglang-0.5.23-server_args-logline.txt").read_text(encoding="utf-8")
    e = parse_line("[2026-10-30 01:04:05] " + text, 1)
    assert e is not None and e.kind == "server_args" and e.time == "2026-10-30T01:04:05"
    assert len(e.fields) == 546
    assert e.fields["mem_fraction_static"] == 0.85
    assert e.fields["schedule_conservativeness"] == 0.3
    assert e.fields["chunked_prefill_size"] == 4096
    assert e.fields["schedule_policy"] == "fcfs"
    assert e.fields["max_running_requests"] is None


def test_server_args_repr_form_with_non_literal_values() -> None:
    """`server_args=ServerArgs(...)` (<= 0.5.18): literals read, an enum repr kept as text."""
    e = parse_line("[2025-01-01 00:00:00] server_args=ServerArgs(model_path='m', mem_fraction_static=0.88, "
                   "schedule_policy='lpm', tp_size=2, cuda_graph_max_bs=160, cuda_graph_bs=[1, 2, 4], "
                   "load_format=<LoadFormat.AUTO: 'auto'>, disable_cuda_graph=False, lora_paths=None, "
                   "json_model_override_args='{\"a\": \"b, c\"}')", 1)
    assert e is not None and e.kind == "server_args"
    f = e.fields
    assert (f["mem_fraction_static"], f["tp_size"], f["cuda_graph_max_bs"]) == (0.88, 2, 160)
    assert f["cuda_graph_bs"] == [1, 2, 4] and f["disable_cuda_graph"] is False and f["lora_paths"] is None
    assert f["load_format"] == "<LoadFormat.AUTO: 'auto'>"
    assert f["json_model_override_args"] == '{"a": "b, c"}'


def test_server_args_never_evaluates_code() -> None:
    """A call inside the dump is kept as text, never executed."""
    e = parse_line("server_args={'model_path': __import__('os').getcwd(), 'tp_size': 4}", 1)
    assert e is not None and e.fields["tp_size"] == 4
    assert e.fields.get("model_path") != __import__("os").getcwd()


def test_capture_companion_event() -> None:
    """A decode capture line listing bs=[...] also yields a cuda_graph_capture event; prefill does not."""
    e = parse_line("[2025-11-22 23:05:07 DP0 TP0 EP0] Capture cuda graph bs [1024]", 8)
    assert e is not None and e.fields["batch_sizes"] == [1024]
    c = capture_event(e)
    assert c is not None and (c.kind, c.line, c.rank) == ("cuda_graph_capture", 8, {"dp": 0, "tp": 0, "ep": 0})
    assert c.fields == {"batch_sizes": [1024], "max_bs": 1024}
    p = parse_line("Capture target prefill CUDA graph begin. backend=x, bs=[1, 2], avail mem=1.00 GB", 9)
    assert p is not None and capture_event(p) is None
    d = parse_line("Capture draft decode CUDA graph end. bs=[1, 2], elapsed=1.00 s, avail mem=1.00 GB.", 10)
    assert d is not None and d.fields["batch_sizes"] == [1, 2] and capture_event(d) is None


def test_only_the_target_decode_graph_bounds_the_decode_ceiling() -> None:
    """Verify, draft and prefill capture lines (num_tokens_per_bs or num_tokens) get no cuda_graph_capture
    companion: only the target decode graph's sizes are the decode ceiling."""
    head = "[2026-11-02 09:00:50 TP0] Capture "
    tail = " CUDA graph begin. backend=full, num_tokens_per_bs=4, bs=[1, 2, 4, 512], avail mem=13.20 GB"
    for graph in ("target verify", "draft decode", "draft extend", "draft verify"):
        e = parse_line(head + graph + tail, 1)
        assert e is not None and capture_event(e) is None, graph
    e = parse_line(head + "target prefill CUDA graph begin. backend=breakable, num_tokens=[64, 4096], avail mem=1 GB", 1)
    assert e is not None and capture_event(e) is None
    e = parse_line(head + "target decode" + tail.replace("=4,", "=1,"), 1)
    assert e is not None
    c = capture_event(e)
    assert c is not None and c.fields["max_bs"] == 512


def test_event_seconds() -> None:
    """ISO stamps become epoch seconds (UTC), time-only stamps seconds since midnight."""
    assert event_seconds("1970-01-02T00:00:01") == 86401.0
    assert event_seconds("2025-01-12T10:11:12.345") == pytest.approx(1736676672.345)
    assert event_seconds("04:40:55") == 4 * 3600 + 40 * 60 + 55
    assert event_seconds(None) is None and event_seconds("garbage") is None and event_seconds("25:00:00") is None
    assert has_date("2025-01-12T10:11:12") and not has_date("10:11:12")


def _rendered(path: Path) -> Iterator[tuple[int, str]]:
    """Messages of log-lines-rendered.txt: indented lines, quoted last columns, (level, msg) lists."""
    for i, raw in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if not raw or raw.startswith("#"):
            continue
        if raw.startswith("    "):
            yield i, raw[4:]
            continue
        last = raw.split("\t")[-1]
        if last.startswith("[("):
            for _level, msg in ast.literal_eval(last):
                yield i, msg
        elif last.startswith("'"):
            yield i, ast.literal_eval(last)


# Unrendered `%`-style templates in the fixture (the logger formats them at run time), not real lines.
RENDERED_KNOWN_UNPARSED = {333, 334}


@pytest.mark.parametrize("prefix", ["", "[2026-10-30 01:04:05 DP1 PP0 TP3 EP4] "])
def test_every_rendered_release_line(shared_dir: Path, prefix: str) -> None:
    """Every message of every release parses to an event; none fails except the listed templates."""
    c = LineClassifier()
    msgs = list(_rendered(shared_dir / "reference" / "sglang-fixtures" / "log-lines-rendered.txt"))
    assert len(msgs) > 300
    missing = [n for n, m in msgs if c.classify(prefix + m, n) is None and n not in RENDERED_KNOWN_UNPARSED]
    assert missing == []
    assert {x["line"] for x in c.stats.as_dict()["unparsed_examples"]} == RENDERED_KNOWN_UNPARSED
    assert c.stats.unparsed == len(RENDERED_KNOWN_UNPARSED) and c.stats.partial == 0
    kinds = c.stats.by_kind
    assert kinds["decode"] >= 60 and kinds["prefill"] >= 50 and kinds["retract"] >= 30


def test_no_corpus_file_has_unparsed_lines(shared_dir: Path) -> None:
    """Across the whole real corpus, no line with a recognised head fails and nothing raises."""
    c = LineClassifier()
    for path in sorted((shared_dir / "corpus" / "logs").glob("*.log")):
        text = path.read_bytes().decode("utf-8", "replace")
        for n, line in enumerate(text.split("\n"), 1):
            c.classify(line, n)
    assert c.stats.unparsed == 0, c.stats.unparsed_examples
    assert c.stats.by_kind["decode"] > 150 and c.stats.by_kind["startup_memory"] > 50



def test_every_pool_too_small_wording_is_a_startup_oom() -> None:
    """SGLang's "Not enough memory. Please try to increase ..." in any wording is one `oom` event of the
    startup phase (the rule the window's oom_startup_count and the sidecar's oom_events_total both read),
    never a plain error only the window would count."""
    from sglang_tuning_exporter.sources.logmessages import POOL_TOO_SMALL

    for text in ("Exception in run_scheduler_process: Not enough memory. Please try to increase the memory.",
                 "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
                 "ValueError: The weights leave no GPU memory for the KV cache"):
        assert POOL_TOO_SMALL.search(text)
        e = parse_line(f"[2025-01-01 10:00:00] {text}", 1)
        assert e is not None and e.kind == "oom", (text, e)
        assert (e.fields["phase"], e.fields["reason"]) == ("startup", "mem_fraction_static_too_small"), e


# A capacity message of a future release no rule knows, and chatter with SGLang's prefix.
FUTURE_CAP = ("[2026-11-28 10:00:00 TP0] max_running_requests is limited to 6 by the frobnicator pool "
              "(frob_slots=36). To raise it: increase --frob-ratio.")


def test_an_unknown_capacity_message_with_sglangs_prefix_is_unparsed_not_dropped() -> None:
    """A line of SGLang's prefix that speaks of capacity and matches no rule is counted as unparsed (its
    example kept); bare chatter of the same prefix, and the same message without the prefix, stay nothing."""
    c = LineClassifier()
    assert c.classify(FUTURE_CAP, 1) is None
    # (`Cuda graph is disabled because <any reason>` is read now: a feature switched off, reason code 99.)
    assert c.classify("[2026-11-28 10:00:00 TP0] The frobnicator pool is capped at 12 slots by the frobnicator "
                      "backend", 2) is None
    assert c.classify("[2026-11-28 10:00:00 TP0] Using KV cache dtype: torch.float8_e4m3fn", 3) is None
    assert c.classify("[2025-11-22 23:15:42 DP0 TP0 EP0] Scheduler.run_batch sleep 180.0s", 4) is None
    assert c.classify(FUTURE_CAP[len("[2026-11-28 10:00:00 TP0] "):], 5) is None
    d = c.stats.as_dict()
    assert (d["lines"], d["unparsed"], d["by_kind"]) == (5, 2, {})
    assert [x["line"] for x in d["unparsed_examples"]] == [1, 2]


class _ServerArgs:
    """What 0.5.15's `{get_global_server_args()=}` prints: the dataclass repr."""

    def __repr__(self) -> str:
        return "ServerArgs(model_path='Qwen/Qwen3-8B', chunked_prefill_size=4096, pp_max_micro_batch_size=4)"


def _fill(fmt: str, values: dict[str, Any]) -> str:
    """A format string with each field (its whole expression, as the audit spells it) replaced by its value."""
    out = []
    for literal, name, _, conv in string.Formatter().parse(fmt):
        out.append(literal)
        if name is not None:
            out.append(repr(values[name]) if conv == "r" else str(values[name]))
    return "".join(out)


@functools.cache
def _catalogue_formats() -> frozenset[str]:
    """The format strings of the release audit's catalogue (read once, with libyaml's safe loader)."""
    text = (ROOT / "audit" / "sglang-catalogue.yaml").read_text(encoding="utf-8")
    return frozenset(s["format"] for s in yaml.load(text, Loader=yaml.CSafeLoader)["sites"])


def _release_formats(start: str) -> list[str]:
    """The format strings of the release audit's catalogue that start so (the wheels' own text)."""
    found = sorted(f for f in _catalogue_formats() if f.startswith(start))
    assert found, start
    return found


def test_runtime_changes_from_the_real_format_strings() -> None:
    """POST /set_internal_state's lines of 0.5.15-0.5.23: an update gives `server_args_update` with the
    changed arguments, a refused key `server_args_rejected` with the key and why."""
    values = {"overrides": {"pp_max_micro_batch_size": 4}, "remaining": {"pp_max_micro_batch_size": 4},
              "get_global_server_args()": _ServerArgs(), "k": "chunked_prefill_size", "key": "chunked_prefill_size",
              "v": 99, "value": 99, "upper": 32, "self.max_running_requests // self.ps.pp_size": 32}
    prefix = "[2026-11-28 10:00:00 TP0] "
    updates = _release_formats("Config updated via context override") + _release_formats("Global server args updated")
    assert len(updates) == 3  # {remaining} (0.5.18-0.5.20), {overrides} (0.5.22+), 0.5.15's whole ServerArgs
    for fmt in updates:
        e = parse_line(prefix + _fill(fmt, values), 7)
        assert e is not None and e.kind == "server_args_update", fmt
        assert e.fields["updated"]["pp_max_micro_batch_size"] == 4 and e.rank == {"tp": 0}
    for fmt in _release_formats("Updating {"):
        e = parse_line(prefix + _fill(fmt, values), 8)
        assert e is not None and e.kind == "server_args_rejected", fmt
        assert e.fields["key"] == "chunked_prefill_size"
        if "valid range" in fmt:
            assert (e.fields["value"], e.fields["valid_max"], e.fields["reason"]) == (99, 32, "out_of_range")
        elif "not supported" in fmt:
            assert e.fields["reason"] == "not_supported"
    assert parse_line(prefix + "Config updated via context override: {}", 9).fields == {"updated": {}}


@pytest.mark.parametrize(("message", "fields"), [
    ("Chunked prefill is disabled because --enable-mis is set.", {"features": ["chunked_prefill"]}),
    ("Mixed chunked prefill is disabled because of using eagle speculative decoding.", {"features": ["mixed_chunk"]}),
    ("Radix cache and chunked prefill are disabled for a decision checkpoint with noncausal full attention.",
     {"features": ["chunked_prefill", "radix_cache"]}),
    ("Mixed chunk and radix cache are disabled when using dual-chunk flash attention backend",
     {"features": ["mixed_chunk", "radix_cache"]}),
    ("KV cache is forced as chunk cache for decode server", {"features": ["radix_cache"]}),
    ("HRM-Text (prefix_lm) detected: forcing --attention-backend triton, --chunked-prefill-size -1, "
     "--disable-radix-cache, and --disable-cuda-graph for correctness of the bidirectional prompt attention.",
     {"features": ["chunked_prefill", "radix_cache"]}),
    ("DP attention is enabled. chunked prefill size is adjusted from 8192 to 2048.",
     {"setting": "chunked_prefill_size", "from": 8192, "to": 2048}),
    ("Rounding --chunked-prefill-size up from 1000 to 1024 (a multiple of page_size = 64) for KV sharding.",
     {"setting": "chunked_prefill_size", "from": 1000, "to": 1024, "page_size": 64}),
    ("SWA ring: swa_max_total_num_tokens 7811 -> 7789 (fixed per-request SWA ring capacity).",
     {"setting": "swa_max_total_num_tokens", "from": 7811, "to": 7789}),
    ("Expanding multimodal decode CUDA graph max_bs from 160 to max_running_requests=256.",
     {"setting": "cuda_graph_max_bs", "from": 160, "to": 256}),
])
def test_a_setting_sglang_forces_is_read_with_why(message: str, fields: dict[str, Any]) -> None:
    """SGLang switching chunked prefill, mixed chunks or the radix cache off (or resizing the chunk) itself,
    0.5.15-0.5.23's own wording: `setting_forced` with what and SGLang's reason."""
    e = parse_line("[2026-11-28 10:00:00 TP0] " + message, 3)
    assert e is not None and e.kind == "setting_forced" and e.rank == {"tp": 0}
    assert e.fields == {**fields, "reason": message}
    graph = parse_line("[2026-11-28 10:00:00 TP0] Cuda graph is disabled because deepep_mode=`normal`", 4)
    assert graph is None or graph.kind != "setting_forced"  # CUDA graphs are the OOM/graph family's


def test_the_single_graph_draft_capture_is_a_startup_line_not_the_decode_ceiling() -> None:
    """The multi-layer EAGLE draft's `Capture single-CG draft extend begin/end` (0.5.15+): its memory figures
    are read; no `cuda_graph_capture` companion (only the target decode graph bounds `cuda graph: True`)."""
    e = parse_line("[2026-11-28 10:00:00 TP0] Capture single-CG draft extend end. elapsed=3.20 s, "
                   "mem usage=1.50 GB, avail mem=14.10 GB.", 5)
    assert e is not None and e.fields == {"stage": "cuda_graph_end", "graph": "single-CG draft extend",
                                          "elapsed_s": 3.2, "mem_usage_gb": 1.5, "avail_mem_gb": 14.1}
    assert capture_event(e) is None


# SGLang 0.5.23's own messages for a feature switched off by another argument (arg_groups/*_hook.py,
# managers/scheduler.py), with the reason code core/features gives them.
CONFIG_OFF = [
    ("Cuda graph is disabled because deepep_mode=`normal`", "cuda_graph", 2),
    ("Cuda graph is disabled because of using torch native attention backend", "cuda_graph", 3),
    ("Cuda graph is disabled because of using torch Flex Attention backend", "cuda_graph", 4),
    ("CUDA graph is disabled because --enable-mis is set.", "cuda_graph", 5),
    ("Cuda graph and server warmup are disabled because of using tensor dump mode", "cuda_graph", 6),
    ("When msProbe is enabled, cuda graph is disabled because msProbe only supports dump in eager mode, warmup is "
     "disabled(skip_server_warmup=True) because there is no need to dump data for this stage.", "cuda_graph", 7),
    ("Cuda graph is disabled for diffusion LLM inference on AMD GPUs", "cuda_graph", 8),
]


@pytest.mark.parametrize(("message", "feature", "code"), CONFIG_OFF)
def test_a_feature_switched_off_by_configuration_is_read_with_its_reason(message: str, feature: str,
                                                                          code: int) -> None:
    """Each `... is disabled because ...` site of 0.5.23 is a startup_memory event `<feature>_disabled` whose
    reason maps to its code; SGLang's mixed-chunk and runtime graph warnings are not."""
    from sglang_tuning_exporter.core.features import reason_code

    e = parse_line(f"[2026-01-01 00:00:00] WARNING server_args.py:123: {message}", 1)
    assert isinstance(e, Event) and e.kind == "startup_memory"
    assert e.fields["stage"] == f"{feature}_disabled" and reason_code(e.fields["reason"]) == code
    for other in ("Mixed chunked prefill is disabled because of using diffusion LLM inference.",
                  "CUDA graph disabled for 5 consecutive decode steps. This may cause significant throughput "
                  "degradation. Check if batch size is within CUDA graph capture range."):
        got = parse_line(f"[2026-01-01 00:00:00] {other}", 1)
        assert not (isinstance(got, Event) and str(got.fields.get("stage", "")).endswith("_disabled")), other


@pytest.mark.parametrize(("message", "stage", "extra"), [
    ("Disable prefill CUDA graph for EAGLE target on tc_piecewise to avoid FP4/MoE decode-replay corruption (#28386).",
     "prefill_graph_disabled", {}),
    ("Disable prefill CUDA graph capture because no configured capture size fits backend=full with "
     "max_capture_tokens=4853 (max_capture_requests=4285, context_length=3789, request-pool size=2048).",
     "prefill_graph_disabled", {"max_capture_tokens": 4853, "max_capture_requests": 4285, "context_length": 3789,
                                "request_pool": 2048}),
    ("Breakable CUDA graph is incompatible with lora; disabling prefill CUDA graph.", "prefill_graph_disabled", {}),
    ("Disabling breakable prefill CUDA graph by default for pipeline parallelism. Set "
     "--cuda-graph-backend-prefill=breakable to opt in.", "prefill_graph_disabled", {}),
    ("Disable DFLASH draft cuda graph because only 1.51 GB GPU memory is available after target backend "
     "initialization.", "draft_graph_disabled", {"graph": "DFLASH draft", "avail_mem_gb": 1.51}),
])
def test_the_prefill_and_draft_graphs_switched_off_in_every_wording(message: str, stage: str,
                                                                   extra: dict[str, Any]) -> None:
    """0.5.15-0.5.23's other wordings of a prefill graph (or a speculative draft's graph) switched off: the
    stage, SGLang's whole message as the reason, and the numbers it names."""
    e = parse_line("[2026-11-28 10:00:00 TP0] " + message, 2)
    assert e is not None and e.kind == "startup_memory" and e.rank == {"tp": 0}
    assert e.fields == {"stage": stage, "reason": message.rstrip("."), **extra}
    assert capture_event(e) is None


def test_a_request_truncated_to_fit_the_pool_or_context_is_read() -> None:
    """`Request length is longer than the KV cache pool size or the max context length. Truncated. ...`
    (--allow-auto-truncate): `request_truncated` with both lengths."""
    e = parse_line("[2026-11-28 10:00:00 TP0] Request length is longer than the KV cache pool size or the max context "
                   "length. Truncated. len(req.origin_input_ids)=40000, max_req_input_len=32760.", 6)
    assert e is not None and e.kind == "request_truncated"
    assert e.fields == {"input_len": 40000, "max_req_input_len": 32760} and e.rank == {"tp": 0}


# SGLang 0.5.23's capacity messages (the format strings of its source, filled in): each an event with its numbers.
CAPACITY_LINES: list[tuple[str, str, dict[str, Any]]] = [
    ("max_running_requests is capped to 6 by the mamba state cache (max_mamba_cache_size=30, 5 state slots per "
     "request). To raise it: increase --mamba-full-memory-ratio or --max-mamba-cache-size, or halve the state size "
     "with --mamba-ssm-dtype bfloat16.", "max_running_reduced",
     {"reduced_to": 6, "by": "mamba_state", "max_mamba_cache_size": 30, "mamba_slots_per_request": 5}),
    ("max_running_requests was reduced from the requested 128 to 50 (per dp worker) due to the available KV cache "
     "capacity.", "max_running_reduced", {"requested": 128, "reduced_to": 50, "by": "kv_pool"}),
    ("max_running_requests was reduced from requested 128 to 50 (per dp worker) due to the available KV cache "
     "capacity.", "max_running_reduced", {"requested": 128, "reduced_to": 50, "by": "kv_pool"}),
    ("Post-capture KV sizing: max_running_requests 48 -> 32", "max_running_reduced",
     {"requested": 48, "reduced_to": 32, "by": "kv_pool_post_capture"}),
    ("Post-capture KV sizing: decode CUDA graph max_bs=8 < max_running_requests=48; reserving activation headroom",
     "startup_memory", {"stage": "post_capture_graph_gap", "decode_graph_max_bs": 8, "max_running_requests": 48}),
    ("KV pool holds 30000 tokens, fewer than --context-length 131072. One full-length request cannot fit, so long "
     "requests will be refused or truncated at serving time. Lower --context-length, raise --mem-fraction-static, or "
     "free memory taken before the pool is sized.", "startup_memory",
     {"stage": "kv_pool_below_context", "kv_pool_tokens": 30000, "context_len": 131072}),
    ("Mamba Cache is allocated. max_mamba_cache_size: 30, conv_state size: 0.01GB, ssm_state size: 0.50GB "
     "intermediate_ssm_state_cache size: 0.25GB intermediate_conv_window_cache size: 0.00GB ", "startup_memory",
     {"stage": "mamba_cache_allocated", "max_mamba_cache_size": 30, "conv_state_gb": 0.01, "ssm_state_gb": 0.5,
      "intermediate_ssm_state_cache_gb": 0.25, "intermediate_conv_window_cache_gb": 0.0}),
    ("Use sliding window memory pool. full_layer_tokens=500000, swa_layer_tokens=400000", "startup_memory",
     {"stage": "swa_pool", "full_layer_tokens": 500000, "swa_layer_tokens": 400000}),
    ("Use sliding window memory pool (all SWA). swa_layer_tokens=400000", "startup_memory",
     {"stage": "swa_pool", "swa_layer_tokens": 400000}),
    ("DSV4 pool sizes: full=100000, swa=20000, c4=25000, c128=800, c4_state=64, c128_state=64", "startup_memory",
     {"stage": "dsv4_pool_sizes", "full": 100000, "swa": 20000, "c4": 25000, "c128": 800, "c4_state": 64,
      "c128_state": 64}),
    ("Max running requests is reset to 48 for speculative decoding. You can override this by explicitly setting "
     "--max-running-requests.", "max_running_default", {"value": 48, "reason": "speculative decoding"}),
    ("Setting max_running_requests to 256 for DeepseekV4ForCausalLM.", "max_running_default",
     {"value": 256, "reason": "DeepseekV4ForCausalLM"}),
    ("RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
     "max_mamba_cache_size=2, mamba_ratio=3, resulting max_num_reqs=0. Try: (1) reduce --max-running-requests, "
     "(2) increase --mem-fraction-static, or (3) use GPUs with more memory.", "oom",
     {"phase": "startup", "reason": "mem_fraction_static_too_small", "max_mamba_cache_size": 2, "mamba_ratio": 3,
      "max_num_reqs": 0}),
    ("RuntimeError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Computed "
     "max_mamba_cache_size=-3 (total_rest_memory=-0.50 GB, mamba_cache_per_req=120.00 MB). Try: (1) reduce "
     "--max-running-requests, (2) increase --mem-fraction-static, (3) reduce --speculative-num-draft-tokens, or (4) "
     "use GPUs with more memory.", "oom",
     {"phase": "startup", "reason": "mem_fraction_static_too_small", "max_mamba_cache_size": -3,
      "total_rest_memory_gb": -0.5, "mamba_cache_per_req_mb": 120.0}),
    ("ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.7. Raise "
     "--mem-fraction-static above 0.812 (minimum viable = 1 - available/pre = 0.8113). If using speculative "
     "decoding, draft weights are now counted.", "oom",
     {"phase": "startup", "reason": "mem_fraction_static_too_small", "mem_fraction_static": 0.7,
      "mem_fraction_floor": 0.812, "mem_fraction_static_viable": 0.8113}),
]


@pytest.mark.parametrize(("text", "kind", "want"), CAPACITY_LINES, ids=[c[0][:40] for c in CAPACITY_LINES])
def test_capacity_messages_keep_their_numbers(text: str, kind: str, want: dict[str, Any]) -> None:
    """Every capacity message of SGLang 0.5.2x is an event with its numbers (none of them was read before)."""
    e = parse_line("[2026-11-28 10:00:00 TP0] " + text, 1)
    assert e is not None and e.kind == kind, e
    assert {k: e.fields.get(k) for k in want} == want


def test_a_refusal_reason_and_an_oom_detail_line_carry_no_secret() -> None:
    """Text SGLang copies into a reason or an OOM's detail lines goes through core/redact like every other."""
    secret = "sk-live-0123456789abcdef"
    e = parse_line(f"[2026-11-28 10:00:00] Updating api_key is rejected while serving api_key={secret}", 1)
    assert e is not None and e.kind == "server_args_rejected" and secret not in str(e.fields), e.fields
    text = ("[2025-06-27 19:02:11 TP0] Prefill out of memory. Try to lower your batch size.\n"
            f"Try to allocate 8192 tokens. token={secret}\n"
            "[2025-06-27 19:02:12 TP0] Decode batch, #running-req: 1, #token: 2, token usage: 0.00, #queue-req: 0\n")
    (oom,) = [ev for ev in read_events(text.splitlines(keepends=True)) if ev.kind == "oom"]
    assert "Try to allocate" in oom.fields["message"] and secret not in oom.fields["message"], oom.fields
