"""Every check fires on a log written in real SGLang line formats, with the exact flag, direction and a
suggested value in a stated range; a healthy log fires nothing; fast and full parsing agree."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from scenario_logs import LogWriter, steady
from sglang_tuning_exporter.core.model import Finding
from sglang_tuning_exporter.guide.checks import load_table
from sglang_tuning_exporter.guide.config import Config
from sglang_tuning_exporter.offline.diagnose import Diagnosis, Scanner, diagnose_source
from sglang_tuning_exporter.sources.accel import SCAN

TABLE = load_table()
FIRING = ("warning", "critical")


def run_log(tmp_path: Path, text: str, *, workload: str = "throughput", profile: str = "docs-2025",
            overrides: dict[str, Any] | None = None) -> list[Finding]:
    """Diagnose `text` as a file; the findings."""
    log = tmp_path / "server.log"
    log.write_text(text, encoding="utf-8")
    res = diagnose_source(str(log), TABLE, Config(), profile, workload, overrides or {}, jobs=1)
    assert res.error is None, res.error
    return res.findings


def by_check(findings: list[Finding], check: str, rank: dict[str, int] | None = None) -> Finding:
    """The finding of `check` (on `rank` when given)."""
    hits = [f for f in findings if f.check == check and (rank is None or f.rank == rank)]
    assert len(hits) == 1, f"{check}: {hits}"
    return hits[0]


def firing(findings: list[Finding]) -> set[str]:
    """Ids of the checks that fire."""
    return {f.check for f in findings if f.status in FIRING}


@dataclass(frozen=True)
class Expect:
    """What a scenario must produce for its check."""

    check: str
    status: tuple[str, ...]
    flag: str | None
    action: str
    low: float | None = None  # suggested value range (numbers)
    high: float | None = None
    value: Any = None  # exact suggested value (non-numbers)
    workload: str = "throughput"
    rank: dict[str, int] | None = None


# --- scenario logs ----------------------------------------------------------------------------
def healthy() -> str:
    """0.5.23, everything inside the guide's bands."""
    w = LogWriter("0.5.23").server_args(mem_fraction_static=0.85, schedule_conservativeness=1.0,
                                        schedule_policy="fcfs", enable_metrics=True, chunked_prefill_size=8192)
    w.startup(total=80.0, weights=15.3, kv=57.1, graph=1.1, max_running=1024)
    steady(w, 12, running=200, usage=0.94, queue=600, graph=True, prefill_every=3, new=4000, cached=1200)
    return w.text()


def queue_empty() -> str:
    """0.4.6 (`Decode batch.`, no cuda-graph field): the client never keeps a queue."""
    w = LogWriter("0.4.6")
    return steady(w, 12, running=40, usage=0.3, queue=0, graph=None).text()


def queue_overloaded() -> str:
    """0.5.5 (`Decode batch,` with trailing `, `): the queue sits far above 2000."""
    w = LogWriter("0.5.5")
    return steady(w, 12, running=256, usage=0.95, queue=3500).text()


def queue_over_older_band() -> str:
    """0.4.3: a queue of 700 is inside the newest band (100-2000) but above the older-md band (50-500)."""
    return steady(LogWriter("0.4.3"), 12, running=256, usage=0.95, queue=700, graph=None).text()


def kv_underused() -> str:
    """0.4.10: requests wait while the KV cache is half empty."""
    w = LogWriter("0.4.10").server_args(schedule_conservativeness=1.0)
    return steady(w, 12, running=120, usage=0.55, queue=80).text()


def retractions_old_wording() -> str:
    """0.4.3 wording `Decode out of memory happened.`: 3 retractions a minute."""
    w = LogWriter("0.4.3")
    for i in range(360):
        w.decode(300, 0.99, 150, graph=None)
        if i % 10 == 0:
            w.retract(1)
        w.tick(2)
    return w.text()


def retractions_new_wording() -> str:
    """0.5.23 wording `KV cache pool is full. Retract requests.`: 10 a minute, current 1.1."""
    w = LogWriter("0.5.23").server_args(schedule_conservativeness=1.1)
    for i in range(360):
        w.decode(300, 0.99, 150)
        if i % 3 == 0:
            w.retract(2)
        w.tick(2)
    return w.text()


