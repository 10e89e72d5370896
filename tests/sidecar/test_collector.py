"""Tests for the live state and the custom collector: catalog conformance, counters, rank bounds."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from helpers.lookups import quantile
from helpers.paths import ROOT
from helpers.runners import get, replay
from helpers.scenario_logs import LogWriter
from sglang_tuning_exporter.core.catalog import BY_NAME, CATALOG, DEPRECATED, PROCESS_METRICS, SIGNAL_UNITS
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.core.model import Finding, Observation, Rank
from sglang_tuning_exporter.pipeline.signals import SIGNAL_NAMES
from sglang_tuning_exporter.pipeline.stats import hist_quantile
from sglang_tuning_exporter.sidecar.collector import (
    BuildInfo,
    TuningCollector,
    build_families,
    catalog_markdown,
    encode_text,
    format_value,
    make_registry,
)
from sglang_tuning_exporter.sidecar.state import LiveState

BUILD = BuildInfo("0.0.0-test", "3.11")
R0, R1 = Rank(dp=0, tp=0), Rank(dp=1, tp=0)


def _state(**kw: int) -> LiveState:
    return LiveState(window_s=600, max_ranks=kw.get("max_ranks", 8), expire_after_s=kw.get("expire", 60),
                     enabled={"log": True, "metrics": True, "server_info": True})


def _full_state() -> LiveState:
    st = _state()
    st.set_server(version="0.5.23", model_name="Qwen/Qwen2.5-7B-Instruct",
                  args={"mem_fraction_static": 0.85, "schedule_policy": "fcfs", "disable_cuda_graph": False},
                  endpoint="/server_info")
    st.add_events([Event(1, "decode", rank={"dp": 0, "tp": 0}, fields={"num_running_reqs": 300, "cuda_graph": False}),
                   Event(2, "decode", rank={"dp": 0, "tp": 0}, fields={"num_running_reqs": 10, "cuda_graph": True}),
                   Event(3, "decode", rank={"dp": 1, "tp": 0}, fields={"num_running_reqs": 10}),
                   Event(4, "retract", rank={"dp": 0, "tp": 0}, fields={"num_retracted_reqs": 3}),
                   Event(5, "prefill", rank={"dp": 0, "tp": 0}, fields={"num_new_tokens": 800, "num_cached_tokens": 200}),
                   Event(6, "oom", fields={"phase": "prefill", "message": "x"})], now=10.0)
    st.add_observations([Observation(10.0, "num_queue_reqs", 5, R0), Observation(10.0, "token_usage", 0.5, R0),
                         Observation(10.0, "available_gpu_mem_gb", 6.84, R0),
                         Observation(10.0, "retraction", 2, R1, "metrics")], now=10.0)
    st.count_log_lines(10, {"decode": 3, "retract": 1, "prefill": 1, "oom": 1}, now=10.0)
    st.set_log_totals(unparsed=1, rotations=0, truncations=0)
    st.record_source("log", ok=True, duration_s=0.001, now=10.0)
    st.record_source("metrics", ok=True, duration_s=0.002, now=10.0)
    st.record_source("server_info", ok=True, duration_s=0.003, now=10.0)
    st.record_scrape(garbage_lines=2, samples=300, model_name="ignored-when-server-named", restarted=False)
    st.set_evaluation(signals={R0: {"queue_empty_ratio": 0.25, "unknown_one": None}},
                      findings=[Finding("kv_underused", "warning", {"dp": 0, "tp": 0}, "--schedule-conservativeness",
                                        "decrease", 1.0, 0.7, "KV cache underused", "usage 0.5 while queue 5"),
                                Finding("queue_empty", "ok", {"dp": 0, "tp": 0}, None, "client", None, None, "", "")],
                      document=None, now=10.0)
    return st


def _samples(st: LiveState, now: float = 10.0) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = generate_latest(make_registry(TuningCollector(lambda: st.snapshot(now), BUILD))).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _rank0(**extra: str) -> frozenset[tuple[str, str]]:
    base = {"model_name": "Qwen/Qwen2.5-7B-Instruct", "dp_rank": "0", "pp_rank": "", "tp_rank": "0",
            "moe_ep_rank": ""}
    return frozenset({**base, **extra}.items())


def test_every_emitted_family_is_in_the_catalog_with_its_type_and_labels() -> None:
    """The collector emits only catalog metrics, with the catalog's type and label names."""
    fams = build_families(_full_state().snapshot(10.0), BUILD)
    assert len(fams) > 20
    for fam in fams:
        suffix = {"counter": "_total", "info": "_info"}.get(fam.type, "")
        spec = BY_NAME[fam.name + suffix]
        assert spec.type == fam.type
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            assert set(s.labels) == set(spec.labels), (fam.name, s.labels)


