"""What the release audit (scripts/audit_release.py) and its CI test share: a logging site's format string
rendered with plausible values, and what the project's reader makes of the rendered line.

A format string is SGLang's message in one spelling whatever its source form (f-string, `%`, `.format`):
literal text with `{expression[!conv][:spec]}` fields, literal braces doubled. Values are chosen from the
field's expression and spec (an int for `:d` or a count, a float for `:.2f` or a size in GB, ...), each
number distinct (derived from the field's text), so "read with its numbers" can be checked field by field.
"""

from __future__ import annotations

import contextlib
import math
import re
import string
import zlib
from dataclasses import dataclass, field
from typing import Any

from sglang_tuning_exporter.core import events as ev
from sglang_tuning_exporter.sources.logreader import scan_text

PREFIX = "[2026-11-28 10:00:00 TP0] "  # SGLang's own prefix (logger format `[%(asctime)s%(prefix)s] `)
# Kinds that say a line was read as what it is; an `error` or `version` event from a message's words is not.
GENERIC_KINDS = frozenset({ev.ERROR, ev.VERSION})

_FORMATTER = string.Formatter()
_FLOATY = re.compile(r"ratio|fraction|frac|usage|util|rate\b|percent|gb\b|_gb|mem|memory|gib|_s\b|seconds|time|"
                     r"elapsed|latency|avail|free|throughput")
_INTY = re.compile(r"size|num|tokens?|bs\b|_bs|len|count|cap|reqs?|requests|max|min|total|steps?|layers?|rank|"
                   r"page|slots?|capacity|budget|limit|chunk|batch|idx|world|tp|dp|pp|ep")
class _Verbatim(str):
    """A value whose repr is its text (`{get_global_server_args()!r}` prints `ServerArgs(...)`, unquoted)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str(self)


_SERVER_ARGS = _Verbatim("ServerArgs(model_path='Qwen/Qwen3-8B', chunked_prefill_size=4096, pp_max_micro_batch_size=4)")
_TEXTS = (("remaining", "{'pp_max_micro_batch_size': 4}"),
          ("__name__", "Qwen3ForCausalLM"), ("_str(", "(details)"), ("_msg", "(details)"), ("graph_backend", "CUDA graph"),
          ("capture_name", "target decode"), ("quant", "quant=fp8, "), ("dtype", "torch.float8_e4m3fn"), ("backend", "flashinfer"), ("mode", "normal"), ("path", "/models/m"),
          ("model", "Qwen/Qwen3-8B"), ("device", "cuda:0"), ("override", "{'chunked_prefill_size': 4096}"),
          ("args", "{'chunked_prefill_size': 4096}"), ("key", "chunked_prefill_size"), ("name", "decode"),
          ("reason", "piecewise CUDA graph is disabled"), ("policy", "lpm"), ("method", "EAGLE"))


def _crc(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


def plausible(expr: str, conv: str | None, spec: str) -> Any:
    """A value for one field: its type from the spec, else from the expression's words; numbers distinct."""
    low = expr.lower()
    c = _crc(expr)
    kind = spec[-1:] if spec else ""
    if kind in "dxXnbo" and kind:
        return 1000 + c % 8000
    if kind in "fFeEgG%" and kind:
        return round(0.05 + (c % 90) / 100, 2) if re.search(r"ratio|fraction|frac|usage|util", low) \
            else round(1.25 + (c % 6000) / 100, 2)
    if "server_args" in low:
        head, _, attr = expr.partition(".")
        # `server_args.max_running_requests` prints the value, `server_args` the whole ServerArgs(...)
        return plausible(attr, conv, spec) if head.endswith("server_args") and attr else _SERVER_ARGS
    if conv == "r" or "{" in spec:
        return "x"
    if expr in ("e", "exc", "err", "error", "ex"):
        return "CUDA out of memory. Tried to allocate 2.00 GiB"  # what a capture or allocation failure carries
    if low.rsplit(".", 1)[-1] in ("rid", "req_id", "request_id"):
        return "a3f29c0d1e"  # a request id is hex text, not a number a reader keeps
    if expr.isupper():
        return "(details)"  # a constant the extraction could not inline
    for word, text in _TEXTS:
        if word in low:
            return text
    if _FLOATY.search(low):
        return round(0.05 + (c % 90) / 100, 2) if re.search(r"ratio|fraction|frac|usage|util", low) \
            else round(1.25 + (c % 6000) / 100, 2)
    if _INTY.search(low):
        return 1000 + c % 8000
    return "auto"


