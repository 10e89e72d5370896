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


def _raised(fmt: str, **values: object) -> dict[str, object]:
    """The one event of a scheduler traceback that ends in SGLang's raised message, its format string
    filled in with values."""
    from sglang_tuning_exporter.sources.logreader import scan_text
    last_line = fmt.format(**values)
    events, _ = scan_text(
        "[2026-11-28 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/sglang/srt/managers/scheduler.py", line 300, in __init__\n    self.init_memory_pool()\n'
        + last_line + "\n")
    (e,) = events
    assert e.kind == "oom" and e.fields["phase"] == "startup"
    return e.fields


def test_a_raised_swa_pool_too_small_for_one_request_is_a_startup_oom_with_its_numbers() -> None:
    # model_executor/pool_configurator.py (0.5.20-0.5.23), SGLang's own format string filled in
    f = _raised("ValueError: SWA pool ({swa_tokens} tokens) cannot hold even one request: the prefill admission "
                "floor is sliding_window_size ({sliding_window_size}) + page_size ({page_size}). Increase "
                "--swa-full-tokens-ratio or the total KV budget.",
                swa_tokens=4096, sliding_window_size=4096, page_size=64)
    assert f["reason"] == "mem_fraction_static_too_small"
    assert (f["swa_tokens"], f["sliding_window_size"], f["page_size"]) == (4096, 4096, 64)


def test_a_raised_swa_pool_cap_leaving_no_full_pool_is_a_startup_oom_with_its_numbers() -> None:
    f = _raised("RuntimeError: SWA pool cap ({swa_tokens} tokens, {cap:.2f} GiB) leaves no room for the full KV "
                "pool within the available {available:.2f} GiB. Reduce --max-running-requests, lower "
                "SGLANG_SWA_EVICTION_INTERVAL, or increase --mem-fraction-static.",
                swa_tokens=262144, cap=31.5, available=30.25)
    assert f["reason"] == "mem_fraction_static_too_small"
    assert (f["swa_tokens"], f["swa_cap_gb"], f["available_gb"]) == (262144, 31.5, 30.25)


def test_a_raised_dsv4_swa_pool_cap_is_a_startup_oom_with_its_numbers() -> None:
    f = _raised("RuntimeError: The DSV4 SWA pool cap ({swa_cap_tokens} tokens, {cap:.2f} GB) leaves no room for "
                "the full KV pool within the available {available:.2f} GB. Reduce --max-running-requests, lower "
                "--swa-prefix-tails or SGLANG_SWA_EVICTION_INTERVAL, or increase --mem-fraction-static.",
                swa_cap_tokens=131072, cap=12.75, available=11.5)
    assert f["reason"] == "mem_fraction_static_too_small"
    assert (f["swa_tokens"], f["swa_cap_gb"], f["available_gb"]) == (131072, 12.75, 11.5)


def test_a_raised_int8_mamba_checkpoint_pool_failure_is_a_headroom_oom_with_its_numbers() -> None:
    """The checkpoint pool is taken from the headroom the fraction leaves: SGLang says lower the fraction."""
    f = _raised("RuntimeError: int8 mamba checkpoint pool needs ~{need:.2f}GB but only {free:.2f}GB HBM is free. "
                "Lower --int8-mamba-ckpt-size (currently {ckpt_size}) or --mem-fraction-static.",
                need=6.4, free=2.1, ckpt_size=512)
    assert f["reason"] == "init_headroom"
    assert (f["mamba_checkpoint_pool_gb"], f["gpu_free_gb"], f["int8_mamba_ckpt_size"]) == (6.4, 2.1, 512)
