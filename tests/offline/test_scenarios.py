"""Every check fires on a log written in real SGLang line formats, with the exact flag, direction and a
suggested value in a stated range; a healthy log fires nothing; fast and full parsing agree."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from helpers.check_logs import (
    ALL_LOGS,
    ceiling_low,
    context_below_pool,
    cuda_graph_uncovered,
    cuda_graph_uncovered_v04,
    decode_graph_capture_oom,
    decode_oom,
    default_oom,
    dp_one_bad_rank,
    fcfs_with_reuse,
    headroom_high,
    headroom_low,
    headroom_zero_without_summary,
    healthy,
    init_oom_without_frames,
    kv_reduced,
    kv_underused,
    latency_large_batch,
    lpm_no_reuse,
    mamba_capped,
    mamba_full_decode_only,
    mamba_state_too_small,
    metrics_disabled,
    oom_unknown,
    pd_decode_busy,
    prefill_graph_capture_oom,
    prefill_oom,
    prefill_oom_v02,
    queue_empty,
    queue_over_older_band,
    queue_overloaded,
    request_slots_oom,
    retractions_new_wording,
    retractions_old_wording,
    running_capped,
    speculative_default_cap,
    startup_capture_oom,
    startup_too_small,
    startup_workspace_oom,
    swa_full,
    weights_leave_no_memory,
)
from helpers.scenario_logs import LogWriter, steady
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
    "startup_headroom_oom": (startup_workspace_oom, Expect("startup_headroom_oom", ("critical",),
                                                           "--mem-fraction-static", "decrease", 0.85, 0.85)),
    "decode_graph_capture_oom": (decode_graph_capture_oom, Expect("decode_graph_capture_oom", ("critical",),
                                                                  "--cuda-graph-max-bs-decode", "decrease", 256, 256)),
    "decode_graph_capture_oom_old_log": (startup_capture_oom, Expect("decode_graph_capture_oom", ("critical",),
                                                                     "--cuda-graph-max-bs-decode", "decrease")),
    "prefill_graph_capture_oom": (prefill_graph_capture_oom, Expect("prefill_graph_capture_oom", ("critical",),
                                                                    "--cuda-graph-max-bs-prefill", "decrease",
                                                                    2048, 2048)),
    "default_oom_prefill": (default_oom, Expect("prefill_oom", ("critical",), "--chunked-prefill-size", "decrease",
                                                4096, 4096)),
    "default_oom_decode": (lambda: default_oom("decode"), Expect("decode_oom", ("critical",), "--max-running-requests",
                                                                 "decrease", 448, 456)),
    "request_slots_oom": (request_slots_oom, Expect("decode_oom", ("critical",), "--max-running-requests", "decrease",
                                                    448, 456)),
    "prefill_oom": (prefill_oom, Expect("prefill_oom", ("critical",), "--chunked-prefill-size", "decrease", 4096, 4096)),
    "prefill_oom_v02": (prefill_oom_v02, Expect("prefill_oom", ("critical",), "--max-prefill-tokens", "decrease",
                                                4096, 4096)),
    "decode_oom": (decode_oom, Expect("decode_oom", ("critical",), "--max-running-requests", "decrease", 400, 456,
                                      rank={"dp": 1})),
    "oom_unknown": (oom_unknown, Expect("oom_unknown_phase", ("critical",), "--max-running-requests", "decrease",
                                        256, 304)),
    "cuda_graph_uncovered": (cuda_graph_uncovered, Expect("cuda_graph_uncovered", ("critical",),
                                                          "--cuda-graph-max-bs-decode", "increase", 280, 304)),
    # No version line, no server args: the newest spelling, the text names the old one (test below).
    "cuda_graph_uncovered_v04": (cuda_graph_uncovered_v04, Expect("cuda_graph_uncovered", ("critical",),
                                                                  "--cuda-graph-max-bs-decode", "increase", 200, 232)),
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
    # What binds running requests (SGLang 0.5.2x's own capacity messages): the flag that moves it.
    "mamba_capped": (mamba_capped, Expect("running_capped_by_mamba", ("warning",), "--max-mamba-cache-size",
                                          "increase", 120, 120)),
    "mamba_full_decode_only": (mamba_full_decode_only, Expect("mamba_pool_full", ("warning",),
                                                              "--max-mamba-cache-size", "increase", 96, 96)),
    # 0.87 alone; the plan's one value for the flag is gpu_mem_headroom_high's 0.89 (both raise it).
    "kv_reduced": (kv_reduced, Expect("running_capped_by_kv", ("warning",), "--mem-fraction-static", "increase",
                                      0.87, 0.89)),
    "context_below_pool": (context_below_pool, Expect("context_exceeds_kv_pool", ("warning",), "--context-length",
                                                      "decrease", 29696, 29696)),
    "swa_full": (swa_full, Expect("swa_pool_full", ("warning",), "--swa-full-tokens-ratio", "increase", 1.0, 1.0)),
    "speculative_default_cap": (speculative_default_cap, Expect("running_capped", ("warning",),
                                                                "--max-running-requests", "increase", 88, 88)),
    # SGLang's own minimum 0.812 + the check's 0.1 margin (guide/suggest.s_mem_fraction_for_weights).
    "weights_leave_no_memory": (weights_leave_no_memory, Expect("startup_mem_fraction_too_small", ("critical",),
                                                                "--mem-fraction-static", "increase", 0.92, 0.92)),
    "mamba_state_too_small": (mamba_state_too_small, Expect("startup_mem_fraction_too_small", ("critical",),
                                                            "--mem-fraction-static", "increase", 0.85, 0.85)),
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


@pytest.mark.parametrize("make", [mamba_capped, kv_reduced], ids=lambda f: f.__name__)
def test_a_cap_sglang_set_from_a_pool_is_never_raised(make: Callable[[], str], tmp_path: Path) -> None:
    """At the mamba state cap or SGLang's KV cut of the requested cap, no firing finding advises raising
    --max-running-requests or lowering --schedule-conservativeness (neither can help), and the suppressed
    running_capped finding carries no remedy."""
    findings = run_log(tmp_path, make())
    fired = [f for f in findings if f.status in FIRING]
    assert fired
    assert not [f for f in fired if f.flag in ("--max-running-requests", "--schedule-conservativeness")], fired
    capped = by_check(findings, "running_capped")
    assert capped.status == "ok" and capped.suggested is None
    assert "Increase --max-running-requests" not in capped.evidence
    assert "Suppressed: running_capped_by_" in capped.evidence


def test_mamba_cap_finding_names_sglangs_remedies(tmp_path: Path) -> None:
    """The state-pool finding gives the size (wanted requests x slots per request) and SGLang's other two levers."""
    f = by_check(run_log(tmp_path, mamba_capped()), "running_capped_by_mamba")
    assert f.current == 30
    assert "5 state slots per request" in f.evidence
    assert "--mamba-full-memory-ratio" in f.evidence and "--mamba-ssm-dtype bfloat16" in f.evidence


