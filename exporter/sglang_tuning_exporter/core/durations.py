"""The one duration grammar of every flag and option: Prometheus's (`500ms`, `30s`, `10m`, `1h30m`,
`7d`, `1w`, `1y`; units largest first, each at most once; decimals allowed), or a bare number of
seconds where the caller allows it. And the one spelling of time text a person reads: durations
(`12 s`, `1.5 min`), times (`2026-11-28T06:00:00Z`) and ages (`... (12 s ago)`)."""

from __future__ import annotations

import math
import re
import time
from typing import Any

_UNITS = (("y", 31536000.0), ("w", 604800.0), ("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0),
          ("ms", 0.001))
_ORDER = {unit: i for i, (unit, _) in enumerate(_UNITS)}
_SIZE = dict(_UNITS)
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|y|w|d|h|m|s)")
EXAMPLES = "e.g. 500ms, 30s, 10m, 1h30m, 7d"


def parse_duration(text: str | float | int, *, bare_seconds: bool = True) -> float:
    """Seconds of a duration; a number (or numeric text, when `bare_seconds`) is seconds. ValueError on
    anything else, a negative or a non-finite value."""
    value: float | None
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text) if bare_seconds else None
    else:
        raw = str(text).strip()
        value = _number(raw) if bare_seconds else None
        if value is None:
            value = _units(raw)
    if value is None:
        raise ValueError(f"not a duration: {text!r} ({EXAMPLES}{'' if bare_seconds else '; a unit is required'})")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"not a duration: {text!r} (must be a finite number of seconds >= 0)")
    return value


def _number(raw: str) -> float | None:
    if re.fullmatch(r"\d+(?:\.\d+)?", raw) is None:
        return None
    return float(raw)


def _units(raw: str) -> float | None:
    pos, total, last = 0, 0.0, -1
    for m in _PART.finditer(raw):
        if m.start() != pos or _ORDER[m.group(2)] <= last:
            return None  # a gap, or units out of order / repeated (Prometheus rejects `30m1h`)
        last = _ORDER[m.group(2)]
        total += float(m.group(1)) * _SIZE[m.group(2)]
        pos = m.end()
    return total if raw and pos == len(raw) else None


def promql_duration(seconds: float) -> str:
    """Seconds -> the shortest exact PromQL duration ('10m', '90s', '1h')."""
    total = round(seconds)
    if total <= 0:
        return "0s"
    for unit, size in (("h", 3600), ("m", 60)):
        if total % size == 0:
            return f"{total // size}{unit}"
    return f"{total}s"


# --- time text: what every page, report, evidence and note writes ------------------------------
_TEXT_UNITS = ((86400.0, "d"), (3600.0, "h"), (60.0, "min"))


def duration_text(seconds: float) -> str:
    """A duration for a person: 3 significant digits below a minute (`0.812 s`, `12 s`, `12.5 s`), else
    the largest of min, h, d that fits, to one decimal (`1.5 min`, `10 min`, `3 h`, `7 d`)."""
    s = float(f"{max(0.0, float(seconds)):.3g}")
    for size, unit in _TEXT_UNITS:
        if s >= size:
            return f"{round(s / size, 1):g} {unit}"
    return f"{s:g} s"


def iso_time(t: float, *, millis: bool = False) -> str:
    """Epoch seconds as RFC 3339 UTC (`2026-11-28T06:00:00Z`; with `millis`, `...:00.123Z`)."""
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))
    return text + (f".{int((t - math.floor(t)) * 1000):03d}Z" if millis else "Z")


def time_text(t: Any) -> Any:
    """Epoch seconds -> ISO UTC; seconds of day (a log stamped without a date) -> HH:MM:SS; anything else
    unchanged."""
    if isinstance(t, (int, float)) and not isinstance(t, bool):
        if t > 1e8:  # epoch seconds
            return iso_time(float(t))
        h, rem = divmod(int(t), 3600)
        return f"{h:02d}:{rem // 60:02d}:{rem % 60:02d}" if h < 24 else f"+{duration_text(t)}"
    return t


def ago_text(t: float, now: float) -> str:
    """`2026-11-28T06:00:00Z (12 s ago)`."""
    return f"{time_text(t)} ({duration_text(now - t)} ago)"
