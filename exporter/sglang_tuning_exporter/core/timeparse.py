"""Event timestamps (as the parser writes them) to seconds, for windows and rates."""

from __future__ import annotations

import calendar
import functools
import itertools
import re
import time
from collections.abc import Callable, Iterable

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


def event_stamp(t: float) -> str:
    """Epoch seconds -> an Event.time as the parser writes it (event_seconds reads it back, to the ms)."""
    whole = int(t)
    frac = t - whole
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
    return text + (f"{frac:.3f}"[1:] if frac > 0 else "")


@functools.lru_cache(maxsize=4096)
def has_date(time: str | None) -> bool:
    """True when the stamp carries a calendar date (so it is comparable across days)."""
    return bool(time) and _ISO.match(time or "") is not None


# --- the log clock (docs/signals.md, "Clocks") --------------------------------------------------
# SGLang did not exist before 2015; a year outside this range is a cut-off or garbled stamp.
EARLIEST_PLAUSIBLE = float(calendar.timegm((2015, 1, 1, 0, 0, 0, 0, 0, 0)))
LATEST_PLAUSIBLE = float(calendar.timegm((2100, 1, 1, 0, 0, 0, 0, 0, 0)))
BACKWARD_TOLERANCE_S = 600.0  # interleaved writers and late flushes stay within this (either way)
REANCHOR_STAMPS = 3  # this many stamps in a row agreeing on another time: the clock moved (back or on)
# Live: a stamp this far ahead of the wall clock is no log time yet (log time is read as UTC, so a log
# written at UTC+14 runs 14 h ahead of a UTC wall clock; the hour on top is a margin).
FUTURE_TOLERANCE_S = 15 * 3600.0
SEED_STAMPS = 64  # stamps (lines) of a log's start read ahead for its first time (LogClock.seed)
MAX_FRAMES = 4  # clock offsets remembered: two interleaved hosts each keep theirs (no runaway)
_DAY = 86400.0


def plausible_seconds(time: str | None) -> float | None:
    """event_seconds, but None for a dated stamp outside the plausible years (what every reader uses)."""
    t = event_seconds(time)
    if t is not None and (t < EARLIEST_PLAUSIBLE or t >= LATEST_PLAUSIBLE) and has_date(time):
        return None
    return t


