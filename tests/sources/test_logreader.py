"""The multi-line reader: tracebacks and multi-line OOM messages become one event at their first line."""

from __future__ import annotations

from helpers import paths
from helpers.scenario_logs import LogWriter
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.sources.logreader import EventReader, read_events
from sglang_tuning_exporter.sources.tail import open_input

FIXTURES = paths.FIXTURES / "logs"

PREFILL_OOM_THEN_RERAISE = """\
[2025-06-27 19:02:10 TP0] Prefill batch. #new-seq: 1, #new-token: 4, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0
[2025-06-27 19:02:11 TP0] Prefill out of memory. Try to lower your batch size.
Try to allocate 8192 tokens.
Avaliable tokens: 100
self.token_to_kv_pool_allocator.available_size()=100
self.tree_cache.evictable_size()=0

[2025-06-27 19:02:11 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/sglang/srt/managers/scheduler.py", line 2336, in run_scheduler_process
    scheduler.event_loop_overlap()
  File "/sglang/srt/managers/schedule_batch.py", line 99, in prepare_for_extend
    out_cache_loc = self.alloc_token_slots(extend_num_tokens)
RuntimeError: Prefill out of memory. Try to lower your batch size.
Try to allocate 8192 tokens.
Avaliable tokens: 100

[2025-06-27 19:02:11] Received sigquit from a child process. It usually means the child failed.
"""

CUDA_OOM_DECODE = """\
[2025-06-27 19:05:11 DP1 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/sglang/srt/managers/scheduler.py", line 2336, in run_scheduler_process
    scheduler.event_loop_overlap()
  File "/sglang/srt/model_executor/model_runner.py", line 99, in forward_decode
    return self.model.forward(x)
           ^^^^^^^^^^^^^^^^^^^^^
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 79.10 GiB
[2025-06-27 19:05:12] INFO:     127.0.0.1:20504 - "POST /v1/completions HTTP/1.1" 200 OK
[2025-06-27 19:05:12 TP0] Decode batch, #running-req: 1, #token: 2, token usage: 0.00, cuda graph: True, gen throughput (token/s): 1.00, #queue-req: 0
"""


def _events(text: str) -> list[Event]:
    return list(read_events(text.splitlines(keepends=True)))


def test_multiline_prefill_oom_is_one_event_and_the_reraise_is_not_counted_twice() -> None:
    """The logged OOM is one oom event at its first line; the re-raised traceback refers to it."""
    events = _events(PREFILL_OOM_THEN_RERAISE)
    assert [(e.line, e.kind) for e in events] == [(1, "prefill"), (2, "oom"), (8, "error"), (17, "error")]
    oom = events[1]
    assert oom.rank == {"tp": 0} and oom.time == "2025-06-27T19:02:11"
    assert oom.fields["phase"] == "prefill"
    assert oom.fields["tokens_requested"] == 8192 and oom.fields["tokens_available"] == 100
    assert oom.fields["message"].splitlines()[0] == "Prefill out of memory. Try to lower your batch size."
    assert oom.fields["message"].splitlines()[1] == "Try to allocate 8192 tokens."
    reraise = events[2]
    assert reraise.fields["same_as_line"] == 2 and reraise.fields["exception"] == "RuntimeError"
    assert reraise.fields["phase"] == "prefill" and reraise.fields["last_frame"] == "prepare_for_extend"


def test_traceback_ending_in_cuda_oom_is_an_oom_classified_by_frames() -> None:
    """No phase word in a CUDA OOM: the frames (forward_decode) decide; following lines still parse."""
    events = _events(CUDA_OOM_DECODE)
    assert [(e.line, e.kind) for e in events] == [(1, "oom"), (9, "decode")]
    oom = events[0]
    assert oom.rank == {"dp": 1, "tp": 0}
    assert oom.fields["phase"] == "decode" and oom.fields["exception"] == "torch.OutOfMemoryError"
    assert oom.fields["tried_to_allocate_gb"] == 1.5 and oom.fields["error"] == "Scheduler hit an exception"


