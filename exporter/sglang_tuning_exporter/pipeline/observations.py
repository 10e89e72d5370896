"""Parser events -> observations (canonical names of docs/contracts.md) and server-state updates.

Time comes from the log's own stamps, live and offline alike (`timeparse.LogClock`: time-only stamps
roll over midnight, implausible stamps take their neighbour's time); a line without one inherits
the latest log time; before any stamp a line is timed by arrival live, by line order offline (1 s per
line; `EventConverter.synthetic_time` says so).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from sglang_tuning_exporter.core import limits
from sglang_tuning_exporter.core.events import Count, Event, counted
from sglang_tuning_exporter.core.features import SERVER_ARGS, reason_code
from sglang_tuning_exporter.core.model import Observation, Rank, Sample, ServerState
from sglang_tuning_exporter.core.timeparse import LogClock
from sglang_tuning_exporter.core.versions import merge_version
from sglang_tuning_exporter.pipeline.signals import SERVER_START
from sglang_tuning_exporter.sources.logline import POOL_USAGES
from sglang_tuning_exporter.sources.logmessages import POOL_TOO_SMALL
from sglang_tuning_exporter.sources.scrape import POOL_GAUGES

SECONDS_PER_LINE = 1.0  # the stand-in clock of a log without timestamps
OFF_WARNED_S = 60.0  # a feature warned off this long before a `server_args` line belongs to that start
# Stages after the KV pool is allocated: their `avail mem` is the headroom when the summary lacks it.
_AFTER_POOL_STAGES = ("memory_pool_end", "cuda_graph_begin", "cuda_graph_end", "cuda_graph_bs",
                      "prefill_graph_begin", "prefill_graph_end")
# Server-args keys that are also startup facts (numbers only).
# Sample(...) without NamedTuple's Python-level __new__ (one per log line): all 12 fields, in order.
_new_sample = functools.partial(tuple.__new__, Sample)
# The counted event kinds (core/events.Count): kind -> what one of its events counts (the window here,
# the sidecar's raw counters in sidecar/state.py).
COUNT_OF: dict[str, Count] = {spec.name: spec.count for spec in counted() if spec.count is not None}
_ARG_FACTS = {"max_running_requests": "max_running_requests", "chunked_prefill_size": "chunked_prefill_size",
              "context_length": "context_len"}


def batch_usage(f: Mapping[str, Any]) -> float | None:
    """The token_usage a Decode/Prefill line stands for: its own, else the fullest pool (hybrid models log
    each pool; SGLang's own gauge is their max); None when it has none."""
    if "token_usage" in f:
        return number(f["token_usage"])
    usages = [u for u in (number(f.get(k)) for k in POOL_USAGES) if u is not None]  # the parser's pools
    return max(usages) if usages else None


# A hybrid pool counts as full at the guide's `token usage > 0.9` (docs/signals.md, "Hybrid pools").
POOL_FULL = 0.9
MAMBA_SIZE_MIN = 0.05  # below this mamba usage, mamba num / usage is too coarse to size the state pool


def pool_pairs(f: Mapping[str, Any]) -> list[tuple[str, float]]:
    """The hybrid-pool observations of one Decode line holding a SWA or mamba pool and #queue-req
    (docs/signals.md, "Hybrid pools"): a sample, the full and SWA usages (their means), and whether requests
    wait while the mamba or SWA pool is full and the full-attention pool is not (the pool that binds)."""
    mamba, swa = number(f.get("mamba_usage")), number(f.get("swa_token_usage"))
    queue = number(f.get("num_queue_reqs"))
    if (mamba is None and swa is None) or queue is None:
        return []
    full = number(f.get("full_token_usage"))
    out = [("pool_samples", 1.0)]
    if full is not None:
        out += [("full_samples", 1.0), ("full_usage_sum", full)]  # before 0.5.10 a scrape has no full gauge
    if swa is not None:
        out += [("swa_samples", 1.0), ("swa_usage_sum", swa)]
    used = number(f.get("mamba_num"))
    if used is not None and mamba is not None and mamba >= MAMBA_SIZE_MIN:
        out += [("mamba_num_sum", used), ("mamba_usage_sum", mamba)]  # their quotient: the state pool's size
    room = full is None or full < POOL_FULL
    if queue > 0 and room:
        if mamba is not None and mamba >= POOL_FULL:
            out.append(("mamba_bound", 1.0))
        if swa is not None and swa >= POOL_FULL:
            out.append(("swa_bound", 1.0))
    return out


_SCRAPED_FIELDS = frozenset(POOL_GAUGES.values())


def scraped_pool_pairs(observations: Iterable[Observation]) -> list[Observation]:
    """A scrape's observations with each rank's pool gauges (sources/scrape.POOL_GAUGES) turned into the
    hybrid-pool observations of a Decode line holding them and that rank's queue (pool_pairs)."""
    out: list[Observation] = []
    fields: dict[tuple[float, Rank], dict[str, float]] = {}
    for o in observations:
        if o.name in _SCRAPED_FIELDS:
            fields.setdefault((o.time, o.rank), {})[o.name] = o.value
            continue
        out.append(o)
    if fields:
        for o in out:
            if o.name == "num_queue_reqs" and (o.time, o.rank) in fields:
                fields[(o.time, o.rank)]["num_queue_reqs"] = o.value
        out.extend(Observation(t, name, v, rank, "metrics") for (t, rank), f in fields.items()
                   for name, v in pool_pairs(f))
    return out


def count_amount(count: Count, f: Mapping[str, Any]) -> Any:
    """What one event of a counted kind adds to `count.name`: its `amount` field's value, or 1 a line."""
    return 1 if count.amount is None else f.get(count.amount)


def number(v: Any) -> float | None:
    """An event field's value as a float (bools 0/1, numeric strings, `12%`), or None."""
    c = v.__class__
    if c is float:
        return v  # type: ignore[no-any-return]
    if c is int:
        return float(v)
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip().rstrip("%"))
        except ValueError:
            return None
    return None


