"""Tests for the pure SGLang /metrics parser and its mapping to observations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.paths import FIXTURES
from sglang_tuning_exporter.core import limits
from sglang_tuning_exporter.core.model import Rank
from sglang_tuning_exporter.sources.scrape import (
    ScrapeInterpreter,
    base_name,
    parse_exposition,
    rank_of,
    wanted,
)

FIX = FIXTURES / "metrics"
REAL = (FIX / "sglang-0.5.23-metrics.txt").read_text()
RANK0 = Rank(dp=None, pp=0, tp=0, ep=0)


def _obs(text: str, now: float = 100.0, interp: ScrapeInterpreter | None = None) -> dict[str, float]:
    res = (interp or ScrapeInterpreter()).interpret(parse_exposition(text), now)
    return {o.name: o.value for o in res.observations}


def test_real_exposition_parses_without_garbage() -> None:
    """The real 0.5.23 exposition parses completely."""
    exp = parse_exposition(REAL)
    assert exp.garbage_lines == 0
    assert len(exp.samples) > 300
    assert exp.types["sglang:cuda_graph_passes_total"] == "counter"


def test_real_exposition_gauges_map_to_canonical_observations() -> None:
    """Gauges of 0.5.23 become the log parser's observation names with exact values."""
    res = ScrapeInterpreter().interpret(parse_exposition(REAL), 5.0)
    by_name = {o.name: o for o in res.observations}
    assert by_name["num_queue_reqs"].value == 412.0
    assert by_name["num_running_reqs"].value == 187.0
    assert by_name["token_usage"].value == 0.93
    assert by_name["gen_throughput"].value == 5321.77
    assert by_name["max_total_num_tokens"].value == 421888.0
    assert by_name["available_gpu_mem_gb"].value == 6.84
    assert by_name["weights_gb"].value == 15.27
    assert by_name["token_usage"].rank == RANK0
    assert by_name["token_usage"].source == "metrics"
    assert by_name["token_usage"].time == 5.0
    assert res.model_name == "Qwen/Qwen2.5-7B-Instruct"
    assert not res.restarted


def test_broken_metrics_are_ignored() -> None:
    """is_cuda_graph, utilization and the num_retracted_reqs gauge never become observations."""
    text = REAL + 'sglang:is_cuda_graph{tp_rank="0"} 1.0\nsglang:utilization{tp_rank="0"} 0.5\n'
    interp = ScrapeInterpreter()
    interp.interpret(parse_exposition(text), 1.0)
    names = {o.name for o in interp.interpret(parse_exposition(text), 2.0).observations}
    assert not names & {"is_cuda_graph", "utilization", "num_retracted_reqs", "cuda_graph"}
    assert "retraction" not in names  # counters unchanged: no delta


def test_counters_give_deltas_after_a_baseline() -> None:
    """First scrape sets baselines; the next gives deltas of retractions, graph passes and tokens."""
    interp = ScrapeInterpreter()
    assert "retraction" not in _obs(REAL, 1.0, interp)
    later = (REAL.replace("num_retracted_requests_total{engine_type=\"unified\",model_name=\"Qwen/Qwen2.5-7B-Instruct\",moe_ep_rank=\"0\",pp_rank=\"0\",tp_rank=\"0\"} 3.0",
                          "num_retracted_requests_total{engine_type=\"unified\",model_name=\"Qwen/Qwen2.5-7B-Instruct\",moe_ep_rank=\"0\",pp_rank=\"0\",tp_rank=\"0\"} 5.0")
             .replace('mode="decode_none",model_name="Qwen/Qwen2.5-7B-Instruct",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 50.0',
                      'mode="decode_none",model_name="Qwen/Qwen2.5-7B-Instruct",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 60.0'))
    assert later != REAL
    obs = _obs(later, 2.0, interp)
    assert obs["retraction"] == 2.0
    assert obs["decode_eager_passes"] == 10.0
    assert "decode_cuda_graph_passes" not in obs


def test_counter_going_backwards_is_a_restart() -> None:
    """A counter lower than before means SGLang restarted; the new value counts as new."""
    interp = ScrapeInterpreter()
    a = 'sglang:num_retracted_requests_total{tp_rank="0"} 10\n'
    b = 'sglang:num_retracted_requests_total{tp_rank="0"} 2\n'
    interp.interpret(parse_exposition(a), 1.0)
    res = interp.interpret(parse_exposition(b), 2.0)
    assert res.restarted
    assert [(o.name, o.value) for o in res.observations] == [("retraction", 2.0)]


