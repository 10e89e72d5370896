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


@functools.lru_cache(maxsize=4096)  # pure; a log repeats each stamp on many lines
def event_seconds(time: str | None) -> float | None:
    """Seconds for an Event.time: epoch seconds (log time read as UTC) with a date, seconds since
    midnight for a time-only stamp, None when absent or unreadable."""
    if not time:
        return None
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


@functools.lru_cache(maxsize=4096)
def has_date(time: str | None) -> bool:
    """True when the stamp carries a calendar date (so it is comparable across days)."""
    return bool(time) and _ISO.match(time or "") is not None