def test_kv_cut_finding_names_the_kv_levers(tmp_path: Path) -> None:
    """SGLang's KV cut: the KV pool is the lever (fraction, fp8 KV cache, context length)."""
    f = by_check(run_log(tmp_path, kv_reduced()), "running_capped_by_kv")
    assert "--kv-cache-dtype fp8_e4m3" in f.evidence and "--context-length" in f.evidence
    assert "128 requested / 50 granted" in f.evidence


def test_a_cap_sglang_chose_is_said_to_be_its_default(tmp_path: Path) -> None:
    """Speculative decoding's 48 (printed before the server_args line that resets the facts): the finding says
    the cap is SGLang's default, not the user's."""
    f = by_check(run_log(tmp_path, speculative_default_cap()), "running_capped")
    assert "SGLang's own default" in f.evidence
    plain = by_check(run_log(tmp_path, running_capped()), "running_capped")
    assert "SGLang's own default" not in plain.evidence


def test_weights_leave_no_memory_keeps_sglangs_floor(tmp_path: Path) -> None:
    """`Raise --mem-fraction-static above 0.812`: the suggestion never goes under SGLang's own minimum."""
    f = by_check(run_log(tmp_path, weights_leave_no_memory()), "startup_mem_fraction_too_small")
    assert f.current == 0.7 and f.suggested is not None and f.suggested >= 0.812
    assert "0.812" in f.evidence


