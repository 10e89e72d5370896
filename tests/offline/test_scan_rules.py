"""The C accelerator's per-sample rules (sources/_scan.c, "SampleStats.add") equal the Python declaration
(pipeline/stats.SampleStats.add) statistic by statistic: every slot of SampleStats (queue_zero/over/under,
kv_under, capped_base and its histogram, graph_miss and its histogram, sums and maxima), over generated
Decode and Prefill lines, usage around usage_good and queues around the band. No rule lives only in C."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.examples import examples
from sglang_tuning_exporter.offline.scanner import Scanner
from sglang_tuning_exporter.pipeline.stats import SampleStats
from sglang_tuning_exporter.sources.accel import SCAN

pytestmark = pytest.mark.skipif(SCAN is None, reason="the C accelerator is not built (pure-Python install)")

STATS = [s for s in SampleStats.__slots__ if s != "frozen"]
USAGE_GOOD, BAND = 0.9, (100.0, 2000.0)

_line = st.tuples(
    st.sampled_from(["Decode", "Prefill"]),
    st.sampled_from([0, 1, 99, 100, 101, 1999, 2000, 2001, 5000]),  # queue, around the band's edges
    st.integers(0, 700),  # running
    st.sampled_from([0.0, 0.5, 0.89, 0.9, 0.91, 1.0]),  # usage, around usage_good
    st.sampled_from([None, True, False]),  # cuda graph field
)


Line = tuple[str, int, int, float, bool | None]


def _text(lines: list[Line]) -> str:
    out = []
    for i, (kind, q, r, u, g) in enumerate(lines):
        stamp = f"[2025-03-01 10:{i // 60 % 60:02d}:{i % 60:02d} TP0]"
        if kind == "Decode":
            graph = "" if g is None else f"cuda graph: {g}, "
            out.append(f"{stamp} Decode batch, #running-req: {r}, #token: {r * 10}, token usage: {u:.2f}, "
                       f"{graph}gen throughput (token/s): {r * 1.5:.2f}, #queue-req: {q}")
        else:
            out.append(f"{stamp} Prefill batch, #new-seq: 1, #new-token: 5, #cached-token: 0, token usage: {u:.2f}, "
                       f"#running-req: {r}, #queue-req: {q}")
    return "\n".join(out) + "\n"


def _sum(stats: list[SampleStats], part: str, out: dict[str, Any]) -> None:
    """Every SampleStats slot of `stats`, summed (histograms merged, maxima taken) into `out`."""
    for s in stats:
        if s.frozen:
            s.thaw()
        for name in STATS:
            v, key = getattr(s, name), f"{part}.{name}"
            if isinstance(v, dict):
                h = out.setdefault(key, {})
                for k, c in v.items():
                    h[k] = h.get(k, 0) + c
            elif name == "usage_max":
                out[key] = max(out.get(key, 0.0), v)
            else:
                out[key] = out.get(key, 0) + v


def _in_c(text: str) -> dict[str, Any]:
    """The accelerator's sums: the buckets of a scan_bytes over the text."""
    res = Scanner(60.0, USAGE_GOOD, BAND).scan_bytes(text.encode())
    assert res.fast == text.count("\n"), "the accelerator did not read every line itself"
    out: dict[str, Any] = {}
    for part in ("decode", "prefill"):
        _sum([getattr(b, part) for b in res.buckets.values()], part, out)
    return out


def _declared(lines: list[Line]) -> dict[str, Any]:
    """The Python declaration: SampleStats.add per line, with the values as the line prints them and the
    fields the window hands it (a Prefill line has no graph or throughput)."""
    decode, prefill = SampleStats(), SampleStats()
    for _, (kind, q, r, u, g) in enumerate(lines):
        usage = float(f"{u:.2f}")
        if kind == "Decode":
            decode.add(q, r, usage, None if g is None else float(g), float(f"{r * 1.5:.2f}"), USAGE_GOOD, BAND)
        else:
            prefill.add(q, r, usage, None, None, USAGE_GOOD, BAND)
    out: dict[str, Any] = {}
    _sum([decode], "decode", out)
    _sum([prefill], "prefill", out)
    return out


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(_line, min_size=1, max_size=60))
def test_c_sample_rules_equal_the_python_declaration(lines: list[Line]) -> None:
    c, py = _in_c(_text(lines)), _declared(lines)
    assert set(c) == set(py) == {f"{p}.{n}" for p in ("decode", "prefill") for n in STATS}
    for key in py:
        if isinstance(py[key], float):
            assert c[key] == pytest.approx(py[key]), key
        else:
            assert c[key] == py[key], key


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
