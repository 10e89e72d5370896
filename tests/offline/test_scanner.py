"""diagnose's reader: a range runs the sidecar's own intake (conversion into a window of its own) and
hands over frozen buckets and only the events the parent must see in order."""

from __future__ import annotations

import math
from typing import Any

import pytest

from helpers.examples import examples
from helpers.scenario_logs import LogWriter
from sglang_tuning_exporter.core.model import Rank
from sglang_tuning_exporter.offline import scanner
from sglang_tuning_exporter.offline.scanner import ChunkResult, Scanner
from sglang_tuning_exporter.pipeline.observations import EventConverter
from sglang_tuning_exporter.pipeline.signals import SignalParams
from sglang_tuning_exporter.pipeline.window import Window
from sglang_tuning_exporter.sources.accel import SCAN
from sglang_tuning_exporter.sources.logreader import scan_text

ACCEL = [pytest.param(True, id="accelerator"), pytest.param(False, id="pure-python")]


def _log() -> str:
    w = LogWriter("0.5.23", tp_size=2)
    w.server_args().startup()
    for i in range(400):
        w.decode(100 + i % 90, 0.5 + (i % 40) / 100, i % 300, graph=i % 5 != 0, dp=i % 2, tp=0)
        if i % 3 == 0:
            w.prefill(3000, 900, 0.7, 120, i % 200, dp=i % 2, tp=0)
            w.access()
        if i % 11 == 0:
            for tp in (0, 1):
                w.retract(2, dp=0, tp=tp)  # printed by both TP ranks: counted once
        w.tick(3)
    return w.text()


def _scan(text: str, accelerated: bool, monkeypatch: pytest.MonkeyPatch) -> ChunkResult:
    if accelerated and SCAN is None:
        pytest.skip("the C accelerator is not built (or SGLANG_TUNING_PURE_PYTHON is set)")
    if not accelerated:
        monkeypatch.setattr(scanner, "SCAN", None)
    return Scanner(600.0, 0.9).scan_bytes(text.encode())


def _window() -> Window:
    return Window(600.0, params=SignalParams(), expire_s=math.inf, resolution_s=600.0)


def _signals(w: Window, now: float) -> dict[Rank, dict[str, Any]]:
    return {r: {k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in s.items()}
            for r, s in w.signals(now).items()}


