"""The guide's "High latency" section as checks (issue 25): each reads SGLang's latency histograms through the
window's signals and names its flag, with a value from what was seen."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.lookups import all_alerts
from sglang_tuning_exporter.core.model import Finding, Rank, ServerState
from sglang_tuning_exporter.guide.advisor import evaluate, statuses
from sglang_tuning_exporter.guide.checks import load_table
from sglang_tuning_exporter.guide.config import Config, ConfigError, parse_config
from sglang_tuning_exporter.pipeline.signals import SIGNAL_NAMES, share_server_latency
from sglang_tuning_exporter.render.command import apply_config
from sglang_tuning_exporter.render.options import RenderOptions
from sglang_tuning_exporter.render.rules import rule_groups

TABLE = load_table()
SERVER = ServerState(version="0.5.23", args={"max_running_requests": 256, "chunked_prefill_size": 4096})


def scheduler(**values: float | None) -> dict[str, float | None]:
    base: dict[str, float | None] = dict.fromkeys(SIGNAL_NAMES)
    base.update({"decode_samples": 50.0, "queue_samples": 50.0, "kv_samples": 50.0, "window_span_s": 600.0,
                 "decode_batch_p90": 200.0, "running_max": 220.0, "queue_p50": 10.0, "queue_time_requests": 400.0,
                 "queue_time_p50_seconds": 0.05})
    base.update(values)
    return base


def server(**values: float | None) -> dict[str, float | None]:
    base: dict[str, float | None] = {"ttft_requests": 400.0, "itl_requests": 9000.0, "e2e_requests": 400.0,
                                     "ttft_p95_seconds": 0.5, "itl_p95_seconds": 0.03, "e2e_p50_seconds": 4.0}
    base.update(values)
    return base


def findings(sched: dict[str, float | None], srv: dict[str, float | None]) -> dict[str, Finding]:
    by_rank = {Rank(pp=0): sched, Rank(): srv}
    share_server_latency(by_rank)
    return {f.check: f for f in evaluate(TABLE, by_rank, SERVER) if f.rank == {"pp": 0}}


def test_scheduler_ranks_take_the_servers_latency() -> None:
    """TTFT/ITL/E2E have no scheduler rank: each rank takes the server's, then the queue share is derived."""
    by_rank = {Rank(pp=0): scheduler(queue_time_p50_seconds=3.0), Rank(): server()}
    share_server_latency(by_rank)
    assert by_rank[Rank(pp=0)]["ttft_p95_seconds"] == 0.5
    assert by_rank[Rank(pp=0)]["queue_time_share"] == 0.75
    assert by_rank[Rank(pp=0)]["servers_for_queue"] == 2.0  # (200 running + 10 queued) / 200 -> 2


def test_slow_tokens_with_a_large_batch_lower_max_running_requests() -> None:
    f = findings(scheduler(), server(itl_p95_seconds=0.3))["latency_high_batch_large"]
    assert (f.status, f.flag, f.action, f.suggested) == ("critical", "--max-running-requests", "decrease", 160)


def test_slow_tokens_with_a_small_batch_are_not_the_batchs_fault() -> None:
    f = findings(scheduler(decode_batch_p90=32.0), server(itl_p95_seconds=0.3))["latency_high_batch_large"]
    assert f.status == "ok"


def test_queue_dominated_latency_is_the_clients_with_the_servers_it_implies() -> None:
    f = findings(scheduler(queue_time_p50_seconds=3.6, queue_p50=600.0), server())["latency_queue_dominates"]
    assert f.status == "critical" and f.action.startswith("reduce the submission rate")
    assert "about 4 servers" in f.evidence  # (200 + 600) / 200


def test_slow_first_tokens_with_long_prompts_raise_chunked_prefill_size() -> None:
    fs = findings(scheduler(prefill_tokens=400.0 * 6000), server(ttft_p95_seconds=6.0))
    f = fs["ttft_long_prompts"]
    assert (f.status, f.flag, f.action, f.suggested) == ("critical", "--chunked-prefill-size", "increase", 8192)
    short = findings(scheduler(prefill_tokens=400.0 * 300), server(ttft_p95_seconds=6.0))["ttft_long_prompts"]
    assert short.status == "ok"


def test_log_only_latency_checks_are_unknown() -> None:
    """No histogram (a log, diagnose): the latency checks are unknown, never ok."""
    by_rank = {Rank(pp=0): scheduler(queue_time_requests=None, queue_time_p50_seconds=None)}
    share_server_latency(by_rank)
    fs = {f.check: f for f in evaluate(TABLE, by_rank, SERVER)}
    for check in ("latency_high_batch_large", "latency_queue_dominates", "ttft_long_prompts"):
        assert fs[check].status == "unknown", check


def test_a_config_moves_the_latency_guards_for_the_advisor_and_the_rules(tmp_path: Path) -> None:
    """The guards (64 batch, 0.5 s queue time, 2048 prompt tokens) are ours, not the guide's: a config's
    `checks.<id>.guard` moves them, for the advisor and the rendered rules alike; a wrong one is refused."""
    cfg = parse_config({"checks": {"ttft_long_prompts": {"guard": {"prefill_tokens_per_request": 8192}}}}, TABLE)
    by_rank = {Rank(pp=0): scheduler(prefill_tokens=400.0 * 6000), Rank(): server(ttft_p95_seconds=6.0)}
    share_server_latency(by_rank)
    def status(config: Config | None) -> str:
        return {f.check: f for f in evaluate(TABLE, by_rank, SERVER, config=config)
                if f.rank == {"pp": 0}}["ttft_long_prompts"].status
    assert (status(None), status(cfg)) == ("critical", "ok")  # 6000 tokens a request: long under 2048, not 8192
    assert statuses(TABLE, by_rank, SERVER, config=cfg)[Rank(pp=0)]["ttft_long_prompts"] == "ok"
    path = tmp_path / "c.yaml"
    path.write_text("checks: {latency_high_batch_large: {guard: {decode_batch_p90: 128}}}\n", encoding="utf-8")
    table, opts = apply_config(TABLE, str(path), RenderOptions())
    rules = {(r["alert"], r["labels"]["source"]): r["expr"] for r in all_alerts(table, opts)}
    assert 'signal="decode_batch_p90"} >= 128)' in rules[("SGLangLatencyHighBatchLarge", "exporter")]
    native = [r["expr"] for g in rule_groups(table, opts) for r in g["rules"]
              if r.get("record") == "rank:sglang_itl_p95_seconds:over10m"]
    assert native and ">= 128)" in native[0] and ">= 64)" not in native[0]
    with pytest.raises(ConfigError) as e:
        parse_config({"checks": {"ttft_long_prompts": {"guard": {"decode_batch_p90": 1, "prefill_tokens_per_request": "x"}}}},
                     TABLE)
    assert any("not a guard of this check" in p for p in e.value.problems)
    assert any("must be a finite number" in p for p in e.value.problems)