def test_values_come_from_the_state() -> None:
    """Spot values: per-rank gauges, counters by label, unit conversion, check status, suggestions."""
    got = _samples(_full_state())
    assert got[("sglang_tuning_queue_requests", _rank0())] == 5.0
    assert got[("sglang_tuning_decode_samples_total", _rank0(cuda_graph="false"))] == 1.0
    assert got[("sglang_tuning_retracted_requests_total", _rank0())] == 3.0
    assert got[("sglang_tuning_prefill_tokens_total", _rank0(source="cached"))] == 200.0
    assert got[("sglang_tuning_available_gpu_memory_bytes", _rank0())] == 6.84 * 2**30
    assert got[("sglang_tuning_check_level", _rank0(check="kv_underused"))] == 1.0
    assert got[("sglang_tuning_check_level", _rank0(check="queue_empty"))] == 0.0
    # deprecated twin: same value, plus the misleading `severity` (highest possible level) label
    assert got[("sglang_tuning_check_status", _rank0(check="kv_underused", severity="warning"))] == 1.0
    assert got[("sglang_tuning_check_status", _rank0(check="queue_empty", severity="warning"))] == 0.0
    flag = "--schedule-conservativeness"
    assert got[("sglang_tuning_suggested_value", _rank0(check="kv_underused", flag=flag))] == 0.7
    assert got[("sglang_tuning_current_value", _rank0(check="kv_underused", flag=flag))] == 1.0
    assert got[("sglang_tuning_signal", _rank0(signal="queue_empty_ratio"))] == 0.25  # deprecated
    assert got[("sglang_tuning_signal_ratio", _rank0(signal="queue_empty_ratio"))] == 0.25
    assert not any("unknown_one" in dict(k[1]).values() for k in got)  # unknown is absent, never NaN
    assert got[("sglang_tuning_server_arg", frozenset({("arg", "mem_fraction_static")}))] == 0.85
    assert got[("sglang_tuning_server_arg", frozenset({("arg", "disable_cuda_graph")}))] == 0.0
    info = {"version": "0.5.23", "model_name": "Qwen/Qwen2.5-7B-Instruct", "schedule_policy": "fcfs"}
    assert got[("sglang_tuning_server_info", frozenset(info.items()))] == 1.0
    rank1 = dict(_rank0())
    rank1["dp_rank"] = "1"
    assert got[("sglang_tuning_retractions_total", frozenset(rank1.items()))] == 1.0
    nowhere = {"model_name": "Qwen/Qwen2.5-7B-Instruct", "dp_rank": "", "pp_rank": "", "tp_rank": "",
               "moe_ep_rank": "", "phase": "prefill"}
    assert got[("sglang_tuning_oom_events_total", frozenset(nowhere.items()))] == 1.0
    assert got[("sglang_tuning_up", frozenset())] == 1.0
    assert got[("sglang_tuning_log_lines_total", frozenset({("kind", "other")}))] == 4.0
    assert got[("sglang_tuning_scrape_garbage_lines_total", frozenset())] == 2.0
    build = frozenset({("python_version", "3.11"), ("version", "0.0.0-test"), ("revision", "unknown")})
    assert got[("sglang_tuning_build_info", build)] == 1.0