def test_legacy_total_retracted_gauge_is_cumulative() -> None:
    """0.4.10-0.5.2 `total_retracted_reqs` is a lifetime total: its increase is the retraction count."""
    interp = ScrapeInterpreter()
    text = (FIX / "sglang-0.4.10-metrics-partial.txt").read_text()
    interp.interpret(parse_exposition(text), 1.0)
    more = text.replace('tp_rank="0"} 17.0', 'tp_rank="0"} 21.0')
    assert more != text
    assert _obs(more, 2.0, interp)["retraction"] == 4.0


def test_priority_series_are_not_summed() -> None:
    """With priority scheduling the total is the priority="" series; per-priority ones are skipped."""
    text = ('sglang:num_queue_reqs{priority="",tp_rank="0"} 30\n'
            'sglang:num_queue_reqs{priority="1",tp_rank="0"} 10\n'
            'sglang:num_queue_reqs{priority="2",tp_rank="0"} 20\n')
    res = ScrapeInterpreter().interpret(parse_exposition(text), 1.0)
    assert [o.value for o in res.observations if o.name == "num_queue_reqs"] == [30.0]


def test_tokenizer_counters_are_the_prefill_fallback() -> None:
    """Without realtime_tokens_total, cached/prompt token counters give prefill token deltas."""
    interp = ScrapeInterpreter()
    a = ('sglang:prompt_tokens_total{model_name="m"} 1000\n'
         'sglang:cached_tokens_total{cache_source="total",model_name="m"} 400\n')
    b = ('sglang:prompt_tokens_total{model_name="m"} 1500\n'
         'sglang:cached_tokens_total{cache_source="total",model_name="m"} 600\n')
    interp.interpret(parse_exposition(a), 1.0)
    obs = _obs(b, 2.0, interp)
    assert obs == {"prefill_cached_tokens": 200.0, "prefill_new_tokens": 300.0}


def test_both_spellings_give_identical_observations() -> None:
    """`sglang:` and `sglang_` (Prometheus 3 underscore escaping) map to the same observations."""
    underscored = REAL.replace("sglang:", "sglang_")
    assert "sglang:" not in underscored
    colon, under = ScrapeInterpreter(), ScrapeInterpreter()
    bump = REAL.replace('mode="decode_cuda_graph",model_name="Qwen/Qwen2.5-7B-Instruct",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 950.0',
                        'mode="decode_cuda_graph",model_name="Qwen/Qwen2.5-7B-Instruct",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 990.0')
    for i, text in enumerate((REAL, bump)):
        a = colon.interpret(parse_exposition(text), float(i))
        b = under.interpret(parse_exposition(text.replace("sglang:", "sglang_")), float(i))
        assert a.observations == b.observations
        assert a.observations
    assert base_name("sglang_tuning_up") is None


def test_garbage_is_counted_not_fatal() -> None:
    """Bad lines are counted; good lines around them still parse."""
    text = ("<html>oops</html>\n"
            "sglang:token_usage{tp_rank=\"0\"} 0.5\n"
            "sglang:num_queue_reqs{tp_rank=\"0\" 3\n"
            "sglang:num_running_reqs{tp_rank=\"0\"} notanumber\n"
            "\x00\xff binary\n"
            "sglang:gen_throughput 12 1700000000000\n")
    exp = parse_exposition(text)
    assert exp.garbage_lines == 4
    assert [(s.name, s.value, s.line) for s in exp.samples] == [
        ("sglang:token_usage", 0.5, 2), ("sglang:gen_throughput", 12.0, 6)]


def test_label_escapes_and_odd_values() -> None:
    """Escaped quotes, backslashes and newlines in label values; NaN/Inf values are not observations."""
    exp = parse_exposition('sglang:token_usage{model_name="a\\"b\\\\c\\nd",tp_rank="1",} NaN\n'
                           'sglang:num_queue_reqs{tp_rank="1"} +Inf\n')
    assert exp.garbage_lines == 0
    assert exp.samples[0].label_map()["model_name"] == 'a"b\\c\nd'
    res = ScrapeInterpreter().interpret(exp, 1.0)
    assert res.observations == ()


def test_rank_labels() -> None:
    """SGLang's rank labels map to Rank; missing ones stay None."""
    assert rank_of({"dp_rank": "3", "tp_rank": "7", "pp_rank": "0"}) == Rank(dp=3, pp=0, tp=7)
    assert rank_of({"model_name": "x"}) == Rank()


