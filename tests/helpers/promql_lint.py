"""Metric names used by a PromQL expression, and the set of names that exist (ours, rules, SGLang's).

A small tokenizer, not a full parser: it knows enough PromQL structure (strings, label matchers,
grouping clauses, functions, keywords, Grafana variables) to tell metric names from everything else.
Used by the dashboard and Kubernetes lints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from helpers.lookups import exposed_names
from sglang_tuning_exporter.render import slo

FUNCTIONS = frozenset((
    "abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh",
    "avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh",
    "count_over_time", "day_of_month", "day_of_week", "day_of_year", "days_in_month", "deg", "delta",
    "deriv", "exp", "floor", "histogram_avg", "histogram_count", "histogram_fraction",
    "histogram_quantile", "histogram_stddev", "histogram_stdvar", "histogram_sum", "holt_winters",
    "hour", "idelta", "increase", "irate", "label_join", "label_replace", "last_over_time", "ln",
    "log10", "log2", "mad_over_time", "max_over_time", "min_over_time", "minute", "month", "pi",
    "predict_linear", "present_over_time", "quantile_over_time", "rad", "rate", "resets", "round",
    "scalar", "sgn", "sin", "sinh", "sort", "sort_by_label", "sort_by_label_desc", "sort_desc", "sqrt",
    "stddev_over_time", "stdvar_over_time", "sum_over_time", "tan", "tanh", "time", "timestamp",
    "vector", "year",
))
AGGREGATIONS = frozenset((
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
    "quantile", "limitk", "limit_ratio",
))
KEYWORDS = frozenset((
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
    "offset", "atan2",
))
GROUPING = frozenset(("by", "without", "on", "ignoring", "group_left", "group_right",))

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<var>\$\{[^}]+\}|\$[A-Za-z_][A-Za-z0-9_]*)
  | (?P<number>(?:0x[0-9a-fA-F]+|[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)(?:ms|[smhdwy])?(?:[0-9]+(?:ms|[smhdwy]))*)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=(){}\[\],@])
""", re.VERBOSE)


class PromQLLintError(ValueError):
    """The expression cannot be tokenized or uses an unknown function."""


@dataclass(frozen=True, slots=True)
class Names:
    """What an expression refers to: plain metric names and `__name__` regexes."""

    metrics: frozenset[str]
    name_regexes: frozenset[str]


def tokens(expr: str) -> list[tuple[str, str]]:
    """(kind, text) tokens without whitespace; raises on a character PromQL does not have."""
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m:
            raise PromQLLintError(f"cannot tokenize at {pos}: {expr[pos:pos + 30]!r}")
        kind = m.lastgroup or ""
        if kind != "ws":
            out.append((kind, m.group()))
        pos = m.end()
    return out


def _unquote(s: str) -> str:
    body = s[1:-1]
    return body if s[0] == "`" else re.sub(r"\\(.)", r"\1", body)


def metric_names(expr: str) -> Names:
    """Metric names an expression selects (identifiers before `{`/`[` or standalone, and `__name__`)."""
    toks = tokens(expr)
    metrics: set[str] = set()
    regexes: set[str] = set()
    brace = 0
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1][1] if i + 1 < len(toks) else ""
        if text == "[":
            # Range or subquery: durations and `:` steps, never names.
            while i < len(toks) and toks[i][1] != "]":
                i += 1
        elif text == "{":
            brace += 1
        elif text == "}":
            brace -= 1
        elif brace > 0:
            # Inside a matcher list: `label op "value"`; only __name__ matchers name metrics.
            if kind == "ident" and text == "__name__" and i + 2 < len(toks) and toks[i + 2][0] == "string":
                op, value = toks[i + 1][1], _unquote(toks[i + 2][1])
                if op == "=":
                    metrics.add(value)
                elif op == "=~":
                    regexes.add(value)
                i += 3
                continue
        elif kind == "ident":
            if text in GROUPING and nxt == "(":
                # Label list of a grouping clause: skip to the closing parenthesis.
                j = i + 2
                while j < len(toks) and toks[j][1] != ")":
                    j += 1
                i = j + 1
                continue
            if nxt == "(":
                if text not in FUNCTIONS and text not in AGGREGATIONS:
                    raise PromQLLintError(f"unknown function {text!r} in {expr!r}")
            elif text not in KEYWORDS and text not in AGGREGATIONS:
                metrics.add(text)
        i += 1
    if brace != 0:
        raise PromQLLintError(f"unbalanced braces in {expr!r}")
    return Names(frozenset(metrics), frozenset(regexes))


