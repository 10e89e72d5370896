"""Where a source's slow work runs (an HTTP request and its parsing): the sidecar's loop hands it to
`Jobs` and takes the outcome back on a later tick, so one slow source never holds the loop (the log
keeps being read, the other sources and the evaluation go on).

`InlineJobs` runs the work at once (tests: deterministic, no threads); `ThreadJobs` runs each job in a
daemon thread and wakes the loop when it ends. One job per source at a time: the loop starts none for a
source whose previous job still runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class Outcome:
    """A finished job: its value, or the exception it raised."""

    source: str
    value: Any = None
    error: BaseException | None = None


class Jobs(Protocol):
    """Runs work off the loop; `take` returns the outcomes finished since the last call, in order."""

    def start(self, source: str, work: Callable[[], Any]) -> None: ...

    def busy(self, source: str) -> bool: ...

    def take(self) -> list[Outcome]: ...


def _run(source: str, work: Callable[[], Any]) -> Outcome:
    try:
        return Outcome(source, work())
    except Exception as exc:  # the loop records it as the source's failure
        return Outcome(source, error=exc)


class InlineJobs:
    """Runs each job at once, in the caller's thread."""

    def __init__(self) -> None:
        self._done: list[Outcome] = []

    def start(self, source: str, work: Callable[[], Any]) -> None:
        """Run `work` now; its outcome waits for `take`."""
        self._done.append(_run(source, work))

    def busy(self, source: str) -> bool:
        """Never: a job ends before `start` returns."""
        return False

    def take(self) -> list[Outcome]:
        """The outcomes so far."""
        done, self._done = self._done, []
        return done


class ThreadJobs:
    """Runs each job in a daemon thread; `notify` (e.g. the loop's wake-up) is called when one ends."""

    def __init__(self, notify: Callable[[], None] = lambda: None) -> None:
        self._notify = notify
        self._lock = threading.Lock()
        self._running: set[str] = set()
        self._done: list[Outcome] = []

    def start(self, source: str, work: Callable[[], Any]) -> None:
        """Start `work` in a thread of its own (the caller checked `busy` first)."""
        with self._lock:
            self._running.add(source)

        def body() -> None:
            outcome = _run(source, work)
            with self._lock:
                self._running.discard(source)
                self._done.append(outcome)
            self._notify()

        threading.Thread(target=body, name=f"sidecar-{source}", daemon=True).start()

    def busy(self, source: str) -> bool:
        """Whether a job of `source` still runs."""
        with self._lock:
            return source in self._running

    def take(self) -> list[Outcome]:
        """The outcomes finished since the last call."""
        with self._lock:
            done, self._done = self._done, []
        return done