def test_corpus_metric_truth_values(shared_dir: Path) -> None:
    """Every `metric` truth entry of the corpus is found at its line with its exact name, labels, value."""
    entries = [json.loads(line) for line in (shared_dir / "corpus" / "truth.jsonl").read_text().splitlines()
               if line.strip()]
    metric_entries = [e for e in entries if e["kind"] == "metric"]
    assert metric_entries
    for e in metric_entries:
        exp = parse_exposition((shared_dir / "corpus" / e["file"]).read_text())
        at_line = [s for s in exp.samples if s.line == e["line_no"]]
        assert len(at_line) == 1, e
        s = at_line[0]
        assert s.name == e["fields"]["metric"]
        assert s.label_map() == e["fields"]["labels"]
        assert s.value == float(e["fields"]["value"])


@pytest.mark.parametrize("name", ["002-sglang1853-curl-metrics-llama32.txt", "004-sglang7944-dsr1-pd-counters.txt",
                                  "006-aibrix1614-dp-rank-labels-dsr1.txt"])
def test_corpus_excerpts_map_model_and_ranks(name: str) -> None:
    """The carried corpus excerpts: model name (either label) and DP ranks come through."""
    exp = parse_exposition((FIX / name).read_text())
    res = ScrapeInterpreter().interpret(exp, 1.0)
    assert res.model_name
    if name.startswith("002"):
        assert exp.garbage_lines == 1  # the pasted `$ curl ...` line
        assert {o.name: o.value for o in res.observations}["max_total_num_tokens"] == 570979.0
        assert {o.name: o.value for o in res.observations}["max_running_requests"] == 2231.0
    if name.startswith("006"):
        assert exp.garbage_lines == 0
        assert {rank_of(s.label_map()).dp for s in exp.samples} == set(range(8))


def test_keep_filter_gives_the_same_observations() -> None:
    """Skipping unread families (the sidecar's fast path) changes neither observations nor garbage."""
    text = "garbage line here\n" + REAL
    full, fast = ScrapeInterpreter(), ScrapeInterpreter()
    a_exp, b_exp = parse_exposition(text), parse_exposition(text, keep=wanted)
    a, b = full.interpret(a_exp, 1.0), fast.interpret(b_exp, 1.0)
    assert a.observations == b.observations and a.model_name == b.model_name
    assert a_exp.garbage_lines == b_exp.garbage_lines == 1
    assert b_exp.sample_lines == len(a_exp.samples) > len(b_exp.samples)


def test_late_2026_memory_and_retry_metrics() -> None:
    """kv_cache_memory_usage_gb is the KV size fact; graph_memory_usage_gb{phase} sums its phases per rank;
    num_prefill_retries_total gives deltas after a baseline."""
    head = ('sglang:kv_cache_memory_usage_gb{tp_rank="0"} 48.31\n'
            'sglang:graph_memory_usage_gb{phase="decode",tp_rank="0"} 0.31\n'
            'sglang:graph_memory_usage_gb{phase="prefill",tp_rank="0"} 0.13\n'
            'sglang:graph_memory_usage_gb{phase="decode",tp_rank="1"} 0.5\n')
    interp = ScrapeInterpreter()
    first = interp.interpret(parse_exposition(head + 'sglang:num_prefill_retries_total{tp_rank="0"} 4\n'), 1.0)
    got = {(o.name, o.rank.tp): o.value for o in first.observations}
    assert got[("kv_cache_gb", 0)] == 48.31
    assert got[("graph_memory_gb", 0)] == pytest.approx(0.44)
    assert got[("graph_memory_gb", 1)] == 0.5
    assert ("prefill_retries", 0) not in got  # a baseline, not an event
    second = interp.interpret(parse_exposition(head + 'sglang:num_prefill_retries_total{tp_rank="0"} 7\n'), 2.0)
    assert {(o.name, o.value) for o in second.observations} >= {("prefill_retries", 3.0)}
    assert all(wanted(n) for n in ("sglang:graph_memory_usage_gb", "sglang_kv_cache_memory_usage_gb",
                                   "sglang:num_prefill_retries_total"))


RAY = (FIX / "sglang-0.5.23-metrics-ray.txt").read_text()


def _ray_replica(text: str, replica: str) -> str:
    return text.replace('ReplicaId="x7k2m9q1"', f'ReplicaId="{replica}"')