# Checks that read SGLang's latency histograms, which no log carries: tests/guide/test_latency_checks.py fires them.
HISTOGRAM_ONLY = {"latency_high_batch_large", "latency_queue_dominates", "ttft_long_prompts"}


def test_every_check_has_a_scenario() -> None:
    """No check of the table is left without a firing scenario (a log's, or its own tests' for the checks a
    log cannot fire)."""
    covered = {e.check for _, e in SCENARIOS.values()}
    assert covered | HISTOGRAM_ONLY == {c.id for c in TABLE.checks}
    assert not covered & HISTOGRAM_ONLY


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
    """The real incident: an OOM before the first batch at 0.93 was read as `Not enough memory` and the
    advice raised the fraction to 0.95. It is a headroom failure: lower it, sized by torch's free-memory fact
    (0.93 + (0.40 - 6.5) / 78.5 = 0.852 -> 0.85); the raise check stays quiet."""
    findings = run_log(tmp_path, startup_workspace_oom(), profile=profile)
    f = by_check(findings, "startup_headroom_oom")
    assert f.status == "critical" and f.flag == "--mem-fraction-static" and f.action == "decrease"
    assert f.current == 0.93 and f.suggested == 0.85
    assert "LOWER" in f.evidence and "0.4 GB" in f.evidence
    assert by_check(findings, "startup_mem_fraction_too_small").status not in ("warning", "critical")
    assert by_check(findings, "decode_graph_capture_oom").status not in ("warning", "critical")


def test_default_mem_fraction_none_is_never_printed(tmp_path: Path) -> None:
    """--mem-fraction-static defaults to None: the current value is the estimate from the start-up lines,
    and no finding prints `None`."""
    findings = run_log(tmp_path, startup_workspace_oom(None), profile="upstream-2026")
    f = by_check(findings, "startup_headroom_oom")
    assert f.current == pytest.approx(0.909) and f.suggested == 0.83  # 1 - (63.2 - 56) / 79.19 (torch capacity)
    assert not any("None" in x.evidence or "None" in x.summary for x in findings)


def _fired(findings: list[Finding]) -> dict[str, Finding]:
    return {f.check: f for f in findings if f.status in FIRING}


def test_a_graph_capture_oom_lowers_the_graph_ceiling_not_a_runtime_flag(tmp_path: Path) -> None:
    """Issue 22: `Capture cuda graph failed: CUDA out of memory` at start-up was read as a runtime OOM. Its
    advice is the decode graph's ceiling (512 -> 256, keeps the KV pool), the static fraction's step computed
    from torch's figures named as the alternative ((6.5 - 0.38) / 79.19 = 0.077 -> 0.08); no runtime OOM
    check, no headroom-failure check fires."""
    fired = _fired(run_log(tmp_path, decode_graph_capture_oom(), profile="upstream-2026"))
    f = fired["decode_graph_capture_oom"]
    assert (f.flag, f.action, f.current, f.suggested) == ("--cuda-graph-max-bs-decode", "decrease", 512, 256)
    assert "lower --mem-fraction-static by 0.08 (0.38 GB free of ~79.19 GB" in f.evidence
    assert not fired.keys() & {"prefill_oom", "decode_oom", "oom_unknown_phase", "startup_headroom_oom",
                               "startup_mem_fraction_too_small", "gpu_mem_headroom_low"}
    # Without the ceiling in the server args: no invented value, SGLang's own example named.
    f = _fired(run_log(tmp_path, decode_graph_capture_oom(None), profile="upstream-2026"))["decode_graph_capture_oom"]
    assert f.suggested is None and "SGLang's own example: 16" in f.evidence


