"""timeparse.event_seconds: the cached fast path for the parser's own stamps equals the general rule
(general_seconds), and the rule gives the expected seconds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.examples import examples
from sglang_tuning_exporter.core.timeparse import event_seconds, general_seconds

stamps = st.builds(
    lambda y, mo, d, h, mi, s, frac, tail: f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}{frac}{tail}",
    st.integers(0, 9999), st.integers(0, 99), st.integers(0, 99), st.integers(0, 99), st.integers(0, 99),
    st.integers(0, 99), st.sampled_from(["", ".5", ".123456", ".", ".x", ".0000001"]),
    st.sampled_from(["", "\n", "Z", " ", "\u0663"]))


@settings(max_examples=examples(600), deadline=None)
@given(st.one_of(stamps, st.text(max_size=30), st.from_regex(r"\d\d:\d\d:\d\d(\.\d+)?", fullmatch=True)))
def test_event_seconds_equals_the_general_rule(time: str) -> None:
    assert event_seconds(time) == general_seconds(time), time


def test_known_values() -> None:
    assert event_seconds("2025-01-12T10:11:12") == 1736676672.0
    assert event_seconds("2025-01-12T10:11:12.250") == 1736676672.25
    assert event_seconds("2025-13-12T10:11:12") is None
    assert event_seconds("10:11:12") == 36672.0
    assert event_seconds(None) is None


def test_log_clock_takes_implausible_stamps_at_their_neighbours_time() -> None:
    """A cut-off year, 1970 and a stamp far back take no time of their own and are counted; three stamps
    in a row that agree on an earlier time are a clock set back: time goes on from the latest."""
    from sglang_tuning_exporter.core.timeparse import BACKWARD_TOLERANCE_S, LogClock

    c = LogClock()
    assert c.take("0025-06-23T18:55:20") is None and c.implausible == 1  # before any stamp
    t0 = c.take("2026-01-01T10:00:00")
    assert t0 is not None
    assert c.take("1970-01-01T00:00:07") is None
    assert c.take("2026-01-01T10:00:05") == t0 + 5
    assert c.take("2026-01-01T09:59:58") == t0 - 2  # a little late: its own time
    assert c.implausible == 2
    back = [c.take(f"2026-01-01T09:00:0{i}") for i in range(3)]  # an hour back: the clock was set back
    assert back[:2] == [None, None] and back[2] == t0 + 5 + 2 and c.jumps == 1  # spacing from the first
    assert c.take("2026-01-01T09:00:10") == t0 + 5 + 10  # the new stamps keep their spacing
    assert BACKWARD_TOLERANCE_S < 3600


def test_log_clock_now_ages_the_latest_stamp_by_the_wall_clock() -> None:
    """Live, the window's now is the latest stamp plus the wall time since it arrived."""
    from sglang_tuning_exporter.core.timeparse import LogClock

    wall = [5000.0]
    c = LogClock(arrival=lambda: wall[0])
    assert c.now(5000.0) == 5000.0  # no stamp yet: the wall clock
    t = c.take("2026-01-01T10:00:00")
    assert t is not None and c.now(5030.0) == t + 30


def _iso(t: float) -> str:
    import time as _t

    return _t.strftime("%Y-%m-%dT%H:%M:%S", _t.gmtime(t))


def test_log_clock_does_not_run_away_on_two_interleaved_hosts() -> None:
    """Two hosts 700 s apart written into one log in runs of 1-5 lines: 20 minutes of log stay about
    20 minutes of log time (the clock moves once, then each host fits its own offset), not days."""
    import random

    from sglang_tuning_exporter.core.timeparse import LogClock

    rnd = random.Random(7)
    base = 1_780_000_000.0
    c = LogClock()
    times: list[float] = []
    elapsed = 0.0
    host = 0
    while elapsed < 1200:
        for _ in range(rnd.randint(1, 5)):
            elapsed += 0.5
            t = c.take(_iso(base + elapsed + 700 * host))
            if t is not None:
                times.append(t)
        host = 1 - host
    span = max(times) - min(times)
    assert span < 1200 + 700 + 60, span  # before: one more 700 s at every run of the other host
    assert c.latest is not None and c.latest - base < 1200 + 1400