class LogClock:
    """Log time for each line, from its stamp (docs/signals.md, "Clocks"). Time-only stamps roll over
    midnight. A stamp more than BACKWARD_TOLERANCE_S from the latest time, before or after it, is an
    outlier (another host's clock, a garbled or future line): it gives no time (the caller takes the
    neighbour's) and is counted in `implausible`, unless REANCHOR_STAMPS stamps in a row agree on it:
    then the clock moved. On: an idle gap, time goes on as written. Back: a clock set back, time continues
    from the latest, shifted (`jumps`). The offsets of earlier moves are remembered, so the lines of two
    interleaved hosts each fit their own and the clock does not run away. So are stamps outside the
    plausible years, and live (`arrival`, an injected wall clock) stamps far in the wall clock's future.
    `judge_dated=False`: dated stamps were judged already (diagnose's scanner): taken as written."""

    def __init__(self, arrival: Callable[[], float] | None = None, *, judge_dated: bool = True) -> None:
        self.arrival = arrival
        self.judge_dated = judge_dated
        self.implausible = 0  # stamps taken at a neighbour's time (outliers settled as such)
        self.example: str | None = None  # the first such stamp, as written (what a warning names)
        self._held: str | None = None  # the first stamp held in `_pending`, as written
        self.jumps = 0  # clocks set back (re-anchored)
        self.latest: float | None = None  # the latest log time given
        self._at: float | None = None  # wall time when `latest` was given (live)
        self._offsets = [0.0]  # added to stamps: the current frame first, then earlier ones
        self._pending: list[float] = []  # raw stamps in a row that agree with each other, off the clock
        self._day_offset = 0.0
        self._last_raw: float | None = None

    def take(self, stamp: str | None) -> float | None:
        """The log time of a line stamped `stamp`; None when it has none worth using."""
        if not stamp:
            return None
        raw = event_seconds(stamp)
        if raw is None:
            self._outlier(stamp)  # unreadable
            return None
        if has_date(stamp):
            if not EARLIEST_PLAUSIBLE <= raw < LATEST_PLAUSIBLE or self._in_future(raw):
                self._outlier(stamp)
                return None
            if not self.judge_dated:
                self.note(raw)
                return raw
        else:
            # Time-only stamps: a jump back of more than 12 h is the next day.
            if self._last_raw is not None and raw < self._last_raw - _DAY / 2:
                self._day_offset += _DAY
            self._last_raw = raw
            raw += self._day_offset
        return self._place(raw, stamp)

    def _outlier(self, stamp: str, n: int = 1) -> None:
        self.implausible += n
        if self.example is None:
            # Digits and separators only, short: it is shown in warnings and reports, never a line's text.
            self.example = "".join(c for c in stamp[:40] if c.isdigit() or c in "-:.TZ ") or "?"

    def _in_future(self, raw: float) -> bool:
        if self.arrival is None:
            return False
        wall = self.arrival()
        # A wall clock before 2015 is no real one (a host without one, a test's): nothing to judge by.
        return wall >= EARLIEST_PLAUSIBLE and raw > wall + FUTURE_TOLERANCE_S

    def _place(self, raw: float, stamp: str) -> float | None:
        latest = self.latest
        t: float | None = None
        if latest is None:
            t = raw + self._offsets[0]
        else:
            for i, off in enumerate(self._offsets):
                if abs(raw + off - latest) <= BACKWARD_TOLERANCE_S:
                    if i:
                        self._offsets.insert(0, self._offsets.pop(i))  # this writer's frame is current
                    t = raw + off
                    break
        pending = self._pending
        if t is None:
            assert latest is not None
            if pending and abs(raw - pending[-1]) > BACKWARD_TOLERANCE_S:
                self.settle()  # they disagree: the earlier ones were outliers
            if not pending:
                self._held = stamp
            pending.append(raw)
            if len(pending) < REANCHOR_STAMPS:
                return None
            first = pending[0]
            pending.clear()
            off = self._offsets[0]
            if first + off < latest:
                # Set back: continue from the latest, keeping the new stamps' spacing.
                off = latest - first
                self._offsets.insert(0, off)
                del self._offsets[MAX_FRAMES:]
                self.jumps += 1
            t = raw + off  # moved on: an idle gap is real, time goes on as written
        elif pending:
            self.settle()
        if latest is None or t > latest:
            self.latest = t
            if self.arrival is not None:
                self._at = self.arrival()
        return t

    def seed(self, stamps: Iterable[str | None]) -> None:
        """Before any time, the first stamps of a log read ahead (a batch, a chunk): when the first dated
        one is off the REANCHOR_STAMPS after it and they agree, the clock starts at the second, so the first
        is an outlier (a stray first line), not the anchor the others would be shifted onto."""
        if self.latest is not None or self._pending or not self.judge_dated:
            return
        raws: list[float] = []
        for stamp in itertools.islice(stamps, SEED_STAMPS):
            t = plausible_seconds(stamp) if has_date(stamp) else None
            if t is not None and not self._in_future(t):
                raws.append(t)
            if len(raws) > REANCHOR_STAMPS:
                break
        if len(raws) <= REANCHOR_STAMPS or abs(raws[1] - raws[0]) <= BACKWARD_TOLERANCE_S:
            return
        if all(abs(b - a) <= BACKWARD_TOLERANCE_S for a, b in itertools.pairwise(raws[1:])):
            self.latest = raws[1]
            if self.arrival is not None:
                self._at = self.arrival()

    def note(self, t: float) -> None:
        """A stamp that fits the clock, read elsewhere (diagnose's C reader): the latest time."""
        if self._pending:
            self.settle()
        if self.latest is None or t > self.latest:
            self.latest = t
            if self.arrival is not None:
                self._at = self.arrival()

    def settle(self) -> None:
        """Count the stamps held as a possible move of the clock as outliers (the clock did not move;
        at the end of a log, call it so a last stray stamp is counted)."""
        if self._pending:
            self._outlier(self._held or "", len(self._pending))
        self._pending.clear()

    def now(self, wall: float) -> float:
        """The current log time live: the latest stamp plus the wall time since it arrived (a quiet
        log ages its data); the wall clock itself before any stamp."""
        if self.latest is None or self._at is None:
            return wall
        return self.latest + max(0.0, wall - self._at)