def test_a_prefill_graph_capture_oom_never_advises_chunked_prefill(tmp_path: Path) -> None:
    """`Capture prefill CUDA graph failed:` ran prefill code during capture: still a start-up failure of the
    prefill graph (--cuda-graph-max-bs-prefill 4096 -> 2048), never --chunked-prefill-size."""
    findings = run_log(tmp_path, prefill_graph_capture_oom(), profile="upstream-2026")
    fired = _fired(findings)
    f = fired["prefill_graph_capture_oom"]
    assert (f.flag, f.action, f.current, f.suggested) == ("--cuda-graph-max-bs-prefill", "decrease", 4096, 2048)
    assert "prefill_oom" not in fired and all(x.flag != "--chunked-prefill-size" for x in fired.values())


@pytest.mark.parametrize(("phase", "check", "flag", "suggested"), [
    ("prefill", "prefill_oom", "--chunked-prefill-size", 4096),
    ("decode", "decode_oom", "--max-running-requests", 448)])
def test_the_default_oom_is_advised_by_its_traceback_phase(tmp_path: Path, phase: str, check: str, flag: str,
                                                           suggested: int) -> None:
    """Issue 22: page size 1's `Out of memory. Try to lower your batch size.` then a traceback through
    alloc_for_extend was "phase unknown -> lower --max-running-requests"; the guide says
    --chunked-prefill-size for a prefill OOM. The traceback's phase decides; no unknown-phase finding."""
    fired = _fired(run_log(tmp_path, default_oom(phase), profile="upstream-2026"))
    assert set(fired) & {"prefill_oom", "decode_oom", "oom_unknown_phase"} == {check}
    f = fired[check]
    assert (f.flag, f.action, f.suggested) == (flag, "decrease", suggested)


def test_request_slot_exhaustion_lowers_max_running_requests(tmp_path: Path) -> None:
    """`alloc_req_slots runs out of memory` raised inside alloc_for_extend: the request pool ran out; SGLang
    says --max-running-requests, whatever phase the traceback passed (not --chunked-prefill-size)."""
    fired = _fired(run_log(tmp_path, request_slots_oom(), profile="upstream-2026"))
    assert set(fired) & {"prefill_oom", "decode_oom", "oom_unknown_phase"} == {"decode_oom"}
    assert fired["decode_oom"].flag == "--max-running-requests" and fired["decode_oom"].suggested == 448


def test_an_oom_stating_free_memory_quotes_it(tmp_path: Path) -> None:
    """A frameless CUDA OOM keeps the ordered advice, but the figures it states are in the evidence."""
    f = _fired(run_log(tmp_path, init_oom_without_frames(), profile="upstream-2026"))["oom_unknown_phase"]
    assert "torch stated 1.9 GB free on the GPU at the failure" in f.evidence


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


@pytest.mark.parametrize("make", ALL_LOGS, ids=lambda f: f.__name__)
def test_fast_path_agrees_with_the_full_parser(make: Callable[[], str]) -> None:
    """The fast path and the full parser give the same signals and findings on every scenario log."""
    lines = make().split("\n")[:-1]
    docs = []
    for fast in (True, False):
        d = Diagnosis(TABLE, Config(), "docs-2025", "throughput", {}, fast=fast)
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


def _graphs_off(warning: str | None, *, tp_size: int = 1, **args: Any) -> str:
    """0.5.23: decode batches of 200-300 with `cuda graph: False`, the feature switched off by `warning`
    (SGLang logs it while resolving the arguments, before `server_args=`) or by the arguments."""
    w = LogWriter("0.5.23", tp_size=tp_size)
    if warning is not None:
        w.add(f"WARNING moe_hook.py:384: {warning}")
    w.server_args(max_running_requests=512, cuda_graph_max_bs_decode=32, **args)
    rank = {"tp": 0} if tp_size > 1 else {}
    w.startup(max_running=512, capture_bs=[], **rank)
    for i in range(360):
        w.decode(200 + (i % 11) * 10, 0.9, 300, graph=False, **rank)
        w.tick(2)
    return w.text()


@pytest.mark.parametrize(("warning", "tp_size", "args", "why"), [
    ("Cuda graph is disabled because deepep_mode=`normal`", 1, {"deepep_mode": "normal"}, "deepep_mode=normal"),
    ("Cuda graph is disabled because of using torch native attention backend", 2, {},
     "the torch native attention backend"),
    (None, 1, {"disable_cuda_graph": True}, "of the server arguments"),
    (None, 1, {"cuda_graph_backend_decode": "disabled"}, "of the server arguments")])
