"""The one duration grammar of every flag and option: Prometheus's (`500ms`, `30s`, `10m`, `1h30m`,
`7d`, `1w`, `1y`; units largest first, each at most once; decimals allowed), or a bare number of
seconds where the caller allows it."""

from __future__ import annotations

import math
import re

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