def test_generic_out_of_memory_gets_phase_from_a_later_traceback_frame() -> None:
    """`Out of memory.` (0.5.4+, no phase) re-raised from alloc_for_decode -> decode."""
    text = ("Scheduler hit an exception: Traceback (most recent call last):\n"
            '  File "/s/scheduler.py", line 1, in run_batch\n'
            '  File "/s/mem_cache/allocation.py", line 2, in alloc_for_decode\n'
            "RuntimeError: Out of memory. Try to lower your batch size.\n"
            "Try to allocate 64 tokens.\n"
            "Available tokens: 3 (available_size=3 + evictable_size=0)\n")
    (e,) = _events(text)
    assert (e.kind, e.fields["phase"], e.fields["tokens_requested"], e.fields["tokens_available"]) == (
        "oom", "decode", 64, 3)


def test_v02_controller_traceback_from_the_corpus() -> None:
    """`Exception in ControllerSingle:` + traceback = one error, decode phase from forward_decode_batch."""
    with open_input(str(FIXTURES / "033-sglang1087-v02-controller-traceback.log")) as lines:
        events = list(read_events(lines))
    assert len(events) == 1
    e = events[0]
    assert (e.line, e.kind, e.fields["error"], e.fields["phase"]) == (1, "error", "Exception in ControllerSingle",
                                                                      "decode")
    assert e.fields["frames"] == 8


def test_capture_line_emits_its_companion_in_order() -> None:
    """A capture line with batch sizes gives startup_memory then cuda_graph_capture, same line number."""
    events = _events("x\n[2025-11-22 23:05:07 DP0 TP0 EP0] Capture cuda graph bs [1, 8, 64]\n")
    assert [(e.line, e.kind) for e in events] == [(2, "startup_memory"), (2, "cuda_graph_capture")]
    assert events[1].fields["max_bs"] == 64


def test_feed_and_flush_for_live_tailing() -> None:
    """feed() holds an open traceback until a non-continuation line; flush() emits it at the end."""
    r = EventReader(start_line=10)
    assert r.feed("[2025-01-01 00:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):") == []
    assert r.feed('  File "/x.py", line 3, in forward_extend') == []
    assert r.feed("ValueError: bad shape") == []
    assert r.next_line == 13
    (e,) = r.flush()
    assert (e.line, e.kind, e.fields["exception"], e.fields["phase"]) == (10, "error", "ValueError", "prefill")
    assert r.flush() == []
    assert r.stats.by_kind["error"] == 1


def test_runaway_block_is_bounded() -> None:
    """An endless indented block is cut after a bounded number of lines; memory stays small."""
    r = EventReader()
    r.feed("Exception in ControllerSingle:")
    out: list[Event] = []
    for _ in range(5000):
        out.extend(r.feed("    more"))
    out.extend(r.flush())
    assert [e.kind for e in out] == ["error"]


def test_line_numbers_count_newlines_only_not_carriage_returns() -> None:
    """\\r inside a line does not shift numbering (corpus file 039 has CR fragments)."""
    with open_input(str(FIXTURES / "039-gb200-scripts-pd-decode-4dp-cr-progress-noise.log")) as lines:
        events = list(read_events(lines))
    by_line = {(e.line, e.kind) for e in events}
    assert (20, "startup_memory") in by_line and (154, "decode") in by_line and (79, "startup_memory") in by_line


