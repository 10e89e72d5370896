"""Signals over the sliding window (ratios, unknown when thin, ranks, expiry, buckets) and the
observations they are built from."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.examples import examples
from helpers.lookups import events_to_observations, quantile
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.core.model import Observation, Rank, ServerState
from sglang_tuning_exporter.pipeline.observations import EventConverter
from sglang_tuning_exporter.pipeline.signals import SignalParams
from sglang_tuning_exporter.pipeline.stats import Bucket, SampleStats, hist_quantile
from sglang_tuning_exporter.pipeline.window import Window

NO_RANK = Rank()


def sample(w: Window, t: float, *, queue: float, running: float = 100, usage: float = 0.95,
           graph: float | None = 1.0, rank: Rank = NO_RANK, source: str = "log") -> None:
    """One Decode-line sample: the observations of one line share a time."""
    w.add(Observation(t, "num_queue_reqs", queue, rank, source))
    w.add(Observation(t, "num_running_reqs", running, rank, source))
    w.add(Observation(t, "token_usage", usage, rank, source))
    if graph is not None:
        w.add(Observation(t, "cuda_graph", graph, rank, source))


def test_queue_ratios_over_the_band() -> None:
    """Empty, over-band and under-band fractions of the samples in the window."""
    w = Window(600)
    for i, q in enumerate([0, 0, 50, 150, 2500, 3000, 500, 0, 1000, 2100]):
        sample(w, 1000.0 + i, queue=q)
    s = w.signals(1010.0)[Rank()]
    assert s["queue_samples"] == 10
    assert s["queue_empty_ratio"] == pytest.approx(0.3)
    assert s["queue_over_band_ratio"] == pytest.approx(0.3)
    assert s["queue_under_band_ratio"] == pytest.approx(0.4)
    assert s["queue_p50"] == 150


def test_too_few_samples_is_unknown_not_ok() -> None:
    """Below min_samples the ratios are None (unknown), never a false verdict."""
    w = Window(600, params=SignalParams(min_samples=5))
    for i in range(4):
        sample(w, 10.0 + i, queue=0)
    s = w.signals(20.0)[Rank()]
    assert s["queue_empty_ratio"] is None and s["queue_samples"] == 4


def test_kv_underused_needs_waiting_requests() -> None:
    """usage < 0.9 counts only while the queue is non-empty."""
    w = Window(600)
    sample(w, 1.0, queue=10, usage=0.5)
    sample(w, 2.0, queue=0, usage=0.5)
    sample(w, 3.0, queue=10, usage=0.95)
    sample(w, 4.0, queue=10, usage=0.6)
    s = w.signals(5.0)[Rank()]
    assert s["kv_underused_ratio"] == pytest.approx(0.5)
    assert s["token_usage_max"] == 0.95


def test_retractions_per_minute_counts_events() -> None:
    """Events per minute over the window (the guide's ~1/min), requests separately."""
    w = Window(600)
    for i in range(20):
        sample(w, float(i * 30), queue=100)
    for i in range(10):
        w.add(Observation(float(i * 60), "retraction", 3.0))
    s = w.signals(600.0)[Rank()]
    assert s["retractions_per_minute"] == pytest.approx(1.0)
    assert s["retracted_requests_per_minute"] == pytest.approx(3.0)


def test_window_prunes_old_samples() -> None:
    """Samples older than the window no longer count."""
    w = Window(60)
    for i in range(10):
        sample(w, float(i), queue=0)
    for i in range(10):
        sample(w, 100.0 + i, queue=500)
    s = w.signals(110.0)[Rank()]
    assert s["queue_empty_ratio"] == 0.0 and s["queue_samples"] == 10


def test_cuda_graph_miss_ratio_and_missed_batch_p90() -> None:
    """Decode lines with `cuda graph: False` and the batch sizes they ran at."""
    w = Window(600)
    for i in range(10):
        sample(w, float(i), queue=10, running=100 + i * 20, graph=0.0 if i >= 5 else 1.0)
    s = w.signals(20.0)[Rank()]
    assert s["cuda_graph_miss_ratio"] == pytest.approx(0.5)
    assert s["cuda_graph_miss_batch_p90"] == 280


def test_counters_from_a_scrape_win_over_sampled_lines() -> None:
    """Exact pass counters (scrape deltas) decide coverage when present."""
    w = Window(600)
    for i in range(10):
        sample(w, float(i), queue=10, graph=0.0, source="metrics")
    w.add(Observation(5.0, "decode_cuda_graph_passes", 90.0, Rank(), "metrics"))
    w.add(Observation(5.0, "decode_eager_passes", 10.0, Rank(), "metrics"))
    assert w.signals(10.0)[Rank()]["cuda_graph_miss_ratio"] == pytest.approx(0.1)


def test_prefix_cache_hit_ratio_from_tokens() -> None:
    """cached / (new + cached) prefill tokens, not SGLang's flickering gauge."""
    w = Window(600)
    for i in range(5):
        w.add(Observation(float(i), "prefill_new_tokens", 300.0))
        w.add(Observation(float(i), "prefill_cached_tokens", 700.0))
    assert w.signals(10.0)[Rank()]["prefix_cache_hit_ratio"] == pytest.approx(0.7)


def test_oom_counts_unknown_without_a_log() -> None:
    """OOMs are only visible in the log: a metrics-only rank leaves them unknown."""
    w = Window(600)
    sample(w, 1.0, queue=1, source="metrics")
    assert w.signals(2.0)[Rank()]["oom_decode_count"] is None
    w.add(Observation(1.5, "oom_decode", 1.0))
    assert w.signals(2.0)[Rank()]["oom_decode_count"] == 1


def test_dp_ranks_separate_tp_ranks_fold() -> None:
    """DP ranks are separate series; TP ranks of one replica are one, and a retraction printed by every TP
    rank counts once."""
    w = Window(600)
    sample(w, 1.0, queue=0, rank=Rank(dp=0, tp=0))
    sample(w, 1.0, queue=5, rank=Rank(dp=1, tp=1))
    for tp in range(8):
        w.add(Observation(2.0, "retraction", 1.0, Rank(tp=tp)))
    sig = w.signals(3.0)
    assert set(sig) == {Rank(dp=0), Rank(dp=1), Rank()}
    assert sig[Rank()]["retractions_per_minute"] == pytest.approx(1.0)


def test_startup_facts_fallback_and_worst_tp() -> None:
    """available_gpu_mem from the summary, else the last avail mem after the pool; the worst TP rank."""
    w = Window(600)
    w.add(Observation(1.0, "avail_mem_after_pool_gb", 3.0, Rank(tp=0)))
    w.add(Observation(1.0, "avail_mem_after_pool_gb", 0.07, Rank(tp=1)))
    s = w.signals(2.0)[Rank()]
    assert s["available_gpu_mem_gb"] == 0.07 and s["available_gpu_mem_from_summary"] == 0.0
    w.add(Observation(1.0, "available_gpu_mem_gb", 6.8))
    assert w.signals(2.0)[Rank()]["available_gpu_mem_from_summary"] == 1.0


def test_ceiling_ratio_and_mem_fraction_estimate() -> None:
    """Captured graph ceiling vs max running requests; the static fraction from startup lines."""
    w = Window(600)
    for name, v in (("cuda_graph_max_bs_captured", 32.0), ("max_running_requests", 2048.0),
                    ("gpu_mem_total_gb", 80.0), ("avail_after_weights_gb", 64.7), ("kv_cache_gb", 48.3)):
        w.add(Observation(1.0, name, v))
    s = w.signals(2.0)[Rank()]
    assert s["cuda_graph_ceiling_ratio"] == pytest.approx(32 / 2048)
    assert s["mem_fraction_static_estimate"] == pytest.approx(1 - (64.7 - 48.3) / 80, abs=1e-3)


def test_rank_cap_and_expiry() -> None:
    """At most max_ranks are tracked; ranks not seen for expire_s are dropped."""
    w = Window(60, max_ranks=2, expire_s=100)
    for dp in range(3):
        sample(w, float(dp), queue=1, rank=Rank(dp=dp))
    assert w.ranks() == [Rank(dp=1), Rank(dp=2)] and w.expired == 1
    sample(w, 200.0, queue=1, rank=Rank(dp=2))
    w.prune(200.0)
    assert w.ranks() == [Rank(dp=2)]


def test_running_capped_ratio() -> None:
    """Batch at the cap with a queue and room in the KV cache."""
    w = Window(600)
    w.add(Observation(0.0, "max_running_requests", 128.0))
    for i in range(10):
        sample(w, float(i + 1), queue=50, running=128 if i < 6 else 60, usage=0.5)
    assert w.signals(20.0)[Rank()]["running_capped_ratio"] == pytest.approx(0.6)


def test_bucket_merge_is_additive() -> None:
    """Merging buckets adds counts and histograms."""
    x, y = Bucket(), Bucket()
    x.decode.add(0, 10, 0.5, 1.0, None, 0.9, (100, 2000))
    y.decode.add(5, 10, 0.95, 0.0, None, 0.9, (100, 2000))
    y.retractions = 2
    x.merge(y)
    assert x.decode.queue_n == 2 and x.decode.running == {10: 2} and x.retractions == 2 and x.decode.graph_miss == 1


def test_quantiles() -> None:
    """Nearest-rank quantiles of lists and histograms agree."""
    values = [5.0, 1.0, 9.0, 3.0, 7.0]
    assert quantile(values, 0.5) == 5.0
    assert hist_quantile({1: 1, 3: 1, 5: 1, 7: 1, 9: 1}, 0.9) == quantile(values, 0.9) == 9.0
    assert hist_quantile({}, 0.5) is None


def test_invalid_window_rejected() -> None:
    """A zero-length window is a programming error."""
    with pytest.raises(ValueError, match="positive"):
        Window(0)


# --- events -> observations (observations.py) ---------------------------------------------------


def names(obs: list[Observation]) -> dict[str, float]:
    """name -> value of a list of observations."""
    return {o.name: o.value for o in obs}


def test_decode_event_observations_and_hybrid_usage() -> None:
    """A Decode event gives the sample names; hybrid pools give their max usage."""
    conv = EventConverter()
    obs = conv.convert(Event(1, "decode", "2025-01-01T00:00:00", {"dp": 1},
                             {"num_running_reqs": 5, "num_queue_reqs": 2, "full_token_usage": 0.4,
                              "swa_token_usage": 0.9, "cuda_graph": False, "gen_throughput": 10.0}))
    got = names(obs)
    assert got["token_usage"] == 0.9 and got["cuda_graph"] == 0.0 and got["num_queue_reqs"] == 2
    assert {o.rank for o in obs} == {Rank(dp=1)}


def test_time_inheritance_rollover_and_line_order() -> None:
    """Untimed events inherit; time-only stamps roll over midnight; no stamps at all: line order."""
    conv = EventConverter()
    a = conv.convert(Event(1, "retract", "23:59:59", {}, {"num_retracted_reqs": 1}))
    b = conv.convert(Event(2, "retract", None, {}, {"num_retracted_reqs": 1}))
    c = conv.convert(Event(3, "retract", "00:00:01", {}, {"num_retracted_reqs": 1}))
    assert a[0].time == b[0].time == 86399.0 and c[0].time == 86401.0 and not conv.synthetic_time
    bare = EventConverter()
    assert bare.convert(Event(7, "retract", None, {}, {}))[0].time == 7.0 and bare.synthetic_time


def test_oom_phases_and_startup_kinds() -> None:
    """OOM phases map to names; a startup sizing failure and a capture failure are told apart."""
    conv = EventConverter()

    def oom(phase: str, **fields: str) -> str:
        return conv.convert(Event(1, "oom", "2025-01-01T00:00:00", {}, {"phase": phase, **fields}))[0].name

    assert oom("prefill") == "oom_prefill" and oom("decode") == "oom_decode" and oom("weird") == "oom_unknown"
    assert oom("startup", message="RuntimeError: Not enough memory. Please try to increase") == "oom_startup"
    assert oom("startup", reason="cuda_graph_capture", graph="decode",
               message="Capture cuda graph failed") == "oom_graph_decode"
    assert oom("startup", reason="cuda_graph_capture", graph="prefill",
               message="Capture prefill CUDA graph failed") == "oom_graph_prefill"
    assert oom("startup", reason="init_headroom", message="CUDA out of memory") == "oom_capture"


def test_startup_facts_and_server_state() -> None:
    """Startup lines give memory facts; server_args update the state and give facts; version floors."""
    server = ServerState()
    evs = [Event(1, "server_args", "2025-01-01T00:00:00", {}, {"max_running_requests": 256,
                                                                "enable_metrics": False, "model_path": "m"}),
           Event(2, "startup_memory", "2025-01-01T00:00:01", {}, {"stage": "load_weight_begin", "avail_mem_gb": 80.0}),
           Event(3, "startup_memory", "2025-01-01T00:00:02", {}, {"stage": "load_weight_end", "avail_mem_gb": 64.7,
                                                                  "mem_usage_gb": 15.3}),
           Event(4, "startup_memory", "2025-01-01T00:00:03", {}, {"stage": "cuda_graph_end", "avail_mem_gb": 0.07,
                                                                  "graph": "target decode",
                                                                  "batch_sizes": [1, 2, 4, 8]}),
           Event(5, "max_running_reduced", "2025-01-01T00:00:04", {}, {"requested": 4096, "reduced_to": 2048})]
    got = names(list(events_to_observations(evs, server=server)))
    assert got["gpu_mem_total_gb"] == 80.0 and got["weights_gb"] == 15.3 and got["avail_mem_after_pool_gb"] == 0.07
    assert got["cuda_graph_max_bs_captured"] == 8 and got["max_running_requests"] == 2048
    assert got["metrics_enabled"] == 0.0
    assert server.args["max_running_requests"] == 256 and server.model_name == "m" and server.version == ">=0.5.14"


def test_live_clock_times_observations() -> None:
    """With a clock (the sidecar), a stamped line keeps its log time; an untimed one after it takes the
    latest log time aged by the wall clock; before any stamp, arrival (docs/signals.md, "Clocks")."""
    wall = [42.0]
    conv = EventConverter(clock=lambda: wall[0])
    assert conv.convert(Event(1, "retract", None, {}, {}))[0].time == 42.0
    assert conv.convert(Event(2, "retract", "2020-01-01T00:00:00", {}, {}))[0].time == 1577836800.0
    wall[0] = 52.0
    assert conv.convert(Event(3, "retract", None, {}, {}))[0].time == 1577836810.0
    assert conv.log_now(112.0) == 1577836870.0


@settings(max_examples=examples(300), deadline=None)
@given(st.dictionaries(st.integers(-5, 5000), st.integers(0, 50), max_size=200),
       st.floats(0.0, 1.0, allow_nan=False))
def test_hist_quantile_is_the_nearest_rank_of_the_expanded_values(hist: dict[int, int], q: float) -> None:
    """The C-level cumulative search equals the textbook nearest-rank quantile of the expanded list."""
    values = [float(k) for k, c in hist.items() for _ in range(c)]
    got = hist_quantile(hist, q)
    if not values:
        assert got is None
    else:
        assert got == quantile(values, q)


_COUNTS = st.dictionaries(st.integers(-(2**40), 2**40) | st.integers(-5, 5000), st.integers(1, 50), max_size=200)


@settings(max_examples=examples(300), deadline=None)
@given(_COUNTS, st.floats(0.0, 1.0, allow_nan=False), st.floats(-(2.0**41), 2.0**41, allow_nan=False))
def test_frozen_hist_answers_as_the_dict_it_froze(hist: dict[int, int], q: float, floor: float) -> None:
    """A FrozenHist (what a diagnose worker sends back) gives the dict's quantile, max, count at least
    a floor, items and pickle round trip; with and without the C accelerator's freeze_hist."""
    import pickle

    from sglang_tuning_exporter.offline import scanner
    from sglang_tuning_exporter.pipeline import stats
    from sglang_tuning_exporter.sources.accel import SCAN

    assert (scanner.FREEZER is not None) == (SCAN is not None)
    for frozen in (stats.FrozenHist.of(hist, scanner.FREEZER), stats.FrozenHist.of(hist)):
        assert dict(frozen) == hist and list(frozen.pairs()) == sorted(hist.items()) and len(frozen) == len(hist)
        assert "x" not in frozen and frozen.get(2**41 + 1) is None  # absent, as in a dict
        assert hist_quantile(frozen, q) == hist_quantile(hist, q)
        assert stats.hist_at_least(frozen, floor) == stats.hist_at_least(hist, floor)
        if hist:
            assert stats.hist_max(frozen) == max(hist)
        back = pickle.loads(pickle.dumps(frozen))
        assert type(back) is stats.FrozenHist and dict(back) == hist


def test_frozen_stats_thaw_on_write_and_merge_like_dicts() -> None:
    """Frozen sample stats give the same signals, and every writer (add, merge, merge into a fresh
    bucket) thaws them first, so a frozen bucket adopted by a window stays correct."""
    params = SignalParams(queue_band=(100.0, 2000.0))

    def filled() -> Bucket:
        b = Bucket()
        for i in range(40):
            b.decode.add(50 + 37 * i % 3000, 10 + i % 17, 0.5 + (i % 5) / 10, float(i % 3 != 0), 100.0,
                         0.9, params.queue_band)
        return b

    plain, frozen = filled(), filled()
    frozen.freeze()
    assert frozen.decode.frozen and type(frozen.decode.queue) is not dict
    kw = {"span_s": 600.0, "from_log": True}
    facts = {"max_running_requests": 20.0}
    from sglang_tuning_exporter.pipeline.signals import compute_signals

    assert compute_signals(frozen, facts, params, **kw) == compute_signals(plain, facts, params, **kw)
    merged_plain, merged_frozen = filled(), filled()
    merged_frozen.freeze()
    merged_plain.merge(plain)
    merged_frozen.merge(frozen)  # frozen into frozen: thaws the receiver
    assert not merged_frozen.decode.frozen
    assert compute_signals(merged_frozen, facts, params, **kw) == compute_signals(merged_plain, facts, params, **kw)
    assert compute_signals(frozen.copy(), facts, params, **kw) == compute_signals(plain, facts, params, **kw)
    frozen.decode.add(7, 3, 0.2, 0.0, 1.0, 0.9, params.queue_band)
    plain.decode.add(7, 3, 0.2, 0.0, 1.0, 0.9, params.queue_band)
    assert compute_signals(frozen, facts, params, **kw) == compute_signals(plain, facts, params, **kw)
    odd = SampleStats()
    odd.queue[2**70] = 1  # past int64: stays a dict
    odd.freeze()
    assert not odd.frozen and odd.queue == {2**70: 1}


def test_startup_facts_outlive_rank_expiry_until_the_next_startup() -> None:
    """A quiet stretch longer than the expiry drops a rank's traffic, not its startup facts; the next
    startup (a `server_args` line: `server_start`) resets them (docs/signals.md, "Sticky facts")."""
    from sglang_tuning_exporter.pipeline.signals import SERVER_START
    from sglang_tuning_exporter.pipeline.window import Window

    w = Window(600, expire_s=600)
    r = Rank(dp=0)
    w.add(Observation(0.0, "available_gpu_mem_gb", 13.5, r, "log"))
    w.add(Observation(1.0, "num_queue_reqs", 5.0, r, "log"))
    sig = w.signals(5000.0)  # long after the expiry
    assert sig[r]["available_gpu_mem_gb"] == 13.5 and sig[r]["queue_samples"] == 0.0
    w.add(Observation(5001.0, SERVER_START, 1.0, Rank(), "log"))
    assert all(s.get("available_gpu_mem_gb") is None for s in w.signals(5002.0).values())


def test_server_update_is_the_one_rule_for_sidecar_and_diagnose() -> None:
    """Args of a startup (the latest start names the model), a version, and SGLang's resolved
    `mem_fraction_static` from `Not enough memory` only where the args left it at None."""
    from sglang_tuning_exporter.pipeline.observations import apply_to_server, server_update

    s = ServerState()
    apply_to_server(Event(1, "server_args", None, {}, {"model_path": "a", "mem_fraction_static": None}), s)
    apply_to_server(Event(9, "server_args", None, {}, {"model_path": "b", "mem_fraction_static": None}), s)
    assert s.model_name == "b"
    oom = Event(10, "oom", None, {}, {"mem_fraction_static": 0.88})
    assert server_update(oom, s.args) == {"args": {"mem_fraction_static": 0.88}}
    assert server_update(oom, {"mem_fraction_static": 0.8}) is None
    assert server_update(Event(11, "version", None, {}, {"version": "0.5.23"}), {}) == {"version": "0.5.23"}


def test_graph_memory_is_the_target_decode_capture_only() -> None:
    """`cuda_graph_gb` (the plan's budget for a larger capture) comes from the target decode graphs, the
    ones the captured batch sizes describe; a draft graph captured after them does not overwrite it."""
    from sglang_tuning_exporter.sources.logreader import read_events

    lines = ["[2026-01-01 10:00:00 TP0] Capture target decode CUDA graph end. elapsed=14.80 s, mem usage=1.20 GB, "
             "avail mem=5.00 GB.",
             "[2026-01-01 10:00:01 TP0] Capture draft extend CUDA graph end. elapsed=1.00 s, mem usage=0.10 GB, "
             "avail mem=4.90 GB."]
    got = [o.value for o in events_to_observations(read_events(lines)) if o.name == "cuda_graph_gb"]
    assert got == [1.2]
