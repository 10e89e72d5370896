"""The advisor: one finding per check and rank, levels, guards, suppression, the diagnose document."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.examples import examples
from sglang_tuning_exporter.core.catalog import OOM_PHASES
from sglang_tuning_exporter.core.durations import time_text
from sglang_tuning_exporter.core.model import STATUS_CODE, Finding, Rank, ServerState
from sglang_tuning_exporter.guide.advisor import (
    aggregate_signals,
    evaluate,
    findings_document,
    server_signals,
    statuses,
    window_for,
)
from sglang_tuning_exporter.guide.checks import load_table
from sglang_tuning_exporter.guide.config import CheckOverride, Config
from sglang_tuning_exporter.pipeline.signals import SIGNAL_NAMES

TABLE = load_table()


def sig(**values: float | None) -> dict[str, float | None]:
    """A rank's signals with plenty of samples."""
    base: dict[str, float | None] = {"queue_samples": 100.0, "decode_samples": 100.0, "kv_samples": 100.0,
                                     "graph_samples": 100.0, "prefill_samples": 100.0}
    base.update(values)
    return base


def one(findings: list[Finding], check: str, rank: dict[str, int] | None = None) -> Finding:
    """The single finding of a check."""
    hits = [f for f in findings if f.check == check and (rank is None or f.rank == rank)]
    assert len(hits) == 1
    return hits[0]


def test_every_check_of_the_workload_once_per_rank() -> None:
    """Two ranks x every throughput check; unknown when there is no data."""
    fs = evaluate(TABLE, {Rank(dp=0): {}, Rank(dp=1): {}}, ServerState())
    n = len(TABLE.for_workload("throughput"))
    assert len(fs) == 2 * n
    assert {f.status for f in fs} == {"unknown"}
    assert {f.check for f in evaluate(TABLE, {}, ServerState(), workload="latency")} == \
        {c.id for c in TABLE.for_workload("latency")}


def test_levels_warning_and_critical() -> None:
    """retractions > 1/min is a warning, > 5/min critical."""
    for value, status in ((0.5, "ok"), (2.0, "warning"), (9.0, "critical")):
        f = one(evaluate(TABLE, {Rank(): sig(retractions_per_minute=value)}, ServerState()), "retractions_frequent")
        assert f.status == status


def test_min_samples_makes_unknown() -> None:
    """A ratio from 3 samples is not enough for a check that needs 10."""
    f = one(evaluate(TABLE, {Rank(): {"queue_empty_ratio": 1.0, "queue_samples": 3.0}}, ServerState()),
            "queue_empty")
    assert f.status == "unknown" and "10 needed" in f.evidence


def test_guard_on_schedule_policy() -> None:
    """lpm-without-reuse only applies while the policy is lpm (server args, or the version default)."""
    s = {Rank(): sig(prefix_cache_hit_ratio=0.01)}
    assert one(evaluate(TABLE, s, ServerState(args={"schedule_policy": "lpm"})),
               "schedule_policy_lpm_no_reuse").status == "warning"
    assert one(evaluate(TABLE, s, ServerState(args={"schedule_policy": "fcfs"})),
               "schedule_policy_lpm_no_reuse").status == "ok"
    assert one(evaluate(TABLE, s, ServerState(version="0.4.0")), "schedule_policy_lpm_no_reuse").status == "warning"
    assert one(evaluate(TABLE, s, ServerState()), "schedule_policy_lpm_no_reuse").status == "unknown"


def test_queue_empty_suppressed_by_cuda_graph_misses() -> None:
    """design.md: suppress the queue-empty finding while decode batches miss the graph."""
    s = {Rank(): sig(queue_empty_ratio=1.0, cuda_graph_miss_ratio=0.8)}
    f = one(evaluate(TABLE, s, ServerState()), "queue_empty")
    assert f.status == "ok" and "suppressed" in f.summary
    f = one(evaluate(TABLE, {Rank(): sig(queue_empty_ratio=1.0, cuda_graph_miss_ratio=0.0)}, ServerState()),
            "queue_empty")
    assert f.status == "warning" and f.flag is None and "submission rate" in f.action


def test_config_overrides_threshold_and_disables() -> None:
    """A threshold from --config wins; a disabled check is left out."""
    cfg = Config(checks={"retractions_frequent": CheckOverride(thresholds={"warning": 3.0, "critical": 10.0}),
                         "queue_empty": CheckOverride(enabled=False)})
    fs = evaluate(TABLE, {Rank(): sig(retractions_per_minute=2.0)}, ServerState(), config=cfg)
    assert one(fs, "retractions_frequent").status == "ok"
    assert not [f for f in fs if f.check == "queue_empty"]


def test_profile_band_in_description() -> None:
    """The description names the active profile's band."""
    f = one(evaluate(TABLE, {Rank(): sig(queue_over_band_ratio=0.95)}, ServerState(), profile="older-md"),
            "queue_overloaded")
    assert f.status == "critical" and "500" in f.evidence and "95%" in f.evidence


