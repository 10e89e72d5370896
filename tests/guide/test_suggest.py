"""Suggested values from evidence and current server args; version-aware flag names."""

from __future__ import annotations

import pytest

from sglang_tuning_exporter.guide.checks import load_table
from sglang_tuning_exporter.guide.suggest import current_value, default_schedule_policy, flag_name, suggest

BY = load_table().by_id()


def test_mem_fraction_moves_headroom_to_the_middle_of_the_band() -> None:
    """0.80 + (14 - 6.5) / 80 = 0.894 -> 0.89 (rounded down, the safe side)."""
    flag, s = suggest(BY["gpu_mem_headroom_high"], {"available_gpu_mem_gb": 14.0, "gpu_mem_total_gb": 80.0},
                      {"mem_fraction_static": 0.80}, "0.5.23")
    assert flag == "--mem-fraction-static" and s.current == 0.80 and s.suggested == 0.89
    assert "6.5" in s.reasoning and "0.894" in s.reasoning


def test_mem_fraction_low_headroom_is_bounded() -> None:
    """A cut never goes below the lower bound."""
    _, s = suggest(BY["gpu_mem_headroom_low"], {"available_gpu_mem_gb": 0.0, "gpu_mem_total_gb": 10.0},
                   {"mem_fraction_static": 0.6}, None)
    assert s.suggested == 0.5


def test_mem_fraction_without_gpu_size_falls_back_to_the_guide() -> None:
    """No `Load weight begin` line: the guide's 0.8 for the low-headroom case."""
    _, s = suggest(BY["gpu_mem_headroom_low"], {"available_gpu_mem_gb": 2.0}, {"mem_fraction_static": 0.9}, None)
    assert s.suggested == 0.8 and "unknown" in s.reasoning


def test_mem_fraction_current_estimated_from_startup_lines() -> None:
    """Without server_args the static fraction is estimated from the weights and KV lines."""
    cur, source = current_value("--mem-fraction-static", {}, {"mem_fraction_static_estimate": 0.758})
    assert cur == 0.758 and "estimate" in source


def test_startup_too_small_raises_to_weights_plus_margin() -> None:
    """60 GB of weights on 80 GB: 0.75 + 0.1 = 0.85; capped at 0.95."""
    c = BY["startup_mem_fraction_too_small"]
    _, s = suggest(c, {"weights_gb": 60.0, "gpu_mem_total_gb": 80.0}, {"mem_fraction_static": 0.7}, None)
    assert s.suggested == 0.85
    _, s = suggest(c, {"weights_gb": 78.0, "gpu_mem_total_gb": 80.0}, {"mem_fraction_static": 0.7}, None)
    assert s.suggested == 0.95 and "more GPUs" in s.reasoning


@pytest.mark.parametrize(("current", "expected"), [(16384, 4096), (8192, 4096), (4096, 2048), (2048, 1024),
                                                   (600, 512), (None, 4096)])
def test_chunked_prefill_halving(current: int | None, expected: int) -> None:
    """The guide's 4096 then 2048, then halving, never below 512."""
    args = {} if current is None else {"chunked_prefill_size": current}
    _, s = suggest(BY["prefill_oom"], {}, args, "0.5.23")
    assert s.suggested == expected


def test_prefill_flag_follows_the_server_args() -> None:
    """A v0.2 server (max_prefill_tokens, no chunked_prefill_size) gets --max-prefill-tokens."""
    c = BY["prefill_oom"]
    assert flag_name(c, None, {"max_prefill_tokens": 16384}) == "--max-prefill-tokens"
    assert flag_name(c, None, {"chunked_prefill_size": 8192, "max_prefill_tokens": 16384}) == "--chunked-prefill-size"
    assert flag_name(c, "0.2.13", {}) == "--max-prefill-tokens"


