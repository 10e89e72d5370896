"""Multi-line records (sources/logrecords.py): what decides a failure's phase, how a record resolves."""

from __future__ import annotations

from sglang_tuning_exporter.core import events as ev
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.sources.logrecords import Block, phase_from_frames, resolve


def test_phase_from_frames_innermost_wins() -> None:
    """The innermost frame that names a phase decides."""
    assert phase_from_frames([("a", "run_batch"), ("b", "forward_extend"), ("c", "replay")]) == "decode"
    assert phase_from_frames([("sglang/x/prefill_cuda_graph_runner.py", "run")]) == "prefill"
    assert phase_from_frames([("x", "init_cuda_graphs"), ("y", "capture")]) == "startup"
    assert phase_from_frames([("x", "main")]) is None


def test_a_re_raised_oom_is_linked_only_when_the_last_oom_is_known() -> None:
    """The same OOM re-raised by a traceback: an error pointing at the OOM when the reader knows it,
    else an oom of its own and a flag saying the check was made blind (the parallel reader re-checks)."""
    def block() -> Block:
        b = Block(Event(50, ev.ERROR, None, {}, {"error": "Scheduler hit an exception"}), traceback=True)
        for line in ('  File "x.py", line 1, in forward_decode',
                     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"):
            b.add(line)
        return b
    e, blind = resolve(block(), None)
    assert e.kind == ev.OOM and e.fields["phase"] == "decode" and blind
    e, blind = resolve(block(), (40, "CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert e.kind == ev.ERROR and e.fields["same_as_line"] == 40 and not blind


def test_a_raised_hybrid_state_pool_failure_is_a_startup_oom_with_its_numbers() -> None:
    """SGLang 0.5.2x raises its hybrid (mamba) state pool failures: the traceback's last line is the start-up
    OOM of the pool-too-small rule (raise the fraction), with the pool's figures, not a bare error."""
    from sglang_tuning_exporter.sources.logreader import scan_text
    events, _ = scan_text(
        "[2026-11-28 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/sglang/srt/managers/scheduler.py", line 300, in __init__\n    self.init_memory_pool()\n'
        "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
        "max_mamba_cache_size=5110, mamba_ratio=0.64, resulting max_num_reqs=5684. Try: (1) reduce "
        "--max-running-requests, (2) increase --mem-fraction-static, or (3) use GPUs with more memory.\n")
    (e,) = events
    assert e.kind == "oom" and e.fields["phase"] == "startup"
    assert (e.fields["max_mamba_cache_size"], e.fields["mamba_ratio"]) == (5110, 0.64)