def test_ranks_expire_but_counters_stay_monotonic() -> None:
    """An expired rank's series go away; when it returns its counters continue, not restart."""
    st = _state(expire=60)
    st.add_events([Event(1, "retract", rank={"dp": 0}, fields={"num_retracted_reqs": 2})], now=0.0)
    st.add_observations([Observation(0.0, "num_queue_reqs", 7, Rank(dp=0))], now=0.0)
    assert st.expire(30.0) == 0
    assert st.expire(61.0) == 1
    snap = st.snapshot(61.0)
    assert snap.ranks == () and snap.ranks_expired == 1
    st.add_events([Event(2, "retract", rank={"dp": 0}, fields={"num_retracted_reqs": 1})], now=70.0)
    r = st.snapshot(70.0).ranks[0]
    assert r.counters[("retracted_requests", "")] == 3.0
    assert "num_queue_reqs" not in r.gauges  # the stale gauge did not come back


def test_tracked_ranks_are_bounded() -> None:
    """Beyond --ranks.max the least recently seen rank is dropped and counted."""
    st = _state(max_ranks=3)
    for i in range(5):
        st.add_observations([Observation(float(i), "num_queue_reqs", i, Rank(dp=i))], now=float(i))
    snap = st.snapshot(5.0)
    assert [r.rank.dp for r in snap.ranks] == [2, 3, 4]
    assert snap.ranks_expired == 2


def test_log_totals_never_go_down() -> None:
    """A new reader/follower restarting its counts at 0 cannot make our counters decrease."""
    st = _state()
    st.set_log_totals(unparsed=5, rotations=2, truncations=1)
    st.set_log_totals(unparsed=0, rotations=0, truncations=0)
    snap = st.snapshot(0.0)
    assert (snap.log_unparsed, snap.log_rotations, snap.log_truncations) == (5, 2, 1)


def test_p90_nearest_rank() -> None:
    """p90 of 1..10 is 9; empty is None."""
    assert hist_quantile({i: 1 for i in range(1, 11)}, 0.9) == 9.0  # what batch_p90 uses
    assert hist_quantile({}, 0.9) is None


def test_disabled_sources_say_so() -> None:
    """Logs-only: source_enabled{metrics} 0, no source_up for it, and no `up` (0 would read "SGLang down")."""
    st = LiveState(window_s=60, max_ranks=4, expire_after_s=60, enabled={"log": True})
    got = _samples(st, 0.0)
    assert got[("sglang_tuning_source_enabled", frozenset({("source", "metrics")}))] == 0.0
    assert got[("sglang_tuning_source_enabled", frozenset({("source", "log")}))] == 1.0
    assert ("sglang_tuning_source_up", frozenset({("source", "metrics")})) not in got
    assert ("sglang_tuning_up", frozenset()) not in got


def test_up_is_the_metrics_source() -> None:
    """With --sglang.url: up 1 after a good scrape, 0 after a failed one."""
    st = _state()
    st.record_source("metrics", ok=False, duration_s=0.1, now=1.0)
    assert _samples(st, 1.0)[("sglang_tuning_up", frozenset())] == 0.0
    st.record_source("metrics", ok=True, duration_s=0.1, now=2.0)
    assert _samples(st, 2.0)[("sglang_tuning_up", frozenset())] == 1.0


def test_signals_are_exported_in_their_unit() -> None:
    """GB become bytes, per-minute rates per second, ratios and counts stay; every signal has a unit family."""
    st = _state()
    st.set_evaluation(signals={R0: {"available_gpu_mem_gb": 6.5, "retractions_per_minute": 3.0,
                                    "kv_underused_ratio": 0.4, "queue_p50": 120.0, "gen_throughput_mean": 900.0,
                                    "metrics_enabled": 1.0}}, findings=[], document=None, now=1.0)
    got = _samples(st, 1.0)
    rank = {"model_name": "", "dp_rank": "0", "pp_rank": "", "tp_rank": "0", "moe_ep_rank": ""}

    def value(name: str, signal: str) -> float:
        return got[(name, frozenset({**rank, "signal": signal}.items()))]

    assert value("sglang_tuning_signal_bytes", "available_gpu_mem") == 6.5 * 2**30
    assert value("sglang_tuning_signal_per_second", "retractions") == pytest.approx(0.05)
    assert value("sglang_tuning_signal_ratio", "kv_underused_ratio") == 0.4
    assert value("sglang_tuning_signal_amount", "queue_p50") == 120.0
    assert value("sglang_tuning_signal_tokens_per_second", "gen_throughput_mean") == 900.0
    assert value("sglang_tuning_signal_flag", "metrics_enabled") == 1.0
    assert value("sglang_tuning_signal", "available_gpu_mem_gb") == 6.5  # deprecated: the old unit


