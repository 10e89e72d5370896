"""The HTTP server's own counts, exported as `sglang_tuning_http_*` (docs/sidecar.md, Metrics)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

from prometheus_client.registry import Collector

from sglang_tuning_exporter.core.catalog import BY_NAME, PREFIX
from sglang_tuning_exporter.sidecar.collector import Family

# Why the server closed a connection itself (a client closing its own is not counted): `room` for a
# new one at --web.max-connections, else the deadline of the phase it was in.
CLOSE_REASONS = ("room", "header_timeout", "idle_timeout", "write_timeout")


class HttpStats:
    """Written by the serving loop and its workers, read by scrapes (one lock, plain counts)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.open_connections = 0  # set by the loop (its only writer)
        self._closed: Counter[str] = Counter()
        self._codes: Counter[int] = Counter()

    def closed(self, reason: str) -> None:
        """A connection the server closed for `reason` (one of CLOSE_REASONS)."""
        with self._lock:
            self._closed[reason] += 1

    def answered(self, code: int) -> None:
        """A request answered with status `code`."""
        with self._lock:
            self._codes[code] += 1

    def counts(self) -> tuple[int, dict[str, int], dict[int, int]]:
        """(open connections, closed by reason, answers by code)."""
        with self._lock:
            return self.open_connections, dict(self._closed), dict(self._codes)


class HttpCollector(Collector):
    """Registers beside the TuningCollector: the server's families from `stats`."""

    def __init__(self, stats: HttpStats) -> None:
        self.stats = stats

    def describe(self) -> list[Any]:
        """Nothing up front (as TuningCollector)."""
        return []

    def collect(self) -> Iterator[Any]:
        """Open connections always; closes and answers once there are any."""
        open_, closed, codes = self.stats.counts()
        gauge = Family(BY_NAME[PREFIX + "http_open_connections"])
        gauge.add((), float(open_))
        yield gauge
        closes = Family(BY_NAME[PREFIX + "http_connections_closed_total"])
        for reason in CLOSE_REASONS:
            if reason in closed:
                closes.add((reason,), float(closed[reason]))
        if closes.rows:
            yield closes
        answers = Family(BY_NAME[PREFIX + "http_requests_total"])
        for code in sorted(codes):
            answers.add((str(code),), float(codes[code]))
        if answers.rows:
            yield answers