def headroom_high() -> str:
    """0.5.23: 14 GB left after startup on an 80 GB GPU at mem_fraction_static 0.80."""
    w = LogWriter("0.5.23").server_args(mem_fraction_static=0.80)
    w.startup(total=80.0, weights=15.3, kv=49.6, graph=1.1, available=14.0)
    return steady(w, 3).text()


def headroom_low() -> str:
    """0.5.10: 2 GB left on 80 GB at 0.90."""
    w = LogWriter("0.5.10").server_args(mem_fraction_static=0.90)
    w.startup(total=80.0, weights=15.3, kv=60.0, graph=2.7, available=2.0)
    return steady(w, 3).text()


def headroom_zero_without_summary() -> str:
    """0.4.6: the summary has no available_gpu_mem; the capture leaves 0.07 GB (critical)."""
    w = LogWriter("0.4.6").server_args(mem_fraction_static=0.92)
    w.startup(total=80.0, weights=15.3, kv=63.5, graph=1.13, available=0.07)
    return steady(w, 3, graph=None).text()


def startup_too_small() -> str:
    """0.5.23: weights of 60 GB on an 80 GB GPU at mem_fraction_static 0.70: `Not enough memory`."""
    w = LogWriter("0.5.23").server_args(mem_fraction_static=0.70)
    w.add("Load weight begin. avail mem=80.00 GB")
    w.add("Load weight end. elapsed=61.20 s, type=LlamaForCausalLM, avail mem=20.00 GB, mem usage=60.00 GB.")
    return w.not_enough_memory().text()


def prefill_oom() -> str:
    """0.5.23: SGLang's own `Prefill out of memory` at chunked_prefill_size 8192."""
    w = LogWriter("0.5.23").server_args(chunked_prefill_size=8192)
    steady(w, 2, prefill_every=2)
    return w.prefill_oom().text()


def prefill_oom_v02() -> str:
    """0.2.13 (no timestamps, `[gpu=0]`): the prefill knob is --max-prefill-tokens."""
    w = LogWriter("0.2.13").server_args(max_prefill_tokens=16384)
    for _ in range(20):
        w.decode(100, 0.8, 50, graph=None)
    return w.prefill_oom().text()


def decode_oom() -> str:
    """0.5.23 DP attention: a CUDA OOM in forward_decode on DP1 at batch 600, cap 1024."""
    w = LogWriter("0.5.23", tp_size=2).server_args(max_running_requests=1024, dp_size=2, enable_dp_attention=True)
    steady(w, 3, running=600, usage=0.97, queue=100, ranks=[{"dp": 0, "tp": 0}, {"dp": 1, "tp": 1}])
    return w.cuda_oom("forward_decode", dp=1, tp=1).text()


def oom_unknown() -> str:
    """0.4.10: a bare torch.OutOfMemoryError without frames."""
    w = LogWriter("0.4.10").server_args(max_running_requests=512)
    steady(w, 3, running=400, usage=0.97, queue=100)
    return w.cuda_oom(None).text()


def cuda_graph_uncovered() -> str:
    """0.5.23: batches of 200-300 run eagerly; graphs captured up to 160, cap 512."""
    w = LogWriter("0.5.23").server_args(cuda_graph_max_bs_decode=160)
    w.startup(max_running=512, capture_bs=[1, 2, 4, 8, 16, 32, 64, 128, 160])
    for i in range(360):
        run = 200 + (i % 11) * 10
        w.decode(run, 0.93, 300, graph=False)
        w.tick(2)
    return w.text()


def cuda_graph_uncovered_v04() -> str:
    """0.4.10 (no server_args): the flag is --cuda-graph-max-bs; queue 0 must not blame the client."""
    w = LogWriter("0.4.10")
    w.startup(max_running=512, capture_bs=[1, 2, 4, 8, 16, 32, 64, 128, 160])
    for i in range(360):
        w.decode(180 + (i % 5) * 10, 0.6, 0, graph=False)
        w.tick(2)
    return w.text()


def ceiling_low() -> str:
    """0.5.16: graphs captured only up to 32 while 2048 requests may run (before any traffic)."""
    w = LogWriter("0.5.16")
    return w.startup(max_running=2048, capture_bs=[1, 2, 4, 8, 16, 24, 32]).text()