def test_torch_rank_tags_swa_details_and_version_line() -> None:
    """`[rankN]:` traceback lines, SWA detail lines of an OOM, and a version-revealing line."""
    text = (
        "[2025-06-27 19:05:11 TP1] Scheduler hit an exception: Traceback (most recent call last):\n"
        '[rank1]:   File "/sglang/srt/managers/scheduler.py", line 2336, in run_scheduler_process\n'
        "[rank1]:     scheduler.event_loop_overlap()\n"
        '[rank1]:   File "/sglang/srt/model_executor/runner/eager_runner.py", line 9, in _execute_extend\n'
        "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.\n"
        "[2025-06-27 19:05:12] Received sigquit from a child process. It usually means the child failed.\n"
        "Decode out of memory. Try to lower your batch size.\n"
        "Try to allocate 12 tokens.\n"
        "Available tokens: 0 (available_size=0 + evictable_size=0)\n"
        "Available full tokens: 0\n"
        "SWA LRU list evictable size: 3\n"
        "image lmsysorg/sglang:v0.5.23 pulled\n")
    events = _events(text)
    assert [(e.line, e.kind) for e in events] == [(1, "oom"), (6, "error"), (7, "oom"), (12, "version")]
    assert events[0].fields["phase"] == "prefill" and events[0].rank == {"tp": 1}
    assert events[0].fields["last_frame"] == "_execute_extend"
    assert events[1].fields["error"] == "Received sigquit from a child process"
    assert events[2].fields["phase"] == "decode" and events[2].fields["message"].count("\n") == 4
    assert events[3].fields == {"version": "0.5.23"}


STARTUP = """\
[2026-10-01 10:00:01 TP0] Load weight begin. avail mem=78.50 GB
[2026-10-01 10:00:30 TP0] Load weight end. elapsed=29.00 s, type=LlamaForCausalLM, avail mem=63.20 GB, mem usage=15.30 GB.
[2026-10-01 10:00:31 TP0] Memory pool end. avail mem=6.60 GB
"""
TORCH_OOM = """\
[2026-10-01 10:00:40 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/sglang/srt/managers/scheduler.py", line 2900, in run_scheduler_process
    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank)
  File "/sglang/srt/managers/scheduler.py", line 310, in __init__
    self.tp_worker = TpModelWorker(server_args, gpu_id, tp_rank)
  File "/sglang/srt/layers/attention/flashinfer_backend.py", line 99, in __init__
    self.workspace = torch.empty(size, device="cuda")
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.25 GiB. GPU 0 has a total capacity of 79.19 GiB of which 412.00 MiB is free.
"""
CAPTURE_FAILED = """\
[2026-10-01 10:00:40 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/sglang/srt/model_executor/cuda_graph_runner.py", line 520, in capture_one_batch_size
    logits_output = forward(input_ids, forward_batch.positions, forward_batch)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.25 GiB. GPU 0 has a total capacity of 79.19 GiB of which 412.00 MiB is free.

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/sglang/srt/model_executor/cuda_graph_runner.py", line 382, in __init__
    raise Exception(
Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 1.25 GiB. GPU 0 has a total capacity of 79.19 GiB of which 412.00 MiB is free.
Possible solutions:
1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)
2. set --cuda-graph-max-bs to a smaller value (e.g., 16)
Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose

[2026-10-01 10:00:41] Received sigquit from a child process. It usually means the child failed.
"""
NOT_ENOUGH = """\
[2026-10-01 10:00:40 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/sglang/srt/model_executor/model_runner.py", line 715, in init_memory_pool
RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static=0.3
"""


def _ooms(text: str) -> list[Event]:
    return [e for e in _events(text) if e.kind == "oom"]


def test_capture_oom_is_one_headroom_incident_with_the_torch_free_fact() -> None:
    """The chained `Exception: Capture cuda graph failed` traceback is one OOM: start-up phase, reason
    cuda_graph_capture of the decode graph (its ceiling first), with torch's capacity and free memory as GB
    facts."""
    (oom,) = _ooms(STARTUP + CAPTURE_FAILED)
    f = oom.fields
    assert (oom.line, f["phase"], f["reason"], f["graph"]) == (4, "startup", "cuda_graph_capture", "decode")
    assert (f["gpu_total_gb"], f["gpu_free_gb"]) == (79.19, 0.4023)


