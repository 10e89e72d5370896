"""Events: the frozen contract between parsing and everything after it, however they are built."""

from __future__ import annotations

import pickle

import pytest

from sglang_tuning_exporter.core import events as ev
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.sources import accel
from sglang_tuning_exporter.sources.accel import SCAN
from sglang_tuning_exporter.sources.logreader import EventReader

DECODE = ("[2025-11-22 23:24:43 DP1 TP1] Decode batch, #running-req: 3, #token: 9, token usage: 0.10, "
          "cuda graph: True, gen throughput (token/s): 1.50, #queue-req: 1, \n")


def test_an_event_is_frozen_and_pickles_as_itself() -> None:
    """A pickled Event comes back equal, frozen, its kind the module's own string object."""
    e = Event(3, "de" + "code", "2025-01-01T00:00:00", {"tp": 0}, {"num_running_reqs": 1})
    back = pickle.loads(pickle.dumps([e, e], protocol=pickle.HIGHEST_PROTOCOL))
    assert back == [e, e] and type(back[0]) is Event
    assert back[0].kind is ev.DECODE
    with pytest.raises(AttributeError):
        back[0].line = 4  # type: ignore[misc]


@pytest.mark.skipif(SCAN is None, reason="the C accelerator is not built (or turned off)")
def test_the_c_reader_builds_events_through_the_class() -> None:
    """The C drop-in calls Event itself: an ordinary, frozen, equal Event (checked by the class's own
    __eq__, so a half-built object would not compare equal)."""
    out = EventReader().feed_bytes(DECODE.encode())
    assert len(out) == 1 and type(out[0]) is Event
    assert out[0] == Event(1, ev.DECODE, "2025-11-22T23:24:43", {"dp": 1, "tp": 1},
                           {"num_running_reqs": 3, "num_used_tokens": 9, "token_usage": 0.1, "cuda_graph": True,
                            "gen_throughput": 1.5, "num_queue_reqs": 1})
    with pytest.raises(AttributeError):
        out[0].kind = "x"  # type: ignore[misc]


@pytest.mark.skipif(SCAN is None, reason="the C accelerator is not built (or turned off)")
def test_the_c_reader_calls_the_event_type_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """No slot writing behind the constructor's back: a subclass configured in its place sees every
    event the C reader makes go through its __init__."""
    assert SCAN is not None
    made: list[int] = []

    class Counting(Event):
        __slots__ = ()

        def __init__(self, *args: object) -> None:
            made.append(1)
            super().__init__(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(accel, "Event", Counting)
    accel.configure(SCAN)
    try:
        out = EventReader().feed_bytes(DECODE.encode() * 3)
    finally:
        monkeypatch.undo()
        accel.configure(SCAN)
    assert len(out) == 3 and all(type(e) is Counting for e in out) and len(made) == 3