def test_cuda_graph_flag_by_version_and_args() -> None:
    """--cuda-graph-max-bs-decode from 0.5.14 (or when the args carry it), --cuda-graph-max-bs before."""
    c = BY["cuda_graph_uncovered"]
    assert flag_name(c, "0.5.20", {}) == "--cuda-graph-max-bs-decode"
    assert flag_name(c, ">=0.5.14", {}) == "--cuda-graph-max-bs-decode"
    assert flag_name(c, "0.5.13", {}) == "--cuda-graph-max-bs"
    assert flag_name(c, None, {"cuda_graph_max_bs_decode": None}) == "--cuda-graph-max-bs-decode"


def test_cuda_graph_cover_rounds_up_and_is_bounded() -> None:
    """p90 of missed batch sizes rounded up to 8, bounded by max_running_requests."""
    c = BY["cuda_graph_uncovered"]
    _, s = suggest(c, {"cuda_graph_miss_batch_p90": 290.0, "max_running_requests": 512.0},
                   {"cuda_graph_max_bs": 160}, "0.5.10")
    assert s.suggested == 296
    _, s = suggest(c, {"cuda_graph_miss_batch_p90": 700.0, "max_running_requests": 512.0}, {}, "0.5.10")
    assert s.suggested == 512


def test_schedule_conservativeness_toward_targets() -> None:
    """To the guide's 1.3 from 1.0; one 0.1 step past it when already there; 1.2 for latency."""
    c = BY["retractions_frequent"]
    assert suggest(c, {}, {"schedule_conservativeness": 1.0}, None)[1].suggested == 1.3
    assert suggest(c, {}, {"schedule_conservativeness": 1.3}, None)[1].suggested == 1.4
    assert suggest(c, {}, {}, None, "latency")[1].suggested == 1.2
    k = BY["kv_underused"]
    assert suggest(k, {}, {"schedule_conservativeness": 1.0}, None)[1].suggested == 0.3
    assert suggest(k, {}, {"schedule_conservativeness": 0.3}, None)[1].suggested == 0.2


def test_schedule_conservativeness_at_the_bound_suggests_nothing() -> None:
    """At the bound (2.0 up, 0.1 down) no 'increase 2 -> 2': no value, and the evidence says why."""
    up = suggest(BY["retractions_frequent"], {}, {"schedule_conservativeness": 2.0}, None)[1]
    down = suggest(BY["kv_underused"], {}, {"schedule_conservativeness": 0.1}, None)[1]
    for s in (up, down):
        assert s.suggested is None and "at the bound" in s.reasoning


def test_mem_fraction_reasoning_adds_up() -> None:
    """The sum in the reasoning shows the current value in full: 0.758 +0.030 = 0.788 (was 0.76 +0.030)."""
    _, s = suggest(BY["gpu_mem_headroom_high"], {"available_gpu_mem_gb": 12.05, "gpu_mem_total_gb": 182.18},
                   {"mem_fraction_static": 0.758}, "0.5.23")
    assert s.suggested == 0.78 and "0.758 +0.030 = 0.788" in s.reasoning


def test_decode_oom_scales_the_smaller_of_cap_and_batch() -> None:
    """3/4 of the largest batch seen when it is below the cap, rounded down to a multiple of 8."""
    c = BY["decode_oom"]
    assert suggest(c, {"running_max": 600.0}, {"max_running_requests": 4096}, None)[1].suggested == 448
    assert suggest(c, {}, {"max_running_requests": 256}, None)[1].suggested == 192


def test_running_to_kv_target() -> None:
    """cap * 0.9 / mean usage, at most doubled."""
    c = BY["running_capped"]
    assert suggest(c, {"token_usage_mean": 0.5}, {"max_running_requests": 128}, None)[1].suggested == 232
    assert suggest(c, {"token_usage_mean": 0.1}, {"max_running_requests": 128}, None)[1].suggested == 256


def test_default_schedule_policy_by_version() -> None:
    """lpm until 0.4.3, fcfs from 0.4.4."""
    assert default_schedule_policy("0.4.3") == "lpm"
    assert default_schedule_policy("0.4.4") == "fcfs"
    assert default_schedule_policy(None) is None
    assert current_value("--schedule-policy", {}, {}, "0.3.0") == ("lpm", "SGLang 0.3.0 default")
