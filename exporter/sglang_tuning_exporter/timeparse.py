"""Event timestamps (as the parser writes them) to seconds, for windows and rates."""

from __future__ import annotations

import calendar
import functools
import re

# The parser writes "YYYY-MM-DDTHH:MM:SS[.fff]" (a date in the log) or "HH:MM:SS[.fff]" (time only).
_ISO = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d+))?$")
_TIME_ONLY = re.compile(r"(\d\d):(\d\d):(\d\d)(?:\.(\d+))?$")


def _fraction(digits: str | None) -> float:
    return float("0." + digits) if digits else 0.0


_MINUTE = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d)")


def general_seconds(time: str) -> float | None:
    """event_seconds without its cache or fast path (the rule itself; tests compare the two)."""
    m = _ISO.match(time)
    if m:
        y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
        try:
            return float(calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0))) + _fraction(m.group(7))
        except (ValueError, OverflowError):
            return None
    m = _TIME_ONLY.match(time)
    if m:
        h, mi, s = (int(g) for g in m.groups()[:3])
        if h > 23 or mi > 59 or s > 60:
            return None
        return h * 3600.0 + mi * 60.0 + s + _fraction(m.group(4))
    return None


@functools.lru_cache(maxsize=1024)
def _minute_seconds(minute: str) -> float | None:
    """`YYYY-MM-DDTHH:MM` (ASCII digits) -> epoch seconds of that minute; None when no calendar date."""
    y, mo, d, h, mi = (int(g) for g in _MINUTE.fullmatch(minute).groups())  # type: ignore[union-attr]
    try:
        return float(calendar.timegm((y, mo, d, h, mi, 0, 0, 0, 0)))
    except (ValueError, OverflowError):
        return None


@functools.lru_cache(maxsize=4096)  # pure; a log repeats each stamp on many lines
def event_seconds(time: str | None) -> float | None:
    """Seconds for an Event.time: epoch seconds (log time read as UTC) with a date, seconds since
    midnight for a time-only stamp, None when absent or unreadable."""
    if not time:
        return None
    # The parser's own `YYYY-MM-DDTHH:MM:SS(.f)`: the minute is cached (retractions and OOMs rarely
    # share a second, but a minute, often); the same value as the general path below.
    if len(time) >= 19 and time[10] == "T" and time[16] == ":" and time.isascii() and time[17:19].isdigit() \
            and _MINUTE.fullmatch(time, 0, 16) is not None:
        rest = time[19:]
        if not rest or (rest[0] == "." and rest[1:].isdigit()):
            base = _minute_seconds(time[:16])
            return None if base is None else base + int(time[17:19]) + _fraction(rest[1:])
    return general_seconds(time)


@functools.lru_cache(maxsize=4096)
def has_date(time: str | None) -> bool:
    """True when the stamp carries a calendar date (so it is comparable across days)."""
    return bool(time) and _ISO.match(time or "") is not None