def test_ray_serve_spelling_reads_like_sglangs_own() -> None:
    """Ray Serve's `ray_sglang_x{ReplicaId=...}` (the 0.5.23 fixture renamed) gives the observations of
    `sglang:x`, the replica as its dp index."""
    assert "sglang:" not in RAY and "ReplicaId" in RAY
    assert base_name("ray_sglang_token_usage") == "token_usage" and wanted("ray_sglang_num_queue_reqs")
    assert base_name("ray_sglang_tuning_up") is None and base_name("ray_tasks") is None
    colon, ray = ScrapeInterpreter(), ScrapeInterpreter()
    for i in range(2):
        a = colon.interpret(parse_exposition(REAL), float(i))
        b = ray.interpret(parse_exposition(RAY), float(i))
        assert a.observations
        assert [(o.name, o.value, o.rank.as_dict()) for o in b.observations] == \
            [(o.name, o.value, {"dp": 0, **o.rank.as_dict()}) for o in a.observations]
        assert b.model_name == a.model_name


def test_ray_replicas_stay_apart() -> None:
    """Two replicas behind one Ray agent: each its own dp index (first seen first), kept across scrapes,
    so a replica's counters never pair with another's."""
    interp = ScrapeInterpreter()
    both = _ray_replica(RAY, "r-b") + "\n" + _ray_replica(RAY, "r-a").replace(
        'ray_sglang_num_queue_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",moe_ep_rank="0",'
        'pp_rank="0",tp_rank="0",ReplicaId="r-a"} 412.0',
        'ray_sglang_num_queue_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",moe_ep_rank="0",'
        'pp_rank="0",tp_rank="0",ReplicaId="r-a"} 7.0')
    res = interp.interpret(parse_exposition(both), 1.0)
    queues = {o.rank.dp: o.value for o in res.observations if o.name == "num_queue_reqs"}
    assert queues == {0: 412.0, 1: 7.0}
    # the next scrape lists r-a first: r-a keeps its index
    res = interp.interpret(parse_exposition(_ray_replica(RAY, "r-a")), 2.0)
    assert {o.rank.dp for o in res.observations if o.name == "num_queue_reqs"} == {1}


def test_ray_replicas_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replicas come and go under Ray Serve: past MAX_RAY_REPLICAS the oldest is forgotten, and a new replica
    never gets an index another one had (its counters are never paired with another's)."""
    monkeypatch.setattr(limits, "MAX_RAY_REPLICAS", 3)
    interp = ScrapeInterpreter()
    one = next(line for line in RAY.splitlines() if line.startswith("ray_sglang_num_queue_reqs{"))
    seen = []
    for i in range(6):
        res = interp.interpret(parse_exposition(one.replace("x7k2m9q1", f"r{i}") + "\n"), float(i))
        seen.append([o.rank.dp for o in res.observations])
    assert seen == [[0], [1], [2], [3], [4], [5]]
    assert len(interp._replicas) == 3


HYBRID = (FIX / "sglang-0.5.23-metrics-hybrid-mamba.txt").read_text()  # 0.5.23's exposition, a mamba model's pools


def _pool_gauges(text: str, interp: ScrapeInterpreter, now: float = 1.0) -> dict[str, float]:
    names = {"full_token_usage", "swa_token_usage", "mamba_usage", "mamba_num"}
    return {o.name: o.value for o in interp.interpret(parse_exposition(text, wanted), now).observations
            if o.name in names}


def test_hybrid_pool_gauges_become_the_decode_lines_fields() -> None:
    """A mamba model's per-pool gauges are read as its Decode line's fields (full token usage, mamba num,
    mamba usage); the SWA gauge SGLang exports at 0 on a model without that pool is not."""
    got = _pool_gauges(HYBRID, ScrapeInterpreter())
    assert got == {"full_token_usage": 0.35, "mamba_usage": 0.98, "mamba_num": 196.0}


def test_pool_gauges_of_a_model_without_hybrid_pools_are_not_read() -> None:
    """0.5.23 exports swa/mamba usage 0 and no slots on a plain model: no pool there, nothing read."""
    assert _pool_gauges(REAL, ScrapeInterpreter()) == {}


def test_a_pool_seen_once_counts_at_zero_usage_too() -> None:
    """Once a rank showed its mamba pool, an idle scrape (usage 0, before 0.5.12: no slot gauges) still counts:
    SGLang-native rules average the zeros too."""
    old = "\n".join(line for line in HYBRID.splitlines() if "mamba_used_tokens" not in line
                    and "mamba_available_tokens" not in line) + "\n"
    idle = old.replace("} 0.98\n", "} 0.0\n")
    assert "sglang:mamba_usage" in idle and _pool_gauges(idle, ScrapeInterpreter()) == {}  # idle, no slots: unknown
    interp = ScrapeInterpreter()
    assert _pool_gauges(old, interp)["mamba_usage"] == 0.98
    assert _pool_gauges(idle, interp, 2.0) == {"full_token_usage": 0.35, "mamba_usage": 0.0}
