"""Coverage, indications and the plan (plan.py; interfaces.md "Coverage, indications and the plan")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.paths import ROOT
from helpers.runners import diagnose_run
from sglang_tuning_exporter.core.model import Finding, Rank, ServerState
from sglang_tuning_exporter.guide.advisor import evaluate, findings_document
from sglang_tuning_exporter.guide.checks import load_table
from sglang_tuning_exporter.guide.plan import (
    build_plan,
    command_diff,
    coverage,
    plan_step_change,
    plan_step_markdown,
    plan_step_text,
    verdict_line,
)

TABLE = load_table()
DECODE = ("[2025-06-01 10:00:{s:02d}] Decode batch. #running-req: 256, #token: 370959, token usage: 0.82, "
          "cuda graph: True, gen throughput (token/s): 4594.01, #queue-req: {q}\n")


def F(check: str, status: str, rank: dict[str, int], flag: str | None, action: str, current: object = None,
      suggested: object = None, summary: str = "", evidence: str = "") -> Finding:
    """A finding with only what the plan reads."""
    return Finding(check, status, rank, flag, action, current, suggested, summary, evidence)


def doc_of(signals: dict[Rank, dict[str, float | None]], server: ServerState) -> dict[str, object]:
    findings = evaluate(TABLE, signals, server)
    return findings_document(findings=findings, signals=signals, server=server, profile=None, workload=None,
                             table=TABLE)


# ------------------------------------------------------------------------------------ coverage
def test_coverage_counts_checks_not_ranks_and_says_why() -> None:
    """A check judged on one rank counts as judged; one unknown everywhere carries its reason."""
    fs = [F("a", "unknown", {"dp": 0}, None, "x", evidence="3 samples; 10 needed"), F("a", "ok", {"dp": 1}, None, "x"),
          F("b", "unknown", {}, None, "x", evidence="no startup memory line")]
    assert coverage(fs) == {"checks": 2, "judged": 1, "unknown": 1, "unknown_why": {"b": "no startup memory line"}}


def test_nothing_judged_never_reads_healthy(tmp_path: Path) -> None:
    """One Decode line: every document says how little was judged; text never says 'No findings:'."""
    log = tmp_path / "one.log"
    log.write_text(DECODE.format(s=0, q=12279))
    code, out, _ = diagnose_run([str(log), "--format", "json"])
    d = json.loads(out)
    cov = d["coverage"]
    checks = len(load_table().for_workload("throughput"))
    assert code == 0 and cov["checks"] == checks and cov["judged"] + cov["unknown"] == checks
    assert set(cov["unknown_why"]) >= {"queue_overloaded", "kv_underused", "gpu_mem_headroom_high"}
    assert "1 batch lines with #queue-req" in cov["unknown_why"]["queue_overloaded"]
    for fmt in ("text", "markdown", "html"):
        _, text, _ = diagnose_run([str(log), "--format", fmt])
        # One line is no time at all: even the absence of OOMs and retractions is not judged (min_span_s).
        assert "No findings: nothing" not in text and "NOT JUDGED" in text, fmt
        assert "queue_overloaded" in text.split("Indications", 1)[1], fmt


def test_verdict_line_when_nothing_is_judged() -> None:
    """Zero judged: NOT JUDGED, whatever else."""
    line = verdict_line({"coverage": {"checks": 16, "judged": 0, "unknown": 16}, "findings": []})
    assert line.startswith("NOT JUDGED") and "not a clean bill of health" in line


# --------------------------------------------------------------------------------- indications
def test_one_sample_far_past_the_band_is_an_indication_not_a_finding(tmp_path: Path) -> None:
    """#queue-req 12279 in the only sample: an indication with the evidence; --fail-on still passes."""
    log = tmp_path / "one.log"
    log.write_text(DECODE.format(s=0, q=12279))
    code, out, _ = diagnose_run([str(log), "--format", "json", "--fail-on", "warning"])
    d = json.loads(out)
    assert code == 0  # indications never fail CI
    ind = next(i for i in d["indications"] if i["check"] == "queue_overloaded")
    assert (ind["value"], ind["threshold"], ind["samples"], ind["needed"]) == (12279, 2000, 1, 10)
    assert ind["flag"] is None and ind["action"] == "client" and "6.1x the band's top (2000)" in ind["evidence"]
    assert all(f["status"] == "unknown" for f in d["findings"] if f["check"] == "queue_overloaded")
    assert not any(k.startswith("few:") for k in d["signals"])  # the raw material stays internal


def test_mixed_samples_are_no_indication(tmp_path: Path) -> None:
    """One sample inside the band: not every sample points past the threshold."""
    log = tmp_path / "two.log"
    log.write_text(DECODE.format(s=0, q=12279) + DECODE.format(s=1, q=500))
    _, out, _ = diagnose_run([str(log), "--format", "json"])
    assert not [i for i in json.loads(out)["indications"] if i["check"] == "queue_overloaded"]


