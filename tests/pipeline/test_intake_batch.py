"""The sidecar's batched log intake (one Sample per Decode/Prefill line, one parser call per poll)
gives exactly what the per-observation path gives: same signals, same live state, same exposition."""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
from pathlib import Path
from typing import Any

import pytest

from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.core.model import Observation, Rank, Sample, ServerState
from sglang_tuning_exporter.pipeline.observations import EventConverter
from sglang_tuning_exporter.pipeline.stats import Bucket
from sglang_tuning_exporter.pipeline.window import Window
from sglang_tuning_exporter.sidecar.serve import build_advisor, build_sidecar, log_input_for, make_web
from sglang_tuning_exporter.sidecar.serveconfig import add_serve_flags, build_config
from sglang_tuning_exporter.sidecar.state import LiveState
from sglang_tuning_exporter.sources import logreader

VALUES: list[Any] = [0, 1, 7, 150, 2500, 0.42, 0.95, float("nan"), float("inf"), True, False, "0.5", "x", None]


def _value(rng: random.Random) -> Any:
    return rng.choice(VALUES) if rng.random() < 0.25 else rng.choice([0, 3, 40, 120, 300, 900, 3000])


def _fields(rng: random.Random, names: tuple[str, ...]) -> dict[str, Any]:
    """Random subset of `names`, mostly complete, sometimes odd values."""
    out: dict[str, Any] = {}
    for name in names:
        if rng.random() < 0.85:
            v = _value(rng)
            if v is not None:
                out[name] = v
    return out


def random_events(seed: int, n: int, ranks: int) -> list[Event]:
    """A mix of Decode/Prefill lines (complete, partial, odd), retractions, OOMs and startup facts."""
    rng = random.Random(seed)
    events = []
    for i in range(n):
        dp = rng.randrange(ranks)
        rank = {"dp": dp} if rng.random() < 0.7 else {"dp": dp, "tp": rng.randrange(2)}
        r = rng.random()
        if r < 0.6:
            f = _fields(rng, ("num_running_reqs", "num_queue_reqs", "gen_throughput", "num_used_tokens"))
            f.update(_fields(rng, ("token_usage",)) if rng.random() < 0.9 else {"full_token_usage": 0.7,
                                                                                  "swa_token_usage": 0.8})
            if rng.random() < 0.8:
                f["cuda_graph"] = rng.random() < 0.6
            events.append(Event(i, "decode", None, rank, f))
        elif r < 0.85:
            f = _fields(rng, ("num_new_tokens", "num_cached_tokens", "num_running_reqs", "num_queue_reqs",
                              "token_usage"))
            events.append(Event(i, "prefill", None, rank, f))
        elif r < 0.92:
            events.append(Event(i, "retract", None, rank, {"num_retracted_reqs": rng.choice([1, 2, 5])}))
        elif r < 0.95:
            events.append(Event(i, "oom", None, rank, {"phase": rng.choice(["decode", "prefill", "x"])}))
        else:
            events.append(Event(i, "startup_memory", None, rank,
                                {"stage": "summary", "available_gpu_mem_gb": 5.5, "max_running_requests": 256,
                                 "max_total_num_tokens": 100000}))
    return events


def _polls(events: list[Event], size: int) -> list[list[Event]]:
    return [events[i:i + size] for i in range(0, len(events), size)]


def _same(a: dict[Rank, dict[str, float | None]], b: dict[Rank, dict[str, float | None]]) -> bool:
    def norm(v: float | None) -> Any:
        return "nan" if isinstance(v, float) and math.isnan(v) else v
    return {r: {k: norm(v) for k, v in s.items()} for r, s in a.items()} == \
        {r: {k: norm(v) for k, v in s.items()} for r, s in b.items()}


@pytest.mark.parametrize(("seed", "ranks", "max_ranks", "poll"), [(1, 8, 256, 50), (2, 64, 256, 400),
                                                                  (3, 12, 5, 30), (4, 3, 256, 1)])
def test_window_batch_intake_equals_per_observation(seed: int, ranks: int, max_ranks: int, poll: int) -> None:
    """add_items(convert_batch) and add_sample one by one give the signals of add(convert_all), poll by poll."""
    events = random_events(seed, 3000, ranks)
    now = [1000.0]
    per_obs, batched, one_by_one = (Window(60.0, max_ranks) for _ in range(3))
    conv_a, conv_b = EventConverter(clock=lambda: now[0]), EventConverter(clock=lambda: now[0])
    samples = 0
    for k, poll_events in enumerate(_polls(events, poll)):
        now[0] = 1000.0 + 0.7 * k
        for o in conv_a.convert_all(poll_events):
            per_obs.add(o)
        items = conv_b.convert_batch(poll_events)
        samples += sum(isinstance(i, Sample) for i in items)
        batched.add_items(items)
        for i in items:
            if isinstance(i, Sample):
                one_by_one.add_sample(i)
            else:
                one_by_one.add(i)
        if k % 7 == 3:
            expected = per_obs.signals(now[0])
            assert _same(batched.signals(now[0]), expected)
            assert _same(one_by_one.signals(now[0]), expected)
    end = now[0] + 1
    assert samples > 1000 and per_obs.signals(end) and _same(batched.signals(end), per_obs.signals(end))
    assert per_obs.expired == batched.expired