def test_log_clock_strict_interleaving_follows_one_host_and_counts_the_other() -> None:
    from sglang_tuning_exporter.core.timeparse import LogClock

    base = 1_780_000_000.0
    c = LogClock()
    got = [(c.take(_iso(base + i)), c.take(_iso(base + 3600 + i))) for i in range(100)]
    assert all(a == base + i for i, (a, _) in enumerate(got))
    c.settle()  # the last one was still held as a possible move of the clock
    assert all(b is None for _, b in got) and c.implausible == 100 and c.jumps == 0


def test_log_clock_ignores_one_far_stamp_either_way() -> None:
    """A line stamped 2099 (or an hour back) among its neighbours is an outlier: counted, the clock stays."""
    from sglang_tuning_exporter.core.timeparse import LogClock

    c = LogClock()
    assert c.take("2026-01-01T10:00:00") is not None
    assert c.take("2099-01-01T10:00:00") is None
    assert c.take("2026-01-01T10:00:01") == c.latest and c.latest is not None
    assert c.take("2026-01-01T09:00:00") is None
    assert c.take("2026-01-01T10:00:02") == c.latest
    assert c.implausible == 2 and c.latest == 1767261602.0
    assert c.take("2099-01-01T10:00:00") is None and c.implausible == 2
    c.settle()  # the end of the log: a last stray stamp is counted too
    assert c.implausible == 3


def test_log_clock_moves_on_after_an_idle_gap_once_stamps_agree() -> None:
    """Forward gaps are real once REANCHOR_STAMPS stamps agree: time goes on as written, nothing counted."""
    from sglang_tuning_exporter.core.timeparse import REANCHOR_STAMPS, LogClock

    c = LogClock()
    c.take("2026-01-01T10:00:00")
    later = [c.take(f"2026-01-01T12:00:0{i}") for i in range(REANCHOR_STAMPS + 1)]
    assert later[:REANCHOR_STAMPS - 1] == [None] * (REANCHOR_STAMPS - 1)
    assert later[-1] == 1767268803.0 and c.implausible == 0 and c.jumps == 0


def test_log_clock_live_refuses_stamps_in_the_wall_clocks_future() -> None:
    """Live, a stamp more than FUTURE_TOLERANCE_S ahead of the wall clock never becomes log time, even
    repeated (a host whose clock is years ahead); a log in a timezone ahead of UTC is not refused."""
    from sglang_tuning_exporter.core.timeparse import LogClock

    wall = [1767261600.0]  # 2026-01-01T10:00:00
    c = LogClock(arrival=lambda: wall[0])
    assert c.take("2026-01-01T19:00:00") == 1767294000.0  # UTC+9
    for _ in range(5):
        assert c.take("2099-01-01T10:00:00") is None
    assert c.implausible == 5 and c.latest == 1767294000.0


def test_seed_lets_the_majority_of_the_first_stamps_win() -> None:
    """A first stamp the next REANCHOR_STAMPS contradict (agreeing with each other) is no anchor; a normal
    start, or a stray second stamp, leaves the clock to anchor on the first as before."""
    from sglang_tuning_exporter.core.timeparse import LogClock, event_seconds

    good = [f"2025-03-01T10:00:0{i}" for i in range(5)]
    clock = LogClock()
    clock.seed(["2099-03-01T10:00:00", None, *good])
    assert clock.take("2099-03-01T10:00:00") is None
    assert clock.take(good[0]) == event_seconds(good[0])
    assert clock.implausible == 1 and clock.example == "2099-03-01T10:00:00" and clock.jumps == 0
    for stamps in (good, [good[0], "2099-03-01T10:00:00", *good[1:]]):
        c = LogClock()
        c.seed(stamps)
        assert c.latest is None and c.take(good[0]) == event_seconds(good[0])