def fields_of(fmt: str) -> list[tuple[str, str | None, str]]:
    """(expression, conversion, spec) of every field of a format string."""
    out = []
    for _, name, spec, conv in _FORMATTER.parse(fmt):
        if name is not None:
            out.append((name, conv, spec or ""))
    return out


def render(fmt: str) -> tuple[str, list[float]]:
    """The message with plausible values, and the numbers it carries (those a reader must keep)."""
    parts: list[str] = []
    numbers: list[float] = []
    for literal, name, spec, conv in _FORMATTER.parse(fmt):
        parts.append(literal)
        if name is None:
            continue
        value = plausible(name, conv, spec or "")
        try:
            text = format(repr(value) if conv == "r" else value, spec or "")
        except (ValueError, TypeError):
            text = str(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            with contextlib.suppress(ValueError):  # hex, binary: not a number a reader keeps
                numbers.append(float(text.rstrip("%")) / (100 if text.endswith("%") else 1))
        parts.append(text)
    return "".join(parts), numbers


def _values(x: Any) -> list[float]:
    if isinstance(x, bool):
        return []
    if isinstance(x, (int, float)):
        return [float(x)]
    if isinstance(x, dict):
        return [v for item in x.values() for v in _values(item)]
    if isinstance(x, (list, tuple)):
        return [v for item in x for v in _values(item)]
    return []


@dataclass
class Reading:
    """What the reader made of one rendered message."""

    kinds: list[str] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)
    missing_numbers: list[float] = field(default_factory=list)
    unparsed: int = 0

    @property
    def read(self) -> bool:
        """Read as what it is (not only as a generic error), every number kept."""
        return bool(set(self.kinds) - GENERIC_KINDS) and not self.missing_numbers

    @property
    def kind(self) -> str | None:
        specific = [k for k in self.kinds if k not in GENERIC_KINDS]
        return specific[0] if specific else (self.kinds[0] if self.kinds else None)


# How a raised message reaches the log: the scheduler's traceback, ending with `Type: message`.
TRACEBACK = ("Scheduler hit an exception: Traceback (most recent call last):\n"
             '  File "/sglang/srt/managers/scheduler.py", line 1100, in event_loop_overlap\n    self.run_batch(batch)\n')


def read_message(message: str, *, prefix: str = PREFIX, exception: str | None = None) -> Reading:
    """Run the project's reader over one rendered message (its first line prefixed; a raised message as
    the `Type: message` lines that end the scheduler's traceback)."""
    text = f"{TRACEBACK}{exception}: {message}" if exception else message
    lines = text.split("\n")
    lines[0] = prefix + lines[0]
    events, stats = scan_text("\n".join(lines) + "\n")
    out = Reading(unparsed=stats.unparsed)
    for e in events:
        out.kinds.append(e.kind)
        for k, v in e.fields.items():
            out.fields.setdefault(k, v)
    return out


def check(fmt: str, *, prefix: str = PREFIX, exception: str | None = None) -> Reading:
    """Render a format string and read it: the reading, with the rendered numbers no event field holds."""
    message, numbers = render(fmt)
    r = read_message(message, prefix=prefix, exception=exception)
    held = _values(r.fields)
    r.missing_numbers = [n for n in numbers if not any(math.isclose(n, h, rel_tol=1e-6, abs_tol=1e-9)
                                                        for h in held)]
    return r
