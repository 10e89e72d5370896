"""Event timestamps (as the parser writes them) to seconds, for windows and rates."""

from __future__ import annotations

import calendar
import functools
import re
from collections.abc import Callable

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


# --- the log clock (docs/signals.md, "Clocks") --------------------------------------------------
# SGLang did not exist before 2015; a year outside this range is a cut-off or garbled stamp.
EARLIEST_PLAUSIBLE = float(calendar.timegm((2015, 1, 1, 0, 0, 0, 0, 0, 0)))
LATEST_PLAUSIBLE = float(calendar.timegm((2100, 1, 1, 0, 0, 0, 0, 0, 0)))
BACKWARD_TOLERANCE_S = 600.0  # interleaved writers and late flushes stay within this
REANCHOR_STAMPS = 3  # this many stamps in a row agreeing on an earlier time: the clock was set back
_DAY = 86400.0


def plausible_seconds(time: str | None) -> float | None:
    """event_seconds, but None for a dated stamp outside the plausible years (what every reader uses)."""
    t = event_seconds(time)
    if t is not None and (t < EARLIEST_PLAUSIBLE or t >= LATEST_PLAUSIBLE) and has_date(time):
        return None
    return t


class LogClock:
    """Log time for each line, from its stamp: time-only stamps roll over midnight, a stamp that is
    implausible against its neighbours (outside the plausible years, or more than
    BACKWARD_TOLERANCE_S before the latest time) gives no time (the caller takes the neighbour's) and
    is counted; REANCHOR_STAMPS such stamps in a row that agree with each other are a clock set back:
    the time continues from the latest, shifted.  Pure: `arrival` (live) is an injected wall clock."""

    def __init__(self, arrival: Callable[[], float] | None = None) -> None:
        self.arrival = arrival
        self.implausible = 0  # stamps taken at a neighbour's time
        self.jumps = 0  # clocks set back (re-anchored)
        self.latest: float | None = None  # the latest log time given
        self._at: float | None = None  # wall time when `latest` was given (live)
        self._offset = 0.0  # added to stamps after a clock was set back
        self._behind: list[float] = []
        self._day_offset = 0.0
        self._last_raw: float | None = None

    def take(self, stamp: str | None) -> float | None:
        """The log time of a line stamped `stamp`; None when it has none worth using."""
        if not stamp:
            return None
        raw = event_seconds(stamp)
        if raw is None:
            self.implausible += 1  # unreadable
            return None
        if has_date(stamp):
            if not EARLIEST_PLAUSIBLE <= raw < LATEST_PLAUSIBLE:
                self.implausible += 1
                return None
        else:
            # Time-only stamps: a jump back of more than 12 h is the next day.
            if self._last_raw is not None and raw < self._last_raw - _DAY / 2:
                self._day_offset += _DAY
            self._last_raw = raw
            raw += self._day_offset
        t = raw + self._offset
        latest = self.latest
        if latest is not None and t < latest - BACKWARD_TOLERANCE_S:
            behind = self._behind
            if behind and abs(raw - behind[-1]) > BACKWARD_TOLERANCE_S:
                behind.clear()
            behind.append(raw)
            if len(behind) < REANCHOR_STAMPS:
                self.implausible += 1
                return None
            # The clock was set back: continue from the latest time, keeping the new stamps' spacing.
            self._offset = latest - behind[0]
            behind.clear()
            self.jumps += 1
            t = raw + self._offset
        else:
            self._behind.clear()
        if latest is None or t > latest:
            self.latest = t
            if self.arrival is not None:
                self._at = self.arrival()
        return t

    def now(self, wall: float) -> float:
        """The current log time live: the latest stamp plus the wall time since it arrived (a quiet
        log ages its data); the wall clock itself before any stamp."""
        if self.latest is None or self._at is None:
            return wall
        return self.latest + max(0.0, wall - self._at)