def test_version_names_the_flag_in_findings() -> None:
    """A 0.5.23 server is told --cuda-graph-max-bs-decode."""
    s = {Rank(): sig(cuda_graph_miss_ratio=0.6, cuda_graph_miss_batch_p90=300.0, max_running_requests=1024.0)}
    f = one(evaluate(TABLE, s, ServerState(version="0.5.23")), "cuda_graph_uncovered")
    assert f.flag == "--cuda-graph-max-bs-decode" and f.suggested == 304 and f.action == "increase"


def test_no_suggested_value_never_reads_none() -> None:
    """A firing check without a computed value says so in words, never 'to None'."""
    f = one(evaluate(TABLE, {Rank(): sig(retractions_per_minute=3.0)},
                     ServerState(args={"schedule_conservativeness": 2.0})), "retractions_frequent")
    assert f.status == "warning" and f.suggested is None
    assert "None" not in f.evidence and "not computed" in f.evidence


def test_version_names_the_flag_when_not_firing() -> None:
    """An ok or unknown finding on a 0.5.23 server names the flag that server accepts too."""
    fs = evaluate(TABLE, {Rank(): sig(cuda_graph_miss_ratio=0.0)}, ServerState(version="0.5.23"))
    assert one(fs, "cuda_graph_uncovered").status == "ok"
    assert one(fs, "cuda_graph_uncovered").flag == "--cuda-graph-max-bs-decode"
    assert one(fs, "cuda_graph_ceiling_low").flag == "--cuda-graph-max-bs-decode"
    old = evaluate(TABLE, {Rank(): sig(cuda_graph_miss_ratio=0.0)}, ServerState(version="0.4.0"))
    assert one(old, "cuda_graph_uncovered").flag == "--cuda-graph-max-bs"


def test_server_signals() -> None:
    """Policy and metrics flags read from the server args."""
    assert server_signals(ServerState(args={"schedule_policy": "lpm", "enable_metrics": False})) == \
        {"schedule_policy_lpm": 1.0, "schedule_policy_cache_aware": 1.0, "metrics_enabled": 0.0,
         "max_running_requests_arg": None}
    assert server_signals(ServerState(args={"max_running_requests": 128}))["max_running_requests_arg"] == 128.0


def test_new_cache_aware_policies_are_not_told_to_use_lpm() -> None:
    """hrrn and shortest-prefill-first (2026) match prefixes themselves: fcfs_with_reuse does not apply to
    them; fcfs still gets the lpm advice."""
    s = {Rank(): sig(prefix_cache_hit_ratio=0.8, prefill_samples=50.0)}
    for policy, status in (("hrrn", "ok"), ("shortest-prefill-first", "ok"), ("fcfs", "warning")):
        f = one(evaluate(TABLE, s, ServerState(args={"schedule_policy": policy})),
                "schedule_policy_fcfs_with_reuse")
        assert f.status == status, policy
        f = one(evaluate(TABLE, s, ServerState(args={"schedule_policy": policy})), "schedule_policy_lpm_no_reuse")
        assert "not applicable" in f.summary, policy


def test_worst_rank_for_paging_and_aggregates() -> None:
    """Aggregation: the worst rank per check; min headroom, max ratios across ranks."""
    sigs = {Rank(dp=0): sig(retractions_per_minute=0.1, available_gpu_mem_gb=7.0),
            Rank(dp=1): sig(retractions_per_minute=8.0, available_gpu_mem_gb=3.0)}
    retractions = [f for f in evaluate(TABLE, sigs, ServerState()) if f.check == "retractions_frequent"]
    assert max(retractions, key=lambda f: STATUS_CODE[f.status]).rank == {"dp": 1}
    agg = aggregate_signals(sigs)
    assert agg["retractions_per_minute"] == 8.0 and agg["available_gpu_mem_gb"] == 3.0


def test_findings_document_schema() -> None:
    """interfaces.md: profile, workload, server{version,args}, window{start,end}, signals, findings."""
    sigs = {Rank(dp=0): sig(retractions_per_minute=3.0)}
    server = ServerState(version="0.5.23", args={"schedule_conservativeness": 1.0})
    fs = evaluate(TABLE, sigs, server)
    doc = findings_document(findings=fs, signals=sigs, server=server, profile="docs-2025", workload="throughput",
                            window=(1736676000.0, 1736676600.0))
    json.dumps(doc)
    assert set(doc) >= {"profile", "workload", "server", "window", "signals", "findings"}
    assert doc["server"] == {"version": "0.5.23", "args": {"schedule_conservativeness": 1.0}}
    assert doc["window"] == {"start": "2025-01-12T10:00:00Z", "end": "2025-01-12T10:10:00Z"}
    r = next(f for f in doc["findings"] if f["check"] == "retractions_frequent")
    assert r == {**r, "status": "warning", "rank": {"dp": 0}, "flag": "--schedule-conservativeness",
                 "action": "increase", "current": 1.0, "suggested": 1.3}
    assert doc["signals"]["retractions_per_minute"] == 3.0