def test_an_oom_while_the_scheduler_is_built_is_an_init_failure() -> None:
    """A workspace allocation OOM in constructors (no event-loop frame: before the first batch) is a start-up
    headroom failure; the same allocation under the event loop keeps its unknown phase."""
    (oom,) = _ooms(STARTUP + TORCH_OOM)
    assert (oom.fields["phase"], oom.fields["reason"]) == ("startup", "init_headroom")
    runtime = TORCH_OOM.replace("scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank)",
                                "scheduler.event_loop_overlap()").replace("in __init__\n    self.tp_worker",
                                                                          "in event_loop_overlap\n    self.tp_worker")
    (oom,) = _ooms(STARTUP + runtime)
    assert oom.fields["phase"] == "unknown" and "reason" not in oom.fields


def test_not_enough_memory_stays_the_raise_case() -> None:
    """SGLang's own sizing failure keeps reason mem_fraction_static_too_small (the pool does not fit)."""
    (oom,) = _ooms(STARTUP + NOT_ENOUGH)
    assert (oom.fields["phase"], oom.fields["reason"]) == ("startup", "mem_fraction_static_too_small")


def test_two_messages_glued_on_one_line_give_both_events() -> None:
    """A lost newline (`... avail mem=6.95 GB max_total_num_tokens=...`): the pool line and the start-up
    summary, both with the line's time and rank; a normal summary line stays one event."""
    glued = ("[2026-11-02 09:00:56 TP0] Memory pool end. avail mem=6.95 GB max_total_num_tokens=2980168, "
             "chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=4096, context_len=65536, "
             "available_gpu_mem=6.95 GB\n")
    a, b = _events(glued)
    assert (a.kind, a.fields["stage"], a.fields["avail_mem_gb"]) == ("startup_memory", "memory_pool_end", 6.95)
    assert (b.kind, b.fields["stage"], b.fields["max_total_num_tokens"], b.fields["max_running_requests"]) == \
        ("startup_memory", "summary", 2980168, 4096)
    assert a.line == b.line == 1 and a.time == b.time == "2026-11-02T09:00:56" and a.rank == b.rank == {"tp": 0}
    plain = "[2026-11-02 09:00:56 TP0] max_total_num_tokens=2980168, max_running_requests=4096, context_len=65536\n"
    assert [e.fields["stage"] for e in _events(plain)] == ["summary"]


def _oom_logs() -> dict[str, str]:
    """0.5.2x failures written from SGLang's own format strings (tests/helpers/scenario_logs)."""
    def w() -> LogWriter:
        return LogWriter("0.5.23").add("Decode batch, #running-req: 12, #token: 4000, token usage: 0.40, "
                                       "cuda graph: True, gen throughput (token/s): 900.00, #queue-req: 3")
    tail = "[2025-03-01 10:00:00] Received sigquit from a child process. It usually means the child failed."
    return {"prefill": w().default_oom("prefill").raw(tail).text(),
            "decode": w().default_oom("decode").raw(tail).text(),
            "slots": w().req_slots_oom().raw(tail).text(),
            "graph_decode": w().graph_capture_oom("decode").text(),
            "graph_prefill": w().graph_capture_oom("prefill").text()}


def _read_every_way(text: str) -> list[list[Event]]:
    """The same text through every entry of the reader: line by line (the sidecar's live feed), whole
    text, bytes (the C drop-in when built) and without the C drop-in."""
    from sglang_tuning_exporter.sources import logreader

    ways: list[list[Event]] = []
    r = EventReader()
    one: list[Event] = []
    for line in text.splitlines():
        one.extend(r.feed(line))
    one.extend(r.flush())
    ways.append(one)
    ways.append(_events(text))
    r = EventReader()
    ways.append([*r.feed_bytes(text.encode()), *r.flush()])
    saved = logreader.SCAN
    logreader.SCAN = None
    try:
        ways.append(_events(text))
    finally:
        logreader.SCAN = saved
    return ways