def test_every_signal_has_a_unit_family() -> None:
    """A new signal in pipeline/signals.py must say its unit in catalog.SIGNAL_UNITS."""
    assert set(SIGNAL_NAMES) == set(SIGNAL_UNITS)
    for short, _, _ in SIGNAL_UNITS.values():
        assert BY_NAME["sglang_tuning_" + short].labels[-1] == "signal"
    labels = [(short, label) for short, label, _ in SIGNAL_UNITS.values()]
    assert len(labels) == len(set(labels))  # no two signals share a series


def test_deprecated_metrics_say_so() -> None:
    """Each deprecated family's HELP starts with DEPRECATED and names its replacement."""
    for old, new in DEPRECATED.items():
        help_ = BY_NAME[old].help
        assert help_.startswith("DEPRECATED") and new.removesuffix("<unit>") in help_, old


def test_process_and_platform_metrics_are_exposed() -> None:
    """The private registry carries prometheus_client's process (Linux /proc) and platform collectors."""
    text = encode_text(make_registry(TuningCollector(lambda: _state().snapshot(0.0), BUILD)).collect()).decode()
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert {"process_resident_memory_bytes", "process_cpu_seconds_total", "python_info"} <= names
    assert set(PROCESS_METRICS) <= names
    bare = encode_text(make_registry(TuningCollector(lambda: _state().snapshot(0.0), BUILD), process=False).collect())
    assert b"process_" not in bare and b"python_info" not in bare


def test_build_info_carries_the_revision(monkeypatch: pytest.MonkeyPatch) -> None:
    """The revision setup.py recorded in _build.py, or "unknown" when there is none."""
    import sys
    import types

    from sglang_tuning_exporter.sidecar import collector

    fake = types.ModuleType("sglang_tuning_exporter.core._build")
    fake.REVISION = "abc1234"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sglang_tuning_exporter.core._build", fake)
    assert collector.current_build().revision == "abc1234"
    monkeypatch.setitem(sys.modules, "sglang_tuning_exporter.core._build", None)  # import fails
    assert collector.current_build().revision == "unknown"


def test_registering_does_not_collect() -> None:
    """Our registry never calls collect() at registration (describe() is empty)."""
    calls: list[int] = []

    def snap():  # type: ignore[no-untyped-def]
        calls.append(1)
        return _state().snapshot(0.0)

    make_registry(TuningCollector(snap, BUILD))
    assert calls == []


def test_catalog_markdown_lists_every_metric() -> None:
    """The docs table is generated from the catalog: one row per metric."""
    md = catalog_markdown()
    assert all(f"`{m.name}`" in md for m in CATALOG)
    assert md.count("\n") == len(CATALOG) + 2


def test_fast_encoder_matches_generate_latest() -> None:
    """Our /metrics encoder writes exactly what prometheus_client's generate_latest writes."""
    st = _full_state()
    st.set_server(model_name='a "quoted"\\name\nwith newline')
    # Without this process's own metrics: its CPU seconds move between the two encodings.
    reg = make_registry(TuningCollector(lambda: st.snapshot(10.0), BUILD), process=False)
    ours = encode_text(reg.collect()).decode()
    theirs = generate_latest(reg).decode()

    def parsed(text: str) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
        return {(s.name, tuple(sorted(s.labels.items())), s.value)
                for f in text_string_to_metric_families(text) for s in f.samples}

    assert parsed(ours) == parsed(theirs)
    assert len(parsed(ours)) > 40
    assert [ln for ln in ours.splitlines() if ln.startswith("#")] == [
        ln for ln in theirs.splitlines() if ln.startswith("#")]