def test_no_graph_advice_when_the_configuration_switched_graphs_off(tmp_path: Path, warning: str | None,
                                                                   tp_size: int, args: dict[str, Any],
                                                                   why: str) -> None:
    """Issue 22: `Cuda graph is disabled because deepep_mode=normal` then `cuda graph: False` Decode lines was a
    critical "raise --cuda-graph-max-bs", which cannot help when no graph is captured. The graph checks are
    not judged and say why; no plan step names a graph flag (also on TP ranks: the warning has no rank)."""
    findings = run_log(tmp_path, _graphs_off(warning, tp_size=tp_size, **args), profile="upstream-2026")
    for check in ("cuda_graph_uncovered", "cuda_graph_ceiling_low"):
        for f in (x for x in findings if x.check == check):
            assert f.status == "unknown" and f.flag is None and f.suggested is None
            assert f.evidence.startswith(f"not judged: CUDA graph disabled because {why}")
            assert "cannot help" in f.evidence
    assert not any(f.flag and "cuda-graph" in f.flag for f in findings if f.status in FIRING)


def test_a_prefill_oom_with_chunked_prefill_forced_off_advises_no_chunk_size(tmp_path: Path) -> None:
    """SGLang turned chunked prefill off itself (`--enable-mis`): lowering --chunked-prefill-size cannot help,
    the finding says why and suggests no value; a server started with -1 is told 4096 turns it on."""
    w = LogWriter("0.5.23")
    w.add("WARNING attention_hook.py:565: Chunked prefill is disabled because --enable-mis is set.")
    w.server_args(chunked_prefill_size=-1, max_running_requests=512)
    steady(w, 2, prefill_every=2)
    f = by_check(run_log(tmp_path, w.prefill_oom().sigquit().text(), profile="upstream-2026"), "prefill_oom")
    assert f.status == "critical" and f.suggested is None
    assert "chunked prefill disabled because --enable-mis" in f.evidence and "cannot help" in f.evidence
    w = LogWriter("0.5.23").server_args(chunked_prefill_size=-1, max_running_requests=512)
    steady(w, 2, prefill_every=2)
    f = by_check(run_log(tmp_path, w.prefill_oom().sigquit().text(), profile="upstream-2026"), "prefill_oom")
    assert f.status == "critical" and f.suggested == 4096 and "turns it on" in f.evidence


@pytest.mark.parametrize(("version_line", "flag", "names_both"), [
    (None, "--cuda-graph-max-bs-decode", True),  # only a floor (>=0.4.7, the `cuda graph:` field)
    ("sglang version: 0.4.10", "--cuda-graph-max-bs", False),
    ("sglang version: 0.5.23", "--cuda-graph-max-bs-decode", False)])
def test_the_flag_spelling_is_never_guessed_from_the_excerpt(tmp_path: Path, version_line: str | None, flag: str,
                                                            names_both: bool) -> None:
    """Issue 22: with the version unknown the product picked --cuda-graph-max-bs or -decode (renamed in 0.5.14)
    from which lines the excerpt held. Unknown: the newest spelling, the evidence naming both; known: that
    release's. The guide quote always names the flag of the change line."""
    text = cuda_graph_uncovered_v04()
    if version_line is not None:
        text = f"[2025-03-01 09:59:59] {version_line}\n" + text
    f = by_check(run_log(tmp_path, text, profile="upstream-2026"), "cuda_graph_uncovered")
    assert f.flag == flag
    both = "--cuda-graph-max-bs-decode (--cuda-graph-max-bs before 0.5.14)"
    assert (both in f.evidence) == names_both
    spelled = set(re.findall(r"--cuda-graph-max-bs(?:-decode)?(?![\w-])", f.guide))
    assert spelled == {flag}
    # The plan's step says it too (its command line keeps the one spelling a command line can hold).
    log = tmp_path / "server.log"
    log.write_text(text, encoding="utf-8")
    res = diagnose_source(str(log), TABLE, Config(), "upstream-2026", "throughput", {}, jobs=1)
    (step,) = [s for s in res.document["plan"] if s["flag"] == flag]
    assert (both in step["why"]) == names_both


