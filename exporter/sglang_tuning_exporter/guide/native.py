"""SGLang's own metrics as checks.yaml writes them (`promql.sglang`: `sglang:name{...}`): one rewrite to a
spelling a server exposes, one filling of the placeholders and the host part that joins a sidecar's target to
its SGLang's, shared by the native alert rules (render/) and the fleet report's native path (fleet/), so both
judge a check by the same expression and pair the same targets."""

from __future__ import annotations

import re
from collections.abc import Callable

# SGLang's QueueCount gauges carry per-priority series under priority scheduling; the total is priority="".
PRIORITY_TOTAL_METRICS = frozenset({"num_queue_reqs", "num_running_reqs"})
SELECTOR = re.compile(r"(?<![\w:])sglang:([a-z0-9_]+)(\{[^}]*\})?")
# The host part of an `instance` ("gpu-a:30000" -> "gpu-a", "[::1]:9470" -> "[::1]"; anchored, as label_replace
# anchors it): a sidecar runs beside its SGLang (same pod IP or host), so their two targets share it. The native
# rules are silenced by it where the sidecar covers a server; the fleet report merges the two rows by it.
HOST_REGEX = "(.+?)(?::[0-9]+)?"


def add_matcher(braces: str | None, matcher: str) -> str:
    """`{matcher,...}`: a label matcher put first in a selector's braces (made when there are none)."""
    inner = (braces or "{}")[1:-1].strip()
    return "{" + (f"{matcher}," + inner if inner else matcher) + "}"


def respell(expr: str, spelling: str, scope: Callable[[str | None], str | None] = lambda b: b) -> str:
    """Every `sglang:x{...}` selector of `expr` in `spelling` (`sglang:`, `sglang_`, `ray_sglang_`), the
    priority total where the gauge splits by priority, and `scope` applied to its braces (None: none)."""
    def sub(m: re.Match[str]) -> str:
        name, braces = m.group(1), m.group(2)
        if name in PRIORITY_TOTAL_METRICS and "priority" not in (braces or ""):
            braces = add_matcher(braces, 'priority=""')
        return f"{spelling}{name}{scope(braces) or ''}"

    return SELECTOR.sub(sub, expr)


def fill(template: str, *, window: str, band: tuple[str, str], min_samples: str, guard: str | None) -> str:
    """A check's expression with its placeholders given (each value already PromQL text)."""
    out = (template.replace("{window}", window).replace("{band_low}", band[0]).replace("{band_high}", band[1])
           .replace("{min_samples}", min_samples))
    return out.replace("{guard}", guard) if guard is not None else out
