"""Shared value types between sources (log, scrape, server info), signals, checks and outputs."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# Numeric encoding of a status on /metrics (sglang_tuning_check_level; ordered so max = the worst).
STATUS_CODE = {"unknown": -1.0, "ok": 0.0, "warning": 1.0, "critical": 2.0}
# The one palette of every page (diagnose HTML, fleet report HTML/SVG): readable as text on white.
STATUS_COLOURS = {"ok": "#2e7d32", "warning": "#b26a00", "critical": "#c62828", "unknown": "#757575"}


@dataclass(frozen=True, slots=True)
class Rank:
    """A scheduler rank; None means the source did not name that dimension."""

    dp: int | None = None
    pp: int | None = None
    tp: int | None = None
    ep: int | None = None

    def _key(self) -> tuple[int, ...]:
        # Ranks from different sources mix named and unnamed dimensions: None sorts first
        # (dataclass order=True would raise comparing None with an int).
        return tuple(-1 if v is None else v for v in (self.dp, self.pp, self.tp, self.ep))

    def __lt__(self, other: Rank) -> bool:
        return self._key() < other._key()

    def __le__(self, other: Rank) -> bool:
        return self._key() <= other._key()

    def __gt__(self, other: Rank) -> bool:
        return self._key() > other._key()

    def __ge__(self, other: Rank) -> bool:
        return self._key() >= other._key()

    @classmethod
    def from_dict(cls, d: dict[str, int]) -> Rank:
        """Build from an Event.rank mapping (keys dp/pp/tp/ep)."""
        return cls(dp=d.get("dp"), pp=d.get("pp"), tp=d.get("tp"), ep=d.get("ep"))

    def as_dict(self) -> dict[str, int]:
        """Only the dimensions that are known, as in interfaces.md (`{"dp": 0}`)."""
        return {k: v for k, v in (("dp", self.dp), ("pp", self.pp), ("tp", self.tp), ("ep", self.ep))
                if v is not None}

    def labels(self) -> dict[str, str]:
        """Prometheus label values in SGLang's own label names; '' when unknown."""
        def s(v: int | None) -> str:
            return "" if v is None else str(v)
        return {"dp_rank": s(self.dp), "pp_rank": s(self.pp), "tp_rank": s(self.tp), "moe_ep_rank": s(self.ep)}


WHOLE_SERVER = "the server"  # how every output names a finding or signal that is for no one rank


def rank_text(rank: Rank | Mapping[str, int]) -> str:
    """A rank as every output shows it to a person: `DP1 TP0`, or `the server` when it names none."""
    d = rank.as_dict() if isinstance(rank, Rank) else rank
    return " ".join(f"{k.upper()}{v}" for k, v in d.items()) or WHOLE_SERVER


def rank_key(rank: Rank | Mapping[str, int]) -> str:
    """A rank as a machine key (the fleet JSON's `instances[].signals`): `dp=1`, or `all`."""
    d = rank.as_dict() if isinstance(rank, Rank) else rank
    return ",".join(f"{k}={v}" for k, v in d.items()) or "all"