def running_capped() -> str:
    """0.5.23: the batch sits at max_running_requests=128 with a queue and half-empty KV cache."""
    w = LogWriter("0.5.23").server_args(max_running_requests=128)
    w.startup(max_running=128)
    return steady(w, 12, running=128, usage=0.5, queue=200).text()


def latency_large_batch() -> str:
    """0.5.23 under the latency recipe: batches of 300."""
    return steady(LogWriter("0.5.23").server_args(max_running_requests=1024), 12, running=300, usage=0.8,
                  queue=0).text()


def lpm_no_reuse() -> str:
    """0.5.23 with --schedule-policy lpm and no prefix hits."""
    w = LogWriter("0.5.23").server_args(schedule_policy="lpm")
    return steady(w, 12, prefill_every=1, new=6000, cached=0).text()


def fcfs_with_reuse() -> str:
    """0.5.9 with fcfs and 70 % of prefill tokens from the prefix cache."""
    w = LogWriter("0.5.9").server_args(schedule_policy="fcfs")
    return steady(w, 12, prefill_every=1, new=3000, cached=7000).text()


def metrics_disabled() -> str:
    """0.5.23 started without --enable-metrics."""
    return steady(LogWriter("0.5.23").server_args(enable_metrics=False), 3).text()


def dp_one_bad_rank() -> str:
    """0.5.23 DP attention (`DPk TPk EPk`): DP2 retracts 6 times a minute, DP0/1/3 are fine."""
    w = LogWriter("0.5.23", tp_size=4).server_args(schedule_conservativeness=1.0, dp_size=4)
    for i in range(360):
        for dp in range(4):
            w.decode(300, 0.97, 400, dp=dp, tp=dp, ep=dp)
            if dp == 2 and i % 5 == 0:
                w.retract(1, dp=dp, tp=dp, ep=dp)
        w.tick(2)
    return w.text()


def startup_capture_oom(mem_fraction: float | None = 0.93) -> str:
    """0.5.23 incident: a torch OOM while capturing CUDA graphs at start-up (before the first batch)."""
    w = LogWriter("0.5.23").server_args(mem_fraction_static=mem_fraction, enable_metrics=True)
    w.add("Load weight begin. avail mem=78.50 GB")
    w.add("Load weight end. elapsed=21.40 s, type=Qwen2ForCausalLM, avail mem=63.20 GB, mem usage=15.30 GB.")
    w.add("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 700000, K size: 28.00 GB, V size: 28.00 GB")
    w.add("Memory pool end. avail mem=6.60 GB")
    w.add("Capture target decode CUDA graph begin. backend=flashinfer, num_tokens_per_req=1, avail mem=6.40 GB")
    return w.capture_oom().text()


