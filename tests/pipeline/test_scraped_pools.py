"""A scrape's hybrid-pool gauges give the observations of the Decode line holding the same values
(observations.pool_pairs), and a window counts each rank's samples once when the log and the scrape both
give them (docs/signals.md, "Hybrid pools")."""

from __future__ import annotations

from sglang_tuning_exporter.core.model import Observation, Rank
from sglang_tuning_exporter.pipeline.observations import EventConverter, scraped_pool_pairs
from sglang_tuning_exporter.pipeline.window import Window
from sglang_tuning_exporter.sources.logreader import EventReader

RANK = Rank()  # as the sidecar lands both sources (size-1 dimensions dropped)
LINE = ("[2026-11-28 10:00:{s:02d}] Decode batch, #running-req: 6, #full token: 60000, full token usage: {full:.2f}, "
        "mamba num: {num}, mamba usage: {mamba:.2f}, cuda graph: True, gen throughput (token/s): 310.00, "
        "#queue-req: {queue}")
T0 = 1_795_860_000.0  # 2026-11-28 10:00:00 UTC


def _scrape(t: float, full: float, mamba: float, num: float, queue: float, rank: Rank = RANK) -> list[Observation]:
    values = {"full_token_usage": full, "mamba_usage": mamba, "mamba_num": num, "num_queue_reqs": queue,
              "num_running_reqs": 6.0, "token_usage": max(full, mamba)}
    return [Observation(t, name, v, rank, "metrics") for name, v in values.items()]


def _log(window: Window, lines: list[str]) -> None:
    reader, conv = EventReader(), EventConverter()
    for line in lines:
        for o in conv.convert_all(reader.feed(line)):
            window.add(o)


def _pools(obs: list[Observation]) -> dict[str, float]:
    return {o.name: o.value for o in obs if o.name not in ("num_queue_reqs", "num_running_reqs", "token_usage")}


def test_a_scrape_gives_the_pool_observations_of_the_same_decode_line() -> None:
    for full, mamba, num, queue in ((0.35, 0.98, 196, 40), (0.95, 0.98, 196, 40), (0.35, 0.50, 100, 40),
                                    (0.35, 0.98, 196, 0), (0.35, 0.01, 2, 3)):
        reader, conv = EventReader(), EventConverter()
        logged = [o for o in conv.convert_all(reader.feed(LINE.format(s=0, full=full, num=num, mamba=mamba,
                                                                         queue=queue)))
                  if o.name in ("pool_samples", "full_samples", "full_usage_sum", "mamba_bound", "mamba_num_sum", "mamba_usage_sum")]
        assert logged, (full, mamba)
        assert _pools(scraped_pool_pairs(_scrape(T0, full, mamba, num, queue))) == {o.name: o.value for o in logged}


def test_pool_gauges_without_the_ranks_queue_give_nothing() -> None:
    """As a Decode line without #queue-req: the rule needs the queue of the same rank."""
    obs = [o for o in _scrape(T0, 0.35, 0.98, 196, 40) if o.name != "num_queue_reqs"]
    other = Observation(T0, "num_queue_reqs", 40.0, Rank(pp=1, tp=0), "metrics")
    assert _pools(scraped_pool_pairs([*obs, other])) == {}


def test_metrics_only_window_reads_the_scraped_pools() -> None:
    w = Window(600.0)
    for i in range(20):
        for o in scraped_pool_pairs(_scrape(T0 + 15 * i, 0.35, 0.98 if i % 2 else 0.50, 196 if i % 2 else 100, 40)):
            w.add(o)
    sig = w.signals(T0 + 15 * 19)[RANK]
    assert sig["pool_samples"] == 20.0
    assert sig["mamba_bound_ratio"] == 0.5
    assert sig["full_usage_mean"] == 0.35
    assert sig["mamba_cache_size_seen"] == 200.0


def test_log_and_scrape_of_one_rank_count_each_sample_once() -> None:
    """Both sources running: the log's Decode lines are the rank's pool samples, the scrapes' are not added
    (they would count the same batches twice, at another rate); with no log pool sample left in the window the
    scrapes' take over."""
    w = Window(600.0)
    # 30 Decode lines (2 s apart): the mamba pool binds in 10 of them; the scrapes say it binds always.
    _log(w, [LINE.format(s=2 * i, full=0.35, num=196 if i < 10 else 100, mamba=0.98 if i < 10 else 0.50, queue=40)
             for i in range(30)])
    for i in range(4):
        for o in scraped_pool_pairs(_scrape(T0 + 15 * i, 0.35, 0.98, 196, 40)):
            w.add(o)
    sig = w.signals(T0 + 60)[RANK]
    assert sig["pool_samples"] == 30.0
    assert sig["mamba_bound_ratio"] == 10 / 30
    later = T0 + 700.0  # the log's lines have left the window; the log is silent, the scrapes go on
    for i in range(5):
        for o in scraped_pool_pairs(_scrape(later - 60 + 15 * i, 0.35, 0.98, 196, 40)):
            w.add(o)
    sig = w.signals(later)[RANK]
    assert sig["pool_samples"] == 5.0
    assert sig["mamba_bound_ratio"] == 1.0


def test_scrapes_without_the_full_gauge_leave_full_usage_unknown() -> None:
    """Before 0.5.10 SGLang exports no sglang:full_token_usage: the mean is unknown (as the fleet report's
    avg_over_time of the missing gauge), never 0."""
    w = Window(600.0)
    for i in range(20):
        obs = [o for o in _scrape(T0 + 15 * i, 0.35, 0.98, 196, 40) if o.name != "full_token_usage"]
        for o in scraped_pool_pairs(obs):
            w.add(o)
    sig = w.signals(T0 + 15 * 19)[RANK]
    assert sig["pool_samples"] == 20.0 and sig["mamba_bound_ratio"] == 1.0
    assert sig.get("full_usage_mean") is None, sig.get("full_usage_mean")
