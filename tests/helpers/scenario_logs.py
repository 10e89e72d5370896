"""Writes SGLang logs for scenario tests in the real line formats of several releases.

The formats are copied from SGLang's own logging code as rendered in
../shared/reference/sglang-fixtures/log-lines-rendered.txt and the corpus (facts, not code):
prefixes by release (sglang-logs.md section 1), Decode/Prefill heads `Decode batch.` (<= 0.5.3) and
`Decode batch,` (>= 0.5.5), the trailing `, ` of 0.4.10-0.5.8, the `cuda graph` field from 0.4.7,
both retraction wordings, startup memory lines, OOM messages and `server_args=` in both forms.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


def vt(version: str) -> tuple[int, ...]:
    """'0.5.23' -> (0, 5, 23)."""
    return tuple(int(x) for x in version.split("."))


@dataclass
class LogWriter:
    """Builds one server's log line by line; `now` advances with `tick`."""

    version: str = "0.5.23"
    start: float = 1_740_823_200.0  # 2025-03-01 10:00:00 UTC (a window boundary)
    tp_size: int = 1
    lines: list[str] = field(default_factory=list)
    now: float = 0.0
    timestamps: bool = True

    def __post_init__(self) -> None:
        self.now = self.start

    # -- prefix -------------------------------------------------------------------------------
    def prefix(self, dp: int | None = None, tp: int = 0, ep: int | None = None) -> str:
        """`[YYYY-MM-DD HH:MM:SS DPx TPy] ` as the release prints it."""
        v = vt(self.version)
        if not self.timestamps or v < (0, 2, 15):
            return "[gpu=0] " if v >= (0, 2, 9) else ""
        fmt = "%H:%M:%S" if v < (0, 3, 4) else "%Y-%m-%d %H:%M:%S"
        ranks = ""
        if dp is not None:
            ranks += f" DP{dp}"
        if v < (0, 4, 7) or self.tp_size > 1 or dp is not None:
            ranks += f" TP{tp}"
        if ep is not None:
            ranks += f" EP{ep}"
        return f"[{time.strftime(fmt, time.gmtime(self.now))}{ranks}] "

    def add(self, text: str, **rank: Any) -> LogWriter:
        """Append one line with the release's prefix."""
        self.lines.append(self.prefix(**rank) + text)
        return self

    def raw(self, text: str) -> LogWriter:
        """Append lines as they are (traceback bodies, uvicorn access lines)."""
        self.lines.extend(text.split("\n"))
        return self

    def tick(self, seconds: float) -> LogWriter:
        """Advance the clock."""
        self.now += seconds
        return self

    # -- startup ------------------------------------------------------------------------------
    def server_args(self, **args: Any) -> LogWriter:
        """`server_args=ServerArgs(...)` (<= 0.5.18) or `server_args={...}` (>= 0.5.19)."""
        base: dict[str, Any] = {"model_path": "Qwen/Qwen2.5-7B-Instruct", "tp_size": self.tp_size}
        base.update(args)
        if vt(self.version) >= (0, 5, 19):
            body = "{" + ", ".join(f"{k!r}: {v!r}" for k, v in base.items()) + "}"
            return self.add(f"server_args={body}")
        body = ", ".join(f"{k}={v!r}" for k, v in base.items())
        # The launcher logs before the rank prefix exists.
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.now))
        self.lines.append(f"[{stamp}] server_args=ServerArgs({body})")
        return self

    def startup(self, *, total: float = 80.0, weights: float = 15.3, kv: float = 48.3, graph: float = 1.1,
                available: float | None = None, max_running: int = 4096, max_total: int = 421888,
                chunked: int = 8192, capture_bs: list[int] | None = None, summary_avail: bool = True,
                **rank: Any) -> LogWriter:
        """Load weights, KV cache, memory pool, CUDA graph capture and the capacity summary."""
        v = vt(self.version)
        after_w = total - weights
        after_pool = after_w - kv
        after_graph = available if available is not None else after_pool - graph
        self.add(f"Load weight begin. avail mem={total:.2f} GB", **rank)
        if v >= (0, 5, 10):
            self.add(f"Load weight end. elapsed=21.40 s, type=Qwen2ForCausalLM, avail mem={after_w:.2f} GB, "
                     f"mem usage={weights:.2f} GB.", **rank)
        else:
            self.add(f"Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail mem={after_w:.2f} GB, "
                     f"mem usage={weights:.2f} GB.", **rank)
        half = kv / 2
        if v >= (0, 5, 13):
            self.add(f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {max_total}, K size: {half:.2f} GB, "
                     f"V size: {half:.2f} GB", **rank)
        else:
            self.add(f"KV Cache is allocated. #tokens: {max_total}, K size: {half:.2f} GB, V size: {half:.2f} GB",
                     **rank)
        self.add(f"Memory pool end. avail mem={after_pool:.2f} GB", **rank)
        bs = capture_bs if capture_bs is not None else [1, 2, 4, 8, 16, 24, 32, 64, 128, 160, 256]
        bs_text = "[" + ", ".join(str(b) for b in bs) + "]"
        if v >= (0, 5, 22):
            self.add(f"Capture target decode CUDA graph begin. backend=flashinfer, num_tokens_per_req=1, "
                     f"avail mem={after_pool:.2f} GB", **rank)
            self.add(f"Capture target decode CUDA graph end. bs={bs_text}, elapsed=14.80 s, mem usage={graph:.2f} GB, "
                     f"avail mem={after_graph:.2f} GB.", **rank)
        elif v >= (0, 5, 14):
            self.add(f"Capture target decode CUDA graph begin. backend=flashinfer, num_tokens_per_bs=1, bs={bs_text}, "
                     f"avail mem={after_pool:.2f} GB", **rank)
            self.add(f"Capture target decode CUDA graph end. elapsed=14.80 s, mem usage={graph:.2f} GB, "
                     f"avail mem={after_graph:.2f} GB.", **rank)
        else:
            self.add(f"Capture cuda graph begin. This can take up to several minutes. avail mem={after_pool:.2f} GB",
                     **rank)
            self.add(f"Capture cuda graph bs {bs_text}", **rank)
            self.add(f"Capture cuda graph end. Time elapsed: 14.80 s. mem usage={graph:.2f} GB. "
                     f"avail mem={after_graph:.2f} GB.", **rank)
        summary = (f"max_total_num_tokens={max_total}, chunked_prefill_size={chunked}, max_prefill_tokens=16384, "
                   f"max_running_requests={max_running}, context_len=32768")
        if summary_avail and v >= (0, 4, 7):
            summary += f", available_gpu_mem={after_graph:.2f} GB"
        return self.add(summary, **rank)

    # -- traffic ------------------------------------------------------------------------------
    def decode(self, running: int, usage: float, queue: int, graph: bool | None = True, tokens: int | None = None,
               throughput: float = 4594.01, **rank: Any) -> LogWriter:
        """One Decode line in the release's format."""
        v = vt(self.version)
        head = "Decode batch," if v >= (0, 5, 5) else "Decode batch."
        tok = tokens if tokens is not None else int(usage * 421888)
        body = f"{head} #running-req: {running}, #token: {tok}, token usage: {usage:.2f}, "
        if v >= (0, 4, 7) and graph is not None:
            body += f"cuda graph: {graph}, "
        body += f"gen throughput (token/s): {throughput:.2f}, #queue-req: {queue}"
        if (0, 4, 10) <= v <= (0, 5, 8) or (0, 4, 4) <= v <= (0, 4, 5):
            body += ", "
        return self.add(body, **rank)

    def prefill(self, new: int, cached: int, usage: float, running: int, queue: int, **rank: Any) -> LogWriter:
        """One Prefill line in the release's format."""
        v = vt(self.version)
        head = "Prefill batch," if v >= (0, 5, 5) else "Prefill batch."
        body = f"{head} #new-seq: 6, #new-token: {new}, #cached-token: {cached}, "
        if v < (0, 4, 4):
            hit = 100.0 * cached / max(1, new + cached)
            body += f"cache hit rate: {hit:.2f}%, "
        body += f"token usage: {usage:.2f}, #running-req: {running}, #queue-req: {queue}"
        if v >= (0, 5, 11):
            body += ", #pending-token: 0, cuda graph: False, input throughput (token/s): 8192.00"
        elif (0, 4, 10) <= v <= (0, 5, 8):
            body += ", "
        return self.add(body, **rank)

    def retract(self, n: int = 1, **rank: Any) -> LogWriter:
        """A retraction in the release's wording."""
        v = vt(self.version)
        if v <= (0, 2, 13):
            return self.add(f"decode out of memory happened, #retracted_reqs: {n}, #new_token_ratio: 0.9998 -> 1.0000",
                            **rank)
        if v <= (0, 4, 6):
            return self.add(f"Decode out of memory happened. #retracted_reqs: {n}, #new_token_ratio: 0.9998 -> 1.0000",
                            **rank)
        if v >= (0, 5, 7):
            return self.add(f"KV cache pool is full. Retract requests. #retracted_reqs: {n}, #new_tokens_gained: 4608, "
                            "#new_token_ratio: 0.3811 -> 0.5127", **rank)
        return self.add(f"KV cache pool is full. Retract requests. #retracted_reqs: {n}, "
                        "#new_token_ratio: 0.9998 -> 1.0000", **rank)

    def access(self) -> LogWriter:
        """A uvicorn access line (noise)."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.now))
        self.lines.append(f'[{stamp}] INFO:     127.0.0.1:40412 - "POST /generate HTTP/1.1" 200 OK')
        return self

    # -- failures -----------------------------------------------------------------------------
    def prefill_oom(self, **rank: Any) -> LogWriter:
        """SGLang's own prefill KV-pool failure, then the re-raise in the scheduler."""
        v = vt(self.version)
        if v < (0, 2, 15):
            return self.add("Prefill out of memory. This should never happen.", **rank)
        self.add("Prefill out of memory. Try to lower your batch size.", **rank)
        self.raw("Try to allocate 8192 tokens.\nAvaliable tokens: 100\nself.tree_cache.evictable_size()=0\n")
        self.add("Scheduler hit an exception: Traceback (most recent call last):", **rank)
        return self.raw('  File "/sglang/srt/managers/scheduler.py", line 2336, in run_scheduler_process\n'
                        "    scheduler.event_loop_overlap()\n"
                        '  File "/sglang/srt/managers/schedule_batch.py", line 99, in prepare_for_extend\n'
                        "    out_cache_loc = self.alloc_token_slots(extend_num_tokens)\n"
                        "RuntimeError: Prefill out of memory. Try to lower your batch size.")

    def cuda_oom(self, frame: str | None = "forward_decode", **rank: Any) -> LogWriter:
        """A CUDA OOM traceback; `frame` tells the phase (None: a bare error without frames)."""
        self.add("Scheduler hit an exception: Traceback (most recent call last):", **rank)
        if frame is not None:
            self.raw('  File "/sglang/srt/managers/scheduler.py", line 2336, in run_scheduler_process\n'
                     "    scheduler.event_loop_overlap()\n"
                     f'  File "/sglang/srt/model_executor/model_runner.py", line 99, in {frame}\n'
                     "    return self.model.forward(x)")
        return self.raw("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. "
                        "GPU 0 has a total capacity of 79.10 GiB")

    def not_enough_memory(self, current: float | None = None, **rank: Any) -> LogWriter:
        """The startup sizing failure: the static fraction is too small for the weights (late 2026 adds
        ` Current value: mem_fraction_static=X`)."""
        tail = "" if current is None else f" Current value: mem_fraction_static={current}"
        self.add("Scheduler hit an exception: Traceback (most recent call last):", **rank)
        return self.raw('  File "/sglang/srt/model_executor/model_runner.py", line 1203, in init_memory_pool\n'
                        "    raise RuntimeError(\n"
                        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static." + tail)

    def capture_oom(self, free_mib: float = 412.0, total_gib: float = 79.19, **rank: Any) -> LogWriter:
        """A torch OOM during CUDA-graph capture, re-raised as `Capture cuda graph failed` (start-up, before
        the first batch): the headroom outside the static pool was too small."""
        torch_msg = (f"CUDA out of memory. Tried to allocate 1.25 GiB. GPU 0 has a total capacity of {total_gib:.2f} "
                     f"GiB of which {free_mib:.2f} MiB is free.")
        self.add("Scheduler hit an exception: Traceback (most recent call last):", **rank)
        return self.raw('  File "/sglang/srt/model_executor/cuda_graph_runner.py", line 520, in capture_one_batch_size\n'
                        "    logits_output = forward(input_ids, forward_batch.positions, forward_batch)\n"
                        f"torch.OutOfMemoryError: {torch_msg}\n\n"
                        "During handling of the above exception, another exception occurred:\n\n"
                        "Traceback (most recent call last):\n"
                        '  File "/sglang/srt/model_executor/cuda_graph_runner.py", line 382, in __init__\n'
                        "    raise Exception(\n"
                        f"Exception: Capture cuda graph failed: {torch_msg}\n"
                        "Possible solutions:\n"
                        "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
                        "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)")

    def default_oom(self, phase: str = "prefill", **rank: Any) -> LogWriter:
        """0.5.2x page size 1 (mem_cache/allocation.py alloc_token_slots): the phase-less `Out of memory.`
        ERROR, the radix tree's print, then the scheduler's traceback through alloc_for_extend (prefill)
        or alloc_for_decode (decode), re-raising the same message."""
        msg = ("Out of memory. Try to lower your batch size.\nTry to allocate 8192 tokens.\n"
               "Available tokens: 120 (available_size=100 + evictable_size=20)\n")
        self.add(msg.split("\n", 1)[0], **rank)
        self.raw(msg.split("\n", 1)[1].rstrip("\n"))
        self.raw("  0 [] r=1\n   120 [151644, 8948, 198] r=0\n#tokens: 120")
        if phase == "prefill":
            frames = ('  File "/sgl/python/sglang/srt/managers/scheduler.py", line 2210, in get_new_batch_prefill\n'
                      "    new_batch.prepare_for_extend()\n"
                      '  File "/sgl/python/sglang/srt/managers/schedule_batch.py", line 1482, in prepare_for_extend\n'
                      "    out_cache_loc, req_pool_indices_tensor, req_pool_indices = alloc_for_extend(self)\n"
                      '  File "/sgl/python/sglang/srt/mem_cache/allocation.py", line 421, in alloc_for_extend\n'
                      "    out_cache_loc = alloc_token_slots(batch.tree_cache, batch.extend_num_tokens)\n")
        else:
            frames = ('  File "/sgl/python/sglang/srt/managers/scheduler.py", line 2301, in update_running_batch\n'
                      "    batch.prepare_for_decode()\n"
                      '  File "/sgl/python/sglang/srt/managers/schedule_batch.py", line 1790, in prepare_for_decode\n'
                      "    self.out_cache_loc = alloc_for_decode(self, token_per_req=1)\n"
                      '  File "/sgl/python/sglang/srt/mem_cache/allocation.py", line 740, in alloc_for_decode\n'
                      "    return alloc_for_decode_default(batch, token_per_req)\n"
                      '  File "/sgl/python/sglang/srt/mem_cache/allocation.py", line 650, in alloc_for_decode_default\n'
                      "    out_cache_loc = alloc_token_slots(batch.tree_cache, bs * token_per_req)\n")
        self.add("Scheduler hit an exception: Traceback (most recent call last):", **rank)
        return self.raw('  File "/sgl/python/sglang/srt/managers/scheduler.py", line 3329, in run_scheduler_process\n'
                        "    scheduler.event_loop_overlap()\n"
                        '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 1190, in event_loop_overlap\n'
                        "    batch = self.get_next_batch_to_run()\n" + frames +
                        '  File "/sgl/python/sglang/srt/mem_cache/allocation.py", line 170, in alloc_token_slots\n'
                        "    raise RuntimeError(error_msg)\n"
                        "RuntimeError: " + msg.rstrip("\n"))

    def req_slots_oom(self, **rank: Any) -> LogWriter:
        """0.5.2x request-slot exhaustion (mem_cache/allocation.py alloc_req_slots), raised while a
        prefill batch is built: the request pool, not the KV pool, ran out."""
        self.add("Scheduler hit an exception: Traceback (most recent call last):", **rank)
        return self.raw('  File "/sgl/python/sglang/srt/managers/scheduler.py", line 3329, in run_scheduler_process\n'
                        "    scheduler.event_loop_overlap()\n"
                        '  File "/sgl/python/sglang/srt/managers/schedule_batch.py", line 1482, in prepare_for_extend\n'
                        "    out_cache_loc, req_pool_indices_tensor, req_pool_indices = alloc_for_extend(self)\n"
                        '  File "/sgl/python/sglang/srt/mem_cache/allocation.py", line 390, in alloc_for_extend\n'
                        "    req_pool_indices = alloc_req_slots(\n"
                        '  File "/sgl/python/sglang/srt/mem_cache/allocation.py", line 344, in alloc_req_slots\n'
                        "    raise RuntimeError(\n"
                        "RuntimeError: alloc_req_slots runs out of memory. Please set a smaller number for "
                        "`--max-running-requests`. req_to_token_pool.available_size()=0, num_reqs=6, ")

    def graph_capture_oom(self, graph: str = "decode", free_gib: float = 0.38, total_gib: float = 79.19,
                          **rank: Any) -> LogWriter:
        """0.5.2x start-up: a torch OOM while capturing the decode graphs (`Capture cuda graph failed:` +
        SGLang's list of remedies, model_executor/runner/decode_cuda_graph_runner.py) or the prefill
        graphs (`Capture prefill CUDA graph failed:`, prefill_cuda_graph_runner.py)."""
        torch_msg = (f"CUDA out of memory. Tried to allocate 1.25 GiB. GPU 0 has a total capacity of {total_gib:.2f} "
                     f"GiB of which {free_gib:.2f} GiB is free. Including non-PyTorch memory, this process has "
                     f"{total_gib - free_gib:.2f} GiB memory in use.")
        if graph == "decode":
            runner, init, head = "decode_cuda_graph_runner", "init_decode_cuda_graph", "Exception: Capture cuda graph failed"
            tail = ("Possible solutions:\n"
                    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
                    "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
                    "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
                    "(Not recommended. Huge performance loss)\n"
                    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose ")
        else:
            runner, init, head = ("prefill_cuda_graph_runner", "init_prefill_cuda_graph",
                                  "RuntimeError: Capture prefill CUDA graph failed")
            tail = ("Fail when using backend: tc_piecewise for prefill runner.\n"
                    "Possible suggestions:\n"
                    "1. change to breakable by --cuda-graph-backend-prefill=breakable\n"
                    "2. disable the prefill CUDA graph by --cuda-graph-backend-prefill=disabled\n"
                    "3. if it is an OOM problem, set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7) "
                    "or set --cuda-graph-max-bs-prefill to a smaller value (e.g., 2048)\n"
                    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose ")
        self.add("Scheduler hit an exception: Traceback (most recent call last):", **rank)
        return self.raw(f'  File "/sgl/python/sglang/srt/model_executor/runner/{runner}.py", line 598, in __init__\n'
                        "    self.capture()\n"
                        f'  File "/sgl/python/sglang/srt/model_executor/runner/{runner}.py", line 700, in capture\n'
                        "    self.backend.capture_one(bs)\n"
                        f"torch.OutOfMemoryError: {torch_msg}\n\n"
                        "During handling of the above exception, another exception occurred:\n\n"
                        "Traceback (most recent call last):\n"
                        '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 3329, in run_scheduler_process\n'
                        "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)\n"
                        '  File "/sgl/python/sglang/srt/model_executor/model_runner.py", line 1610, in ' + init + "\n"
                        f"    self.graph_runner = {runner.title().replace('_', '')}(self)\n"
                        f'  File "/sgl/python/sglang/srt/model_executor/runner/{runner}.py", line 603, in __init__\n'
                        "    raise Exception(\n"
                        f"{head}: {torch_msg}\n{tail}")

    def sigquit(self) -> LogWriter:
        """The launcher's line after a scheduler died (no rank prefix): it closes the records before it."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.now))
        self.lines.append(f"[{stamp}] Received sigquit from a child process. It usually means the child failed.")
        return self

    def text(self) -> str:
        """The whole log."""
        return "\n".join(self.lines) + "\n"


def steady(w: LogWriter, minutes: float, every_s: float = 2.0, *, running: int = 200, usage: float = 0.93,
           queue: int = 400, graph: bool | None = True, ranks: list[dict[str, Any]] | None = None,
           prefill_every: int = 0, new: int = 4000, cached: int = 1500, **kw: Any) -> LogWriter:
    """Decode lines every `every_s` seconds for `minutes` (one per rank), optional Prefill lines."""
    n = int(minutes * 60 / every_s)
    for i in range(n):
        for r in ranks or [{}]:
            w.decode(running, usage, queue, graph, **kw, **r)
            if prefill_every and i % prefill_every == 0:
                w.prefill(new, cached, usage, running, queue, **r)
        w.tick(every_s)
    return w
