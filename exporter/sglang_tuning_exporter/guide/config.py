"""The `--config` YAML file: overrides of thresholds, windows and options, validated as a whole.

Example::

    guide_profile: older-md        # which guide version's thresholds
    workload: latency
    window_s: 900                  # signal window (default 600)
    max_ranks: 64
    expire_s: 1800                 # drop ranks not seen for this long
    signals: {usage_good: 0.9, capped_fraction: 0.95, min_samples: 3}
    profiles:
      older-md: {queue_band: [50, 400]}
    checks:
      retractions_frequent: {thresholds: {warning: 2, critical: 10}, min_samples: 1}
      queue_empty: {enabled: false}
      ttft_long_prompts: {guard: {prefill_tokens_per_request: 4096}}
    server_args: {mem_fraction_static: 0.85}
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sglang_tuning_exporter.core.problems import ProblemsError
from sglang_tuning_exporter.core.redact import MASK, is_secret_name, redact_args, redact_text, redact_value
from sglang_tuning_exporter.guide.checks import Check, CheckTable, is_number, load_table, parse_levels

WORKLOADS = ("throughput", "latency", "long-context", "multi-turn")
_TOP = {"guide_profile", "workload", "window_s", "max_ranks", "expire_s", "signals", "profiles", "checks",
        "server_args", "slo"}
# SLO targets (`slo:`): a latency a request must beat, at one of SGLang's bucket bounds (the burn-rate rules
# count the requests slower than that bucket), and the objective, the share of requests that must.
SLO_BUCKETS = {"ttft_p95_seconds": (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0),
               "itl_p95_seconds": (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06,
                                   0.08, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0)}
DEFAULT_OBJECTIVE = 0.99  # `slo.objective` when unset (the config, the SLO rules and the chart's default)
_SIGNAL_KEYS = {"usage_good", "capped_fraction", "min_samples"}
_CHECK_KEYS = {"enabled", "thresholds", "min_samples", "window_s", "for_s", "guard"}


class ConfigError(ProblemsError):
    """The configuration is invalid; `problems` lists every problem found."""

    what = "configuration"


@dataclass(frozen=True, slots=True)
class CheckOverride:
    """Per-check overrides from the config file."""

    enabled: bool = True
    thresholds: dict[str, float] = field(default_factory=dict)
    min_samples: int | None = None
    window_s: float | None = None
    for_s: float | None = None
    guard: dict[str, float] = field(default_factory=dict)  # guard signal -> the value it must meet

    def on(self, check: Check) -> Check:
        """The check with this override's guard values (the advisor and the rules judge the same guard)."""
        if not self.guard:
            return check
        return replace(check, guard=tuple(replace(g, value=self.guard.get(g.signal, g.value)) for g in check.guard))


@dataclass(frozen=True, slots=True)
class Config:
    """Validated configuration (defaults when no file is given)."""

    guide_profile: str | None = None
    workload: str | None = None
    window_s: float = 600.0
    max_ranks: int = 256
    expire_s: float | None = None
    usage_good: float = 0.9
    capped_fraction: float = 0.95
    min_samples: int = 3
    queue_bands: dict[str, tuple[float, float]] = field(default_factory=dict)
    checks: dict[str, CheckOverride] = field(default_factory=dict)
    server_args: dict[str, Any] = field(default_factory=dict)
    slo: dict[str, float] = field(default_factory=dict)  # SLO_BUCKETS targets and `objective`

    def override(self, check_id: str) -> CheckOverride:
        """The overrides for one check (empty when none)."""
        return self.checks.get(check_id, CheckOverride())


def _positive(raw: dict[str, Any], key: str, where: str, problems: list[str], *, integer: bool = False,
              allow_zero: bool = False) -> float | None:
    if key not in raw:
        return None
    v = raw[key]
    ok = is_number(v) and (v >= 0 if allow_zero else v > 0) and (not integer or float(v).is_integer())
    if not ok:
        kind = "an integer" if integer else "a finite number"
        problems.append(f"{where}{key}: must be {kind} {'>= 0' if allow_zero else '> 0'}, got {v!r}")
        return None
    return float(v)


