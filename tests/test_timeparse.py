"""timeparse.event_seconds: the cached fast path for the parser's own stamps equals the general rule
(general_seconds), and the rule gives the expected seconds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_tuning_exporter.timeparse import event_seconds, general_seconds

stamps = st.builds(
    lambda y, mo, d, h, mi, s, frac, tail: f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}{frac}{tail}",
    st.integers(0, 9999), st.integers(0, 99), st.integers(0, 99), st.integers(0, 99), st.integers(0, 99),
    st.integers(0, 99), st.sampled_from(["", ".5", ".123456", ".", ".x", ".0000001"]),
    st.sampled_from(["", "\n", "Z", " ", "\u0663"]))


@settings(max_examples=600, deadline=None)
@given(st.one_of(stamps, st.text(max_size=30), st.from_regex(r"\d\d:\d\d:\d\d(\.\d+)?", fullmatch=True)))
def test_event_seconds_equals_the_general_rule(time: str) -> None:
    assert event_seconds(time) == general_seconds(time), time


def test_known_values() -> None:
    assert event_seconds("2025-01-12T10:11:12") == 1736676672.0
    assert event_seconds("2025-01-12T10:11:12.250") == 1736676672.25
    assert event_seconds("2025-13-12T10:11:12") is None
    assert event_seconds("10:11:12") == 36672.0
    assert event_seconds(None) is None
