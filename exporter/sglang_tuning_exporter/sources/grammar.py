"""What one reader learns from the lines it reads (`Grammar`): the batch-line layouts its server
prints, one regex that reads them all at once, and the line prefixes it has already split.

A speed cache, never a source of meaning: the events are the same with a fresh Grammar, a warm one or
none (module-level `logparse.parse_line` learns nothing). Each reader owns its own
(`logparse.LineClassifier`, hence `logreader.EventReader`), so nothing learnt crosses readers or calls.
Pure: no I/O, no clock."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from sglang_tuning_exporter.core import events as ev
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.sources.logline import (
    BATCH_KEYS,
    GRAPH_LABELS,
    POOL_USAGES,
    STD_PREFIX,
    STD_PREFIX_GROUPS,
    auto_value,
    compute_prefix,
    derive_token_usage,
    normalise_key,
    std_ranks,
    to_bool,
    to_ratio,
)

_SAFE_NAME = re.compile(r"[a-z0-9_]+")
_BOOLS = {"True": True, "False": False}


class Layout:
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
            known = BATCH_KEYS.get(k)
            name, conv = known if known is not None else (normalise_key(k), auto_value)
            if not _SAFE_NAME.fullmatch(name):
                raise ValueError(name)
            names.append(name)
            if conv is int:
                items.append((name, "int(g[{}])"))
            elif conv is float:
                items.append((name, "float(g[{}])"))
            elif conv is to_bool:
                items.append((name, "B[g[{}]]"))
            elif conv is to_ratio:
                items.append((name, "R(g[{}])"))
            else:
                items.append((name, "A(g[{}])"))
            if k in GRAPH_LABELS:
                self.extra["graph_backend"] = GRAPH_LABELS[k]
        self.items = tuple(items)
        self.text_values = any(expr.startswith("A(") for _, expr in items)  # free text: may hold anything
        self.fields = self._generate(items, 0)
        self.derive_usage = "token_usage" not in names and any(u in names for u in POOL_USAGES)

    @staticmethod
    def _generate(items: list[tuple[str, str]], offset: int) -> Callable[[tuple[Any, ...]], dict[str, Any]]:
        src = "lambda g: {" + ", ".join(f"{name!r}: " + expr.format(i + offset)
                                        for i, (name, expr) in enumerate(items)) + "}"
        env = {"__builtins__": {}, "int": int, "float": float, "B": _BOOLS, "R": to_ratio, "A": auto_value}
        # Our own generated source (see above), evaluated with no builtins; log text is never code.
        fn: Callable[[tuple[Any, ...]], dict[str, Any]] = eval(compile(src, "<batch-layout>", "eval"), env)
        return fn


class LineBatches:
    """Every known layout of both heads as ONE anchored regex over a whole line.

    `fullmatch` reads SGLang's own prefix (date, time, rank tags: groups 1-3), the head and every
    value in C; `builders[m.lastindex]` names the layout that matched (each layout is one outer
    group) and the generated function that reads its fields from `m.groups()`.
    """

    __slots__ = ("builders", "rx")

    def __init__(self, decode: tuple[Layout, ...], prefill: tuple[Layout, ...]) -> None:
        self.builders: dict[int, tuple[str, Layout, Callable[[tuple[Any, ...]], dict[str, Any]]]] = {}
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
        self.rx = re.compile(STD_PREFIX_GROUPS + "(?:" + "|".join(heads) + ")")


MAX_LAYOUTS = 16  # per head: a server prints a handful
# Layouts seen once: learning one compiles its regex and rebuilds the one-regex matcher of every
# layout, worth it for the few a server prints millions of times, ruinous for a log whose every line
# has new keys (48 of 53 s in re.compile on mutated lines). A layout is learnt at its second line.
_MAX_ONCE = 1024
_MAX_PREFIXES = 4096


class Grammar:
    """One reader's learnt layouts and prefix splits (see the module docstring)."""

    __slots__ = ("_batches", "_once", "_prefixes", "_ranks", "layouts")

    def __init__(self) -> None:
        self.layouts: dict[str, list[Layout]] = {ev.DECODE: [], ev.PREFILL: []}  # newest first
        self._once: set[tuple[str, tuple[str, ...]]] = set()
        self._prefixes: dict[str, tuple[str | None, dict[str, int]]] = {}
        self._ranks: dict[str, dict[str, int]] = {}  # by the rank tags of SGLang's own prefix
        self._batches: LineBatches | None = None  # built from `layouts` when first needed

    def split_prefix(self, prefix: str) -> tuple[str | None, dict[str, int]]:
        """logline.split_prefix, remembered (the rank dict is shared: callers copy it)."""
        hit = self._prefixes.get(prefix)
        if hit is None:
            if len(self._prefixes) >= _MAX_PREFIXES:
                self._prefixes.clear()
            m = STD_PREFIX.fullmatch(prefix)
            hit = compute_prefix(prefix) if m is None else (f"{m.group(1)}T{m.group(2)}", self._rank_of(m.group(3)))
            self._prefixes[prefix] = hit
        return hit

    def _rank_of(self, tags: str) -> dict[str, int]:
        rank = self._ranks.get(tags)
        if rank is None:
            rank = std_ranks(tags)
            if len(self._ranks) < _MAX_PREFIXES:
                self._ranks[tags] = rank
        return rank

    def event(self, line_no: int, kind: str, prefix: str, fields: dict[str, Any]) -> Event:
        """logline.make_event with the prefix split remembered."""
        time, rank = self.split_prefix(prefix)
        return Event(line_no, kind, time, dict(rank), fields)

    def learn(self, kind: str, raw_keys: list[str]) -> None:
        """A batch line of `kind` read on the general path with these keys, none malformed: its layout
        is learnt the second time it is seen (not again when a known layout could not read the line)."""
        layouts = self.layouts[kind]
        keys = tuple(raw_keys)
        if any(known.keys == keys for known in layouts) or not self._seen_twice(kind, keys):
            return
        try:
            layout = Layout(raw_keys)
        except (ValueError, SyntaxError):
            return  # odd keys: this layout stays on the general path
        layouts.insert(0, layout)
        del layouts[MAX_LAYOUTS:]
        self._batches = None  # the one-regex matcher is rebuilt for the new set

    def _seen_twice(self, kind: str, keys: tuple[str, ...]) -> bool:
        key = (kind, keys)
        once = self._once
        if key in once:
            once.discard(key)
            return True
        if len(once) >= _MAX_ONCE:
            once.clear()  # bounded: a flood of one-off layouts forgets, and is never learnt
        once.add(key)
        return False

    def line_batches(self) -> LineBatches | None:
        """The one-regex matcher for every layout learnt so far; None before the first."""
        hit = self._batches
        if hit is None:
            decode, prefill = tuple(self.layouts[ev.DECODE]), tuple(self.layouts[ev.PREFILL])
            if not decode and not prefill:
                return None
            hit = self._batches = LineBatches(decode, prefill)
        return hit

    def fast_batch(self, line: str, n: int) -> Event | None:
        """The reader's shortcut for a standard-prefix batch line of a learnt layout.

        Returns exactly what logparse.parse_line would, or None when the line needs the general path
        (other prefix, new layout, odd value); never raises for a str."""
        if line[:1] != "[":
            return None  # decorated prefix (docker, Ray, custom format): the general path reads it
        lb = self._batches  # what line_batches() returns once built (one call per line saved)
        if lb is None:
            lb = self.line_batches()
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
            derive_token_usage(f)
        return Event(n, kind, f"{g[0]}T{g[1]}", self._rank_of(g[2]).copy(), f)
