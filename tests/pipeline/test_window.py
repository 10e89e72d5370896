"""The window's hand-over: what a window filled over one range of a log gives the window merging the ranges."""

from __future__ import annotations

from sglang_tuning_exporter.core.model import Observation, Rank, Sample
from sglang_tuning_exporter.pipeline.window import Window


def _sample(t: float, rank: Rank, queue: float | None = 5.0) -> Sample:
    return Sample(t, rank, False, queue, 100.0, 0.8, 50.0, 1000.0, 1.0, "log", None, None)


def test_hand_over_commits_pending_and_carries_spans_and_dedup_state() -> None:
    w = Window(600.0, resolution_s=60.0)
    tp0, tp1 = Rank(dp=1, tp=0), Rank(dp=1, tp=1)
    w.add_items([_sample(10.0, tp0), _sample(70.0, tp0), _sample(75.0, tp0, queue=None),  # the last is pending
                 Observation(80.0, "retraction", 2.0, tp0, "log"), Observation(80.0, "retraction", 2.0, tp1, "log")])
    (part,) = w.hand_over()
    assert part.rank == Rank(dp=1)  # TP ranks folded
    assert (part.first_seen, part.last_seen) == (10.0, 80.0)
    assert [s for s, _ in part.buckets] == [0.0, 60.0]
    assert sum(b.decode.running_n for _, b in part.buckets) == 3  # the pending sample committed
    assert part.buckets[1][1].retractions == 1  # printed by both TP ranks: once
    assert part.event_keys["retraction"] == (80.0, 2.0, frozenset({0, 1}))

    expected = w.signals(100.0)
    merged = Window(600.0, resolution_s=60.0)
    for start, b in part.buckets:
        merged.add_bucket(part.rank, start, b, first=part.first_seen, last=part.last_seen)
    merged.carry_event_key(part.rank, "retraction", part.event_keys["retraction"])
    merged.add(Observation(80.0, "retraction", 2.0, Rank(dp=1, tp=2), "log"))  # another print of that event
    got = merged.signals(100.0)
    assert got == expected and got[Rank(dp=1)]["decode_samples"] == 3


def test_late_data_joins_its_bucket_or_takes_its_place_in_order() -> None:
    """Data older than the newest bucket (diagnose's ranges add retractions after their lines) lands in
    its own bucket, found or inserted in time order."""
    w = Window(600.0, resolution_s=60.0)
    rank = Rank(dp=0)
    w.add_items([_sample(t, rank) for t in (10.0, 130.0, 250.0, 370.0)])
    w.add_items([Observation(t, "retraction", 1.0, rank, "log") for t in (135.0, 70.0, 15.0, 300.0, 380.0)])
    (part,) = w.hand_over()
    assert [(s, b.decode.running_n, b.retractions) for s, b in part.buckets] == [
        (0.0, 1, 1), (60.0, 0, 1), (120.0, 1, 1), (240.0, 1, 0), (300.0, 0, 1), (360.0, 1, 1)]