# ---------------------------------------------------------------------------------------- plan
def test_graph_raise_and_headroom_raise_become_one_memory_budget() -> None:
    """The graph raise's memory (from the startup log's graph size) comes out of the mem-fraction raise:
    one value, one entry per flag, memory before graphs."""
    signals = {Rank(): {"available_gpu_mem_gb": 13.5, "gpu_mem_total_gb": 80.0, "cuda_graph_gb": 1.0,
                        "cuda_graph_max_bs_captured": 160.0, "max_running_requests": 4096.0,
                        "cuda_graph_miss_ratio": 0.6, "cuda_graph_miss_batch_p90": 320.0, "graph_samples": 100.0}}
    server = ServerState("0.5.12", {"mem_fraction_static": 0.8, "cuda_graph_max_bs": 160})
    d = doc_of(signals, server)
    plan = d["plan"]
    assert isinstance(plan, list)
    flags = [s["flag"] for s in plan]
    assert flags == ["--mem-fraction-static", "--cuda-graph-max-bs"]
    mem, graph = plan
    assert graph["to"] == 320 and mem["current"] == 0.8
    # 13.5 GB - 1 GB * (320 - 160) / 160 = 12.5 GB; (12.5 - 6.5) / 80 = +0.075 -> 0.87 (not the 0.88 alone)
    assert mem["to"] == 0.87 and mem["action"] == "increase" and "one memory budget" in mem["why"]
    assert set(mem["checks"]) == {"gpu_mem_headroom_high", "cuda_graph_uncovered"}
    assert [s["step"] for s in plan] == [1, 2] and all(s["then"].startswith("watch ") for s in plan)
    assert command_diff(plan, server.args) == ["- --mem-fraction-static 0.8", "+ --mem-fraction-static 0.87",
                                               "- --cuda-graph-max-bs 160", "+ --cuda-graph-max-bs 320"]
    assert d["command_diff"] == command_diff(plan, server.args)


def test_a_flag_is_never_pulled_both_ways_and_crashes_come_first() -> None:
    """decode_oom (crash) lowers --max-running-requests; running_capped would raise it: one entry, the
    crash's direction, the other named as re-check; the client step comes last."""
    fs = [F("running_capped", "warning", {}, "--max-running-requests", "increase", 256, 512, "capped"),
          F("queue_empty", "warning", {}, None, "send faster", None, None, "queue empty"),
          F("decode_oom", "critical", {}, "--max-running-requests", "decrease", 256, 192, "decode OOM"),
          F("retractions_frequent", "warning", {}, "--schedule-conservativeness", "increase", 1.0, 1.3, "r")]
    plan = build_plan(TABLE, fs, {})
    assert [(s["flag"], s["action"]) for s in plan] == [
        ("--max-running-requests", "decrease"), ("--schedule-conservativeness", "increase"), (None, "client")]
    first = plan[0]
    assert first["to"] == 192 and first["checks"] == ["decode_oom", "running_capped"]
    assert "running_capped would increase it instead" in first["why"]


def test_same_direction_takes_the_value_every_finding_agrees_with() -> None:
    """Two ranks asking for different raises: the larger satisfies both (a cut: the smaller)."""
    fs = [F("retractions_frequent", "warning", {"dp": 0}, "--schedule-conservativeness", "increase", 1.0, 1.3),
          F("retractions_frequent", "critical", {"dp": 1}, "--schedule-conservativeness", "increase", 1.0, 1.4)]
    assert [(s["to"], s["checks"]) for s in build_plan(TABLE, fs, {})] == [(1.4, ["retractions_frequent"])]
    assert build_plan(TABLE, [F("queue_empty", "ok", {}, None, "x", None, None, "")], {}) == []


@pytest.mark.skipif(not (ROOT / "examples" / "recorded.log").exists(), reason="examples/recorded.log missing")
def test_recorded_log_plan_has_one_mem_fraction_value() -> None:
    """The issue's example: no '(and lower --mem-fraction-static a little)' next to a raise."""
    code, out, _ = diagnose_run([str(ROOT / "examples" / "recorded.log"), "--format", "json"])
    d = json.loads(out)
    flags = [s["flag"] for s in d["plan"]]
    assert code == 0 and len(flags) == len(set(flags)) and "--mem-fraction-static" in flags
    assert flags.index("--mem-fraction-static") < flags.index("--cuda-graph-max-bs-decode")
    assert "a little" not in out