def oom_phase(fields: Mapping[str, Any]) -> str:
    """The phase an OOM event counts under (the one rule for the window and the sidecar's counter):
    at startup, SGLang's own "pool does not fit after the weights" (`reason` mem_fraction_static_too_small,
    set by the reader: raise the fraction) is `startup`; a CUDA graph that failed to capture is
    `graph_decode` / `graph_prefill` (that graph's batch ceiling first); any other allocation that failed
    before the first batch (workspace, pool preallocation) is `capture` (lower it)."""
    phase = fields.get("phase")
    if phase == "startup":
        reason = fields.get("reason")
        if reason is None:  # an event not from the reader: the message tells
            too_small = POOL_TOO_SMALL.search(str(fields.get("message") or "")) is not None
        else:
            too_small = reason == "mem_fraction_static_too_small"
        if too_small:
            return "startup"
        if reason == "cuda_graph_capture":  # the graph's own batch ceiling is the first lever
            return "graph_prefill" if fields.get("graph") == "prefill" else "graph_decode"
        return "capture"
    return phase if phase in ("prefill", "decode") else "unknown"


SERVER_EVENT_KINDS = frozenset({"server_args", "server_args_update", "oom", "version"})  # what server_update reads


def server_update(event: Event, args: Mapping[str, Any]) -> dict[str, Any] | None:
    """What an event says of the server (the one rule for the sidecar and diagnose): `args` to merge, a
    `version`, a `model_name` (the latest startup's), or None when it says nothing. `args` is what is
    known so far (a resolved default only fills a flag the server args left at None)."""
    kind = event.kind
    if kind == "server_args":
        new = dict(event.fields)
        model = new.get("served_model_name") or new.get("model_path")
        return {"args": new, "model_name": model if isinstance(model, str) and model else None}
    if kind == "server_args_update" and isinstance(event.fields.get("updated"), dict):
        return {"args": dict(event.fields["updated"])}  # changed without a restart: merged into what is known
    if kind == "oom" and isinstance(event.fields.get("mem_fraction_static"), float) \
            and args.get("mem_fraction_static") is None:
        # `--mem-fraction-static` defaults to None; SGLang's `Not enough memory` states the resolved value.
        return {"args": {"mem_fraction_static": event.fields["mem_fraction_static"]}}
    if kind == "version" and isinstance(event.fields.get("version"), str):
        return {"version": event.fields["version"]}
    return None