def test_time_text_forms() -> None:
    """Epoch -> ISO UTC, seconds of day -> HH:MM:SS."""
    assert time_text(3723.0) == "01:02:03"
    assert time_text(None) is None


def test_window_for_uses_profile_band() -> None:
    """The sidecar's window carries the profile's queue band and config ratios."""
    w = window_for(TABLE, "older-web", Config(window_s=900))
    assert w.params.queue_band == (50.0, 1000.0) and w.length_s == 900


_SIGNAL_VALUE = st.one_of(st.none(), st.sampled_from([0.0, 0.5, 0.9, 0.95, 1.0, 2.0, 5.0, 8.0, 40.0, 100.0, 600.0,
                                                       2500.0]), st.floats(0.0, 3000.0))


@settings(max_examples=examples(300), deadline=None)
@given(st.dictionaries(st.sampled_from(SIGNAL_NAMES), _SIGNAL_VALUE, max_size=len(SIGNAL_NAMES)),
       st.dictionaries(st.sampled_from(SIGNAL_NAMES), _SIGNAL_VALUE, max_size=8),
       st.sampled_from(sorted(TABLE.workloads)), st.sampled_from(sorted(TABLE.profiles)),
       st.sampled_from([None, "0.4.0", "0.5.4", ">=0.5.14", "0.5.23"]),
       st.dictionaries(st.sampled_from(["schedule_policy", "max_running_requests", "cuda_graph_max_bs",
                                        "mem_fraction_static", "chunked_prefill_size", "dp_size"]),
                       st.sampled_from([None, "lpm", "fcfs", 1, 8, 256, 0.8, 0.9]), max_size=4))
def test_statuses_equal_the_full_evaluation(a: dict[str, float | None], b: dict[str, float | None], workload: str,
                                             profile: str, version: str | None, args: dict[str, object]) -> None:
    """diagnose skips the full evaluation on windows where `statuses` sees nothing worse: the two must
    agree on every check of every rank, suppression included."""
    signals = {Rank(dp=0): a, Rank(dp=1): b}
    server = ServerState(version, dict(args))
    quick = statuses(TABLE, signals, server, profile=profile, workload=workload)
    for rank in signals:
        full = {f.check: f.status for f in evaluate(TABLE, {rank: signals[rank]}, server, profile=profile,
                                                    workload=workload)}
        assert quick[rank] == full


# ------------------------------------------------------------------ evidence that matches the data (#24)
ABSENCE_CHECKS = {"retractions_frequent", *(c.id for c in TABLE.checks if c.signal.startswith("oom_"))}


def test_absence_over_no_time_is_no_verdict() -> None:
    """Five Decode lines of one second: no retraction and no OOM in 0 s is not `ok` but unknown, with why;
    the same absence over a minute is ok, and an event seen in 0 s still fires."""
    zero = {**sig(retractions_per_minute=0.0, window_span_s=0.0),
            **{f"oom_{p}_count": 0.0 for p in OOM_PHASES}}
    fs = evaluate(TABLE, {Rank(): zero}, ServerState())
    for cid in ABSENCE_CHECKS:
        f = one(fs, cid)
        assert f.status == "unknown", f
        assert "in the 0 s seen" in f.evidence and "min_span_s 60" in f.evidence, f.evidence
    assert {cid for cid, st in statuses(TABLE, {Rank(): zero}, ServerState())[Rank()].items()
            if st == "unknown"} >= ABSENCE_CHECKS
    minute = {**zero, "window_span_s": 60.0}
    assert {one(evaluate(TABLE, {Rank(): minute}, ServerState()), c).status for c in ABSENCE_CHECKS} == {"ok"}
    oom = {**zero, "oom_decode_count": 1.0}
    assert one(evaluate(TABLE, {Rank(): oom}, ServerState()), "decode_oom").status == "critical"
    assert len(ABSENCE_CHECKS) == 1 + len(OOM_PHASES)  # every OOM phase has its check
    assert all(c.min_span_s == 60 for c in TABLE.checks if c.id in ABSENCE_CHECKS)


def test_evidence_says_the_span_it_covers() -> None:
    """2 retractions in a 12 s excerpt: the evidence says 12 s, never the 10 min window it did not see;
    a ratio over 2 s says 2 s."""
    f = one(evaluate(TABLE, {Rank(): sig(retractions_per_minute=2.0, window_span_s=12.0)}, ServerState()),
            "retractions_frequent")
    assert f.status == "warning"
    assert "2 retractions in the 12 s seen" in f.evidence and "10 min" not in f.evidence, f.evidence
    q = one(evaluate(TABLE, {Rank(): sig(queue_empty_ratio=1.0, cuda_graph_miss_ratio=0.0, window_span_s=2.0)},
                     ServerState()), "queue_empty")
    assert q.status == "warning" and "the 2 s seen" in q.evidence and "10 min" not in q.evidence, q.evidence
    full = one(evaluate(TABLE, {Rank(): sig(retractions_per_minute=2.0, window_span_s=600.0)}, ServerState()),
               "retractions_frequent")
    assert "over the last 10 min" in full.evidence
