"""timeparse.event_seconds: the cached fast path for the parser's own stamps equals the general rule."""

from __future__ import annotations

import calendar
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_tuning_exporter.timeparse import event_seconds

_ISO = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d+))?$")
_TIME_ONLY = re.compile(r"(\d\d):(\d\d):(\d\d)(?:\.(\d+))?$")


def reference(time: str | None) -> float | None:
    """The rule written out once more, without caches or shortcuts."""
    if not time:
        return None
    m = _ISO.match(time)
    if m:
        y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
        frac = float("0." + m.group(7)) if m.group(7) else 0.0
        try:
            return float(calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0))) + frac
        except (ValueError, OverflowError):
            return None
    m = _TIME_ONLY.match(time)
    if m:
        h, mi, s = (int(g) for g in m.groups()[:3])
        if h > 23 or mi > 59 or s > 60:
            return None
        return h * 3600.0 + mi * 60.0 + s + (float("0." + m.group(4)) if m.group(4) else 0.0)
    return None


stamps = st.builds(
    lambda y, mo, d, h, mi, s, frac, tail: f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}{frac}{tail}",
    st.integers(0, 9999), st.integers(0, 99), st.integers(0, 99), st.integers(0, 99), st.integers(0, 99),
    st.integers(0, 99), st.sampled_from(["", ".5", ".123456", ".", ".x", ".0000001"]),
    st.sampled_from(["", "\n", "Z", " ", "\u0663"]))


@settings(max_examples=600, deadline=None)
@given(st.one_of(stamps, st.text(max_size=30), st.from_regex(r"\d\d:\d\d:\d\d(\.\d+)?", fullmatch=True)))
def test_event_seconds_equals_the_general_rule(time: str) -> None:
    got, want = event_seconds(time), reference(time)
    assert got == want or (got is not None and want is not None and abs(got - want) == 0.0), time


def test_known_values() -> None:
    assert event_seconds("2025-01-12T10:11:12") == 1736676672.0
    assert event_seconds("2025-01-12T10:11:12.250") == 1736676672.25
    assert event_seconds("2025-13-12T10:11:12") is None
    assert event_seconds("10:11:12") == 36672.0
    assert event_seconds(None) is None