def _weights_leave_no_kv(weights_lines: bool) -> str:
    """0.5.23 `ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.7.
    Raise --mem-fraction-static above 0.772 (minimum viable = ...)` (mem_cache/kv_cache_configurator.py)."""
    w = LogWriter("0.5.23").server_args(mem_fraction_static=0.7)
    if weights_lines:
        w.add("Load weight begin. avail mem=79.19 GB")
        w.add("Load weight end. elapsed=61.20 s, type=LlamaForCausalLM, avail mem=18.10 GB, mem usage=61.09 GB.")
    w.add("Scheduler hit an exception: Traceback (most recent call last):")
    w.raw('  File "/sgl/python/sglang/srt/managers/scheduler.py", line 3329, in run_scheduler_process\n'
          "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)\n"
          '  File "/sgl/python/sglang/srt/mem_cache/kv_cache_configurator.py", line 3050, in profile_max_num_token\n'
          "    raise ValueError(\n"
          "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.7. Raise "
          "--mem-fraction-static above 0.772 (minimum viable = 1 - available/pre = 0.7714). If using speculative "
          "decoding, draft weights are now counted.")
    return w.sigquit().text()


@pytest.mark.parametrize(("weights_lines", "suggested"), [(False, 0.88), (True, 0.88)])
def test_sglangs_own_minimum_fraction_is_the_floor(tmp_path: Path, weights_lines: bool, suggested: float) -> None:
    """SGLang states the minimum viable --mem-fraction-static (0.772 here): the raise never suggests less than
    it plus the guide's margin for a KV cache (0.772 + 0.1 -> 0.88); without the weights' lines the old advice
    was 0.7 + 0.05 = 0.75, which SGLang refuses again."""
    f = by_check(run_log(tmp_path, _weights_leave_no_kv(weights_lines), profile="upstream-2026"),
                 "startup_mem_fraction_too_small")
    assert f.status == "critical" and f.action == "increase" and f.current == 0.7
    assert f.suggested == suggested and "0.772" in f.evidence


def _frameless_oom_at_init(batches_first: bool) -> str:
    """0.5.23 on a 140 GB GPU at 0.9: a CUDA OOM stating its figures (1.9 of 139.8 GiB free), no frames, after
    the start-up lines and before any batch (or, `batches_first`, after traffic)."""
    w = LogWriter("0.5.23").server_args(mem_fraction_static=0.9, max_running_requests=512)
    w.add("Load weight begin. avail mem=139.80 GB")
    w.add("Load weight end. elapsed=21.40 s, type=Qwen2ForCausalLM, avail mem=120.00 GB, mem usage=19.80 GB.")
    if batches_first:
        steady(w, 3, running=400, usage=0.97, queue=100)
    w.add("Scheduler hit an exception: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. "
          "GPU 0 has a total capacity of 139.80 GiB of which 1.90 GiB is free.")
    return w.sigquit().text()


def test_a_frameless_oom_before_the_first_batch_uses_its_figures(tmp_path: Path) -> None:
    """Issue 22: `CUDA out of memory ... 139.80 GiB of which 1.90 GiB is free` before any batch was read as a
    runtime OOM of unknown phase and given the generic order. Before the first batch it is a start-up headroom
    failure: --mem-fraction-static down, computed from the figures (0.9 - (6.5 - 1.9) / 139.8 = 0.867 -> 0.86).
    After traffic the phase stays unknown (the ordered advice, the figures in its evidence)."""
    fired = _fired(run_log(tmp_path, _frameless_oom_at_init(False), profile="upstream-2026"))
    assert "oom_unknown_phase" not in fired
    f = fired["startup_headroom_oom"]
    assert (f.flag, f.action, f.current, f.suggested) == ("--mem-fraction-static", "decrease", 0.9, 0.86)
    assert "1.9 GB" in f.evidence
    fired = _fired(run_log(tmp_path, _frameless_oom_at_init(True), profile="upstream-2026"))
    assert "startup_headroom_oom" not in fired and "oom_unknown_phase" in fired