def test_convert_batch_samples_stand_for_the_same_observations() -> None:
    """Expanding each Sample gives convert_all's observations (same names, values, order per event), and
    the same release floor (retractions have a batch branch of their own)."""
    events = [
        *random_events(5, 500, 4),
        Event(501, "retract", "2025-03-01T10:00:00", {"dp": 1}, {}),  # one retracted request
        Event(502, "retract", None, {"tp": 1}, {"num_retracted_reqs": "3"}),
        Event(503, "retract", None, {}, {"num_retracted_reqs": "x"}),  # no number: no observation
        Event(504, "retract", None, {"dp": 0}, {"num_retracted_reqs": 2, "num_new_tokens_gained": 10})]
    srv_a, srv_b = ServerState(), ServerState()
    a = list(EventConverter(clock=lambda: 5.0, server=srv_a).convert_all(events))
    b: list[Observation] = []
    for i in EventConverter(clock=lambda: 5.0, server=srv_b).convert_batch(events):
        b.extend(i.observations() if isinstance(i, Sample) else [i])
    assert srv_a.version == srv_b.version == ">=0.5.7"
    def key(o: Observation) -> Any:
        return o.time, o.name, "nan" if math.isnan(o.value) else o.value, o.rank, o.source

    assert [key(o) for o in a] == [key(o) for o in b]


def test_live_state_batch_intake_equals_per_observation() -> None:
    """LiveState fed Samples keeps the gauges, counters and ranks it keeps from per-field observations."""
    events = random_events(6, 2000, 10)
    states = [LiveState(window_s=60, max_ranks=6, expire_after_s=600, enabled={"log": True}) for _ in range(2)]
    clock = [100.0]
    conv = EventConverter(clock=lambda: clock[0])
    for k, poll_events in enumerate(_polls(events, 37)):
        clock[0] = now = 100.0 + k
        per_obs: list[Observation | Sample] = list(conv.convert_all(poll_events))
        for st, items in ((states[0], per_obs), (states[1], conv.convert_batch(poll_events))):
            st.add_events(poll_events, now)
            st.add_observations(items, now)
    a, b = (dataclasses.replace(s.snapshot(clock[0]), document=None) for s in states)
    assert a.ranks and str(a) == str(b)  # str: NaN gauges compare equal as text


class _Lines:
    rotations = 0
    truncations = 0
    exists = True

    def __init__(self) -> None:
        self.queue: list[str] = []

    def poll(self) -> list[str]:
        out, self.queue = self.queue, []
        return out


class _LineByLine:
    """An EventReader without feed_lines: the sidecar feeds it one line at a time."""

    def __init__(self) -> None:
        self.reader = logreader.EventReader()
        self.stats = self.reader.stats

    def feed(self, line: str) -> list[Event]:
        return self.reader.feed(line)

    def flush(self) -> list[Event]:
        return self.reader.flush()


def _log_lines(n: int) -> list[str]:
    out = []
    for i in range(n):
        dp, run, queue = i % 16, 100 + (i * 7) % 200, (i * 13) % 900
        usage = 0.6 + ((i * 11) % 39) / 100
        prefix = f"[2026-01-01 00:00:{i % 60:02d} DP{dp} TP0]"
        if i % 97 == 0:
            out.append(f"{prefix} KV cache pool is full. Retract requests. #retracted_reqs: 2, "
                       f"#new_tokens_gained: 3000, #new_token_ratio: 0.4000 -> 0.5000")
        elif i % 5 == 0:
            out.append(f"{prefix} Prefill batch, #new-seq: 3, #new-token: 2400, #cached-token: 800, "
                       f"token usage: {usage:.2f}, #running-req: {run}, #queue-req: {queue}")
        elif i % 41 == 0:
            out.append(f"{prefix} Decode batch, #running-req: {run}, #token: 1000, token usage: {usage:.2f}, "
                       f"gen throughput (token/s): 100.00, #queue-req: {queue}")  # no cuda graph field
        else:
            out.append(f"{prefix} Decode batch, #running-req: {run}, #token: {int(usage * 4e5)}, "
                       f"token usage: {usage:.2f}, cuda graph: {run <= 256}, "
                       f"gen throughput (token/s): {run * 21.5:.2f}, #queue-req: {queue}")
        if i % 300 == 7:
            out.append("some other line")
    return out


