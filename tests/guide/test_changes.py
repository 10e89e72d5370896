"""Issue 16: a verdict before and after every flag change (changes.py, diagnose over restarts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import change_logs
from helpers.runners import diagnose_json, diagnose_run
from sglang_tuning_exporter.guide.changes import (
    Section,
    WindowSummary,
    compare_sections,
    detect,
    judge,
    watched_checks,
)
from sglang_tuning_exporter.guide.checks import TableError, load_table, parse_table

TABLE = load_table()
FIX = change_logs.FIXTURES


@pytest.mark.parametrize("name", sorted(change_logs.ALL))
def test_recorded_fixtures_are_what_the_writer_writes(name: str) -> None:
    assert (FIX / f"{name}.log").read_text(encoding="utf-8") == change_logs.ALL[name](), \
        "run `cd tests && python3 -m helpers.change_logs` to record again"


def test_improved() -> None:
    (c,) = diagnose_json(FIX / "improved.log")["changes"]
    assert (c["flag"], c["from"], c["to"], c["source"], c["verdict"]) == (
        "--schedule-conservativeness", 1.0, 1.3, "log", "improved")
    assert c["checks"]["retractions_frequent"] == {"before": "critical", "after": "ok"}
    assert c["before"]["signals"]["retractions_per_minute"] > 4 and c["after"]["signals"]["retractions_per_minute"] == 0
    assert c["at"] == "2025-03-01T10:33:00Z"
    assert c["before"]["end"] <= c["at"] <= c["after"]["start"]
    assert "comparable load" in c["why"] and "retractions_per_minute" in c["why"]


def test_worse_through_an_oom_names_the_value_to_go_back_to() -> None:
    (c,) = diagnose_json(FIX / "worse_oom.log")["changes"]
    assert (c["flag"], c["from"], c["to"], c["verdict"]) == ("--mem-fraction-static", 0.85, 0.93, "worse")
    assert c["checks"]["decode_oom"] == {"before": "ok", "after": "critical"}
    assert "out-of-memory" in c["why"] and "go back to --mem-fraction-static 0.85" in c["why"]


def test_no_change() -> None:
    (c,) = diagnose_json(FIX / "no_change.log")["changes"]
    assert (c["flag"], c["from"], c["to"], c["verdict"]) == ("--chunked-prefill-size", 8192, 4096, "no_change")
    # The latency checks naming the flag read SGLang's histograms: a log leaves them unknown on both sides.
    latency = {"ttft_long_prompts", "latency_high_batch_large"}
    assert all(v == {"before": "ok", "after": "ok"} for k, v in c["checks"].items() if k not in latency)
    assert all(c["checks"][k] == {"before": "unknown", "after": "unknown"} for k in latency & set(c["checks"]))


def test_inconclusive_when_too_little_traffic_after() -> None:
    (c,) = diagnose_json(FIX / "inconclusive.log")["changes"]
    assert c["verdict"] == "inconclusive"
    assert c["why"].startswith("too little traffic after the change")
    assert c["checks"]["retractions_frequent"] == {"before": "critical", "after": "unknown"}


def test_restart_with_identical_args_has_no_change_entry() -> None:
    assert diagnose_json(FIX / "same_args.log")["changes"] == []


def test_a_log_without_restart_has_no_changes_key(tmp_path: Path) -> None:
    one = tmp_path / "one.log"
    text = (FIX / "improved.log").read_text(encoding="utf-8")
    one.write_text(text[:text.rindex("server_args=")].rsplit("\n", 1)[0] + "\n", encoding="utf-8")
    assert "changes" not in diagnose_json(one)


def test_several_files_of_one_server_in_time_order(tmp_path: Path) -> None:
    text = (FIX / "improved.log").read_text(encoding="utf-8")
    cut = text.rfind("\n", 0, text.rindex("server_args=")) + 1
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text(text[:cut], encoding="utf-8")
    b.write_text(text[cut:], encoding="utf-8")
    doc = diagnose_json(a, b, same_server=True)
    assert [d["source"] for d in doc["sources"]] == [str(a), str(b)]
    (c,) = doc["changes"]
    assert (c["flag"], c["verdict"]) == ("--schedule-conservativeness", "improved")
    assert "changes" not in diagnose_json(a, b)  # without --same-server the files are separate servers


def test_text_and_markdown_sections() -> None:
    for fmt, head in (("text", "== changes"), ("markdown", "## Changes"), ("html", "<h2>Changes</h2>")):
        code, body, _ = diagnose_run([str(FIX / "worse_oom.log"), "--format", fmt])
        assert code == 0
        assert head in body and "--mem-fraction-static" in body and "worse" in body.lower(), fmt


# --- the pure judgement -------------------------------------------------------------------------
def win(t: float, *, running: float = 300, queue: float = 150, samples: float = 120,
        statuses: dict[str, str] | None = None, **signals: float) -> WindowSummary:
    sig: dict[str, float | None] = {"decode_samples": samples, "decode_batch_p90": running, "queue_p50": queue,
                                    "gen_throughput_mean": 4000.0, **signals}
    return WindowSummary(t, t + 600, sig, statuses or {})


def test_trade_off_made_worse_is_worse() -> None:
    before = [win(i * 600, statuses={"retractions_frequent": "critical", "kv_underused": "ok"},
                  retractions_per_minute=6.0, kv_underused_ratio=0.0) for i in range(3)]
    after = [win(3600 + i * 600, statuses={"retractions_frequent": "ok", "kv_underused": "warning"},
                 retractions_per_minute=0.1, kv_underused_ratio=0.7) for i in range(3)]
    v = judge("--schedule-conservativeness", 1.0, 1.6, before, after, TABLE)
    assert v.verdict == "worse"
    assert "retractions_frequent critical -> ok" in v.why and "but kv_underused ok -> warning" in v.why
    assert v.why.endswith("go back to --schedule-conservativeness 1.0")


def test_load_not_comparable_is_inconclusive() -> None:
    before = [win(i * 600, running=300, queue=150, statuses={"retractions_frequent": "critical"}) for i in range(3)]
    after = [win(3600 + i * 600, running=40, queue=0, statuses={"retractions_frequent": "ok"}) for i in range(3)]
    v = judge("--schedule-conservativeness", 1.0, 1.3, before, after, TABLE)
    assert v.verdict == "inconclusive" and "load not comparable" in v.why


def test_only_windows_at_matching_load_are_compared() -> None:
    before = [win(0, running=300, queue=150, statuses={"retractions_frequent": "critical"}),
              win(600, running=20, queue=0, statuses={"retractions_frequent": "ok"})]
    after = [win(3600, running=20, queue=0, statuses={"retractions_frequent": "ok"}),
             win(4200, running=300, queue=160, statuses={"retractions_frequent": "ok"})]
    v = judge("--schedule-conservativeness", 1.0, 1.3, before, after, TABLE)
    assert [w.start for w in v.before.windows] == [0] and [w.start for w in v.after.windows] == [4200]
    assert v.verdict == "improved"


def test_oom_after_a_non_memory_flag_is_not_an_automatic_worse() -> None:
    before = [win(0, statuses={"schedule_policy_lpm_no_reuse": "warning"})]
    after = [win(3600, statuses={"schedule_policy_lpm_no_reuse": "ok"}, oom_decode_count=1.0)]
    assert judge("--schedule-policy", "lpm", "fcfs", before, after, TABLE).verdict == "improved"


def test_detect_only_tracked_changed_flags() -> None:
    old = {"schedule_conservativeness": 1.0, "port": 30000, "mem_fraction_static": 0.8, "tp_size": 1}
    new = {"schedule_conservativeness": 1, "port": 30001, "mem_fraction_static": 0.88, "tp_size": 2,
           "chunked_prefill_size": 4096}
    assert detect(old, new, TABLE) == [("--mem-fraction-static", 0.8, 0.88), ("--tp-size", 1, 2)]


def test_watched_checks_are_the_naming_checks_and_their_trade_offs() -> None:
    w = watched_checks(TABLE, "--schedule-conservativeness")
    assert w[:2] == ["kv_underused", "retractions_frequent"] and "running_capped" in w
    assert len(watched_checks(TABLE, "--tp-size")) == len(TABLE.checks)  # no check names it: all of them


def test_compare_sections_one_entry_per_changed_flag() -> None:
    a = Section(0.0, {"mem_fraction_static": 0.8, "chunked_prefill_size": 8192}, (win(0),))
    b = Section(1200.0, {"mem_fraction_static": 0.85, "chunked_prefill_size": 4096}, (win(1200),))
    flags = [c["flag"] for c in compare_sections([a, b], TABLE)]
    assert flags == ["--chunked-prefill-size", "--mem-fraction-static"]


def test_hurts_must_name_known_checks() -> None:
    import yaml

    from sglang_tuning_exporter.guide.checks import default_path
    raw = yaml.safe_load(default_path().read_text(encoding="utf-8"))
    raw["checks"][0]["hurts"] = ["no_such_check"]
    with pytest.raises(TableError, match="hurts names unknown check 'no_such_check'"):
        parse_table(raw)


def test_detect_compares_numbers_however_they_are_spelt() -> None:
    """1, 1.0 and "1" are one value (server args from the log, server info and a config file spell them
    differently); a real change, or a word, is still a change."""
    same = detect({"schedule_conservativeness": 1, "mem_fraction_static": "0.85"},
                  {"schedule_conservativeness": "1.0", "mem_fraction_static": 0.85}, TABLE)
    assert same == []
    moved = detect({"schedule_conservativeness": "1", "schedule_policy": "lpm"},
                   {"schedule_conservativeness": 1.3, "schedule_policy": "fcfs"}, TABLE)
    assert moved == [("--schedule-conservativeness", "1", 1.3), ("--schedule-policy", "lpm", "fcfs")]


def test_a_flag_value_is_spelt_alike_in_every_output() -> None:
    """A boolean or whole-number change reads the same in the last-change line, diagnose's changes
    section and the plan (guide/plan.value_text): `false -> true`, `8192`, never `False` or `8192.0`."""
    from sglang_tuning_exporter.guide.changes import last_change_text
    from sglang_tuning_exporter.guide.plan import plan_step_values
    from sglang_tuning_exporter.offline.changes import text_section

    note = {"flag": "--enable-torch-compile", "from": False, "to": True, "at": "2025-03-01T10:33:00Z",
            "verdict": "improved", "why": "faster", "then": "watch", "checks": {}}
    assert "--enable-torch-compile false -> true at" in last_change_text(note)
    assert "--enable-torch-compile false -> true: IMPROVED" in text_section([note])
    assert plan_step_values({"current": False, "to": True}) == ("false", "true")
    big = {**note, "flag": "--chunked-prefill-size", "from": 8192.0, "to": 4096}
    assert "--chunked-prefill-size 8192 -> 4096" in last_change_text(big) and "8192 -> 4096" in text_section([big])


# --- latency guard (issue 25) --------------------------------------------------------------------
def _conservativeness(ttft_after: float, itl_after: float = 0.02, tput_after: float = 4480.0,
                      latency: bool = True) -> tuple[list[WindowSummary], list[WindowSummary]]:
    lat_b = {"ttft_p95_seconds": 0.8, "itl_p95_seconds": 0.02} if latency else {}
    lat_a = {"ttft_p95_seconds": ttft_after, "itl_p95_seconds": itl_after} if latency else {}
    before = [win(i * 600, statuses={"retractions_frequent": "critical"}, retractions_per_minute=6.0, **lat_b)
              for i in range(3)]
    after = [WindowSummary(3600 + i * 600, 4200 + i * 600,
                           {**win(0, retractions_per_minute=0.1, **lat_a).signals, "gen_throughput_mean": tput_after},
                           {"retractions_frequent": "ok"}) for i in range(3)]
    return before, after


def test_fewer_retractions_but_doubled_ttft_is_worse_and_says_the_trade() -> None:
    """The issue's case: retractions fell, p95 TTFT doubled at comparable load -> worse, with the trade."""
    before, after = _conservativeness(ttft_after=1.6)
    v = judge("--schedule-conservativeness", 1.0, 1.3, before, after, TABLE)
    assert v.verdict == "worse"
    assert "retractions_frequent critical -> ok" in v.why
    assert "throughput +12 %, p95 TTFT 0.8 s -> 1.6 s (+100 %)" in v.why
    assert v.why.endswith("go back to --schedule-conservativeness 1.0")
    assert v.after.signals["ttft_p95_seconds"] == 1.6 and v.before.signals["ttft_p95_seconds"] == 0.8


def test_latency_within_the_margin_keeps_the_improvement() -> None:
    """p95 TTFT +20 % (under the 25 % margin) and ITL unchanged: the fall in retractions is an improvement."""
    before, after = _conservativeness(ttft_after=0.96)
    v = judge("--schedule-conservativeness", 1.0, 1.3, before, after, TABLE)
    assert v.verdict == "improved" and "latency not seen" not in v.why


def test_itl_regression_alone_is_worse() -> None:
    before, after = _conservativeness(ttft_after=0.8, itl_after=0.05)
    v = judge("--schedule-conservativeness", 1.0, 1.3, before, after, TABLE)
    assert v.verdict == "worse" and "p95 ITL 0.02 s -> 0.05 s (+150 %)" in v.why


def test_log_only_verdict_says_latency_was_not_seen() -> None:
    """diagnose reads no histogram: an improvement says that latency was not part of it."""
    before, after = _conservativeness(ttft_after=0.0, latency=False)
    v = judge("--schedule-conservativeness", 1.0, 1.3, before, after, TABLE)
    assert v.verdict == "improved" and "latency not seen" in v.why
    (c,) = diagnose_json(FIX / "improved.log")["changes"]
    assert c["verdict"] == "improved" and "latency not seen" in c["why"]
