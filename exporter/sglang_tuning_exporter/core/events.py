"""Typed events produced by the log parser: the contract between parsing and everything after it."""

from __future__ import annotations

from typing import Any, NamedTuple

# Event kinds (see docs/contracts.md and ../shared/reference/interfaces.md).
DECODE = "decode"
PREFILL = "prefill"
RETRACT = "retract"
STARTUP_MEMORY = "startup_memory"
SERVER_ARGS = "server_args"
OOM = "oom"
ERROR = "error"
CUDA_GRAPH_CAPTURE = "cuda_graph_capture"  # `Capture cuda graph begin ... bs=[...]`: fields.batch_sizes
# SGLang cut --max-running-requests: fields reduced_to, `by` (kv_pool | kv_pool_post_capture | mamba_state),
# requested (the KV cuts), max_mamba_cache_size and mamba_slots_per_request (the mamba cap)
MAX_RUNNING_REDUCED = "max_running_reduced"
# SGLang chose the cap itself (speculative decoding's 48, a model family's value): fields value, reason
MAX_RUNNING_DEFAULT = "max_running_default"
VERSION = "version"  # a line that reveals the SGLang version: fields.version
STARTUP_TIMINGS = "startup_timings"  # `Engine startup timings (s): ...` (0.5.18+): fields `<phase>_s`
SERVER_READY = "server_ready"  # `The server is fired up and ready to roll!`: no fields
# `CUDA graph disabled for N consecutive decode steps. ...` (managers/cuda_graph_warner.py, WARNING every
# 5th consecutive eager decode step): fields.consecutive_steps
CUDA_GRAPH_DISABLED = "cuda_graph_disabled"
# Arguments changed without a restart (POST /set_internal_state): `Config updated via context override: {...}`
# (0.5.18+) or `Global server args updated! get_global_server_args()=ServerArgs(...)` (0.5.15): fields.updated
SERVER_ARGS_UPDATE = "server_args_update"
# `Updating {key} is not supported.` / `... is rejected because ...`: fields.key, reason (value, valid_max)
SERVER_ARGS_REJECTED = "server_args_rejected"
# SGLang switching a scheduler feature off or resizing it itself, whatever was asked (`Chunked prefill is
# disabled because ...`, `Radix cache is disabled for ...`, `chunked prefill size is adjusted from X to Y`):
# fields.features (chunked_prefill, mixed_chunk, radix_cache), reason; or setting, to (from)
SETTING_FORCED = "setting_forced"
# `Request length is longer than the KV cache pool size or the max context length. Truncated. ...`:
# fields.input_len, max_req_input_len
REQUEST_TRUNCATED = "request_truncated"
# Every kind the parser emits (parse --kind is checked against it).
KINDS = (DECODE, PREFILL, RETRACT, STARTUP_MEMORY, SERVER_ARGS, OOM, ERROR, CUDA_GRAPH_CAPTURE,
         MAX_RUNNING_REDUCED, VERSION, STARTUP_TIMINGS, SERVER_READY, CUDA_GRAPH_DISABLED, SERVER_ARGS_UPDATE,
         SERVER_ARGS_REJECTED, SETTING_FORCED, REQUEST_TRUNCATED, MAX_RUNNING_DEFAULT)


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


_KIND_OF = {k: k for k in KINDS}


def _rebuild(line: int, kind: str, time: str | None, rank: dict[str, int], fields: dict[str, Any]) -> Event:
    return Event(line, _KIND_OF.get(kind, kind), time, rank, fields)
