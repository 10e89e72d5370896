"""Generated logs for the differential tests of the readers: a pool of real-looking lines (every head,
decorated prefixes, tracebacks, access lines, odd values) and a hypothesis strategy mixing them with junk."""

from __future__ import annotations

from hypothesis import strategies as st

TS = "[2025-11-22 23:24:43 DP{r} TP{r} EP{r}] "
POOL = [
    TS + "Decode batch, #running-req: 1024, #token: 1922048, token usage: 0.62, pre-allocated usage: 0.00, "
    "#prealloc-req: 0, #transfer-req: 0, #retracted-req: 0, cuda graph: True, gen throughput (token/s): 0.89, "
    "#queue-req: 853, ",
    TS + "Decode batch, #running-req: 3, #token: 1442, token usage: 0.18, cuda graph: False, "
    "gen throughput (token/s): 12.5, #queue-req: 0",
    TS + "Prefill batch, #new-seq: 2, #new-token: 8192, #cached-token: 0, token usage: 0.92, #running-req: 4, "
    "#queue-req: 105, #pending-token: 0, cuda graph: False, input throughput (token/s): 968.08",
    TS + "Prefill batch. #new-seq: 1, #new-token: 4, #cached-token: 0, cache hit rate: 12.89%, token usage: 0.00, "
    "#running-req: 0, #queue-req: 0",
    TS + "Decode batch, #running-req: 5, #full token: 10, full token usage: 0.50, #swa token: 3, "
    "swa token usage: 0.70, npu graph: True, gen throughput (token/s): 1.0, #queue-req: 1",
    TS + "Prefill batch, #new-seq: 1, note: Decode batch, #queue-req: 2",  # free text holding the other head
    TS + "Prefill batch, #new-seq: 1, note: has text, #queue-req: 2",
    TS + "Decode batch, #running-req: x, #token: 1442, token usage: 0.18, cuda graph: False, "
    "gen throughput (token/s): 12.5, #queue-req: 0",  # a value that does not convert
    TS + "Decode batch [123457], #running-req: 3, #token: 1442, token usage: 0.18, cuda graph: False, "
    "gen throughput (token/s): 12.5, #queue-req: 0",
    "sglang  | " + TS + "Decode batch, #running-req: 3, #token: 1442, token usage: 0.18, cuda graph: False, "
    "gen throughput (token/s): 12.5, #queue-req: 0",
    "\x1b[32m" + TS + "Decode batch, #running-req: 3, #token: 1442, token usage: 0.18, cuda graph: False, "
    "gen throughput (token/s): 12.5, #queue-req: 0\x1b[0m",
    "50%|#####   | 5/10 [00:01<00:01, 4.9it/s]\r" + TS + "Decode batch, #running-req: 3, #token: 1442, "
    "token usage: 0.18, cuda graph: False, gen throughput (token/s): 12.5, #queue-req: 0",
    '[2025-11-22 23:24:43] INFO:     10.0.0.1:4000 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    '[2025-11-22 23:24:43] INFO:     10.0.0.1:4000 - "GET /v1/batches HTTP/1.1" 200 OK',
    TS + "KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_token_ratio: 0.3811 -> 0.5127",
    TS + "Prefill out of memory. Try to lower your batch size.",
    "Try to allocate 8192 tokens.",
    "Avaliable tokens: 100",
    TS + "Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/sglang/srt/managers/schedule_batch.py", line 99, in prepare_for_extend',
    "    out_cache_loc = self.alloc_token_slots(extend_num_tokens)",
    "RuntimeError: Prefill out of memory. Try to lower your batch size.",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB.",
    "[rank1]: Traceback (most recent call last):",
    "",
    "    more context",
    TS + "max_total_num_tokens=903439, chunked_prefill_size=8192, max_prefill_tokens=16384, "
    "max_running_requests=3529, context_len=131072, available_gpu_mem=10.26 GB",
    TS + "Capture cuda graph begin. This can take up to several minutes. avail mem=2.04 GB",
    TS + "Capture cuda graph bs [1, 8, 64]",
    "server_args={'model_path': 'dummy', 'tp_size': 1, 'mem_fraction_static': 0.85}",
    TS + "Scheduler.run_batch sleep 180.0s",
    "The server is fired up and ready to roll!",
    "new fill batch. #seq: 1. #cached_token: 478. #new_token: 254. #remaining_req: 0. #running_req: 4. "
    "tree_cache_hit_rate: 80.81%.",
]


@st.composite
def mixed_log(draw: st.DrawFn, min_lines: int = 0) -> bytes:
    """A log of real-looking lines, junk, tracebacks cut anywhere, odd bytes, with or without a last newline."""
    pieces = draw(st.lists(st.one_of(st.sampled_from(POOL), st.text(max_size=40)), min_size=min_lines,
                           max_size=60))
    lines = [p.replace("{r}", str(draw(st.integers(0, 3)))) for p in pieces]
    text = "\n".join(lines)
    last_newline = draw(st.booleans())
    if lines and last_newline:
        text += "\n"
    data = text.encode("utf-8", "surrogatepass")
    if draw(st.booleans()) and data:
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(max_size=6)) + data[at:]
    if data[:2] == b"\x1f\x8b":
        data = b" " + data  # the gzip magic: readers take the file for gzip (a plain log never starts so)
    return data
