"""Typed events produced by the log parser: the contract between parsing and everything after it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple


@dataclass(frozen=True, slots=True)
class Count:
    """What a counted kind counts: each event adds `amount` (the named field's value, or 1 per line) to the
    observation `name`. That one line yields, with no code elsewhere, the windowed signal
    `<name>_per_minute` (docs/signals.md, unit family per minute) and the sidecar's raw counter
    `sglang_tuning_<name>_total` (TP prints of one replica counted once, as retractions are)."""

    name: str
    help: str  # the counter's HELP text (what one unit is)
    amount: str | None = None


@dataclass(frozen=True, slots=True)
class KindSpec:
    """One event kind the parser emits: its name, its fields (name -> unit or meaning, documentation),
    optionally the rule that reads its line and what it counts.

    `pattern` (with `gate`, a substring every such line holds: the parser's cheap test, and the C reader's
    marker) is a regular expression searched in the line; its named groups are the fields (numbers as
    numbers), the text before the match is the line's prefix. Kinds without one have a handler in
    sources/logmessages.py (their lines need more than one expression)."""

    name: str
    fields: Mapping[str, str] = field(default_factory=dict)
    count: Count | None = None
    pattern: str | None = None
    gate: str = ""


SPECS: dict[str, KindSpec] = {}  # every kind the parser emits, in declaration order
KINDS: tuple[str, ...] = ()  # their names (parse --kind is checked against it)


def declare(spec: KindSpec) -> str:
    """Register a kind (once, at import; the modules that derive tables from SPECS read them when they are
    imported) and return its name."""
    global KINDS
    if spec.name in SPECS or (spec.pattern is None) != (not spec.gate):
        raise ValueError(f"kind {spec.name!r}: declared twice, or a pattern without its gate")
    SPECS[spec.name] = spec
    KINDS = (*KINDS, spec.name)
    return spec.name


_BATCH = {"num_running_reqs": "requests (#running-req)", "num_queue_reqs": "requests (#queue-req)",
          "token_usage": "ratio 0-1"}
DECODE = declare(KindSpec("decode", {**_BATCH, "num_used_tokens": "tokens (#token)", "cuda_graph": "bool",
                                     "gen_throughput": "tokens/s", "<pool>_token_usage": "ratio 0-1 (hybrid pools)"}))
PREFILL = declare(KindSpec("prefill", {**_BATCH, "num_new_seqs": "requests", "num_new_tokens": "tokens",
                                       "num_cached_tokens": "tokens", "cache_hit_rate": "ratio 0-1"}))
RETRACT = declare(KindSpec("retract", {"num_retracted_reqs": "requests", "new_token_ratio_before": "ratio",
                                       "new_token_ratio_after": "ratio", "num_new_tokens_gained": "tokens"}))
STARTUP_MEMORY = declare(KindSpec("startup_memory", {
    "stage": "load_weight_begin, load_weight_end, kv_cache_allocated, memory_pool_end, cuda_graph_*, summary, ...",
    "avail_mem_gb": "GiB", "mem_usage_gb": "GiB", "kv_size_gb": "GiB", "max_total_num_tokens": "tokens",
    "max_running_requests": "requests", "available_gpu_mem_gb": "GiB"}))
SERVER_ARGS = declare(KindSpec("server_args", {"<argument>": "the parsed server arguments"}))
OOM = declare(KindSpec("oom", {"phase": "prefill, decode, startup, unknown", "message": "text (redacted)",
                               "gpu_free_gb": "GiB", "gpu_total_gb": "GiB"}))
ERROR = declare(KindSpec("error", {"message": "text (redacted)"}))
# `Capture cuda graph begin ... bs=[...]`
CUDA_GRAPH_CAPTURE = declare(KindSpec("cuda_graph_capture", {"batch_sizes": "list of batch sizes",
                                                             "max_bs": "requests", "graph": "which graph"}))
# SGLang cut --max-running-requests: `by` kv_pool | kv_pool_post_capture | mamba_state; requested (the KV cuts),
# max_mamba_cache_size and mamba_slots_per_request (the mamba cap)
MAX_RUNNING_REDUCED = declare(KindSpec("max_running_reduced", {
    "reduced_to": "requests", "by": "what cut it", "requested": "requests", "max_mamba_cache_size": "slots",
    "mamba_slots_per_request": "slots"}))
VERSION = declare(KindSpec("version", {"version": "text"}))  # a line that reveals the SGLang version
# `Engine startup timings (s): ...` (0.5.18+)
STARTUP_TIMINGS = declare(KindSpec("startup_timings", {"<phase>_s": "seconds"}))
SERVER_READY = declare(KindSpec("server_ready", pattern="The server is fired up and ready to roll", gate="fired up"))
# managers/cuda_graph_warner.py: a WARNING every 5th consecutive eager decode step
CUDA_GRAPH_DISABLED = declare(KindSpec(
    "cuda_graph_disabled", {"consecutive_steps": "decode steps"},
    pattern=r"CUDA graph disabled for (?P<consecutive_steps>\d+) consecutive decode steps",
    gate="consecutive decode steps"))
# Arguments changed without a restart (POST /set_internal_state): `Config updated via context override: {...}`
# (0.5.18+) or `Global server args updated! get_global_server_args()=ServerArgs(...)` (0.5.15)
SERVER_ARGS_UPDATE = declare(KindSpec("server_args_update", {"updated": "the changed arguments"}))
# `Updating {key} is not supported.` / `... is rejected because ...`
SERVER_ARGS_REJECTED = declare(KindSpec("server_args_rejected", {"key": "argument", "reason": "text",
                                                                 "value": "number", "valid_max": "number"}))
# SGLang switching a scheduler feature off or resizing it itself, whatever was asked (`Chunked prefill is
# disabled because ...`, `Radix cache is disabled for ...`, `chunked prefill size is adjusted from X to Y`)
SETTING_FORCED = declare(KindSpec("setting_forced", {
    "features": "chunked_prefill, mixed_chunk, radix_cache", "reason": "text", "setting": "argument",
    "to": "number", "from": "number"}))
# `Request length is longer than the KV cache pool size or the max context length. Truncated.
# len(req.origin_input_ids)=N, max_req_input_len=M.` (managers/utils.py, --allow-auto-truncate)
REQUEST_TRUNCATED = declare(KindSpec(
    "request_truncated", {"input_len": "tokens", "max_req_input_len": "tokens"},
    pattern=r"Request length is longer than the KV cache pool size or the max context length\. Truncated\."
            r"(?: len\(req\.origin_input_ids\)=(?P<input_len>\d+), max_req_input_len=(?P<max_req_input_len>\d+))?",
    gate="Request length is longer"))
# SGLang chose the cap itself (speculative decoding's 48, a model family's value)
MAX_RUNNING_DEFAULT = declare(KindSpec("max_running_default", {"value": "requests", "reason": "text"}))


def counted() -> tuple[KindSpec, ...]:
    """The kinds that declare a Count, in declaration order."""
    return tuple(s for s in SPECS.values() if s.count is not None)


class _EventRecord(NamedTuple):
    line: int
    kind: str
    time: str | None  # ISO 8601 with a date, "HH:MM:SS" time-only, None when absent
    rank: dict[str, int]
    fields: dict[str, Any]


class Event(_EventRecord):
    """One recognised log event; `fields` uses the canonical names of interfaces.md.

    An immutable record (a tuple): both the Python parser and the C reader build it whole, the C side
    the way CPython builds any tuple subclass (allocate, fill the five items), so nothing ever writes
    into an existing Event. `rank` and `fields` default to a fresh dict each (never one shared dict:
    the parser edits `fields` of the event it has just made).
    """

    __slots__ = ()

    def __new__(cls, line: int, kind: str, time: str | None = None, rank: dict[str, int] | None = None,
                fields: dict[str, Any] | None = None) -> Event:
        return tuple.__new__(cls, (line, kind, time, {} if rank is None else rank,
                                   {} if fields is None else fields))

    # Equal only to an Event of the same class, never to a bare tuple of the same values (a record,
    # not a sequence). Unhashable: its dicts are mutable (and _scan.configure relies on it).
    def __eq__(self, other: object) -> bool:
        return other.__class__ is self.__class__ and tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as its five values (parallel readers send many back), and the kind comes back as the
        # module's own string, one object for every event of that kind.
        return (_rebuild, tuple(self))

    def to_json_dict(self) -> dict[str, Any]:
        """The `parse` output object of interfaces.md."""
        return {"line": self.line, "kind": self.kind, "time": self.time, "rank": dict(self.rank),
                "fields": dict(self.fields)}


def _rebuild(line: int, kind: str, time: str | None, rank: dict[str, int], fields: dict[str, Any]) -> Event:
    spec = SPECS.get(kind)
    return Event(line, kind if spec is None else spec.name, time, rank, fields)
