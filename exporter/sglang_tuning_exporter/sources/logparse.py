"""Pure SGLang log-line parser: one line of text in, one typed Event (or None) out.

Lines are parsed by structure, not by one regex per release: a prefix (timestamp, rank tags,
docker-compose / Ray / custom logging decorations), a recognised head (`Decode batch`, `Prefill
batch`, `KV cache pool is full`, `Load weight end`, ...), then `key: value` / `key=value` pairs.
Known keys get the canonical names of interfaces.md; unknown keys are kept under a normalised name,
so a field added by a future release is carried through rather than lost. No I/O, no clock.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from sglang_tuning_exporter.core import events as ev
from sglang_tuning_exporter.core.events import Event, new_event
from sglang_tuning_exporter.sources.serverargs import parse_server_args


class _Unparsed:
    """Sentinel: the line carries a recognised head but its body could not be read."""

    __slots__ = ()


UNPARSED: Final = _Unparsed()
_Result = Event | None | _Unparsed

# ---------------------------------------------------------------------------------------------
# Prefix: timestamp and rank tags, wherever the decorations put them.
# ---------------------------------------------------------------------------------------------
_TS = re.compile(r"(?:(\d{4}-\d\d-\d\d)[ T])?(\d\d:\d\d:\d\d)(?:[.,](\d{1,6}))?(?![\d:])")
_RANK = re.compile(r"\b(ATTN_CP|MOE_DP|DP|PP|TP|EP)(\d+)\b")
_CUT_DATE = re.compile(r"\d-\d\d-\d\d[ T]$")
_RANK_V01 = re.compile(r"\bRank (\d+): ")
_RANK_KEYS = {"DP": "dp", "PP": "pp", "TP": "tp", "EP": "ep", "ATTN_CP": "attn_cp", "MOE_DP": "moe_dp"}
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_PREFIX_CACHE: dict[str, tuple[str | None, dict[str, int]]] = {}
_PREFIX_CACHE_MAX = 4096


def _compute_prefix(prefix: str) -> tuple[str | None, dict[str, int]]:
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
_STD_PREFIX_GROUPS = r"\[(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d(?:\.\d{1,6})?)((?: [A-Z_]+\d+)*)\] "
_STD_PREFIX = re.compile(_STD_PREFIX_GROUPS)  # LineBatches starts every layout with the same groups
_RANK_CACHE: dict[str, dict[str, int]] = {}


def split_prefix(prefix: str) -> tuple[str | None, dict[str, int]]:
    """Time (ISO, or HH:MM:SS when the log has no date) and ranks named by a line prefix."""
    hit = _PREFIX_CACHE.get(prefix)
    if hit is None:
        if len(_PREFIX_CACHE) >= _PREFIX_CACHE_MAX:
            _PREFIX_CACHE.clear()
        m = _STD_PREFIX.fullmatch(prefix)
        if m is not None:
            tags = m.group(3)
            rank = _RANK_CACHE.get(tags)
            if rank is None:
                rank = {_RANK_KEYS[k]: int(v) for k, v in _RANK.findall(tags)}
                if len(_RANK_CACHE) < _PREFIX_CACHE_MAX:
                    _RANK_CACHE[tags] = rank
            hit = (f"{m.group(1)}T{m.group(2)}", rank)
        else:
            hit = _compute_prefix(prefix)
        _PREFIX_CACHE[prefix] = hit
    return hit


def _event(line_no: int, kind: str, prefix: str, fields: dict[str, Any]) -> Event:
    time, rank = split_prefix(prefix)
    return Event(line_no, kind, time, dict(rank), fields)


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


def _to_bool(v: str) -> bool:
    v = v.strip()
    if v == "True":
        return True
    if v == "False":
        return False
    raise ValueError(v)


def _to_ratio(v: str) -> float:
    v = v.strip()
    return _percent(v) if v.endswith("%") else float(v)


_Conv = Callable[[str], Any]

# Batch-line keys (Decode/Prefill of every release, v0.1 spellings included) -> canonical names.
_BATCH_KEYS: dict[str, tuple[str, _Conv]] = {
    "#running-req": ("num_running_reqs", int),
    "#token": ("num_used_tokens", int),
    "token usage": ("token_usage", float),
    "cuda graph": ("cuda_graph", _to_bool),
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
    "cache hit rate": ("cache_hit_rate", _to_ratio),
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
    "tree_cache_hit_rate": ("cache_hit_rate", _to_ratio),
}
# Other device labels of the graph flag: the value is still `cuda_graph`, the label is kept.
for _label in ("npu", "cpu", "musa", "xpu"):
    _BATCH_KEYS[f"{_label} graph"] = ("cuda_graph", _to_bool)
_GRAPH_LABELS = {"npu graph": "npu", "cpu graph": "cpu", "musa graph": "musa", "xpu graph": "xpu"}
POOL_USAGES = (  # hybrid models log each pool; token_usage is then the fullest (SGLang's gauge)
    "full_token_usage", "swa_token_usage", "mamba_usage", "gpu_token_usage")

_RETRACT_KEYS: dict[str, tuple[str, _Conv]] = {
    "#retracted_reqs": ("num_retracted_reqs", int),
    "#new_tokens_gained": ("num_new_tokens_gained", int),
    "#mamba_num_gained": ("num_mamba_num_gained", int),
    "#aborted_retracted_reqs": ("num_aborted_retracted_reqs", int),
}


def _pairs(body: str, sep: str, keys: dict[str, tuple[str, _Conv]], out: dict[str, Any],
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
        if name == "cuda_graph" and k in _GRAPH_LABELS:
            backend = _GRAPH_LABELS[k]
    if backend is not None:
        out["graph_backend"] = backend
    return bad


_SAFE_NAME = re.compile(r"[a-z0-9_]+")
_BOOLS = {"True": True, "False": False}


class _Layout:
    """A batch-line layout seen before (same keys, same order), matched by one compiled regex.

    A server prints the same few layouts millions of times. Matching the whole line at once in C
    and building the fields with one generated dict display (names from our key table or the
    unknown-key rule, so only `[a-z0-9_]`; values are never code) is several times cheaper than a
    per-pair loop. `rx`/`fields` match the body after the head; `body` is the same pattern that
    `LineBatches` joins with every other layout to read whole lines with SGLang's own prefix.
    """

    __slots__ = ("body", "derive_usage", "extra", "fields", "items", "keys", "rx", "text_values")

    def __init__(self, raw_keys: list[str]) -> None:
        self.keys = tuple(raw_keys)
        body = ", ".join(re.escape(k) + ": ([^,]*)" for k in raw_keys) + r",? *\n?"
        self.body = body
        self.rx = re.compile(body)
        items: list[tuple[str, str]] = []
        self.extra: dict[str, Any] = {}
        names: list[str] = []
        for k in raw_keys:
            known = _BATCH_KEYS.get(k)
            name, conv = known if known is not None else (normalise_key(k), auto_value)
            if not _SAFE_NAME.fullmatch(name):
                raise ValueError(name)
            names.append(name)
            if conv is int:
                items.append((name, "int(g[{}])"))
            elif conv is float:
                items.append((name, "float(g[{}])"))
            elif conv is _to_bool:
                items.append((name, "B[g[{}]]"))
            elif conv is _to_ratio:
                items.append((name, "R(g[{}])"))
            else:
                items.append((name, "A(g[{}])"))
            if k in _GRAPH_LABELS:
                self.extra["graph_backend"] = _GRAPH_LABELS[k]
        self.items = tuple(items)
        self.text_values = any(expr.startswith("A(") for _, expr in items)  # free text: may hold anything
        self.fields = self._generate(items, 0)
        self.derive_usage = "token_usage" not in names and any(u in names for u in POOL_USAGES)

    @staticmethod
    def _generate(items: list[tuple[str, str]], offset: int) -> Callable[[tuple[Any, ...]], dict[str, Any]]:
        src = "lambda g: {" + ", ".join(f"{name!r}: " + expr.format(i + offset)
                                        for i, (name, expr) in enumerate(items)) + "}"
        env = {"__builtins__": {}, "int": int, "float": float, "B": _BOOLS, "R": _to_ratio, "A": auto_value}
        # Our own generated source (see above), evaluated with no builtins; log text is never code.
        fn: Callable[[tuple[Any, ...]], dict[str, Any]] = eval(compile(src, "<batch-layout>", "eval"), env)
        return fn


def _derive_usage(fields: dict[str, Any]) -> None:
    pools = [fields[k] for k in POOL_USAGES if isinstance(fields.get(k), float)]
    if pools:
        # SGLang's own sglang:token_usage gauge is the fullest pool on hybrid models.
        fields["token_usage"] = max(pools)


_LAYOUTS: dict[str, list[_Layout]] = {ev.DECODE: [], ev.PREFILL: []}
_MAX_LAYOUTS = 16
# Layouts seen once: learning one compiles its regex and rebuilds the one-regex matcher of every
# layout, worth it for the few a server prints millions of times, ruinous for a log whose every line
# has new keys (48 of 53 s in re.compile on mutated lines). A layout is learnt at its second line.
_ONCE: set[tuple[str, tuple[str, ...]]] = set()
_MAX_ONCE = 1024


def _seen_twice(kind: str, raw_keys: list[str]) -> bool:
    key = (kind, tuple(raw_keys))
    if key in _ONCE:
        _ONCE.discard(key)
        return True
    if len(_ONCE) >= _MAX_ONCE:
        _ONCE.clear()  # bounded: a flood of one-off layouts forgets, and is never learnt
    _ONCE.add(key)
    return False

# ---------------------------------------------------------------------------------------------
# Handlers: each returns an Event, None (not its line) or UNPARSED (its head, unreadable body).
# ---------------------------------------------------------------------------------------------
DECODE_HEAD, PREFILL_HEAD, FILL_HEAD_V01 = "Decode batch", "Prefill batch", "new fill batch. "
_BATCH_HEAD = re.compile(r"(Decode|Prefill) batch(?: \[(\d+)\])?(?:\(mixed #running-req: (\d+)\))?[.,](?: |$)")
_PARTIAL: Final = "_partial"  # internal marker key, removed before the event leaves the parser


def _batch(s: str, n: int) -> _Result:
    p = s.find(DECODE_HEAD)
    if p < 0:
        p = s.find(PREFILL_HEAD)
        if p < 0:
            p = s.find(FILL_HEAD_V01)
            return _fill_batch_v01(s, n, p) if p >= 0 else None
    m = _BATCH_HEAD.match(s, p)
    if m is None:
        return None
    kind = ev.DECODE if m.group(1) == "Decode" else ev.PREFILL
    body_at = m.end()
    mixed = m.group(3)
    if mixed is None:
        # Fast path: a layout this process has already seen.
        for layout in _LAYOUTS[kind]:
            g = layout.rx.fullmatch(s, body_at)
            if g is not None:
                try:
                    f = layout.fields(g.groups())
                except (ValueError, KeyError):
                    break
                if layout.extra:
                    f.update(layout.extra)
                if layout.derive_usage:
                    _derive_usage(f)
                if m.group(2):
                    f = {"forward_iter": int(m.group(2)), **f}
                return _event(n, kind, s[:p], f)
    fields: dict[str, Any] = {}
    if m.group(2):
        fields["forward_iter"] = int(m.group(2))
    if m.group(3):
        fields["num_running_reqs"] = int(m.group(3))
        fields["mixed_chunk"] = True
    body = s[body_at:].rstrip().rstrip(",")
    raw_keys: list[str] = []
    bad = _pairs(body, ", ", _BATCH_KEYS, fields, raw_keys)
    known = sum(1 for k in fields if k not in ("forward_iter", "mixed_chunk"))
    if not known:
        return UNPARSED
    if "token_usage" not in fields:
        _derive_usage(fields)
    if bad:
        fields[_PARTIAL] = bad
    elif mixed is None and len(set(raw_keys)) == len(raw_keys) and not any(
            known_layout.keys == tuple(raw_keys) for known_layout in _LAYOUTS[kind]) and _seen_twice(
            kind, raw_keys):
        # (A known layout that could not read this line — an odd value — is not learnt again.)
        try:
            layout = _Layout(raw_keys)
        except (ValueError, SyntaxError):
            pass  # odd keys: this layout stays on the generic path
        else:
            layouts = _LAYOUTS[kind]
            layouts.insert(0, layout)
            del layouts[_MAX_LAYOUTS:]
            _CURRENT[0] = None  # the one-regex matcher is rebuilt for the new set
    return _event(n, kind, s[:p], fields)


class LineBatches:
    """Every known layout of both heads as ONE anchored regex over a whole line.

    `fullmatch` reads SGLang's own prefix (date, time, rank tags: groups 1-3), the head and every
    value in C; `builders[m.lastindex]` names the layout that matched (each layout is one outer
    group) and the generated function that reads its fields from `m.groups()`.
    """

    __slots__ = ("builders", "rx")

    def __init__(self, decode: tuple[_Layout, ...], prefill: tuple[_Layout, ...]) -> None:
        self.builders: dict[int, tuple[str, _Layout, Callable[[tuple[Any, ...]], dict[str, Any]]]] = {}
        heads: list[str] = []
        group = 4
        for kind, head, layouts in ((ev.DECODE, "Decode", decode), (ev.PREFILL, "Prefill", prefill)):
            alts: list[str] = []
            for layout in layouts:
                alts.append("(" + layout.body + ")")
                # groups() index `group` is this layout's first value (group number group + 1).
                self.builders[group] = (kind, layout, layout._generate(list(layout.items), group))
                group += 1 + len(layout.items)
            if alts:
                heads.append(head + r" batch[.,] (?:" + "|".join(alts) + ")")
        self.rx = re.compile(_STD_PREFIX_GROUPS + "(?:" + "|".join(heads) + ")")


_CURRENT: list[LineBatches | None] = [None]


def line_batches() -> LineBatches | None:
    """The one-regex matcher for every batch layout seen so far; None before the first (rebuilt only
    when a layout is learnt)."""
    hit = _CURRENT[0]
    if hit is None:
        decode, prefill = tuple(_LAYOUTS[ev.DECODE]), tuple(_LAYOUTS[ev.PREFILL])
        if not decode and not prefill:
            return None
        hit = _CURRENT[0] = LineBatches(decode, prefill)
    return hit


def fast_batch(line: str, n: int) -> Event | None:
    """The reader's shortcut for a standard-prefix batch line of an already seen layout.

    Returns exactly what parse_line would, or None when the line needs the general path (other
    prefix, new layout, odd value); never raises for a str."""
    if line[:1] != "[":
        return None  # decorated prefix (docker, Ray, custom format): the general path reads it
    lb = _CURRENT[0]  # what line_batches() returns once set (one call per line saved)
    if lb is None:
        lb = line_batches()
        if lb is None:
            return None
    m = lb.rx.fullmatch(line)
    if m is None:
        return None
    kind, layout, fields_of = lb.builders[m.lastindex]  # type: ignore[index]
    if layout.text_values and kind == ev.PREFILL and "Decode batch" in line:
        return None  # free text holding another head: the general parser reads the first head
    g = m.groups()
    try:
        f = fields_of(g)
    except (ValueError, KeyError):
        return None
    if layout.extra:
        f.update(layout.extra)
    if layout.derive_usage:
        _derive_usage(f)
    rank = _RANK_CACHE.get(g[2])
    if rank is None:
        return None
    return new_event(n, kind, f"{g[0]}T{g[1]}", rank.copy(), f)


def _fill_batch_v01(s: str, n: int, p: int) -> _Result:
    body = s[p + len(FILL_HEAD_V01):].rstrip().rstrip(".")
    fields: dict[str, Any] = {}
    bad = _pairs(body, ". ", _BATCH_KEYS, fields)
    if not fields:
        return UNPARSED
    if bad:
        fields[_PARTIAL] = bad
    return _event(n, ev.PREFILL, s[:p], fields)


def _status_v01(s: str, n: int) -> _Result:
    # v0.1.14 decode status line: `#running-req: 3, #token: 1442, token usage: 0.18, #queue-req: 0`
    p = s.find("#running-req: ")
    if p < 0 or "#queue-req" not in s:
        return None
    fields: dict[str, Any] = {}
    bad = _pairs(s[p:].rstrip().rstrip(","), ", ", _BATCH_KEYS, fields)
    if "num_running_reqs" not in fields:
        return UNPARSED
    if bad:
        fields[_PARTIAL] = bad
    return _event(n, ev.DECODE, s[:p], fields)


# SGLang's own retraction line after its prefix (0.4-0.5.x); _RETRACT_HEAD reads it and older spellings.
RETRACT_HEAD_STD = "KV cache pool is full. Retract requests. "
_RETRACT_HEAD = re.compile(
    r"(?i)(decode out of memory happened[.,]?|kv cache pool is full\. retract requests\.|testing retraction\.) ?")
_RATIO = re.compile(r"#new_token_ratio: ([0-9.]+) -> ([0-9.]+)")


def _retract(s: str, n: int) -> _Result:
    m = _RETRACT_HEAD.search(s)
    if m is not None:
        p, body_at = m.start(), m.end()
    else:
        p = body_at = s.find("#retracted_reqs")
        if p < 0:
            return None
    fields: dict[str, Any] = {}
    r = _RATIO.search(s, body_at)
    body = s[body_at:r.start() if r else len(s)].rstrip().rstrip(",")
    bad = _pairs(body, ", ", _RETRACT_KEYS, fields)
    if r is not None:
        fields["new_token_ratio_before"] = float(r.group(1))
        fields["new_token_ratio_after"] = float(r.group(2))
    if "num_retracted_reqs" not in fields:
        return UNPARSED
    if m is not None and m.group(1).lower().startswith("testing"):
        fields["testing"] = True
    if bad:
        fields[_PARTIAL] = bad
    return _event(n, ev.RETRACT, s[:p], fields)


# --- OOM ---------------------------------------------------------------------------------------
_OOM = re.compile(
    r"(?P<pd>(?i:prefill|decode)) out of memory(?! happened)"
    r"|(?P<generic>Out of memory\. (?:Try to lower|Please set))"
    r"|(?P<reqslots>alloc_req_slots runs out of memory)"
    r"|(?P<cuda>CUDA out of memory|OutOfMemoryError|CUDA error: out of memory)"
    r"|(?P<capture>Capture (?:cuda |CUDA )?graph failed)"
    r"|(?P<startup>Not enough memory\. Please try to increase --mem-fraction-static"
    r"|leave no GPU memory for the KV cache)"
    r"|(?P<abort>due to OOM|Out of memory even after retracting)")
# Bounded and anchored to a token start: an unbounded `\w*...Error` search is quadratic on long words.
_EXC_HEAD = re.compile(r"(?<![\w.])((?:[A-Za-z_]\w{0,60}\.){0,8}[A-Z]\w{0,60}?(?:Error|Exception)): ")
_TRY_ALLOC = re.compile(r"Try to allocate (\d+) tokens")
_AVAIL_TOKENS = re.compile(r"Ava(?:li|il)able tokens: (\d+)")
_TRIED = re.compile(r"Tried to allocate ([0-9.]+) ([KMGT]i?B)")
# `Not enough memory. ... Current value: mem_fraction_static=0.3` (late 2026): the value SGLang resolved.
_MFS_VALUE = re.compile(r"Current value: mem_fraction_static=([0-9.]+)")
# torch's allocator message ("capacty" in torch 2.0-2.1): the GPU's size and what was free at the failure,
# the headroom fact of an OOM before the first batch.
_CAPACITY = re.compile(r"GPU (\d+) has a total capac(?:i)?ty of ([0-9.]+) ([KMGT]i?B) of which ([0-9.]+) ([KMGT]i?B)"
                       r" is free")
_UNIT_GB = {"KiB": 1 / 1024**2, "KB": 1e-6, "MiB": 1 / 1024, "MB": 1e-3, "GiB": 1.0, "GB": 1.0, "TiB": 1024.0,
            "TB": 1000.0}


def oom_phase_from_text(text: str) -> str:
    """Phase named by an OOM message itself: prefill, decode, startup, or unknown."""
    m = _OOM.search(text)
    if m is None:
        return "unknown"
    if m.group("pd"):
        return m.group("pd").lower()
    if m.group("capture") or m.group("startup"):
        return "startup"
    if m.group("abort"):
        return "decode"
    return "unknown"


def oom_detail_fields(text: str, fields: dict[str, Any]) -> None:
    """Numbers an OOM message carries (tokens asked/available, CUDA bytes asked)."""
    m = _TRY_ALLOC.search(text)
    if m:
        fields["tokens_requested"] = int(m.group(1))
    m = _AVAIL_TOKENS.search(text)
    if m:
        fields["tokens_available"] = int(m.group(1))
    m = _TRIED.search(text)
    if m:
        fields["tried_to_allocate_gb"] = round(float(m.group(1)) * _UNIT_GB.get(m.group(2), 1.0), 4)
    m = _MFS_VALUE.search(text)
    if m:
        fields["mem_fraction_static"] = float(m.group(1))  # the effective value (its default is None)
    m = _CAPACITY.search(text)
    if m:
        fields["gpu"] = int(m.group(1))
        fields["gpu_total_gb"] = round(float(m.group(2)) * _UNIT_GB.get(m.group(3), 1.0), 4)
        fields["gpu_free_gb"] = round(float(m.group(4)) * _UNIT_GB.get(m.group(5), 1.0), 4)


def _oom(s: str, n: int) -> _Result:
    m = _OOM.search(s)
    if m is None:
        return _retract(s, n) if "out of memory happened" in s.lower() else None
    p = m.start()
    exception = None
    # `RuntimeError: Prefill out of memory...` / `torch.OutOfMemoryError: CUDA out of memory...`
    for x in _EXC_HEAD.finditer(s, max(0, p - 300), m.end() + 2):
        if x.start() <= p:
            exception, p, msg_at = x.group(1), x.start(), x.end()
    message = s[msg_at if exception else p:].strip()
    fields: dict[str, Any] = {"phase": oom_phase_from_text(message), "message": message}
    if exception:
        fields["exception"] = exception
    if m.group("reqslots"):
        fields["pool"] = "req_to_token"
    elif m.group("startup"):
        fields["reason"] = "mem_fraction_static_too_small"
    elif m.group("capture"):
        fields["reason"] = "cuda_graph_capture"
    oom_detail_fields(s, fields)
    return _event(n, ev.OOM, s[:p], fields)


# --- errors ------------------------------------------------------------------------------------
_ERROR_HEAD = re.compile(
    r"(?P<head>\b\w+ hit an exception|Exception in \w+|Traceback \(most recent call last\)"
    r"|Received sigquit from a child process)")


def _error(s: str, n: int) -> _Result:
    m = _ERROR_HEAD.search(s)
    if m is None:
        return None
    head = m.group("head")
    rest = s[m.end():].lstrip(":. ").strip()
    fields: dict[str, Any] = {"error": head if not head.startswith("Traceback") else "Traceback"}
    if rest:
        fields["message"] = rest
    return _event(n, ev.ERROR, s[:m.start()], fields)


# --- startup memory / capacity -----------------------------------------------------------------
_SPLIT_STARTUP = re.compile(r"[.,] +")
_BS = re.compile(r"\bbs=?\s*\[([0-9,\s]*)\]?")
_NUM_LIST = re.compile(r"\b(\w+)=\[([0-9,\s]*)\]")
_UNIT = re.compile(r"^(-?[0-9.]+)\s*(GB|MB|GiB|MiB|s)\.?$")
_STARTUP_ALIASES = {
    "Time elapsed": "elapsed", "#tokens": "kv_tokens", "max_total_num_token": "max_total_num_tokens",
    "max_prefill_num_token": "max_prefill_tokens",
}


def _startup_pairs(body: str, fields: dict[str, Any]) -> None:
    for piece in _SPLIT_STARTUP.split(body.strip().rstrip(".")):
        eq = piece.find("=")
        colon = piece.find(": ")
        if eq < 0 and colon < 0:
            continue
        if colon >= 0 and (eq < 0 or colon < eq):
            k, v = piece[:colon], piece[colon + 2:]
        else:
            k, v = piece[:eq], piece[eq + 1:]
        raw = k.strip()
        key = _STARTUP_ALIASES.get(raw) or normalise_key(raw)
        if not key or len(raw.split()) > 4:
            continue  # prose, not a field
        v = v.strip()
        u = _UNIT.match(v)
        if u:
            unit = u.group(2).lower().replace("ib", "b")
            fields[f"{key}_{unit}"] = float(u.group(1))
        else:
            fields[key] = auto_value(v)


def _batch_sizes(s: str, fields: dict[str, Any]) -> str:
    m = _BS.search(s)
    if m is not None:
        sizes = [int(x) for x in re.findall(r"\d+", m.group(1))]
        if sizes:
            fields["batch_sizes"] = sizes
        s = s[:m.start()] + s[m.end():]
    # Other number lists (the prefill graph's `num_tokens=[64, 128, ...]`, 0.5.14+): kept as lists.
    for k, body in _NUM_LIST.findall(s):
        fields[normalise_key(k)] = [int(x) for x in re.findall(r"\d+", body)]
    return _NUM_LIST.sub("", s) if "[" in s else s


_CAPTURE = re.compile(r"Capture (?P<what>[\w ]{0,80}?)graph (?P<stage>begin|end|bs)\b[.,]? ?")
_LOAD = re.compile(r"Load weight (begin|end)\. ?")
_COMMIT = re.compile(r"in ([0-9.]+) s \(capture overlap window ([0-9.]+) s, startup overlap total ([0-9.]+) s\)")
_KV = re.compile(r"(?:(?<![\w-])(?P<label>[\w-]{1,40}) )?KV Cache (?P<stage>is allocated|VA upper bound)\. ?")
_POST_KV = re.compile(r"Post-capture KV sizing: (?:(?P<alloc>KV cache allocated)\. ?)?")
_DSV4 = re.compile(r"DSv4 (memory calculation|pool sizes): ")
_INIT_DIST = re.compile(r"Init torch distributed (begin|ends?)\.? ?")
_SUMMARY = re.compile(r"max_total_num_tokens?=")
_REDUCED = re.compile(r"max_running_requests was reduced from (?:requested )?(\d+) to (\d+)")
_TIMINGS = re.compile(r"Engine startup timings \(s\): ")


def _startup(kind_stage: str, s: str, n: int, p: int, body: str) -> _Result:
    fields: dict[str, Any] = {"stage": kind_stage}
    _startup_pairs(body, fields)
    return _event(n, ev.STARTUP_MEMORY, s[:p], fields)


def _load_weight(s: str, n: int) -> _Result:
    m = _LOAD.search(s)
    if m is None:
        return None
    body = s[m.end():]
    if m.group(1) == "end" and body.startswith("Committed"):
        c = _COMMIT.search(body)
        if c is None:
            return UNPARSED
        fields: dict[str, Any] = {"stage": "load_weight_commit", "elapsed_s": float(c.group(1)),
                                  "capture_overlap_window_s": float(c.group(2)),
                                  "startup_overlap_total_s": float(c.group(3))}
        return _event(n, ev.STARTUP_MEMORY, s[:m.start()], fields)
    e = _startup(f"load_weight_{m.group(1)}", s, n, m.start(), body)
    if isinstance(e, Event) and "avail_mem_gb" not in e.fields:
        return UNPARSED
    return e


def _kv_cache(s: str, n: int) -> _Result:
    m = _POST_KV.search(s)
    if m is not None:
        stage = "post_capture_kv_allocated" if m.group("alloc") else "post_capture_kv_sizing"
        return _startup(stage, s, n, m.start(), s[m.end():])
    m = _KV.search(s)
    if m is None:
        return None
    stage = "kv_cache_allocated" if m.group("stage") == "is allocated" else "kv_cache_va_upper_bound"
    label = m.group("label")
    p = m.start() if label and label not in ("The",) else m.start("stage") - len("KV Cache ")
    e = _startup(stage, s, n, p, s[m.end():])
    if isinstance(e, Event):
        if label and p == m.start():
            e.fields["pool"] = label
        if not any(k.endswith("_gb") for k in e.fields):
            return UNPARSED
    return e


def _memory_pool_end(s: str, n: int) -> _Result:
    p = s.find("Memory pool end.")
    if p < 0:
        return None
    e = _startup("memory_pool_end", s, n, p, s[p + len("Memory pool end."):])
    if isinstance(e, Event) and "avail_mem_gb" not in e.fields:
        return UNPARSED
    return e


def _capture(s: str, n: int) -> _Result:
    m = _CAPTURE.search(s)
    if m is None:
        return None
    what = m.group("what").strip()
    prefill = "prefill" in what.lower() or "piecewise" in what.lower()
    stage = ("prefill_graph_" if prefill else "cuda_graph_") + m.group("stage")
    fields: dict[str, Any] = {"stage": stage}
    if what and what.lower() != "cuda":
        fields["graph"] = what
    body = s[m.end():]
    if m.group("stage") == "bs":
        body = "bs=" + body  # older releases: `Capture cuda graph bs [1, 2, 4, ...]`
    body = _batch_sizes(body, fields)
    _startup_pairs(body, fields)
    if m.group("stage") == "bs" and "batch_sizes" not in fields:
        return UNPARSED
    return _event(n, ev.STARTUP_MEMORY, s[:m.start()], fields)


# `CUDA graph disabled for {n} consecutive decode steps. This may cause significant throughput
# degradation. Check if batch size is within CUDA graph capture range.` (managers/cuda_graph_warner.py)
_GRAPH_WARN = re.compile(r"CUDA graph disabled for (\d+) consecutive decode steps")
# `Disable prefill CUDA graph because <reason>` (model runner, 0.5.14+; INFO or WARNING)
_PREFILL_OFF = re.compile(r"Disable prefill CUDA graph because ?")


def _graph_warner(s: str, n: int) -> _Result:
    m = _GRAPH_WARN.search(s)
    if m is None:
        return None
    return _event(n, ev.CUDA_GRAPH_DISABLED, s[:m.start()], {"consecutive_steps": int(m.group(1))})


def _prefill_graph_off(s: str, n: int) -> _Result:
    m = _PREFILL_OFF.search(s)
    if m is None:
        return None
    return _event(n, ev.STARTUP_MEMORY, s[:m.start()],
                  {"stage": "prefill_graph_disabled", "reason": s[m.end():].strip().rstrip(".")})


def _summary(s: str, n: int) -> _Result:
    m = _REDUCED.search(s)
    if m is not None:
        return _event(n, ev.MAX_RUNNING_REDUCED, s[:m.start()],
                      {"requested": int(m.group(1)), "reduced_to": int(m.group(2))})
    m = _SUMMARY.search(s)
    if m is None:
        return None
    p = m.start()
    prefix = s[:p]
    fields: dict[str, Any] = {"stage": "summary"}
    _startup_pairs(s[p:].rstrip().rstrip(","), fields)
    if not isinstance(fields.get("max_total_num_tokens"), int):
        return UNPARSED
    return _event(n, ev.STARTUP_MEMORY, prefix, fields)


def _dsv4(s: str, n: int) -> _Result:
    m = _DSV4.search(s)
    if m is None:
        return None
    stage = "dsv4_" + m.group(1).replace(" ", "_")
    return _startup(stage, s, n, m.start(), s[m.end():])


def _init_dist(s: str, n: int) -> _Result:
    m = _INIT_DIST.search(s)
    if m is None:
        return None
    stage = "init_torch_distributed_" + ("begin" if m.group(1) == "begin" else "end")
    return _startup(stage, s, n, m.start(), s[m.end():])


_TIMING_PAIR = re.compile(r"\b(\w+)=(\{[^}]*\}|[0-9.]+)")


def _timings(s: str, n: int) -> _Result:
    m = _TIMINGS.search(s)
    if m is None:
        return None
    fields: dict[str, Any] = {}
    for key, value in _TIMING_PAIR.findall(s, m.end()):
        if value.startswith("{"):
            fields[f"{key}_s"] = {k: float(v) for k, v in _TIMING_PAIR.findall(value)}
        else:
            fields[f"{key}_s"] = float(value)
    if not fields:
        return UNPARSED
    return _event(n, ev.STARTUP_TIMINGS, s[:m.start()], fields)


def _server_args(s: str, n: int) -> _Result:
    p = s.find("server_args")
    if p < 0:
        return None
    after = s[p + len("server_args"):p + len("server_args") + 3]
    if not (after.startswith("=") or after.startswith(": ")):
        return None
    try:
        args = parse_server_args(s[p:])
    except (RecursionError, MemoryError):
        args = None
    if not args:
        return UNPARSED
    return _event(n, ev.SERVER_ARGS, s[:p], args)


_VERSION = re.compile(
    r"(?i)\bsglang(?:==| version:? ?v?|_version[=:] ?v?|:v| v)(\d+\.\d+(?:\.\d+)?(?:\.?post\d+|rc\d+|\.dev\d+)?)\b")


def _version(s: str, n: int) -> _Result:
    m = _VERSION.search(s)
    if m is None:
        return None
    return _event(n, ev.VERSION, s[:m.start()], {"version": m.group(1)})


def _ready(s: str, n: int) -> _Result:
    p = s.find("The server is fired up and ready to roll")
    if p < 0:
        return None
    return _event(n, ev.SERVER_READY, s[:p], {})


# Cheap substring gates, tried in order; each handler re-checks its own head precisely.
_DISPATCH: tuple[tuple[str, Callable[[str, int], _Result]], ...] = (
    ("etract", _retract),
    ("#running-req", _status_v01),
    ("emory", _oom),
    ("OOM", _oom),
    ("Memory pool end", _memory_pool_end),
    ("Load weight", _load_weight),
    ("KV ", _kv_cache),
    ("Capture ", _capture),
    ("consecutive decode steps", _graph_warner),
    ("Disable prefill CUDA graph", _prefill_graph_off),
    ("max_", _summary),
    ("server_args", _server_args),
    ("xception", _error),
    ("Traceback", _error),
    ("sigquit", _error),
    ("DSv4", _dsv4),
    ("torch distributed", _init_dist),
    ("startup timings", _timings),
    ("fired up", _ready),
    ("sglang", _version),
    ("SGLang", _version),
)


def dispatch_markers() -> tuple[str, ...]:
    """Substrings of which a line must hold one for _parse_clean to return anything (the batch heads
    and every dispatch gate): the C accelerator skips lines holding none of them."""
    return (DECODE_HEAD, PREFILL_HEAD, FILL_HEAD_V01, *(marker for marker, _ in _DISPATCH))


def _parse_clean(s: str, n: int) -> _Result:
    if "batch" in s:
        r = _batch(s, n)
        if r is not None:
            return r
    if "HTTP/1." in s:
        return None  # uvicorn access line: the commonest line in a busy log, never an event
    for marker, handler in _DISPATCH:
        if marker in s:
            r = handler(s, n)
            if r is not None:
                return r
    return None


_NOTHING: Final[tuple[_Result, bool]] = (None, False)


def parse_any(text: str, line_no: int) -> tuple[_Result, bool]:
    """Like parse_line, but also says UNPARSED (recognised head, unreadable body) and whether the
    event came from a line with malformed pieces (truncated or mangled: counted, still used)."""
    if "HTTP/1." in text and "\r" not in text:
        return _NOTHING  # uvicorn access line: rejected before any other work
    try:
        s = text[:-1] if text[-1:] == "\n" else text
        if "\x1b" in s:
            s = _ANSI.sub("", s)
        if "\r" in s:
            # Progress bars redraw with \r: the record is the last fragment that holds one.
            r: _Result = None
            for seg in reversed(s.split("\r")):
                r = _parse_clean(seg, line_no)
                if r is not None:
                    break
        else:
            r = _parse_clean(s, line_no)
    except Exception:  # never let one odd line stop a reader
        return UNPARSED, False
    if r.__class__ is Event and _PARTIAL in r.fields:
        del r.fields[_PARTIAL]
        return r, True
    return r, False


# A startup summary glued after another message (a paste that lost a newline):
# `... avail mem=6.95 GB max_total_num_tokens=2980168, ...`. Only after a character that ends a value
# (never `]` or `: `, which end a prefix: there the summary is the line's one message).
_GLUED_SUMMARY = re.compile(r"[A-Za-z0-9.)] ?(?=max_total_num_tokens?=)")
GLUE_GATE = "max_total_num_token"  # substring every glued line holds (a cheap test before glue_point)


def glue_point(text: str) -> int:
    """Where a second message glued onto the line starts, or -1 (see _GLUED_SUMMARY)."""
    m = _GLUED_SUMMARY.search(text)
    if m is None or not text[:m.start()].strip():
        return -1
    return m.end()


def parse_line(text: str, line_no: int) -> Event | None:
    """One log line -> the Event it carries, or None. Pure; never raises."""
    r = parse_any(text, line_no)[0]
    return r if isinstance(r, Event) else None


# ---------------------------------------------------------------------------------------------
# Statistics.
# ---------------------------------------------------------------------------------------------
@dataclass
class ParseStats:
    """Counts kept while classifying lines: by kind, unparsed (with examples), partial."""

    lines: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    unparsed: int = 0
    implausible_times: int = 0  # stamps taken at a neighbour's time (core/timeparse.LogClock)
    partial: int = 0
    truncated: int = 0
    unparsed_examples: list[tuple[int, str]] = field(default_factory=list)
    max_examples: int = 20

    def note_unparsed(self, line_no: int, text: str) -> None:
        """Count a line with a recognised head and an unreadable body; keep the first few as examples."""
        self.unparsed += 1
        if len(self.unparsed_examples) < self.max_examples:
            self.unparsed_examples.append((line_no, text.rstrip("\n")[:300]))

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        return {"lines": self.lines, "events": sum(self.by_kind.values()), "by_kind": dict(sorted(self.by_kind.items())),
                "unparsed": self.unparsed, "implausible_times": self.implausible_times, "partial": self.partial, "truncated": self.truncated,
                "unparsed_examples": [{"line": n, "text": t} for n, t in self.unparsed_examples]}


class LineClassifier:
    """parse_line plus statistics: what was recognised, what carried a head but could not be read."""

    def __init__(self) -> None:
        self.stats = ParseStats()

    def classify(self, text: str, line_no: int) -> Event | None:
        """Parse one line and count the outcome."""
        st = self.stats
        st.lines += 1
        r, partial = parse_any(text, line_no)
        if r is None:
            return None
        if isinstance(r, _Unparsed):
            st.note_unparsed(line_no, text)
            return None
        if partial:
            st.partial += 1
        st.by_kind[r.kind] += 1
        return r

    def count(self, event: Event) -> None:
        """Count an event produced outside classify (e.g. a traceback finished by the reader)."""
        self.stats.by_kind[event.kind] += 1


def capture_event(e: Event) -> Event | None:
    """The `cuda_graph_capture` companion of a capture line that lists its batch sizes."""
    sizes = e.fields.get("batch_sizes")
    if e.kind != ev.STARTUP_MEMORY or not isinstance(sizes, list) or not sizes:
        return None
    graph = str(e.fields.get("graph", "")).lower()
    if str(e.fields.get("stage", "")).startswith("prefill_graph") or "draft" in graph or "verify" in graph:
        return None  # only the target model's decode graph bounds `cuda graph: True` on Decode lines
    fields: dict[str, Any] = {"batch_sizes": sizes, "max_bs": max(sizes)}
    if "graph" in e.fields:
        fields["graph"] = e.fields["graph"]
    return Event(e.line, ev.CUDA_GRAPH_CAPTURE, e.time, dict(e.rank), fields)
