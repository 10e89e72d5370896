"""The parser's common ground: a line's prefix (timestamp, rank tags, decorations), values and
canonical keys. Pure and stateless: no I/O, no clock, nothing kept between calls (what a reader learns
from its lines is in grammar.Grammar)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final

from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.core.redact import redact_text


class Unparsed:
    """Sentinel: the line carries a recognised head but its body could not be read."""

    __slots__ = ()


UNPARSED: Final = Unparsed()
ParseResult = Event | None | Unparsed

# ---------------------------------------------------------------------------------------------
# Prefix: timestamp and rank tags, wherever the decorations put them.
# ---------------------------------------------------------------------------------------------
_TS = re.compile(r"(?:(\d{4}-\d\d-\d\d)[ T])?(\d\d:\d\d:\d\d)(?:[.,](\d{1,6}))?(?![\d:])")
_RANK = re.compile(r"\b(ATTN_CP|MOE_DP|DP|PP|TP|EP)(\d+)\b")
_CUT_DATE = re.compile(r"\d-\d\d-\d\d[ T]$")
_RANK_V01 = re.compile(r"\bRank (\d+): ")
_RANK_KEYS = {"DP": "dp", "PP": "pp", "TP": "tp", "EP": "ep", "ATTN_CP": "attn_cp", "MOE_DP": "moe_dp"}
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def compute_prefix(prefix: str) -> tuple[str | None, dict[str, int]]:
    last = None
    for m in _TS.finditer(prefix):
        last = m
    time: str | None = None
    rank_region = prefix
    if last is not None:
        date, clock, frac = last.group(1), last.group(2), last.group(3)
        time = clock if date is None else f"{date}T{clock}"
        if frac:
            time = f"{time}.{frac}"
        if date is None and _CUT_DATE.search(prefix, 0, last.start()):
            time = None  # a date that lost digits (`025-06-23 18:55:20`): no stamp, not a time of day
        # Rank tags follow the timestamp; text before it (docker/Ray names) is not a rank.
        rank_region = prefix[last.end():]
    rank = {_RANK_KEYS[k]: int(v) for k, v in _RANK.findall(rank_region)}
    if not rank:
        m0 = _RANK_V01.search(prefix)
        if m0:
            rank = {"tp": int(m0.group(1))}
    return time, rank


# SGLang's own prefix, `[YYYY-MM-DD HH:MM:SS(.mmm)( RANKn)*] `: read without the general search.
STD_PREFIX_GROUPS = r"\[(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d(?:\.\d{1,6})?)((?: [A-Z_]+\d+)*)\] "
STD_PREFIX = re.compile(STD_PREFIX_GROUPS)  # grammar.LineBatches starts every layout with the same groups


def std_ranks(tags: str) -> dict[str, int]:
    """The ranks of the tags of SGLang's own prefix (` DP0 TP1`)."""
    return {_RANK_KEYS[k]: int(v) for k, v in _RANK.findall(tags)}


def split_prefix(prefix: str) -> tuple[str | None, dict[str, int]]:
    """Time (ISO, or HH:MM:SS when the log has no date) and ranks named by a line prefix
    (grammar.Grammar remembers them for a reader)."""
    m = STD_PREFIX.fullmatch(prefix)
    if m is not None:
        return f"{m.group(1)}T{m.group(2)}", std_ranks(m.group(3))
    return compute_prefix(prefix)


def make_event(line_no: int, kind: str, prefix: str, fields: dict[str, Any]) -> Event:
    time, rank = split_prefix(prefix)  # a fresh rank dict
    return Event(line_no, kind, time, rank, fields)


# ---------------------------------------------------------------------------------------------
# Values and keys.
# ---------------------------------------------------------------------------------------------
_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def normalise_key(key: str) -> str:
    """Unknown-key rule: lower-case, leading `#` -> `num_`, other non-alphanumeric runs -> `_`."""
    k = key.strip()
    lead = ""
    if k.startswith("#"):
        lead = "num_"
        k = k[1:]
    return lead + _NON_ALNUM.sub("_", k.lower()).strip("_")


def _percent(v: str) -> float:
    num = v[:-1].strip()
    decimals = len(num.partition(".")[2])
    return round(float(num) / 100.0, decimals + 2)


def auto_value(v: str) -> Any:
    """Numbers as numbers, True/False as booleans, `12.89%` as 0.1289, anything else as text."""
    v = v.strip()
    if not v:
        return v
    c = v[0]
    if c.isdigit() or c in "-+.":
        try:
            return int(v)
        except ValueError:
            pass
        try:
            return float(v)
        except ValueError:
            pass
        if v.endswith("%"):
            try:
                return _percent(v)
            except ValueError:
                return v
        return v
    if v == "True":
        return True
    if v == "False":
        return False
    if v in ("None", "nan", "inf"):
        return None if v == "None" else float(v)
    return v


def to_bool(v: str) -> bool:
    v = v.strip()
    if v == "True":
        return True
    if v == "False":
        return False
    raise ValueError(v)


def to_ratio(v: str) -> float:
    v = v.strip()
    return _percent(v) if v.endswith("%") else float(v)


_Conv = Callable[[str], Any]