def test_plan_step_text_is_one_spelling_for_every_format() -> None:
    """A step's change reads the same in text, Markdown and HTML: values as the guide writes them, a missing
    value said in words, a client step named by its checks; the formats only number and escape it."""
    step = {"step": 2, "flag": "--chunked-prefill-size", "action": "decrease", "current": 8192.0, "to": None,
            "why": "prefill OOM", "then": "watch OOMs"}
    assert plan_step_change(step) == "decrease --chunked-prefill-size: 8192 -> a value to measure first (see why)"
    assert plan_step_text(step) == "2. " + plan_step_change(step)
    assert plan_step_change({"step": 1, "flag": None, "checks": ["queue_empty"]}) == "client side (queue_empty)"
    assert plan_step_change({**step, "to": True, "current": None}) == (
        "decrease --chunked-prefill-size: current not in the input -> true")
    line = plan_step_markdown(step, code=lambda t: f"[{t}]", text=str.upper)
    assert line == f"2. [{plan_step_change(step)}] — PREFILL OOM. *Then:* WATCH OOMS."



# ------------------------------------------------------------------------- one value per flag
CG_SIGNALS = {Rank(): {"cuda_graph_miss_ratio": 1.0, "graph_samples": 300.0, "cuda_graph_miss_batch_p90": 187.0,
                       "cuda_graph_max_bs_captured": 32.0, "max_running_requests": 4096.0,
                       "cuda_graph_ceiling_ratio": 32 / 4096, "window_span_s": 600.0}}
CG_SERVER = ServerState("0.5.23", {"cuda_graph_max_bs_decode": 32, "max_running_requests": 4096})


def test_every_finding_on_a_flag_carries_the_plans_one_value() -> None:
    """The CUDA-graph case of issue #24: cuda_graph_uncovered alone would raise the ceiling to 192 and
    cuda_graph_ceiling_low to 256; the plan takes 256, and both findings (their value, their change text)
    say 256, the uncovered one keeping its own 192 as a reason."""
    findings = evaluate(TABLE, CG_SIGNALS, CG_SERVER)
    fired = {f.check: f for f in findings if f.status in ("warning", "critical")}
    assert set(fired) == {"cuda_graph_uncovered", "cuda_graph_ceiling_low"}
    d = findings_document(findings=findings, signals=CG_SIGNALS, server=CG_SERVER, profile=None, workload=None,
                          table=TABLE)
    plan = d["plan"]
    assert isinstance(plan, list)
    step = next(s for s in plan if s["flag"] == "--cuda-graph-max-bs-decode")
    assert step["to"] == 256
    for f in fired.values():
        assert f.suggested == 256, f
        assert "to 256" in f.evidence and "to 192" not in f.evidence
    own = fired["cuda_graph_uncovered"].evidence
    assert "192" in own and "the plan" in own  # its own value survives only as the reason
    assert [f["suggested"] for f in d["findings"]
            if f["status"] in ("warning", "critical") and f["flag"] == step["flag"]] == [256, 256]


def test_dissenting_finding_carries_the_plans_value_and_says_why() -> None:
    """decode_oom lowers --max-running-requests, running_capped would raise it: one value on both."""
    signals = {Rank(): {"oom_decode_count": 1.0, "running_capped_ratio": 0.9, "decode_samples": 100.0,
                        "running_max": 256.0, "token_usage_mean": 0.5, "window_span_s": 600.0}}
    server = ServerState("0.5.23", {"max_running_requests": 256})
    findings = evaluate(TABLE, signals, server)
    fired = {f.check: f for f in findings if f.status in ("warning", "critical")}
    assert {"decode_oom", "running_capped"} <= set(fired)
    assert fired["decode_oom"].suggested == fired["running_capped"].suggested == 192
    assert "judge it again" in fired["running_capped"].evidence


def test_plan_text_comes_from_the_active_profile_and_never_says_question_mark() -> None:
    """The queue step's `then` names the active profile's band (older-md: 50-500, not docs-2025's 100-2000);
    a step without a value says what is missing and what would give it; an unknown current value is said."""
    findings = evaluate(TABLE, {Rank(): {"queue_empty_ratio": 0.9, "queue_samples": 100.0,
                                         "cuda_graph_miss_ratio": 0.0, "graph_samples": 100.0}},
                        ServerState(), profile="older-md")
    d = findings_document(findings=findings, signals={}, server=ServerState(), profile="older-md", workload=None,
                          table=TABLE)
    step = next(s for s in d["plan"] if s["checks"] == ["queue_empty"])
    assert "between 50 and 500 (the older-md band)" in step["then"] and "2000" not in step["then"], step["then"]
    oom = evaluate(TABLE, {Rank(): {"oom_decode_count": 1.0, "window_span_s": 600.0}}, ServerState())
    plan = build_plan(TABLE, oom, {})
    cut = next(s for s in plan if s["flag"] == "--max-running-requests")
    assert cut["to"] is None and "No value computed: neither the cap nor the batch size is known" in cut["why"]
    text = plan_step_text(cut)
    assert "?" not in text and "current not in the input" in text and "to measure" in text, text
