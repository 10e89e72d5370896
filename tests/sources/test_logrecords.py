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
