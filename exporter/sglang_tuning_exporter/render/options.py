"""Render options: what the generated rules depend on besides the checks table (the `render:` keys of a
YAML file or the CLI flags), read and validated with every problem listed at once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sglang_tuning_exporter.core.durations import parse_duration
from sglang_tuning_exporter.core.problems import ProblemsError
from sglang_tuning_exporter.guide.checks import CheckTable

DEFAULT_RUNBOOK_URL = ("https://github.com/sglang-tuning-exporter/sglang-tuning-exporter/blob/main/"
                       "alerts/runbook.md")
# A derived join label: the host part of `instance`. A sidecar runs beside its SGLang (same pod IP or
# host), so its instance and SGLang's share the host and differ only in the port.
HOST_LABEL = "instance_host"
DEFAULT_GRAFANA_URL = "http://localhost:3000"  # the compose stack's Grafana
# One PromQL label matcher (`cluster="prod"`, `namespace=~"llm-.*"`); the selector option is a comma list.
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*")\s*(?:,|$)')
# Labels the renderer sets itself: the job matchers are their own options, `__name__` picks the metric.
_RESERVED_LABELS = frozenset({"job", "__name__", HOST_LABEL})


class OptionsError(ProblemsError):
    """Invalid render options; `problems` lists every problem."""

    what = "render options"


@dataclass(frozen=True, slots=True)
class RenderOptions:
    """What the rules depend on besides the table (YAML `render:` file keys or CLI flags)."""

    exporter_job: str = "sglang-tuning-exporter"  # job label of our scrape; "" = no job matcher
    sglang_job: str = "sglang"  # job label of SGLang's own /metrics scrape; "" = no job matcher
    runbook_url: str = DEFAULT_RUNBOOK_URL  # base URL; each alert links `<base>#<alert name lowercased>`
    profile: str | None = None  # guide profile for thresholds; None = the table's default
    workload: str = "throughput"  # the guide recipe the exporter runs with (same as `serve --workload`)
    override_for_s: float | None = None  # test override: every `for:` (e.g. 15s for end-to-end tests)
    override_window_s: float | None = None  # test override: every PromQL range window
    min_for_s: float = 60.0  # floor on `for:` so one evaluation never pages
    # native alert silenced where the exporter covers these labels; `instance_host` is derived from instance
    dedup_on: tuple[str, ...] = (HOST_LABEL, "model_name", "dp_rank")
    log_stale_s: float = 300.0  # log considered stalled after this long without a line
    native: bool = True  # render the SGLang-native group
    # matchers added to every rule, recording rule, annotation lookup and dashboard query (a mixin's
    # `_config` selector), normalised `name="v",name=~"v"`; "" = none
    selector: str = ""
    grafana_url: str = DEFAULT_GRAFANA_URL  # base URL of Grafana; each alert's dashboard_url starts with it
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys for other renderers (kubernetes, ...)
    # latency SLO from the exporter's config (`slo:`): `<latency>_p95_seconds` targets and `objective`; {} = none
    slo: Mapping[str, float] = field(default_factory=dict)


OPTION_KEYS = {"exporter_job", "sglang_job", "runbook_url", "profile", "workload", "override_for",
               "override_window", "min_for", "dedup_on", "log_stale", "native", "selector", "grafana_url"}


def options_from_mapping(raw: Any, base: RenderOptions | None = None) -> RenderOptions:
    """Render options from a YAML mapping (`render:` section or the whole file); raises OptionsError."""
    opts = base or RenderOptions()
    if raw is None:
        return opts
    if not isinstance(raw, dict):
        raise OptionsError(["render options must be a mapping"])
    problems: list[str] = []
    extra = {k: v for k, v in raw.items() if k not in OPTION_KEYS}
    changes: dict[str, Any] = {"extra": {**opts.extra, **extra}}
    for key in ("exporter_job", "sglang_job", "runbook_url", "workload", "grafana_url"):
        if key in raw:
            if not isinstance(raw[key], str):
                problems.append(f"{key}: must be a string")
            else:
                changes[key] = raw[key]
    if "profile" in raw:
        changes["profile"] = None if raw["profile"] is None else str(raw["profile"])
    for key, attr in (("override_for", "override_for_s"), ("override_window", "override_window_s"),
                      ("min_for", "min_for_s"), ("log_stale", "log_stale_s")):
        if key in raw and raw[key] is not None:
            try:
                value = parse_duration(raw[key])
            except ValueError as exc:
                problems.append(f"{key}: {exc}")
                continue
            if not value.is_integer():  # PromQL ranges and `for:` are written in whole seconds
                problems.append(f"{key}: {raw[key]!r} is not a whole number of seconds")
                continue
            changes[attr] = value
    if "dedup_on" in raw:
        v = raw["dedup_on"]
        if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
            problems.append("dedup_on: must be a list of label names")
        else:
            changes["dedup_on"] = tuple(v)
    if "native" in raw:
        if not isinstance(raw["native"], bool):
            problems.append("native: must be true or false")
        else:
            changes["native"] = raw["native"]
    if "selector" in raw:
        try:
            changes["selector"] = parse_selector(raw["selector"])
        except ValueError as exc:
            problems.append(f"selector: {exc}")
    if problems:
        raise OptionsError(problems)
    return replace(opts, **changes)


def parse_selector(raw: Any) -> str:
    """A selector option (`cluster="prod", namespace=~"llm-.*"`, braces optional) normalised to
    `cluster="prod",namespace=~"llm-.*"`; raises ValueError naming what is wrong."""
    if raw is None:
        return ""
    if not isinstance(raw, str):
        raise ValueError('must be a string of label matchers, e.g. cluster="prod",namespace=~"llm-.*"')
    text = raw.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    matchers: list[str] = []
    pos = 0
    while pos < len(text):
        m = _MATCHER.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"{raw!r} is not a list of label matchers like cluster=\"prod\" "
                             f"(problem at {text[pos:pos + 20]!r})")
        name, op, value = m.groups()
        if "{" in value or "}" in value:  # the rule and dashboard rewriting reads selectors up to the first }
            raise ValueError(f"{name}: braces in a matcher value are not supported ({value})")
        if name in _RESERVED_LABELS:
            raise ValueError(f"{name}: set by the renderer (the exporter_job/sglang_job options), not a selector")
        matchers.append(f"{name}{op}{value}")
        pos = m.end()
    return ",".join(matchers)


def selector_labels(selector: str) -> tuple[str, ...]:
    """The label names of a normalised selector, in order (the groupings that keep them)."""
    return tuple(m.group(1) for m in _MATCHER.finditer(selector))


def validate_options(table: CheckTable, opts: RenderOptions) -> list[str]:
    """Problems with options that depend on the table (profile, workload)."""
    problems = []
    if opts.profile is not None and opts.profile not in table.profiles:
        problems.append(f"profile: unknown guide profile {opts.profile!r} (known: {', '.join(table.profiles)})")
    if opts.workload not in table.workloads:
        problems.append(f"workload: unknown workload {opts.workload!r} (known: {', '.join(table.workloads)})")
    if opts.override_window_s is not None and opts.override_window_s <= 0:
        problems.append("override_window: must be > 0")
    return problems