def matchers(expr: str) -> list[dict[str, tuple[str, str]]]:
    """Every `{...}` matcher list as {label: (operator, value)}, in order."""
    out: list[dict[str, tuple[str, str]]] = []
    toks = tokens(expr)
    for i, (_, text) in enumerate(toks):
        if text != "{":
            continue
        current: dict[str, tuple[str, str]] = {}
        j = i + 1
        while j + 2 < len(toks) and toks[j][1] != "}":
            label, op, value = toks[j][1], toks[j + 1][1], toks[j + 2]
            if value[0] == "string":
                current[label] = (op, _unquote(value[1]))
            j += 4 if j + 3 < len(toks) and toks[j + 3][1] == "," else 3
        out.append(current)
    return out


def range_durations(expr: str) -> list[str]:
    """The contents of every `[...]` range (or subquery) in the expression."""
    toks = tokens(expr)
    out: list[str] = []
    for i, (_, text) in enumerate(toks):
        if text == "[":
            j = i + 1
            inner = []
            while j < len(toks) and toks[j][1] != "]":
                inner.append(toks[j][1])
                j += 1
            out.append("".join(inner))
    return out


# --- the names that exist -------------------------------------------------------------------------

_SUFFIXES = {"Counter": ("_total",), "Histogram": ("_bucket", "_sum", "_count"), "Summary": ("_sum", "_count"),
             "GaugeHistogram": ("_bucket", "_gsum", "_gcount"), "Gauge": ("",)}


def sglang_names(scan_file: Path) -> set[str]:
    """Exposed SGLang sample names from the scan (`name | Type | since`), in both spellings."""
    names: set[str] = set()
    for line in scan_file.read_text(encoding="utf-8").splitlines():
        if not line.startswith("sglang:"):
            continue
        name, kind = (part.strip() for part in line.split("|")[:2])
        for suffix in _SUFFIXES.get(kind, ("",)):
            exposed = name if suffix == "_total" and name.endswith("_total") else name + suffix
            names.update({exposed, exposed.replace(":", "_")})
    return names


def recording_rule_names(alerts_dir: Path) -> set[str]:
    """`record:` names in the committed rule files (when the rules exist)."""
    names: set[str] = set()
    for path in sorted(alerts_dir.glob("*.y*ml")):
        doc = yaml.load(path.read_text(encoding="utf-8"), Loader=yaml.CSafeLoader)  # safe_load, in libyaml
        if not isinstance(doc, dict):
            continue
        for group in doc.get("groups") or []:
            for rule in group.get("rules") or []:
                if "record" in rule:
                    names.add(str(rule["record"]))
    return names


def known_names(scan_file: Path, alerts_dir: Path) -> set[str]:
    """Every metric a dashboard may query: our catalog, our recording rules (the committed ones and those
    an `slo:` renders, named by the renderer itself), SGLang's own."""
    return (exposed_names() | recording_rule_names(alerts_dir) | slo.record_names() | sglang_names(scan_file)
            | {"up"})


def unknown_metrics(expr: str, known: set[str]) -> list[str]:
    """Names (or `__name__` regex alternatives) in `expr` that match no known metric."""
    names = metric_names(expr)
    bad = sorted(n for n in names.metrics if n not in known)
    for regex in sorted(names.name_regexes):
        for alternative in _alternatives(regex):
            pattern = re.compile(alternative)
            if not any(pattern.fullmatch(k) for k in known):
                bad.append(f"__name__=~{alternative!r}")
    return bad


def _alternatives(regex: str) -> list[str]:
    """Split a regex at its top-level `|` (each alternative must match something on its own)."""
    parts, depth, cur = [], 0, ""
    for ch in regex:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "|" and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts
