"""The C accelerator's per-sample rules (sources/_scan.c, "SampleStats.add", and the token usage it derives
from a hybrid model's pools) equal the Python declaration statistic by statistic. The declaration is the
Python read path (EventReader -> EventConverter -> Window -> pipeline/stats.SampleStats.add and Bucket);
the statistics compared are ENUMERATED from `Bucket.__slots__` and `SampleStats.__slots__`, so a statistic
added in Python without C parity fails here, and one the generated lines cannot exercise fails
test_every_declared_statistic_is_exercised until the generator reaches it. No rule lives only in C."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.examples import examples
from sglang_tuning_exporter.offline.scanner import ChunkResult, Scanner
from sglang_tuning_exporter.pipeline.stats import Bucket, SampleStats, hist_pairs
from sglang_tuning_exporter.sources.accel import SCAN

pytestmark = pytest.mark.skipif(SCAN is None, reason="the C accelerator is not built (pure-Python install)")

USAGE_GOOD, BAND = 0.9, (100.0, 2000.0)
SAMPLE_PARTS = ("decode", "prefill")  # the Bucket slots that hold a SampleStats
BOOKKEEPING = {"frozen"}  # SampleStats' state flag, not a statistic
# Declared statistics no Decode/Prefill line feeds: left at their start by both paths here.
NOT_FROM_BATCH_LINES = {
    "retractions": "retraction lines (test_scan_accel compares them)", "retracted": "retraction lines",
    "oom": "OOM records", "counts": "the counted event kinds (core/events.Count)",
    "disabled_steps": "cuda_graph_disabled warnings", "latency": "scraped histograms only",
    "graph_passes": "scraped counters only", "eager_passes": "scraped counters only",
}
PREFILL_HAS_NO = {"graph_n", "graph_miss", "missed", "tp_n", "tp_sum"}  # a Prefill line prints no graph, throughput
STATISTICS = sorted([f"{p}.{s}" for p in SAMPLE_PARTS for s in SampleStats.__slots__ if s not in BOOKKEEPING]
                    + [s for s in Bucket.__slots__ if s not in SAMPLE_PARTS])

_line = st.tuples(
    st.sampled_from(["Decode", "Prefill"]),
    st.sampled_from([0, 1, 99, 100, 101, 1999, 2000, 2001, 5000]),  # queue, around the band's edges
    st.integers(0, 700),  # running
    st.sampled_from([0.0, 0.5, 0.89, 0.9, 0.91, 1.0]),  # usage (the full pool's on a hybrid line), around usage_good
    st.sampled_from([None, True, False]),  # cuda graph field
    st.sampled_from([None, "swa", "mamba"]),  # a hybrid model's second pool
    st.sampled_from([0.0, 0.04, 0.9, 0.95]),  # its usage: around the mamba floor (0.05) and POOL_FULL
    st.integers(0, 9000),  # a Prefill line's new tokens (its cached tokens: a third of them)
)
Line = tuple[str, int, int, float, bool | None, str | None, float, int]


def _text(lines: list[Line]) -> str:
    out = []
    for i, (kind, q, r, u, g, pool, pu, new) in enumerate(lines):
        stamp = f"[2025-03-01 10:{i // 60 % 60:02d}:{i % 60:02d} TP0]"
        usage = {None: f"token usage: {u:.2f}", "swa": f"full token usage: {u:.2f}, swa token usage: {pu:.2f}",
                 "mamba": f"full token usage: {u:.2f}, mamba num: {r}, mamba usage: {pu:.2f}"}[pool]
        if kind == "Decode":
            graph = "" if g is None else f"cuda graph: {g}, "
            out.append(f"{stamp} Decode batch, #running-req: {r}, #token: {r * 10}, {usage}, "
                       f"{graph}gen throughput (token/s): {r * 1.5:.2f}, #queue-req: {q}")
        else:
            out.append(f"{stamp} Prefill batch, #new-seq: 1, #new-token: {new}, #cached-token: {new // 3}, {usage}, "
                       f"#running-req: {r}, #queue-req: {q}")
    return "\n".join(out) + "\n"


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if hasattr(v, "total"):  # a FrozenHist
        return dict(hist_pairs(v))
    return v


def _statistics(res: ChunkResult) -> dict[tuple[Any, str], Any]:
    """Every declared statistic of every bucket of a scan: (bucket key, `part.slot` or `slot`) -> value."""
    out: dict[tuple[Any, str], Any] = {}
    for key, b in res.buckets.items():
        for name in STATISTICS:
            part, _, slot = name.rpartition(".")
            out[key, name] = _plain(getattr(getattr(b, part) if part else b, slot))
    return out


def _in_c(text: str) -> tuple[dict[tuple[Any, str], Any], int]:
    """The accelerator's sums: the buckets of a scan_bytes over the text; and how many lines it read."""
    res = Scanner(60.0, USAGE_GOOD, BAND).scan_bytes(text.encode())
    return _statistics(res), res.fast


def _declared(text: str) -> dict[tuple[Any, str], Any]:
    """The Python declaration: the same text through the event reader, converter and window."""
    return _statistics(Scanner(60.0, USAGE_GOOD, BAND).scan(text.splitlines()))