def finite_number(v: Any) -> float | None:
    """`v` as a float when it is a finite int or float (not a bool); None for anything else."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def measure_text(v: Any) -> str:
    """A measured value in evidence text: `6` for 6.0, at most three decimals (`0.127`); `?` for none."""
    x = finite_number(v)
    if x is None:
        return "?" if v is None else str(v)
    return str(int(x)) if x.is_integer() else f"{x:.3f}".rstrip("0").rstrip(".")


def value_text(x: Any) -> str:
    """A flag value as every output spells it (plan, report, alert annotations): `true`/`false`, `2980168` for
    2980168.0 (never `2.98017e+06`), `0.85`; `%g`-style only for a fraction, so float noise never shows."""
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float):
        if x.is_integer() and abs(x) < 1e15:
            return str(int(x))
        return f"{x:.12g}"
    return str(x)


@dataclass(frozen=True, slots=True)
class Observation:
    """One measured value: (rank, time, name, value), whatever the source (design.md)."""

    time: float  # seconds; epoch for live data, log-derived seconds for offline
    name: str
    value: float
    rank: Rank = Rank()
    source: str = "log"  # log | metrics | server_info


# One cumulative bucket of a latency histogram (sources/scrape.HISTOGRAMS): its requests since the previous
# scrape reach the window as an observation `latency_bucket:<latency>:<le>`.
LATENCY_PREFIX = "latency_bucket:"


def latency_bucket_name(latency: str, le: float) -> str:
    """The observation name of one cumulative bucket's delta (`le` = the bucket's upper bound)."""
    return f"{LATENCY_PREFIX}{latency}:{le!r}"


def parse_latency_bucket(name: str) -> tuple[str, float] | None:
    """(latency, upper bound) of a `latency_bucket_name`; None for any other name."""
    if not name.startswith(LATENCY_PREFIX):
        return None
    latency, _, le = name[len(LATENCY_PREFIX):].partition(":")
    try:
        return latency, float(le)
    except ValueError:
        return None


# A Prefill line's sample values are observed under prefixed names (signals.PREFILL_SAMPLE_NAMES).
_PREFILL_NAME = {"num_queue_reqs": "prefill_num_queue_reqs", "num_running_reqs": "prefill_num_running_reqs",
                 "token_usage": "prefill_token_usage"}


class Sample(NamedTuple):
    """One Decode (or Prefill) line's values in one record: what its per-field observations would
    carry (None = the line lacks that field). `signals.Window.add_sample` takes it in one step."""

    time: float
    rank: Rank
    prefill: bool  # a Prefill line: only queue, running and usage are samples
    queue: float | None
    running: float | None
    usage: float | None
    throughput: float | None = None
    used: float | None = None  # num_used_tokens: not aggregated, but part of the sample
    graph: float | None = None
    source: str = "log"
    new_tokens: float | None = None  # a Prefill line's #new-token and #cached-token (window events)
    cached_tokens: float | None = None

    def pairs(self) -> tuple[tuple[str, float | None], ...]:
        """(observation name, value) of the sample values, in the order the converter emits them."""
        if self.prefill:
            return (("num_queue_reqs", self.queue), ("num_running_reqs", self.running), ("token_usage", self.usage))
        return (("num_queue_reqs", self.queue), ("num_running_reqs", self.running), ("token_usage", self.usage),
                ("gen_throughput", self.throughput), ("num_used_tokens", self.used), ("cuda_graph", self.graph))

    def observations(self) -> list[Observation]:
        """The per-field observations this sample stands for."""
        out = [Observation(self.time, name, v, self.rank, self.source)
               for name, v in (("prefill_new_tokens", self.new_tokens), ("prefill_cached_tokens", self.cached_tokens))
               if v is not None]
        out.extend(Observation(self.time, _PREFILL_NAME[name] if self.prefill else name, v, self.rank, self.source)
                   for name, v in self.pairs() if v is not None)
        return out


@dataclass(slots=True)
class ServerState:
    """What we know about the SGLang server's configuration."""

    version: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    model_name: str | None = None


def version_fields(version: str | None) -> dict[str, str | None]:
    """A release for JSON documents: `{"version": "0.5.23"}`, or `{"version": null, "version_floor":
    "0.5.14"}` when only line formats told (`>=0.5.14`), so `version` is a release or null for tools."""
    if version and version.startswith(">="):
        return {"version": None, "version_floor": version[2:]}
    return {"version": version}


@dataclass(frozen=True, slots=True)
class Finding:
    """The verdict of one check for one rank, as in the `findings` array of interfaces.md."""

    check: str
    status: str  # ok | warning | critical | unknown
    rank: dict[str, int]
    flag: str | None
    action: str  # increase | decrease | set | client-side text
    current: Any
    suggested: Any
    summary: str
    evidence: str
    severity: str = "warning"  # severity the check has when it fires
    guide: str = ""  # the guide's reason in one line
    tradeoff: str = ""

    def to_json_dict(self) -> dict[str, Any]:
        """Serialise in the diagnose JSON schema."""
        return {"check": self.check, "status": self.status, "rank": dict(self.rank), "flag": self.flag,
                "action": self.action, "current": self.current, "suggested": self.suggested,
                "summary": self.summary, "evidence": self.evidence, "severity": self.severity,
                "guide": self.guide, "tradeoff": self.tradeoff}