@pytest.mark.parametrize("accelerated", ACCEL)
def test_a_range_ships_buckets_not_batch_lines(accelerated: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dated Decode/Prefill lines and retractions are summed in the range; the parent gets the startup
    facts (in line order) and no batch line, and still counts every event."""
    text = _log()
    res = _scan(text, accelerated, monkeypatch)
    events, _ = scan_text(text)
    kinds = {e.kind for e in res.events}
    assert not kinds & {"decode", "prefill"}, kinds
    # Only the leading prints of a replica's first retraction: whether they count depends on the range before.
    lead = [e for e in res.events if e.kind == "retract"]
    assert [e.rank.get("tp") for e in lead] == [0, 1] and len({e.time for e in lead}) == 1
    assert {"server_args", "startup_memory"} <= kinds
    assert [e.line for e in res.events] == sorted(e.line for e in res.events)
    assert len(res.events) + res.summed_events + res.fast == len(events)
    assert res.buckets and set(res.rank_span) == {(0, None), (1, None)}
    assert res.retract_keys[(0, None)][2] == frozenset({0, 1})  # the window's de-dup state, handed over
    assert res.version_floor == "0.5.7"  # `#new_tokens_gained`, noted by the sidecar's conversion


@pytest.mark.parametrize("accelerated", ACCEL)
def test_range_buckets_are_the_window_intake(accelerated: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The buckets a range hands over, merged into a window, give the signals of that window fed the
    same events through the sidecar's conversion (the accelerator replaces parse, convert and sum only)."""
    text = _log()
    res = _scan(text, accelerated, monkeypatch)
    merged, direct = _window(), _window()
    for (dp, pp, start), b in sorted(res.buckets.items(), key=lambda kv: kv[0][2]):
        span = res.rank_span[(dp, pp)]
        merged.add_bucket(Rank(dp=dp, pp=pp), start, b, first=span[0], last=span[1])
    merged.add_items(EventConverter().convert_batch([e for e in res.events if e.kind == "retract"]))  # the lead
    conv = EventConverter()
    events, _ = scan_text(text)
    direct.add_items(conv.convert_batch([e for e in events if e.kind in ("decode", "prefill", "retract")]))
    end = (conv.last_time or 0.0) + 1.0  # the last window holds 100 Decode lines of each replica
    assert res.last_t == conv.last_time
    got, want = _signals(merged, end), _signals(direct, end)
    assert got == want and want[Rank(dp=0)]["decode_samples"] == 100
    assert want[Rank(dp=0)]["retractions_per_minute"] is not None


def test_a_range_is_decoded_a_block_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the accelerator the bytes are decoded in blocks cut at line ends (never the whole range
    at once), with the same result, lines longer than a block included."""
    monkeypatch.setattr(scanner, "SCAN", None)
    text = _log().replace("\n", "\n" + "x" * 300 + "\n", 3)  # a line longer than the block
    whole = Scanner(600.0, 0.9).scan_bytes(text.encode())
    monkeypatch.setattr(scanner, "_TEXT_BLOCK", 256)
    decoded: list[int] = []
    real = bytes.decode

    class Spy(bytes):
        def __getitem__(self, key: Any) -> Any:
            got = bytes.__getitem__(self, key)
            return Spy(got) if isinstance(key, slice) else got

        def decode(self, *args: Any, **kw: Any) -> str:  # type: ignore[override]
            decoded.append(len(self))
            return real(self, *args, **kw)

    blocks = Scanner(600.0, 0.9).scan_bytes(Spy(text.encode()))
    assert decoded and max(decoded) < 1024 and sum(decoded) == len(text.encode())
    assert (blocks.lines, blocks.summed_events, len(blocks.events)) == \
        (whole.lines, whole.summed_events, len(whole.events))
    assert sorted(blocks.buckets) == sorted(whole.buckets)
    assert blocks.rank_span == whole.rank_span and blocks.retract_keys == whole.retract_keys


def test_a_partial_line_is_completed_across_a_chunk_boundary() -> None:
    """A Decode line missing a field is completed by the next line of the same rank and second, as in
    the sidecar's one window, even when a chunk of the stream ends between the two lines."""
    first = "[2025-03-01 10:00:00] Decode batch, #running-req: 3, #token: 10, token usage: 0.10, cuda graph: True, "
    second = ("[2025-03-01 10:00:00] Decode batch, #running-req: 5, #token: 20, token usage: 0.20, cuda graph: True, "
              "gen throughput (token/s): 9.00, #queue-req: 700")
    tail = "[2025-03-01 10:00:09] Decode batch, #running-req: 4, #token: 30, token usage: 0.30, cuda graph: True, " \
           "gen throughput (token/s): 8.00, #queue-req: 1"

    def buckets(chunks: list[list[str]]) -> dict[Any, tuple[Any, ...]]:
        """The chunks' buckets merged by start, as the parent's window merges them."""
        sc = Scanner(10.0, 0.9, (100.0, 2000.0))  # lines through the event reader into the range's window
        out: dict[Any, tuple[Any, ...]] = {}
        for i, lines in enumerate(chunks):
            res = sc.scan(lines, final=i == len(chunks) - 1)
            for key, b in res.buckets.items():
                d = b.decode
                qn, kn, us, q, r = out.get(key, (0, 0, 0.0, {}, {}))
                out[key] = (qn + d.queue_n, kn + d.kv_n, round(us + d.usage_sum, 9),
                            {k: q.get(k, 0) + dict(d.queue).get(k, 0) for k in {*q, *dict(d.queue)}},
                            {k: r.get(k, 0) + dict(d.running).get(k, 0) for k in {*r, *dict(d.running)}})
        return out

    whole = buckets([[first, second, tail]])
    assert whole and whole == buckets([[first], [second, tail]]) == buckets([[first, second], [tail]])


# --- C and Python alike around a partial line (differential) -------------------------------------
_PARTIAL = [
    # A partial Decode line (queue only: "Decode batch" quoted in a note), a whole one of a learnt
    # layout, then one the C reader hands back (`\r\r\r`): the whole line commits the partial sample.
    "[2025-11-22 23:24:43 DP0 TP0 EP0] Prefill batch, #new-seq: 1, note: Decode batch, #queue-req: 2",
    "[2025-11-22 23:24:43 DP0 TP0 EP0] Decode batch, #running-req: 5, #full token: 10, full token usage: 0.50, "
    "#swa token: 3, swa token usage: 0.70, npu graph: True, gen throughput (token/s): 1.0, #queue-req: 1",
    "50%|#####   | 5/10 [00:01<00:01, 4.9it/s]\r[2025-11-22 23:24:43 DP0 TP0 EP0] Decode batch, #running-req: 3, "
    "#token: 1442, token usage: 0.18, cuda graph: False, gen throughput (token/s): 12.5, #queue-req:\r\r\r 0",
]


def _diagnosed_both(data: bytes, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    from sglang_tuning_exporter.guide.checks import load_table
    from sglang_tuning_exporter.guide.config import Config
    from sglang_tuning_exporter.offline.diagnosis import ClockSetBack, Diagnosis

    out: list[Any] = []
    table = load_table()
    for scan in (SCAN, None):
        monkeypatch.setattr(scanner, "SCAN", scan)
        d = Diagnosis(table, Config(), "docs-2025", "throughput", {})
        try:
            d.add_chunk(Scanner(d.res, 0.9).scan_bytes(data))
        except ClockSetBack:
            out.append("again")
            continue
        doc = d.finish("x").document
        out.append((doc["signals"], doc["signals_by_rank"], d.lines, d.unparsed, d.nul))
    return out


@pytest.mark.skipif(SCAN is None, reason="the C accelerator is not built here or turned off")
def test_a_whole_line_after_a_partial_one_commits_it_in_c_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The C reader summed the whole line beside the window, so the partial sample stayed open and took
    the next line's values: 2 KV samples where the sidecar's window counts 1."""
    c, py = _diagnosed_both(("\n".join(_PARTIAL) + "\n").encode(), monkeypatch)
    assert c == py and py[0]["kv_samples"] == 1.0


@pytest.mark.skipif(SCAN is None, reason="the C accelerator is not built here or turned off")
def test_generated_lines_with_carriage_returns_diagnose_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real-looking lines with `\\r` runs cut in anywhere: the same signals with and without C."""
    import random

    from helpers.mixed_logs import POOL

    rnd = random.Random(11)
    for _ in range(examples(120)):  # a tenth under make test-fast
        lines = []
        for _ in range(rnd.randint(1, 8)):
            p = rnd.choice(POOL).replace("{r}", str(rnd.randint(0, 2)))
            if rnd.random() < 0.5:
                k = rnd.randint(0, len(p))
                p = p[:k] + "\r" * rnd.randint(1, 3) + p[k:]
            lines.append(p)
        data = ("\n".join(lines) + "\n").encode()
        c, py = _diagnosed_both(data, monkeypatch)
        assert c == py, data


@pytest.mark.skipif(SCAN is None, reason="the C accelerator is not built here or turned off")
def test_hybrid_decode_lines_diagnose_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hybrid model's log (SWA and mamba pools, full pool near and past full, queues): the C reader sums its
    Decode lines itself now (they went to Python) and the signals, pool signals included, are the same."""
    import random

    rnd = random.Random(5)
    lines = []
    for i in range(600):
        stamp = f"[2025-03-01 10:{i // 60 % 60:02d}:{i % 60:02d} DP{i % 2} TP0]"
        pools = [f"#full token: 100, full token usage: {rnd.choice([0.3, 0.85, 0.9, 0.95]):.2f}"] * (i % 3 != 0)
        pools += [f"#swa token: 50, swa token usage: {rnd.choice([0.2, 0.9, 1.0]):.2f}"] * (i % 4 != 1)
        pools += [f"mamba num: {rnd.randint(0, 300)}, mamba usage: {rnd.choice([0.01, 0.05, 0.6, 0.93]):.2f}"] * (
            i % 4 != 2 or not pools[-1:])
        lines.append(f"{stamp} Decode batch, #running-req: {rnd.randint(1, 64)}, " + ", ".join(pools)
                     + f", cuda graph: True, gen throughput (token/s): 10.00, #queue-req: {rnd.choice([0, 3])}")
    data = ("\n".join(lines) + "\n").encode()
    res = Scanner(60.0, 0.9).scan_bytes(data)
    assert res.fast == len(lines), "the C reader handed hybrid lines back"
    c, py = _diagnosed_both(data, monkeypatch)
    assert c == py
    assert py[0]["pool_samples"] > 0 and 0 < py[0]["mamba_bound_ratio"] < 1, py[0]  # the pools were judged