def test_sidecar_batched_intake_exposes_the_same_metrics(tmp_path: Path) -> None:
    """The sidecar with Samples and feed_lines serves the /metrics of the per-line, per-observation path."""
    parser = argparse.ArgumentParser()
    add_serve_flags(parser)
    cfg = build_config(parser.parse_args(["--sglang.log-file", str(tmp_path / "x.log"), "--window", "2m"]))
    fast_adv = build_advisor(cfg)
    slow_adv = dataclasses.replace(build_advisor(cfg), to_samples=None)
    assert fast_adv.to_samples is not None
    followers = [_Lines(), _Lines()]
    sidecars = [build_sidecar(cfg, timer=lambda: 0.0, advisor=fast_adv,
                              log_input=log_input_for(followers[0], logreader.EventReader())),
                build_sidecar(cfg, timer=lambda: 0.0, advisor=slow_adv,
                              log_input=log_input_for(followers[1], _LineByLine()))]
    clock = [1000.0]
    webs = [make_web(cfg, sc, lambda: clock[0], process_metrics=False) for sc in sidecars]  # this process's CPU moves
    lines = _log_lines(6000)
    for k in range(30):
        for f in followers:
            f.queue = lines[k * 200:(k + 1) * 200]
        for sc in sidecars:
            sc.tick(clock[0])
        clock[0] += 1.0
    bodies = [w.handle("GET", "/metrics").body for w in webs]
    for needle in (b"sglang_tuning_signal{", b"sglang_tuning_decode_samples_total{", b'dp_rank="15"',
                   b"sglang_tuning_check_status{"):
        assert needle in bodies[0]
    assert bodies[0] == bodies[1]


def _fresh_sum(st: Any, sealed: list[Bucket]) -> Bucket:
    total = Bucket()
    for b in sealed:
        total.merge(b)
    return total


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_window_reuses_its_sums_without_changing_signals(seed: int) -> None:
    """Signals from the sums kept between evaluations equal a fresh merge of the window's buckets, with
    buckets leaving the window, late observations and merged-in buckets."""
    rng = random.Random(seed)
    kept, fresh = Window(60.0, 64), Window(60.0, 64)
    fresh._sum_of = _fresh_sum  # type: ignore[method-assign]
    conv = EventConverter(clock=None)
    t = 0.0
    checked = 0
    for k, poll_events in enumerate(_polls(random_events(seed, 12000, 3), 40)):
        t += rng.choice([0.3, 0.9, 2.5, 7.0])
        items = conv.convert_batch(poll_events)
        late = rng.random() < 0.1  # late data lands in an older (already summed) bucket
        when = t - rng.choice([5.0, 20.0]) if late else t
        items = [i._replace(time=when) if isinstance(i, Sample) else
                 Observation(when, i.name, i.value, i.rank, i.source) for i in items]
        for w in (kept, fresh):
            w.add_items(items)
        if rng.random() < 0.05:
            extra = Bucket()
            extra.decode.add(5.0, 77.0, 0.5, 0.0, 10.0, 0.9, (100.0, 2000.0))
            extra.retractions, extra.retracted = 1, 3.0
            for w in (kept, fresh):
                w.add_bucket(Rank(dp=1), math.floor((t - 10) / w.resolution_s) * w.resolution_s, extra.copy())
        if k % 3 == 0:
            a, b = kept.signals(t), fresh.signals(t)
            assert _same(a, b)
            checked += sum(1 for s in a.values() if (s["decode_samples"] or 0) > 100)
    assert checked > 100


def _expected_counters(events: list[Event]) -> dict[Rank, dict[tuple[str, str], float]]:
    """The counters of docs/sidecar.md, computed the plain way."""
    out: dict[Rank, dict[tuple[str, str], float]] = {}

    def count(rank: Rank, key: tuple[str, str], amount: float) -> None:
        if amount > 0 and math.isfinite(amount):
            out.setdefault(rank, {})[key] = out.setdefault(rank, {}).get(key, 0.0) + amount

    for e in events:
        rank, f = Rank.from_dict(e.rank), e.fields
        if e.kind == "decode":
            cg = f.get("cuda_graph")
            count(rank, ("decode_samples", "unknown" if not isinstance(cg, bool) else str(cg).lower()), 1)
        elif e.kind == "retract":
            count(rank, ("retractions", ""), 1)
            count(rank, ("retracted_requests", ""), float(f["num_retracted_reqs"]))
        elif e.kind == "prefill":
            for name, label in (("num_new_tokens", "new"), ("num_cached_tokens", "cached")):
                v = f.get(name)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    count(rank, ("prefill_tokens", label), float(v))
        elif e.kind == "oom":
            phase = f["phase"] if f["phase"] in ("prefill", "decode", "startup") else "unknown"
            count(rank, ("oom_events", phase), 1)
    return out


def test_live_state_counters_from_events() -> None:
    """add_events (one rank lookup per poll) counts what each event says, with odd values skipped."""
    events = random_events(7, 3000, 9)
    state = LiveState(window_s=60, max_ranks=64, expire_after_s=600, enabled={"log": True})
    for k, poll_events in enumerate(_polls(events, 77)):
        state.add_events(poll_events, 100.0 + k)
    snap = state.snapshot(100.0 + len(events) // 77)
    expected = _expected_counters(events)
    assert len(snap.ranks) > 9 and {r.rank: dict(r.counters) for r in snap.ranks if r.counters} == expected