@pytest.mark.parametrize("value", [0.0, 412.0, 0.93, -1.0, 7344394076.16, 1e-7, 123456789.0, float("inf"),
                                   float("-inf"), float("nan"), 2.0**60])
def test_value_format_is_gos(value: float) -> None:
    """Sample values are formatted like prometheus_client's floatToGoString."""
    from prometheus_client.utils import floatToGoString

    assert format_value(value) == floatToGoString(value)


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_accepts_the_exposition(tmp_path: Path) -> None:
    """`promtool check metrics` lints our output clean."""
    text = encode_text(make_registry(TuningCollector(lambda: _full_state().snapshot(10.0), BUILD)).collect())
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr.decode() + proc.stdout.decode()


def test_evaluation_families_are_reused_until_the_next_evaluation() -> None:
    """Signals and verdicts are rendered once per evaluation; a new evaluation replaces them."""
    st = _full_state()
    coll = TuningCollector(lambda: st.snapshot(10.0), BUILD)
    coll.warm()
    first = {f.name: f for f in coll.collect()}
    again = {f.name: f for f in coll.collect()}
    assert first["sglang_tuning_check_level"] is again["sglang_tuning_check_level"]
    assert first["sglang_tuning_up"] is not again["sglang_tuning_up"]  # the rest is fresh per scrape
    st.set_evaluation(signals={}, findings=[Finding("queue_empty", "critical", {}, None, "client", None, None, "", "")],
                      document=None, now=20.0)
    later = {f.name: f for f in coll.collect()}
    rows = later["sglang_tuning_check_level"].rows  # type: ignore[attr-defined]
    assert [r[2] for r in rows] == [2.0]
    assert "sglang_tuning_signal" not in later and "sglang_tuning_signal_ratio" not in later


def test_docs_metric_table_is_current() -> None:
    """docs/sidecar.md carries the metric table exactly as catalog_markdown() generates it."""
    doc = (ROOT / "docs" / "sidecar.md").read_text()
    assert catalog_markdown() in doc, "regenerate the table in docs/sidecar.md from collector.catalog_markdown()"


def test_event_counters_start_at_zero_for_tracked_ranks() -> None:
    """Before any OOM or retraction a tracked rank exports them at 0, so the first one is an increase."""
    st = _state()
    st.add_observations([Observation(0.0, "num_queue_reqs", 3, R0)], now=0.0)
    got = _samples(st, 0.0)
    for phase in ("prefill", "decode", "startup", "unknown"):
        assert got[("sglang_tuning_oom_events_total", _rank0(phase=phase, model_name=""))] == 0.0
    assert got[("sglang_tuning_retractions_total", _rank0(model_name=""))] == 0.0
    st.add_events([Event(1, "oom", rank={"dp": 0, "tp": 0}, fields={"phase": "prefill"})], now=1.0)
    assert _samples(st, 1.0)[("sglang_tuning_oom_events_total", _rank0(phase="prefill", model_name=""))] == 1.0


def test_batch_size_without_graph_is_the_windows_signal() -> None:
    """`decode_batch_size_without_graph` is the window's cuda_graph_miss_batch_p90, computed once: per
    replica (two TP ranks printing the same batch count once), the p90 of the eager batch sizes."""
    w = LogWriter("0.5.23", tp_size=2)
    eager = [130, 257, 300, 301, 64, 8, 290, 280, 270, 260] * 6
    for i, bs in enumerate(eager):
        for tp in (0, 1):
            w.decode(bs, 0.8, 150, graph=False, dp=0, tp=tp)
            w.decode(16, 0.8, 150, graph=True, dp=0, tp=tp)
        if i % 2:
            w.tick(5)
    sc, app = replay(w.text())
    ((_, values),) = sc.state.snapshot(0.0).signals
    assert values["cuda_graph_miss_batch_p90"] == quantile([float(b) for b in eager], 0.9) == 300.0
    _, body = get(app, "/metrics")
    rows = [line for line in body.splitlines() if line.startswith("sglang_tuning_decode_batch_size_without_graph{")]
    assert len(rows) == 1 and rows[0].endswith(" 300.0") and 'dp_rank="0"' in rows[0], rows