def parse_config(raw: Any, table: CheckTable, source: str = "config") -> Config:
    """Validate a loaded YAML document against the checks table; raises ConfigError with every problem."""
    if raw is None:
        return Config()
    if not isinstance(raw, dict):
        raise ConfigError([f"{source}: top level must be a mapping, got {type(raw).__name__}"])
    problems: list[str] = []
    for key in sorted(set(raw) - _TOP, key=str):
        problems.append(f"{source}: unknown key {key!r} (allowed: {', '.join(sorted(_TOP))})")
    profile = raw.get("guide_profile")
    if profile is not None and profile not in table.profiles:
        problems.append(f"guide_profile: unknown profile {profile!r} (known: {', '.join(table.profiles)})")
    workload = raw.get("workload")
    if workload is not None and workload not in WORKLOADS:
        problems.append(f"workload: must be one of {', '.join(WORKLOADS)}, got {workload!r}")
    window_s = _positive(raw, "window_s", "", problems)
    max_ranks = _positive(raw, "max_ranks", "", problems, integer=True)
    expire_s = _positive(raw, "expire_s", "", problems)
    sig = raw.get("signals") or {}
    usage_good = capped = min_samples = None
    if not isinstance(sig, dict):
        problems.append("signals: must be a mapping")
    else:
        for key in sorted(set(sig) - _SIGNAL_KEYS, key=str):
            problems.append(f"signals: unknown key {key!r} (allowed: {', '.join(sorted(_SIGNAL_KEYS))})")
        usage_good = _positive(sig, "usage_good", "signals.", problems)
        capped = _positive(sig, "capped_fraction", "signals.", problems)
        min_samples = _positive(sig, "min_samples", "signals.", problems, integer=True)
        for key, v in (("usage_good", usage_good), ("capped_fraction", capped)):
            if v is not None and v > 1:
                problems.append(f"signals.{key}: must be a ratio 0-1, got {v}")
    bands: dict[str, tuple[float, float]] = {}
    profs = raw.get("profiles") or {}
    if not isinstance(profs, dict):
        problems.append("profiles: must be a mapping of profile name to {queue_band: [low, high]}")
        profs = {}
    for name, spec in profs.items():
        if name not in table.profiles:
            problems.append(f"profiles: unknown profile {name!r} (known: {', '.join(table.profiles)})")
            continue
        if not isinstance(spec, dict) or set(spec) - {"queue_band"}:
            problems.append(f"profiles.{name}: only queue_band may be overridden")
            continue
        band = spec.get("queue_band")
        if not (isinstance(band, list) and len(band) == 2 and all(is_number(b) for b in band) and band[0] < band[1]):
            problems.append(f"profiles.{name}.queue_band: must be [low, high] with low < high, got {band!r}")
            continue
        bands[name] = (float(band[0]), float(band[1]))
    overrides: dict[str, CheckOverride] = {}
    chk = raw.get("checks") or {}
    if not isinstance(chk, dict):
        problems.append("checks: must be a mapping of check id to overrides")
        chk = {}
    known = table.by_id()
    for cid, spec in chk.items():
        where = f"checks.{cid}."
        if cid not in known:
            problems.append(f"checks: unknown check {cid!r}")
            continue
        if not isinstance(spec, dict):
            problems.append(f"checks.{cid}: must be a mapping")
            continue
        for key in sorted(set(spec) - _CHECK_KEYS, key=str):
            problems.append(f"{where}{key}: unknown key (allowed: {', '.join(sorted(_CHECK_KEYS))})")
        enabled = spec.get("enabled", True)
        if not isinstance(enabled, bool):
            problems.append(f"{where}enabled: must be true or false, got {enabled!r}")
            enabled = True
        th = spec.get("thresholds", {})
        # An empty mapping overrides nothing; anything else is validated like the table's thresholds.
        levels = parse_levels(th, f"{where}thresholds", problems) if th != {} else {}
        ms = _positive(spec, "min_samples", where, problems, integer=True)
        ws = _positive(spec, "window_s", where, problems)
        fs = _positive(spec, "for_s", where, problems, allow_zero=True)
        guard = _guard(spec.get("guard"), known[cid], where, problems)
        overrides[cid] = CheckOverride(enabled=enabled, thresholds=levels,
                                       min_samples=None if ms is None else int(ms), window_s=ws, for_s=fs,
                                       guard=guard)
    server_args = raw.get("server_args") or {}
    if not isinstance(server_args, dict):
        problems.append("server_args: must be a mapping of argument name to value")
        server_args = {}
    for key, value in server_args.items():
        problem = server_arg_problem(str(key), value)
        if problem is not None:
            problems.append(f"server_args.{key}: {problem}")
    slo = _slo(raw.get("slo"), problems)
    if problems:
        raise ConfigError(problems)
    return Config(slo=slo, guide_profile=profile, workload=workload,
                  window_s=window_s if window_s is not None else 600.0,
                  max_ranks=int(max_ranks) if max_ranks is not None else 256, expire_s=expire_s,
                  usage_good=usage_good if usage_good is not None else 0.9,
                  capped_fraction=capped if capped is not None else 0.95,
                  min_samples=int(min_samples) if min_samples is not None else 3,
                  queue_bands=bands, checks=overrides, server_args=redact_args(server_args))


def _guard(raw: Any, check: Check, where: str, problems: list[str]) -> dict[str, float]:
    """`guard: {signal: value}`: new values for the check's own guards (e.g. the latency checks' 64 batch,
    0.5 s queue time, 2048 prompt tokens)."""
    if raw is None:
        return {}
    names = [g.signal for g in check.guard]
    if not isinstance(raw, dict):
        problems.append(f"{where}guard: must be a mapping of guard signal to value ({', '.join(names) or 'none'})")
        return {}
    out: dict[str, float] = {}
    for name, v in raw.items():
        if name not in names:
            problems.append(f"{where}guard.{name}: not a guard of this check (its guards: {', '.join(names) or 'none'})")
        elif not is_number(v):  # finite, not a bool
            problems.append(f"{where}guard.{name}: must be a finite number, got {v!r}")
        else:
            out[str(name)] = float(v)
    return out