def apply_to_server(event: Event, server: ServerState) -> bool:
    """Update `server` from an event (server_update's rule); True when something changed."""
    upd = server_update(event, server.args)
    if upd is None:
        return False
    limits.merge_args(server.args, upd.get("args") or {})  # at most MAX_SERVER_ARGS, as the sidecar's
    if upd.get("model_name"):
        server.model_name = upd["model_name"]
    if upd.get("version"):
        server.version = upd["version"]
    return True


class EventConverter:
    """Stateful events -> observations mapping (timestamps carried across lines)."""

    def __init__(self, clock: Callable[[], float] | None = None, server: ServerState | None = None, *,
                 judge_dated: bool = True) -> None:
        self.clock = clock
        self.server = server
        self.synthetic_time = False  # some events were timed by line order
        # Live (`clock` given) the log's own stamps still time its lines; the wall clock ages them.
        # judge_dated=False: dated stamps come judged already (diagnose's scanner, LogClock).
        self.log_clock = LogClock(arrival=clock, judge_dated=judge_dated)
        self._hint: float | None = None
        self._weight_begin: dict[Rank, float] = {}
        self._floor_seen: tuple[str | None, str] | None = None  # (server version, floor) last compared
        self.first_time: float | None = None
        self.last_time: float | None = None
        self._ranks: dict[tuple[tuple[str, int], ...], Rank] = {}  # event rank dict -> Rank (bounded)
        # Facts SGLang states while resolving the arguments, just before it logs them (features it
        # switched off, a cap it chose):
        # (time, rank, fact, code), stated again after that `server_args` line resets the startup facts.
        self._off_warned: list[tuple[float, Rank, str, float]] = []

    def _time(self, e: Event) -> float:
        t = self.log_clock.take(e.time)
        if t is None:
            # No usable stamp: the neighbour's time (the latest log time; live, aged by the wall
            # clock), the time the reader says comes next, or, before any stamp, arrival (live) or line
            # order (offline).
            lc = self.log_clock
            if self.clock is not None:
                t = lc.now(self.clock())
            elif lc.latest is not None:
                t = lc.latest
            elif self._hint is not None:
                t = self._hint
            else:
                self.synthetic_time = True
                t = e.line * SECONDS_PER_LINE
        if self.first_time is None:
            self.first_time = t
        self.last_time = t if self.last_time is None else max(self.last_time, t)
        return t

    @property
    def implausible_times(self) -> int:
        """Stamps taken at a neighbour's time (docs/signals.md, "Clocks")."""
        return self.log_clock.implausible

    def log_now(self, wall: float) -> float:
        """The current log time (live): what windows are evaluated at."""
        return self.log_clock.now(wall)

    def hint_time(self, t: float | None) -> None:
        """The first time the reader saw ahead (diagnose's fast path): lines before any stamp take it."""
        if self._hint is None and t is not None:
            self._hint = t

    def note_version_floor(self, version: str) -> None:
        """A line format reveals the release is at least `version` (kept as `>=X.Y.Z` until a real
        version line is seen): it decides flag names and defaults."""
        srv = self.server
        if srv is None:
            return
        cur = srv.version
        if self._floor_seen == (cur, version):
            return  # called per Decode line: skip re-parsing the same two versions
        srv.version = merge_version(cur, ">=" + version)
        self._floor_seen = (srv.version, version)

    def note_time(self, t: float) -> None:
        """A later time seen elsewhere (e.g. a fast-path line): following untimed events inherit it."""
        lc = self.log_clock
        if lc.latest is None or t > lc.latest:
            lc.latest = t
        self.last_time = t if self.last_time is None else max(self.last_time, t)

    def convert(self, e: Event) -> list[Observation]:
        """The observations one event yields (updates the server state when bound)."""
        if self.server is not None:
            apply_to_server(e, self.server)
        t = self._time(e)
        rank = self._rank(e.rank)
        f = e.fields
        out: list[Observation] = []

        def add(name: str, value: Any) -> None:
            v = number(value)
            if v is not None:
                out.append(Observation(t, name, v, rank, "log"))

        kind = e.kind
        if kind == "decode" and "cuda_graph" in f:
            self.note_version_floor("0.4.7")
        elif kind == "retract" and "num_new_tokens_gained" in f:
            self.note_version_floor("0.5.7")
        elif kind == "startup_memory" and "decode" in str(f.get("graph", "")).lower():
            self.note_version_floor("0.5.14")  # `Capture target decode CUDA graph` naming
        count = COUNT_OF.get(kind)
        if count is not None:
            add(count.name, count_amount(count, f))
        if kind == "decode":
            self._batch_sample(f, add, "")
            add("gen_throughput", f.get("gen_throughput"))
            add("num_used_tokens", f.get("num_used_tokens", f.get("num_full_tokens")))
            if "cuda_graph" in f:
                add("cuda_graph", f["cuda_graph"])
            for name, v in pool_pairs(f):
                add(name, v)
        elif kind == "prefill":
            add("prefill_new_tokens", f.get("num_new_tokens"))
            add("prefill_cached_tokens", f.get("num_cached_tokens"))
            # Judged only on ranks without Decode lines (PD prefill nodes, v0.1 logs): see signals.py.
            self._batch_sample(f, add, "prefill_")
        elif kind == "retract":
            add("retraction", f.get("num_retracted_reqs", 1))
        elif kind == "oom":
            phase = str(f.get("phase") or "unknown")
            out.extend(self._oom(t, rank, f))
            # torch's `GPU N has a total capacity of X of which Y is free`: what was free at the failure
            # and the GPU's size, whatever the phase.
            add("oom_gpu_free_gb", f.get("gpu_free_gb"))
            add("mem_fraction_floor", f.get("mem_fraction_floor"))  # SGLang's own minimum viable fraction
            add("gpu_mem_total_gb", f.get("gpu_total_gb"))
            if phase == "startup" and f.get("reason") != "cuda_graph_capture":
                # Before the first batch (a failed start prints no summary) it is the headroom the static
                # fraction left. Inside a graph capture it is what the capture had eaten, not the headroom.
                add("avail_mem_after_pool_gb", f.get("gpu_free_gb"))
        elif kind == "error":
            msg = str(f.get("message") or "")
            if POOL_TOO_SMALL.search(msg):  # the oom rule's own text, not any "not enough memory"
                # SGLang's `RuntimeError: Not enough memory ...`: the pool does not fit after the weights.
                out.extend(self._oom(t, rank, {"phase": "startup", "reason": "mem_fraction_static_too_small"}))
        elif kind == "startup_memory":
            self._startup(f, rank, add)
        elif kind == "cuda_graph_capture":
            sizes = [s for s in (f.get("batch_sizes") or []) if isinstance(s, (int, float))]
            if sizes:
                add("cuda_graph_max_bs_captured", max(sizes))
        elif kind == "cuda_graph_disabled":
            # SGLang warns at every 5th consecutive eager decode step (managers/cuda_graph_warner.py):
            # each warning stands for 5 more decode steps without a CUDA graph.
            if number(f.get("consecutive_steps")) is not None:
                add("cuda_graph_disabled_steps", 5)
        elif kind == "setting_forced" and "chunked_prefill" in (f.get("features") or ()):
            # Chunked prefill SGLang switched off itself (sources/logsettings): the reason's code.
            add("chunked_prefill_off", reason_code(str(f.get("reason") or "")))
        elif kind == "max_running_reduced":
            add("max_running_requests", f.get("reduced_to"))
            if f.get("by") == "mamba_state":
                add("mamba_running_cap", f.get("reduced_to"))
                add("mamba_cache_size", f.get("max_mamba_cache_size"))
                add("mamba_slots_per_request", f.get("mamba_slots_per_request"))
            else:  # the KV pool cut the cap the user asked for
                add("max_running_requested", f.get("requested"))
        elif kind == "max_running_default":
            # Printed while the arguments are resolved, before their `server_args` line resets the facts:
            # stated again after that line (and now, for a log that lacks it), as a feature switched off is.
            add("max_running_default", f.get("value"))
        elif kind == "server_args":
            out.append(Observation(t, SERVER_START, 1.0, rank, "log"))  # before this start's facts
            warned = set()
            for at, off_rank, name, code in self._off_warned:
                if t - OFF_WARNED_S <= at <= t:
                    out.append(Observation(t, name, code, off_rank, "log"))
                    warned.add(name)  # SGLang's reason beats "the server arguments"
            self._off_warned.clear()
            for key, name in _ARG_FACTS.items():
                if f.get(key) is not None:
                    add(name, f[key])
            graph_off = bool(f.get("disable_cuda_graph") or f.get("disable_decode_cuda_graph")
                             or str(f.get("cuda_graph_backend_decode") or "").lower() == "disabled")
            ceiling = f.get("cuda_graph_max_bs_decode", f.get("cuda_graph_max_bs"))
            if ceiling is not None and not graph_off:
                add("cuda_graph_max_bs_captured", ceiling)
            if graph_off and "cuda_graph_off" not in warned:
                add("cuda_graph_off", SERVER_ARGS)
            size = number(f.get("chunked_prefill_size"))
            if size is not None and size <= 0 and "chunked_prefill_off" not in warned:  # -1: chunked prefill off
                add("chunked_prefill_off", SERVER_ARGS)
            if "enable_metrics" in f:
                add("metrics_enabled", bool(f["enable_metrics"]))
        for o in out:
            if o.name in ("cuda_graph_off", "chunked_prefill_off", "max_running_default") and kind != "server_args":
                self._off_warned = [*self._off_warned[-7:], (t, o.rank, o.name, o.value)]
        return out

    @staticmethod
    def _batch_sample(f: dict[str, Any], add: Callable[[str, Any], None], prefix: str) -> None:
        add(prefix + "num_queue_reqs", f.get("num_queue_reqs"))
        add(prefix + "num_running_reqs", f.get("num_running_reqs"))
        add(prefix + "token_usage", batch_usage(f))

    @staticmethod
    def _oom(t: float, rank: Rank, fields: Mapping[str, Any]) -> list[Observation]:
        return [Observation(t, "oom_" + oom_phase(fields), 1.0, rank, "log")]

    def _startup(self, f: dict[str, Any], rank: Rank, add: Callable[[str, Any], None]) -> None:
        stage = str(f.get("stage") or "")
        graph = str(f.get("graph") or "").lower()
        decode_graph = stage.startswith("cuda_graph_") and "draft" not in graph and "verify" not in graph
        avail = number(f.get("avail_mem_gb"))
        if stage == "load_weight_begin" and avail is not None:
            self._weight_begin[rank] = avail
            add("gpu_mem_total_gb", avail)
        elif stage == "load_weight_end":
            usage = number(f.get("mem_usage_gb"))
            if usage is None and avail is not None and rank in self._weight_begin:
                usage = self._weight_begin[rank] - avail
            add("weights_gb", usage)
            add("avail_after_weights_gb", avail)
            if avail is not None and usage is not None and rank not in self._weight_begin:
                add("gpu_mem_total_gb", avail + usage)  # no begin line: avail + weights estimates capacity
        elif stage == "kv_cache_allocated":
            kv = number(f.get("kv_size_gb"))
            if kv is None and number(f.get("k_size_gb")) is not None and number(f.get("v_size_gb")) is not None:
                kv = float(f["k_size_gb"]) + float(f["v_size_gb"])
            add("kv_cache_gb", kv)
        elif stage in _AFTER_POOL_STAGES and avail is not None:
            add("avail_mem_after_pool_gb", avail)
            if stage == "cuda_graph_end" and decode_graph:
                # The target decode graphs' own memory (the one the captured batch sizes describe): the
                # plan's budget for a larger capture. Draft/verify graphs are other captures.
                add("cuda_graph_gb", number(f.get("mem_usage_gb")))
        elif stage == "cuda_graph_disabled":
            # CUDA graphs SGLang switched off because of another argument: the fact's value is the reason's code.
            add("cuda_graph_off", reason_code(str(f.get("reason") or "")))
        elif stage == "kv_pool_below_context":
            add("kv_pool_tokens", f.get("kv_pool_tokens"))
            add("context_len", f.get("context_len"))
        elif stage == "mamba_cache_allocated":
            add("mamba_cache_size", f.get("max_mamba_cache_size"))
        elif stage == "dsv4_pool_sizes":
            add("full_pool_tokens", f.get("full"))
            add("swa_pool_tokens", f.get("swa"))
        elif stage == "summary":
            add("available_gpu_mem_gb", f.get("available_gpu_mem_gb"))
            for key in ("max_total_num_tokens", "max_running_requests", "chunked_prefill_size", "context_len"):
                add(key, f.get(key))
        if "swa_layer_tokens" in f:  # `Use sliding window memory pool` and its post-capture re-sizing
            add("full_pool_tokens", f.get("full_layer_tokens"))
            add("swa_pool_tokens", f.get("swa_layer_tokens"))
        sizes = f.get("batch_sizes")
        if decode_graph and isinstance(sizes, list) and sizes:
            add("cuda_graph_max_bs_captured", max(s for s in sizes if isinstance(s, (int, float))))

    def _rank(self, d: dict[str, int]) -> Rank:
        key = tuple(d.items())
        rank = self._ranks.get(key)
        if rank is None:
            if len(self._ranks) >= 4096:
                self._ranks.clear()  # bounded: ranks come and go
            rank = self._ranks[key] = Rank.from_dict(d)
        return rank

    def convert_batch(self, events: Iterable[Event]) -> list[Observation | Sample]:
        """`convert` of many events, except that each Decode/Prefill line's values come as one `Sample`
        (what `Window.add_sample` takes) instead of one observation per field."""
        out: list[Observation | Sample] = []
        append = out.append
        server, ranks = self.server, self._ranks
        events = self._seeded(events)
        for e in events:
            kind = e.kind
            if kind == "retract":
                # What `convert` does for a retraction (diagnose sums many), without its general steps.
                f = e.fields
                t = self._time(e)
                if server is not None and "num_new_tokens_gained" in f:
                    self.note_version_floor("0.5.7")
                v = number(f.get("num_retracted_reqs", 1))
                if v is not None:
                    append(Observation(t, "retraction", v, ranks.get(tuple(e.rank.items())) or self._rank(e.rank),
                                       "log"))
                continue
            if kind != "decode" and kind != "prefill":
                out.extend(self.convert(e))
                continue
            # What `convert` does for these kinds (apply_to_server only reads args/version events).
            t = self._time(e)
            key = tuple(e.rank.items())
            rank = ranks.get(key)
            if rank is None:
                rank = self._rank(e.rank)
            f = e.fields
            get: Callable[[str], Any] = f.get  # Any: the parser's values, classes checked below
            usage = get("token_usage")
            if usage.__class__ is not float:  # a float is what `_usage` would return for it
                usage = batch_usage(f)
            # `_num` inline for the parser's usual classes (exactly float and int; bool is neither):
            # five calls per line saved, the same values.
            q, r = get("num_queue_reqs"), get("num_running_reqs")
            c = q.__class__
            if c is not float:
                q = float(q) if c is int else number(q)
            c = r.__class__
            if c is not float:
                r = float(r) if c is int else number(r)
            if kind == "decode":
                graph = None
                if "cuda_graph" in f:
                    if server is not None:
                        self.note_version_floor("0.4.7")
                    graph = f["cuda_graph"]
                    graph = 1.0 if graph is True else (0.0 if graph is False else number(graph))
                used = get("num_used_tokens")
                if used is None and "num_used_tokens" not in f:
                    used = get("num_full_tokens")
                tp = get("gen_throughput")
                c = tp.__class__
                if c is not float:
                    tp = float(tp) if c is int else number(tp)
                c = used.__class__
                if c is not float:
                    used = float(used) if c is int else number(used)
                if (q is not None or r is not None or usage is not None or tp is not None or used is not None
                        or graph is not None):
                    append(_new_sample((t, rank, False, q, r, usage, tp, used, graph, "log", None, None)))
                if "mamba_usage" in f or "swa_token_usage" in f:
                    for name, v in pool_pairs(f):
                        append(Observation(t, name, v, rank, "log"))
                continue
            new, cached = get("num_new_tokens"), get("num_cached_tokens")
            c = new.__class__
            if c is not float:
                new = float(new) if c is int else number(new)
            c = cached.__class__
            if c is not float:
                cached = float(cached) if c is int else number(cached)
            if q is not None or r is not None or usage is not None or new is not None or cached is not None:
                append(_new_sample((t, rank, True, q, r, usage, None, None, None, "log", new, cached)))
        return out


    def convert_all(self, events: Iterable[Event]) -> Iterator[Observation]:
        """Observations for many events, in order."""
        for e in self._seeded(events):
            yield from self.convert(e)

    def _seeded(self, events: Iterable[Event]) -> Iterable[Event]:
        """`events`, the log clock seeded with their first stamps before any time (LogClock.seed)."""
        if self.log_clock.latest is not None:
            return events
        events = events if isinstance(events, list) else list(events)
        self.log_clock.seed(e.time for e in events)
        return events
