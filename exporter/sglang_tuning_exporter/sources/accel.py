"""The optional C accelerator of the log reader (`_scan`), configured from logparse's own tables.

`SCAN` is the configured module, or None when it was not built (no compiler at install time) or
`SGLANG_TUNING_PURE_PYTHON=1` turns it off; the reader then runs the pure-Python path, which
tests/sources/test_scan_accel.py holds it to: the same events, line numbers and statistics.
"""

from __future__ import annotations

import array
import os
import zlib
from pathlib import Path
from types import ModuleType
from typing import Any

from sglang_tuning_exporter.core import events as ev
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.sources import logline, logmessages, logparse

ENV_DISABLE = "SGLANG_TUNING_PURE_PYTHON"
_STALE = "the C accelerator was built from another version of _scan.c (%s): running the pure-Python reader; rebuild it with `python3 setup.py build_ext --inplace` or reinstall"
# logparse's converters by the code the C side knows them by; keys with any other stay in Python.
_CONV_CODES: dict[Any, int] = {int: 0, float: 1, logline.to_bool: 2, logline.to_ratio: 3}


# What diagnose's buckets sum per Decode/Prefill line, by role (see _scan.c line_accumulate): Decode
# (running, usage, graph, throughput, queue), Prefill (new, cached, usage, running, queue); a line
# without running or queue goes through the Python path.
DECODE_COLUMNS = ("num_running_reqs", "token_usage", "cuda_graph", "gen_throughput", "num_queue_reqs")
PREFILL_COLUMNS = ("num_new_tokens", "num_cached_tokens", "token_usage", "num_running_reqs", "num_queue_reqs")
# A hybrid model's Decode fields the pool sums read (pipeline/observations.pool_pairs, whose thresholds the
# scanner hands to each scan_buckets call): full, SWA and mamba usage, mamba num.
HYBRID_COLUMNS = ("full_token_usage", "swa_token_usage", "mamba_usage", "mamba_num")


def configure(mod: ModuleType) -> None:
    """Hand the parser's tables to the C module (it holds none of its own)."""
    keys = [(raw, name, _CONV_CODES[conv], logline.GRAPH_LABELS.get(raw))
            for raw, (name, conv) in logline.BATCH_KEYS.items() if conv in _CONV_CODES]
    ranks = tuple(logline._RANK_KEYS[tag] for tag in ("DP", "PP", "TP", "EP", "ATTN_CP", "MOE_DP"))
    mod.configure(Event, (ev.DECODE, ev.PREFILL), keys, list(logparse.dispatch_markers()),
                  ("forward_iter", "token_usage", "graph_backend"), logline.POOL_USAGES, ranks)
    # Retraction keys, the one every retract event has first (the C side requires keys[0]).
    rkeys = sorted(((raw, name) for raw, (name, conv) in logline.RETRACT_KEYS.items() if conv is int),
                   key=lambda kv: kv[1] != "num_retracted_reqs")
    mod.configure_retract(ev.RETRACT, logmessages.RETRACT_HEAD_STD, rkeys,
                          ("new_token_ratio_before", "new_token_ratio_after"))
    mod.configure_columns(DECODE_COLUMNS, PREFILL_COLUMNS, HYBRID_COLUMNS)


# What the rest of the package calls; `_scan.c`'s histograms are int32 ('i') or int64 ('q') arrays.
_ENTRY_POINTS = ("configure", "configure_columns", "configure_retract", "scan_buffer",
                 "scan_buckets", "freeze_hist", "group_hists")


def load(disabled: bool | None = None) -> ModuleType | None:
    """The configured accelerator, or None (not built, or turned off)."""
    if disabled is None:
        disabled = os.environ.get(ENV_DISABLE, "") not in ("", "0")
    if disabled:
        return None
    try:
        from sglang_tuning_exporter.sources import _scan
    except ImportError:
        return None
    if array.array("i").itemsize != 4:
        return None  # an odd platform: the Python path is safe
    built_from, source = getattr(_scan, "SOURCE", "unknown"), source_digest()
    if source is not None and built_from != source:  # an editable install after a pull that changed _scan.c
        _warn_stale(f"built from _scan.c {built_from}, the source beside it is {source}")
        return None
    missing = [name for name in _ENTRY_POINTS if not hasattr(_scan, name)]
    if missing:
        _warn_stale("no " + ", ".join(missing))
        return None
    try:
        configure(_scan)
    except (TypeError, ValueError) as exc:  # its configure takes other arguments
        _warn_stale(exc)
        return None
    return _scan



def source_digest() -> str | None:
    """The digest setup.py builds into `_scan` (the CRC-32 and the length of `_scan.c`, 16 hex digits: zlib is
    loaded anyway, where importing hashlib costs a diagnose start 2 ms), of the `_scan.c` beside
    this file; None where the source is not shipped (an installed wheel): nothing to compare then."""
    path = Path(__file__).with_name("_scan.c")
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return f"{zlib.crc32(data):08x}{len(data):08x}"


def _warn_stale(why: object) -> None:
    # logging is imported only here: a CLI run whose accelerator loads never pays for it.
    import logging

    logging.getLogger(__name__).warning(_STALE, why)


SCAN: ModuleType | None = load()
