"""The sidecar's warning when its log clock takes stamps as outliers (docs/signals.md, "Clocks")."""

from __future__ import annotations

import logging

log = logging.getLogger("sglang_tuning_exporter.sidecar.engine")
OUTLIER_WARN_EVERY_S = 600.0  # at most one warning about outlier log stamps this often


class OutlierWarning:
    """One warning when outliers start, then at most one per OUTLIER_WARN_EVERY_S while more come (the
    count is on /metrics all along)."""

    def __init__(self) -> None:
        self._last: tuple[int, float] | None = None  # (count, monotonic time) at the last warning

    def note(self, count: int, example: str | None, mono: float) -> None:
        """`count` outliers so far, the first stamp `example` (digits and separators only: LogClock)."""
        last = self._last
        if count == 0 or (last is not None and (count == last[0] or mono - last[1] < OUTLIER_WARN_EVERY_S)):
            return
        self._last = (count, mono)
        log.warning("log: %d timestamp%s far off the log's clock (e.g. %s: another host's clock, a stray or "
                    "future line) taken at a neighbour's time (sglang_tuning_log_implausible_times_total)",
                    count, "" if count == 1 else "s", example or "?")