# Batch-line keys (Decode/Prefill of every release, v0.1 spellings included) -> canonical names.
BATCH_KEYS: dict[str, tuple[str, _Conv]] = {
    "#running-req": ("num_running_reqs", int),
    "#token": ("num_used_tokens", int),
    "token usage": ("token_usage", float),
    "cuda graph": ("cuda_graph", to_bool),
    "gen throughput (token/s)": ("gen_throughput", float),
    "#queue-req": ("num_queue_reqs", int),
    "#full token": ("num_full_tokens", int),
    "full token usage": ("full_token_usage", float),
    "#swa token": ("num_swa_tokens", int),
    "swa token usage": ("swa_token_usage", float),
    "mamba num": ("mamba_num", int),
    "mamba usage": ("mamba_usage", float),
    "#gpu token": ("num_gpu_tokens", int),
    "gpu token usage": ("gpu_token_usage", float),
    "#cpu token": ("num_cpu_tokens", int),
    "cpu token usage": ("cpu_token_usage", float),
    "accept len": ("accept_len", float),
    "accept rate": ("accept_rate", float),
    "cap len": ("cap_len", float),
    "block accept len": ("block_accept_len", float),
    "pre-allocated usage": ("pre_allocated_usage", float),
    "#prealloc-req": ("num_prealloc_reqs", int),
    "#transfer-req": ("num_transfer_reqs", int),
    "#retracted-req": ("num_retracted_reqs", int),
    "#inflight-req": ("num_inflight_reqs", int),
    "#host-receive-req": ("num_host_receive_reqs", int),
    "#new-seq": ("num_new_seqs", int),
    "#new-token": ("num_new_tokens", int),
    "#cached-token": ("num_cached_tokens", int),
    "cache hit rate": ("cache_hit_rate", to_ratio),
    "input throughput (token/s)": ("input_throughput", float),
    "#pending-token": ("num_pending_tokens", int),
    "#unbootstrapped-req": ("num_unbootstrapped_reqs", int),
    "#transferring-req": ("num_transferring_reqs", int),
    "#bootstrap-req": ("num_bootstrap_reqs", int),
    "#optimistic-req": ("num_optimistic_reqs", int),
    "#replay-token": ("num_replay_tokens", int),
    # v0.1 `new fill batch.` spellings
    "#seq": ("num_new_seqs", int),
    "#cached_token": ("num_cached_tokens", int),
    "#new_token": ("num_new_tokens", int),
    "#remaining_req": ("num_queue_reqs", int),
    "#running_req": ("num_running_reqs", int),
    "tree_cache_hit_rate": ("cache_hit_rate", to_ratio),
}
# Other device labels of the graph flag: the value is still `cuda_graph`, the label is kept.
for _label in ("npu", "cpu", "musa", "xpu"):
    BATCH_KEYS[f"{_label} graph"] = ("cuda_graph", to_bool)
GRAPH_LABELS = {"npu graph": "npu", "cpu graph": "cpu", "musa graph": "musa", "xpu graph": "xpu"}
POOL_USAGES = (  # hybrid models log each pool; token_usage is then the fullest (SGLang's gauge)
    "full_token_usage", "swa_token_usage", "mamba_usage", "gpu_token_usage")

RETRACT_KEYS: dict[str, tuple[str, _Conv]] = {
    "#retracted_reqs": ("num_retracted_reqs", int),
    "#new_tokens_gained": ("num_new_tokens_gained", int),
    "#mamba_num_gained": ("num_mamba_num_gained", int),
    "#aborted_retracted_reqs": ("num_aborted_retracted_reqs", int),
}


def read_pairs(body: str, sep: str, keys: dict[str, tuple[str, _Conv]], out: dict[str, Any],
           raw_keys: list[str] | None = None) -> int:
    """Read `key: value` pieces into `out`; returns how many pieces were malformed.

    `graph_backend` (from an `npu graph:` style key) goes after the line's own keys, where the learnt
    layouts and the C accelerator put it: `parse` output is the same, key order included, either way."""
    bad = 0
    backend: str | None = None
    for piece in body.split(sep):
        k, colon, v = piece.partition(": ")
        if not colon:
            if piece.strip():
                bad += 1
            continue
        k = k.strip()
        if raw_keys is not None:
            raw_keys.append(k)
        known = keys.get(k)
        if known is None:
            out[normalise_key(k)] = auto_value(v)
            continue
        name, conv = known
        try:
            out[name] = conv(v)
        except ValueError:
            bad += 1
        if name == "cuda_graph" and k in GRAPH_LABELS:
            backend = GRAPH_LABELS[k]
    if backend is not None:
        out["graph_backend"] = backend
    return bad


def derive_token_usage(fields: dict[str, Any]) -> None:
    pools = [fields[k] for k in POOL_USAGES if isinstance(fields.get(k), float)]
    if pools:
        # SGLang's own sglang:token_usage gauge is the fullest pool on hybrid models.
        fields["token_usage"] = max(pools)


PARTIAL: Final = "_partial"  # internal marker key, removed before the event leaves the parser


MAX_REASON_CHARS = 300


def reason_text(text: str, *, full_stop: bool = True) -> str:
    """The rest of a log line kept as an event's reason (its final full stop kept unless not `full_stop`):
    secrets redacted before the cut, bounded."""
    text = text.strip() if full_stop else text.strip().rstrip(".")
    return redact_text(text)[:MAX_REASON_CHARS]