def _slo(raw: Any, problems: list[str]) -> dict[str, float]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append("slo: must be a mapping of targets (ttft_p95_seconds, itl_p95_seconds) and objective")
        return {}
    out: dict[str, float] = {}
    for key in sorted(set(raw) - {*SLO_BUCKETS, "objective"}, key=str):
        problems.append(f"slo: unknown key {key!r} (allowed: {', '.join([*SLO_BUCKETS, 'objective'])})")
    for key, bounds in SLO_BUCKETS.items():
        v = _positive(raw, key, "slo.", problems)
        if v is None:
            continue
        if v not in bounds:
            problems.append(f"slo.{key}: must be one of SGLang's bucket bounds "
                            f"({', '.join(f'{b:g}' for b in bounds)}), got {v:g}")
            continue
        out[key] = v
    objective = raw.get("objective", DEFAULT_OBJECTIVE)
    if not is_number(objective) or not 0 < objective < 1:
        problems.append(f"slo.objective: must be a ratio between 0 and 1 (0.99 = 99 % of requests), got {objective!r}")
    elif out:
        out["objective"] = float(objective)
    if not out and not any(k in raw for k in SLO_BUCKETS):
        problems.append("slo: names no target (ttft_p95_seconds or itl_p95_seconds)")
    return out


def load_config(path: str | Path | None, table: CheckTable | None = None) -> Config:
    """Read and validate a config file (None: defaults); raises ConfigError listing every problem."""
    if path is None:
        return Config()
    if table is None:
        table = load_table()
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{p}: cannot read: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError:
        raise ConfigError([f"{p}: not UTF-8 text"]) from None
    import yaml  # imported only when a file is read: a start without --config never loads YAML

    from sglang_tuning_exporter.core import yamltext

    try:
        raw = yamltext.load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"{p}: not valid YAML: {exc}"]) from None
    return parse_config(raw, table, source=str(p))


# The server arguments the advice computes from, with the values SGLang accepts: a value of another kind
# would silently become the "current value" of a suggestion, so it is refused where it is given.
SERVER_ARG_KINDS: dict[str, tuple[str, float | None, float | None]] = {
    # name: (kind, minimum, maximum); kind is "number", "integer", "boolean" or "text"
    "mem_fraction_static": ("number", 0.0, 1.0),
    "schedule_conservativeness": ("number", 0.0, None),
    "chunked_prefill_size": ("integer", -1, None),  # -1 disables chunked prefill
    "max_prefill_tokens": ("integer", 1, None),
    "max_running_requests": ("integer", 1, None),
    "cuda_graph_max_bs": ("integer", 1, None),
    "cuda_graph_max_bs_decode": ("integer", 1, None),
    "schedule_policy": ("text", None, None),
    "enable_metrics": ("boolean", None, None),
}


def server_arg_problem(key: str, value: Any) -> str | None:
    """Why `value` cannot be SGLang's `key` (None when it can, or when the advice does not read `key`)."""
    kind_of = SERVER_ARG_KINDS.get(key)
    if kind_of is None or value is None:
        return None
    kind, low, high = kind_of
    if kind == "boolean":
        return None if isinstance(value, bool) else f"{value!r} is not true or false"
    if kind == "text":
        return None if isinstance(value, str) else f"{value!r} is not text"
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not number or (kind == "integer" and not float(value).is_integer()):
        return f"{value!r} is not {'an integer' if kind == 'integer' else 'a finite number'}"
    if low is not None and high is not None and not low <= value <= high:
        return f"{value!r} is outside {low:g} to {high:g}"
    if low is not None and value < low:
        return f"{value!r} is below the minimum {low:g}"
    return None


def parse_server_arg_overrides(items: list[str]) -> tuple[dict[str, Any], list[str]]:
    """`--server-arg KEY=VALUE` strings -> (args, problems); values parsed as YAML scalars, the
    arguments the advice reads checked against the values SGLang accepts, and a secret's value
    redacted (core/redact) as the server's own."""
    args: dict[str, Any] = {}
    problems: list[str] = []
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if not sep or not key:
            problems.append(f"--server-arg {_shown(item)!r}: expected KEY=VALUE")
            continue
        import yaml  # only when there are overrides to read

        try:
            parsed = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError:
            parsed = value
        args[key] = redact_value(key, parsed)
        problem = server_arg_problem(key, args[key])
        if problem is not None:
            problems.append(f"--server-arg {_shown(item)!r}: {problem}")
    return args, problems


def _shown(item: str) -> str:
    """A `--server-arg` item as an error may quote it: what follows a secret's name is never echoed
    (`api_key sk-...` without its `=` is a malformed item, and still a key)."""
    name = re.split(r"[\s=:]", item.strip(), maxsplit=1)[0]
    if is_secret_name(name.lstrip("-").replace("-", "_")):
        return f"{name} {MASK}" if name != item.strip() else name
    return redact_text(item)