def test_the_default_oom_takes_its_phase_from_the_traceback_that_follows() -> None:
    """Page size 1: `Out of memory. Try to lower your batch size.` names no phase; the scheduler's traceback
    after it passes alloc_for_extend (prefill) or alloc_for_decode* (decode). One OOM, that phase, however
    the lines are fed; the traceback is the same incident (not a second OOM)."""
    logs = _oom_logs()
    for phase in ("prefill", "decode"):
        for events in _read_every_way(logs[phase]):
            ooms = [e for e in events if e.kind == "oom"]
            assert [(e.fields["phase"], e.fields["tokens_requested"]) for e in ooms] == [(phase, 8192)], phase
            (again,) = [e for e in events if e.fields.get("same_as_line")]
            assert again.fields["same_as_line"] == ooms[0].line and again.fields["phase"] == phase
            assert [e.line for e in events] == sorted(e.line for e in events)


def test_request_slot_exhaustion_counts_where_max_running_requests_is_the_remedy() -> None:
    """`alloc_req_slots runs out of memory` (raised inside alloc_for_extend): the request pool ran out, whose
    remedy is --max-running-requests down: decode_oom's phase whatever frames it passed."""
    for events in _read_every_way(_oom_logs()["slots"]):
        (oom,) = [e for e in events if e.kind == "oom"]
        assert (oom.fields["phase"], oom.fields["pool"]) == ("decode", "req_to_token")


def test_a_graph_capture_oom_names_the_graph_and_is_never_a_runtime_oom() -> None:
    """`Capture cuda graph failed:` / `Capture prefill CUDA graph failed:` at start-up (frames through the
    graph runners' capture): a start-up failure of that graph's capture, never prefill/decode."""
    for graph in ("decode", "prefill"):
        for events in _read_every_way(_oom_logs()["graph_" + graph]):
            (oom,) = [e for e in events if e.kind == "oom"]
            f = oom.fields
            assert (f["phase"], f["reason"], f["graph"]) == ("startup", "cuda_graph_capture", graph)
            assert (f["gpu_total_gb"], f["gpu_free_gb"]) == (79.19, 0.38)


def test_tp_ranks_interleaving_their_default_ooms_each_get_their_tracebacks_phase() -> None:
    """TP0 and TP1 both log `Out of memory.` before either traceback: each held message (per rank) takes the
    phase of its own rank's traceback."""
    a = LogWriter("0.5.23", tp_size=2).default_oom("prefill", tp=0).lines
    b = LogWriter("0.5.23", tp_size=2).default_oom("decode", tp=1).lines
    ia = next(i for i, x in enumerate(a) if "Scheduler hit" in x)
    ib = next(i for i, x in enumerate(b) if "Scheduler hit" in x)
    text = "\n".join([*a[:ia], *b[:ib], *a[ia:], *b[ib:]]) + "\n"
    for events in _read_every_way(text):
        ooms = {e.rank["tp"]: e.fields["phase"] for e in events if e.kind == "oom"}
        assert ooms == {0: "prefill", 1: "decode"}


def test_a_frameless_oom_after_a_start_and_before_any_batch_is_a_startup_failure() -> None:
    """No frames, no phase word: after `Load weight begin` and before any Decode/Prefill line it failed at
    start-up (reason init_headroom, torch's figures kept); after a batch line it stays unknown. Every entry of
    the reader agrees (line by line, text, bytes with and without the C drop-in)."""
    oom = ("Scheduler hit an exception: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. "
           "GPU 0 has a total capacity of 139.80 GiB of which 1.90 GiB is free.")
    start = LogWriter("0.5.23").add("Load weight begin. avail mem=139.80 GB")
    for batch, want in ((False, ("startup", "init_headroom")), (True, ("unknown", None))):
        w = LogWriter("0.5.23")
        w.lines = list(start.lines)
        if batch:
            w.decode(12, 0.4, 3)
        w.add(oom).sigquit()
        for events in _read_every_way(w.text()):
            (e,) = [x for x in events if x.kind == "oom"]
            assert (e.fields["phase"], e.fields.get("reason")) == want
            assert e.fields["gpu_free_gb"] == 1.9
