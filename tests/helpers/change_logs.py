"""Before/after logs of one server restarted with other flags (issue 16), written with LogWriter.

`cd tests && python3 -m helpers.change_logs` rewrites the recorded fixtures under tests/fixtures/changes/ (the tests
check that the recorded files equal what these functions write, so an edit here is seen).
"""

from __future__ import annotations

import sys

from helpers import paths
from helpers.scenario_logs import LogWriter

FIXTURES = paths.FIXTURES / "changes"
BASE = {"mem_fraction_static": 0.85, "schedule_conservativeness": 1.0, "chunked_prefill_size": 8192,
        "max_running_requests": 4096}


def _traffic(w: LogWriter, minutes: float, *, retract_every: int = 0, running: int = 300, usage: float = 0.95,
             queue: int = 150, every_s: float = 5.0) -> LogWriter:
    for i in range(int(minutes * 60 / every_s)):
        w.decode(running, usage, queue)
        if retract_every and i % retract_every == 0:
            w.retract(2)
        w.tick(every_s)
    return w


def _start(w: LogWriter, **args: object) -> LogWriter:
    w.server_args(**{**BASE, **args})
    w.startup(total=80.0, weights=15.3, kv=52.0, graph=1.1, available=8.0)
    return w.tick(60)


def improved() -> str:
    """Retractions about 6 a minute at conservativeness 1.0; none at 1.3 under the same load."""
    w = _start(LogWriter("0.5.23"))
    _traffic(w, 30, retract_every=2)
    w.tick(120)
    _start(w, schedule_conservativeness=1.3)
    return _traffic(w, 30, running=290, queue=160, usage=0.93).text()


def worse_oom() -> str:
    """--mem-fraction-static 0.85 -> 0.93: healthy before, a decode CUDA OOM a few minutes after."""
    w = _start(LogWriter("0.5.23"))
    _traffic(w, 30, usage=0.93)
    w.tick(120)
    _start(w, mem_fraction_static=0.93)
    _traffic(w, 4, usage=0.93)
    return w.cuda_oom().text()


def no_change() -> str:
    """--chunked-prefill-size 8192 -> 4096 on a healthy server: every check stays ok."""
    w = _start(LogWriter("0.5.23"))
    _traffic(w, 30, usage=0.93)
    w.tick(120)
    _start(w, chunked_prefill_size=4096)
    return _traffic(w, 30, usage=0.93).text()


def inconclusive() -> str:
    """--schedule-conservativeness 1.0 -> 1.3, then only half a minute of traffic."""
    w = _start(LogWriter("0.5.23"))
    _traffic(w, 30, retract_every=2)
    w.tick(120)
    _start(w, schedule_conservativeness=1.3)
    return _traffic(w, 0.5, usage=0.93).text()


def same_args() -> str:
    """A restart with identical arguments: no change entry."""
    w = _start(LogWriter("0.5.23"))
    _traffic(w, 20, usage=0.93)
    w.tick(120)
    _start(w)
    return _traffic(w, 20, usage=0.93).text()


# SGLang 0.5.22-0.5.23's message after POST /set_internal_state (managers/scheduler_components/internal_state.py,
# `logger.info(f"Config updated via context override: {overrides}")`; audit/sglang-catalogue.yaml holds it).
CONTEXT_OVERRIDE = "Config updated via context override: {overrides}"


def runtime_update(fmt: str = CONTEXT_OVERRIDE, field: str = "overrides") -> str:
    """--pp-max-micro-batch-size 8 -> 4 without a restart (POST /set_internal_state), under steady traffic;
    `fmt` is the release's format string of the update line, its one field `field` the changed arguments."""
    w = _start(LogWriter("0.5.23"), pp_max_micro_batch_size=8)
    _traffic(w, 30, usage=0.93)
    w.add(fmt.format(**{field: {"pp_max_micro_batch_size": 4}}))
    return _traffic(w.tick(5), 30, usage=0.93).text()


ALL = {"improved": improved, "worse_oom": worse_oom, "no_change": no_change, "inconclusive": inconclusive,
       "same_args": same_args}


def main() -> int:
    """Rewrite the recorded fixtures."""
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name, fn in ALL.items():
        (FIXTURES / f"{name}.log").write_text(fn(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