def _assert_equal(c: dict[tuple[Any, str], Any], py: dict[tuple[Any, str], Any]) -> None:
    assert set(c) == set(py)
    for key in sorted(py, key=str):
        if isinstance(py[key], float | dict):  # sums and pool sums: the same up to float rounding
            assert c[key] == pytest.approx(py[key]), key
        else:
            assert c[key] == py[key], key


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(_line, min_size=1, max_size=60))
def test_c_sample_rules_equal_the_python_declaration(lines: list[Line]) -> None:
    text = _text(lines)
    in_c, fast = _in_c(text)
    assert fast == len(lines), "the accelerator did not read every line itself"
    _assert_equal(in_c, _declared(text))


# Every corner of the generator's values, each kind of line and pool (fewer than 3600 lines: one hour of stamps).
CORNERS: list[Line] = [
    (kind, q, r, u, g, pool, pu, new)
    for kind in ("Decode", "Prefill") for q in (0, 1, 101, 2001, 5000) for r, u in ((0, 0.0), (300, 0.5), (700, 0.95))
    for g in (None, True, False) for pool, pu in ((None, 0.0), ("swa", 0.95), ("mamba", 0.95), ("mamba", 0.04))
    for new in (0, 4096)
]


def test_the_corners_agree() -> None:
    text = _text(CORNERS)
    in_c, fast = _in_c(text)
    assert fast == len(CORNERS), "the accelerator did not read every line itself"
    _assert_equal(in_c, _declared(text))


def test_every_declared_statistic_is_exercised() -> None:
    """Each statistic of Bucket and SampleStats moves off its start on the generator's lines, or is named
    above with the reason no batch line feeds it: a new statistic needs its lines here before it can pass."""
    assert set(NOT_FROM_BATCH_LINES) <= set(Bucket.__slots__)
    assert set(SampleStats.__slots__) >= PREFILL_HAS_NO
    got = _declared(_text(CORNERS))
    start = {name: value for (_, name), value in _statistics(_one_empty_bucket()).items()}
    moved = {name for (_, name), value in got.items() if value != start[name]}
    expected = (set(STATISTICS) - set(NOT_FROM_BATCH_LINES)
                - {f"prefill.{s}" for s in PREFILL_HAS_NO})
    assert expected - moved == set(), "declared statistics the generated lines never feed"
    assert moved & set(NOT_FROM_BATCH_LINES) == set(), "fed by batch lines after all: compare them"


def _one_empty_bucket() -> ChunkResult:
    res = ChunkResult()
    res.buckets[(None, None, 0.0)] = Bucket()
    return res


# --- hybrid models: the pool sums of Decode lines with SWA or mamba usage (observations.pool_pairs) -----
_hybrid = st.tuples(
    st.sampled_from([0, 1, 5]),  # queue: waiting or not
    st.sampled_from([None, 0.0, 0.5, 0.89, 0.9, 0.95]),  # full token usage, around POOL_FULL
    st.sampled_from([None, 0.0, 0.5, 0.9, 1.0]),  # swa token usage
    st.sampled_from([None, 0.0, 0.04, 0.05, 0.5, 0.9, 0.97]),  # mamba usage, around its size floor and POOL_FULL
    st.sampled_from([None, 0, 7, 120]),  # mamba num
).filter(lambda h: h[2] is not None or h[3] is not None)  # a hybrid line has a SWA or a mamba pool

Hybrid = tuple[int, float | None, float | None, float | None, int | None]


def _hybrid_text(lines: list[Hybrid]) -> str:
    out = []
    for i, (q, full, swa, mamba, num) in enumerate(lines):
        parts = [f"[2025-03-01 10:{i // 60 % 60:02d}:{i % 60:02d} TP0] Decode batch, #running-req: 4"]
        if full is not None:
            parts.append(f"#full token: 100, full token usage: {full:.2f}")
        if swa is not None:
            parts.append(f"#swa token: 50, swa token usage: {swa:.2f}")
        if num is not None:
            parts.append(f"mamba num: {num}")
        if mamba is not None:
            parts.append(f"mamba usage: {mamba:.2f}")
        parts.append(f"cuda graph: True, gen throughput (token/s): 12.50, #queue-req: {q}")
        out.append(", ".join(parts))
    return "\n".join(out) + "\n"


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(_hybrid, min_size=1, max_size=60))
def test_c_pool_sums_equal_the_python_declaration(lines: list[Hybrid]) -> None:
    """Hybrid Decode lines are read in C (they went to the Python path, about 8x slower) and their pool
    sums are pool_pairs' own, key by key (a key appears only where pool_pairs gives it)."""
    from sglang_tuning_exporter.pipeline.observations import pool_pairs

    text = _hybrid_text(lines)
    res = Scanner(60.0, USAGE_GOOD, BAND).scan_bytes(text.encode())
    assert res.fast == len(lines), "the accelerator did not read every hybrid line itself"
    c: dict[str, float] = {}
    for b in res.buckets.values():
        for name, v in b.pools.items():
            c[name] = c.get(name, 0.0) + v
    py: dict[str, float] = {}
    for q, full, swa, mamba, num in lines:
        f: dict[str, Any] = {"num_queue_reqs": q}
        for name, v in (("full_token_usage", full), ("swa_token_usage", swa), ("mamba_usage", mamba)):
            if v is not None:
                f[name] = float(f"{v:.2f}")
        if num is not None:
            f["mamba_num"] = num
        for name, v in pool_pairs(f):
            py[name] = py.get(name, 0.0) + v
    assert set(c) == set(py)
    for name in py:
        assert c[name] == pytest.approx(py[name]), name