SCENARIOS: dict[str, tuple[Callable[[], str], Expect]] = {
    "queue_empty": (queue_empty, Expect("queue_empty", FIRING, None, "increase the request submission rate "
                                        "(more concurrent clients or a larger client-side batch)")),
    "queue_overloaded": (queue_overloaded, Expect("queue_overloaded", ("critical",), None,
                                                  "reduce the request submission rate (or add replicas behind the router)")),
    "kv_underused": (kv_underused, Expect("kv_underused", FIRING, "--schedule-conservativeness", "decrease", 0.3, 0.3)),
    "retractions_old": (retractions_old_wording, Expect("retractions_frequent", ("warning",),
                                                         "--schedule-conservativeness", "increase", 1.3, 1.3)),
    "retractions_new": (retractions_new_wording, Expect("retractions_frequent", ("critical",),
                                                         "--schedule-conservativeness", "increase", 1.3, 1.3)),
    "retractions_latency": (retractions_old_wording, Expect("retractions_frequent", ("warning",),
                                                             "--schedule-conservativeness", "increase", 1.2, 1.2,
                                                             workload="latency")),
    "headroom_high": (headroom_high, Expect("gpu_mem_headroom_high", ("warning",), "--mem-fraction-static",
                                            "increase", 0.88, 0.90)),
    "headroom_low": (headroom_low, Expect("gpu_mem_headroom_low", ("warning",), "--mem-fraction-static", "decrease",
                                          0.83, 0.85)),
    "headroom_zero": (headroom_zero_without_summary, Expect("gpu_mem_headroom_low", ("critical",),
                                                             "--mem-fraction-static", "decrease", 0.83, 0.85)),
    "startup_too_small": (startup_too_small, Expect("startup_mem_fraction_too_small", ("critical",),
                                                    "--mem-fraction-static", "increase", 0.85, 0.86)),
    "startup_headroom_oom": (startup_capture_oom, Expect("startup_headroom_oom", ("critical",), "--mem-fraction-static",
                                                         "decrease", 0.85, 0.85)),
    "prefill_oom": (prefill_oom, Expect("prefill_oom", ("critical",), "--chunked-prefill-size", "decrease", 4096, 4096)),
    "prefill_oom_v02": (prefill_oom_v02, Expect("prefill_oom", ("critical",), "--max-prefill-tokens", "decrease",
                                                4096, 4096)),
    "decode_oom": (decode_oom, Expect("decode_oom", ("critical",), "--max-running-requests", "decrease", 400, 456,
                                      rank={"dp": 1})),
    "oom_unknown": (oom_unknown, Expect("oom_unknown_phase", ("critical",), "--max-running-requests", "decrease",
                                        256, 304)),
    "cuda_graph_uncovered": (cuda_graph_uncovered, Expect("cuda_graph_uncovered", ("critical",),
                                                          "--cuda-graph-max-bs-decode", "increase", 280, 304)),
    "cuda_graph_uncovered_v04": (cuda_graph_uncovered_v04, Expect("cuda_graph_uncovered", ("critical",),
                                                                  "--cuda-graph-max-bs", "increase", 200, 232)),
    "ceiling_low": (ceiling_low, Expect("cuda_graph_ceiling_low", ("warning",), "--cuda-graph-max-bs-decode",
                                        "increase", 256, 256)),
    "running_capped": (running_capped, Expect("running_capped", ("warning",), "--max-running-requests", "increase",
                                              224, 256)),
    "latency_batch": (latency_large_batch, Expect("latency_batch_too_large", ("warning",), "--max-running-requests",
                                                  "decrease", 128, 128, workload="latency")),
    "lpm_no_reuse": (lpm_no_reuse, Expect("schedule_policy_lpm_no_reuse", ("warning",), "--schedule-policy", "set",
                                          value="fcfs")),
    "fcfs_with_reuse": (fcfs_with_reuse, Expect("schedule_policy_fcfs_with_reuse", ("warning",), "--schedule-policy",
                                                "set", value="lpm")),
    "metrics_disabled": (metrics_disabled, Expect("metrics_disabled", ("warning",), "--enable-metrics", "set",
                                                  value=True)),
    "dp_one_bad_rank": (dp_one_bad_rank, Expect("retractions_frequent", ("critical",), "--schedule-conservativeness",
                                                "increase", 1.3, 1.3, rank={"dp": 2})),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_fires_with_flag_direction_and_value(name: str, tmp_path: Path) -> None:
    """The scenario's check fires with the exact flag, direction and a suggested value in range."""
    make, e = SCENARIOS[name]
    findings = run_log(tmp_path, make(), workload=e.workload)
    f = by_check(findings, e.check, e.rank)
    assert f.status in e.status, f
    assert f.flag == e.flag
    assert f.action == e.action
    if e.low is not None:
        assert isinstance(f.suggested, (int, float)), f
        assert e.low <= f.suggested <= (e.high if e.high is not None else e.low), f
    if e.value is not None:
        assert f.suggested == e.value
    assert f.evidence and f.guide and f.tradeoff


def test_every_check_has_a_scenario() -> None:
    """No check of the table is left without a firing scenario."""
    covered = {e.check for _, e in SCENARIOS.values()}
    assert covered == {c.id for c in TABLE.checks}


def test_healthy_log_fires_nothing(tmp_path: Path) -> None:
    """A server inside every band: no warning, no critical, and the startup checks are known."""
    findings = run_log(tmp_path, healthy())
    assert firing(findings) == set()
    assert by_check(findings, "gpu_mem_headroom_low").status == "ok"
    assert by_check(findings, "cuda_graph_ceiling_low").status == "ok"
    assert by_check(findings, "retractions_frequent").status == "ok"


def test_dp_attention_only_the_bad_rank_fires(tmp_path: Path) -> None:
    """One bad DP rank among good ones: the others stay ok."""
    findings = run_log(tmp_path, dp_one_bad_rank())
    statuses = {f.rank.get("dp"): f.status for f in findings if f.check == "retractions_frequent"}
    assert statuses == {0: "ok", 1: "ok", 2: "critical", 3: "ok"}


def test_queue_empty_is_suppressed_while_decode_misses_the_graph(tmp_path: Path) -> None:
    """An empty queue with eager decode is the graph ceiling's fault, not the client's."""
    findings = run_log(tmp_path, cuda_graph_uncovered_v04())
    q = by_check(findings, "queue_empty")
    assert q.status == "ok" and "cuda_graph_uncovered" in q.summary


def test_queue_empty_only_for_throughput(tmp_path: Path) -> None:
    """A queue of 0 is fine under the latency recipe: the check is not evaluated."""
    findings = run_log(tmp_path, queue_empty(), workload="latency")
    assert not [f for f in findings if f.check == "queue_empty"]


def test_profile_bands_differ(tmp_path: Path) -> None:
    """A queue of 700: fine for the newest guide (100-2000), overloaded for older-md (50-500)."""
    text = queue_over_older_band()
    assert by_check(run_log(tmp_path, text), "queue_overloaded").status == "ok"
    assert by_check(run_log(tmp_path, text, profile="older-md"), "queue_overloaded").status == "critical"


def test_fallback_headroom_is_named_in_evidence(tmp_path: Path) -> None:
    """Without the summary's available_gpu_mem the capture's `avail mem` is used and said so."""
    f = by_check(run_log(tmp_path, headroom_zero_without_summary()), "gpu_mem_headroom_low")
    assert "0.07" in f.evidence


def test_startup_failure_says_raise_not_lower(tmp_path: Path) -> None:
    """`Not enough memory` is the opposite of a runtime OOM: the advice raises the fraction."""
    findings = run_log(tmp_path, startup_too_small())
    f = by_check(findings, "startup_mem_fraction_too_small")
    assert f.action == "increase" and f.current == 0.70
    assert "RAISE" in f.evidence


@pytest.mark.parametrize("profile", ["upstream-2026", "docs-2025"])
def test_oom_before_the_first_batch_lowers_the_fraction(tmp_path: Path, profile: str) -> None:
    """The real incident: a CUDA-graph capture OOM at 0.93 was read as `Not enough memory` and the advice
    raised the fraction to 0.95. It is a headroom failure: lower it, sized by torch's free-memory fact
    (0.93 + (0.40 - 6.5) / 78.5 = 0.852 -> 0.85); the raise check stays quiet."""
    findings = run_log(tmp_path, startup_capture_oom(), profile=profile)
    f = by_check(findings, "startup_headroom_oom")
    assert f.status == "critical" and f.flag == "--mem-fraction-static" and f.action == "decrease"
    assert f.current == 0.93 and f.suggested == 0.85
    assert "LOWER" in f.evidence and "0.4 GB" in f.evidence
    assert by_check(findings, "startup_mem_fraction_too_small").status == "ok"


def test_default_mem_fraction_none_is_never_printed(tmp_path: Path) -> None:
    """--mem-fraction-static defaults to None: the current value is the estimate from the start-up lines,
    and no finding prints `None`."""
    findings = run_log(tmp_path, startup_capture_oom(None), profile="upstream-2026")
    f = by_check(findings, "startup_headroom_oom")
    assert f.current == pytest.approx(0.909) and f.suggested == 0.83  # 1 - (63.2 - 56) / 79.19 (torch capacity)
    assert not any("None" in x.evidence or "None" in x.summary for x in findings)


def test_not_enough_memory_states_the_resolved_default(tmp_path: Path) -> None:
    """With the default `--mem-fraction-static` (None) the late-2026 message's `Current value:` is the
    current value of the raise advice."""
    w = LogWriter("0.5.23").server_args(mem_fraction_static=None)
    w.add("Load weight begin. avail mem=80.00 GB")
    w.add("Load weight end. elapsed=61.20 s, type=LlamaForCausalLM, avail mem=20.00 GB, mem usage=60.00 GB.")
    f = by_check(run_log(tmp_path, w.not_enough_memory(current=0.7).text(), profile="upstream-2026"),
                 "startup_mem_fraction_too_small")
    assert f.action == "increase" and f.current == 0.7 and f.suggested == 0.85
    assert "None" not in f.evidence


def test_server_arg_override_changes_current_value(tmp_path: Path) -> None:
    """--server-arg KEY=VALUE replaces what the log says."""
    findings = run_log(tmp_path, kv_underused(), overrides={"schedule_conservativeness": 0.2})
    f = by_check(findings, "kv_underused")
    assert f.current == 0.2 and f.suggested == 0.1


def pd_decode_busy() -> str:
    """0.5.23 PD decode node (pre-allocated/prealloc/transfer fields, `DPk TPk EPk`) behind a busy
    HTTP front: mostly access lines, speculative and PD Decode lines, Prefill lines."""
    w = LogWriter("0.5.23", tp_size=2)
    for i in range(900):
        for _ in range(3):
            w.access()
        dp = i % 2
        w.add(f"Decode batch, #running-req: {100 + i % 50}, #token: 90000, token usage: 0.{50 + i % 40}, "
              f"pre-allocated usage: 0.00, #prealloc-req: 0, #transfer-req: 0, #retracted-req: 0, "
              f"cuda graph: {i % 3 != 0}, gen throughput (token/s): 1082.11, #queue-req: {i % 7}", dp=dp, tp=dp, ep=dp)
        if i % 4 == 0:
            w.add("Decode batch, #running-req: 24, #token: 233600, token usage: 0.66, accept len: 3.05, "
                  "accept rate: 0.68, cuda graph: True, gen throughput (token/s): 239.06, #queue-req: 2",
                  dp=dp, tp=dp, ep=dp)
            w.prefill(3000, 900, 0.7, 120, 4, dp=dp, tp=dp, ep=dp)
        w.tick(1)
    return w.text()


ALL_LOGS = [pd_decode_busy, healthy, queue_empty, queue_overloaded, kv_underused, retractions_old_wording, retractions_new_wording,
            headroom_high, headroom_low, headroom_zero_without_summary, startup_too_small, prefill_oom,
            prefill_oom_v02, decode_oom, oom_unknown, cuda_graph_uncovered, cuda_graph_uncovered_v04, ceiling_low,
            running_capped, latency_large_batch, lpm_no_reuse, fcfs_with_reuse, metrics_disabled, dp_one_bad_rank]


@pytest.mark.parametrize("make", ALL_LOGS, ids=lambda f: f.__name__)
def test_fast_path_agrees_with_the_full_parser(make: Callable[[], str]) -> None:
    """The fast path and the full parser give the same signals and findings on every scenario log."""
    lines = make().split("\n")[:-1]
    docs = []
    for fast in (True, False):
        d = Diagnosis(TABLE, Config(), "docs-2025", "throughput", {})
        d.add_chunk(Scanner(d.res, 0.9, (100.0, 2000.0), fast=fast).scan_bytes(("\n".join(lines) + "\n").encode()))
        docs.append(d.finish("x").document)
    fast_doc, full_doc = docs
    assert fast_doc["signals"] == full_doc["signals"]
    assert [(f["check"], f["status"], f["suggested"]) for f in fast_doc["findings"]] == \
        [(f["check"], f["status"], f["suggested"]) for f in full_doc["findings"]]


def test_fast_path_takes_pd_and_speculative_decode_lines() -> None:
    """PD and speculative Decode lines and Prefill lines are summed by the accelerator, access lines skipped."""
    if SCAN is None:
        pytest.skip("the C accelerator is not built (or SGLANG_TUNING_PURE_PYTHON is set): no fast path")
    lines = pd_decode_busy().split("\n")[:-1]
    res = Scanner(600.0, 0.9, (100.0, 2000.0)).scan_bytes(("\n".join(lines) + "\n").encode())
    assert res.fast == 900 + 2 * 225 and res.lines == len(lines) and res.events == []
