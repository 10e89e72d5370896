"""Events: the immutable contract between parsing and everything after it, however they are built."""

from __future__ import annotations

import gc
import pickle
import sys
import tracemalloc
from dataclasses import dataclass

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
    with pytest.raises(TypeError):
        back[0][0] = 4  # type: ignore[index]
    with pytest.raises(AttributeError):
        back[0].extra = 1  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        hash(e)


def test_missing_rank_and_fields_are_fresh_dicts() -> None:
    """Each event gets dicts of its own: the parser edits `fields` of the event it has just made."""
    a, b = Event(1, ev.SERVER_READY), Event(2, ev.SERVER_READY, rank=None)
    assert a.rank == {} and a.fields == {} and a.time is None
    a.fields["x"] = 1
    assert b.fields == {} and a.rank is not b.rank and a.fields is not b.fields


def test_an_event_equals_only_an_event_of_its_class() -> None:
    """As the dataclass it replaces: equal values of another class (a bare tuple, a subclass) differ."""
    class Sub(Event):
        __slots__ = ()

    values = (1, ev.RETRACT, None, {}, {"num_retracted_reqs": 1})
    e = Event(*values)
    assert e == Event(*values) and e != values and e != Sub(*values) and e != Event(2, *values[1:])
    # != is Event's own too (a subclass defining only __eq__ would keep tuple's !=)
    assert [e != Event(*values), e != values, e != Sub(*values)] == [False, True, True]
    assert e._replace(time="00:00:01") == Event(1, ev.RETRACT, "00:00:01", {}, {"num_retracted_reqs": 1})


@pytest.mark.skipif(SCAN is None, reason="the C accelerator is not built (or turned off)")
def test_the_c_reader_builds_whole_events() -> None:
    """The C drop-in builds an ordinary Event, equal to the Python one (by the class's own __eq__, so
    a half-built object would not compare equal), GC-tracked, and holding exactly one reference to
    each dict it made (none leaked, none shared)."""
    out = EventReader().feed_bytes(DECODE.encode())
    assert len(out) == 1 and type(out[0]) is Event
    assert out[0] == Event(1, ev.DECODE, "2025-11-22T23:24:43", {"dp": 1, "tp": 1},
                           {"num_running_reqs": 3, "num_used_tokens": 9, "token_usage": 0.1, "cuda_graph": True,
                            "gen_throughput": 1.5, "num_queue_reqs": 1})
    assert out[0].kind is ev.DECODE and gc.is_tracked(out[0])
    # Counted before asserting (pytest's rewriting holds references): the event's or list's + the call's.
    counts = [sys.getrefcount(out[0].rank), sys.getrefcount(out[0].fields), sys.getrefcount(out[0])]
    assert counts == [2, 2, 2]
    with pytest.raises(AttributeError):
        out[0].kind = "x"  # type: ignore[misc]


@pytest.mark.skipif(SCAN is None, reason="the C accelerator is not built (or turned off)")
def test_the_c_reader_builds_the_event_type_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """The C side holds no Event of its own: a subclass configured in its place is what comes back,
    with the same values the Python path gives."""
    assert SCAN is not None

    class Other(Event):
        __slots__ = ()

    monkeypatch.setattr(accel, "Event", Other)
    accel.configure(SCAN)
    try:
        out = EventReader().feed_bytes(DECODE.encode() * 3)
    finally:
        monkeypatch.undo()
        accel.configure(SCAN)
    assert len(out) == 3 and all(type(e) is Other for e in out)
    same = EventReader().feed_bytes(DECODE.encode())[0]
    assert [e.line for e in out] == [1, 2, 3] and tuple(out[0]) == tuple(same)


@pytest.mark.skipif(SCAN is None, reason="the C accelerator is not built (or turned off)")
def test_the_c_reader_refuses_an_event_type_it_cannot_fill() -> None:
    """C only fills a tuple's items: a type that is no tuple, carries state a constructor would set (a
    __dict__) or is hashable (a hash cache to set) is refused, and the working configuration stays."""
    assert SCAN is not None

    class WithDict(Event):
        pass

    class Hashable(Event):
        __slots__ = ()
        __hash__ = tuple.__hash__

    @dataclass(frozen=True)
    class NotATuple:
        line: int

    for bad in (WithDict, Hashable, NotATuple, int):
        with pytest.raises(TypeError):
            SCAN.configure(bad, (ev.DECODE, ev.PREFILL), [], [], ("a", "b", "c"), ("p", "q", "r", "s"),
                           ("dp", "pp", "tp", "ep", "attn_cp", "moe_dp"))
    assert type(EventReader().feed_bytes(DECODE.encode())[0]) is Event


@pytest.mark.skipif(SCAN is None, reason="the C accelerator is not built (or turned off)")
def test_c_built_events_are_freed() -> None:
    """Building and dropping many events in C leaves no memory behind (references balanced)."""
    data = DECODE.encode() * 2000
    reader = EventReader()
    for _ in range(3):
        reader.feed_bytes(data)  # warm caches and free lists
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(50):
            reader.feed_bytes(data)  # 100,000 events made and dropped
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 100_000  # a leaked dict per event would be tens of MB
