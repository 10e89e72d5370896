"""The checks table (checks.yaml): the tuning guide as validated, typed data.

Every consumer (advisor, alert renderer, runbook, dashboards, fleet report) reads the table
through `load_table`; the schema is documented at the top of checks.yaml and in docs/checks.md.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from sglang_tuning_exporter.core.catalog import SIGNAL_UNITS
from sglang_tuning_exporter.core.problems import ProblemsError
from sglang_tuning_exporter.core.versions import (  # re-exported: the table's users
    version_tuple,
)
from sglang_tuning_exporter.guide import tablecache

SCHEMA_VERSION = 1
COMPARISONS = (">", ">=", "<", "<=", "==")
LEVELS = ("warning", "critical")
ACTIONS = ("increase", "decrease", "set", "client")
SEVERITIES = ("warning", "critical")
SUGGEST_METHODS = ("none", "constant", "toward_target", "mem_fraction_headroom", "mem_fraction_for_weights",
                   "chunked_prefill_halve", "scale_down_running", "cuda_graph_cover", "cuda_graph_ceiling",
                   "running_to_kv_target", "cuda_graph_ceiling_down", "chunked_prefill_double",
                   "mamba_cache_for_wanted", "kv_pool_for_cap", "swa_ratio_balance", "context_to_pool")
RUNBOOK_PARTS = ("meaning", "impact", "confirm", "mitigation")
_ID = re.compile(r"^[a-z][a-z0-9_]*$")
_ALERT = re.compile(r"^SGLang[A-Z][A-Za-z0-9]*$")
_VERSION = re.compile(r"^\d+(\.\d+){0,2}$")


class TableError(ProblemsError):
    """The checks table is invalid; `problems` lists every problem found."""

    what = "checks table"


@dataclass(frozen=True, slots=True)
class GuideQuote:
    """A sentence of the guide, and which guide files say it."""

    versions: tuple[str, ...]
    text: str


@dataclass(frozen=True, slots=True)
class Guard:
    """An extra condition that must hold for a check to fire."""

    signal: str
    comparison: str
    value: float


@dataclass(frozen=True, slots=True)
class VersionFlag:
    """The flag name a range of SGLang releases accepts (since inclusive, until exclusive)."""

    flag: str
    since: str | None = None
    until: str | None = None


@dataclass(frozen=True, slots=True)
class Suggest:
    """How the suggested value is computed: a suggest.py method, its params, the guide's fallback."""

    method: str
    params: dict[str, Any] = field(default_factory=dict)
    guide_value: Any = None


@dataclass(frozen=True, slots=True)
class PlanStep:
    """Where a check's change goes in the plan, and what to watch after it."""

    stage: str
    watch: str
    watch_for: str


# The default order when a table names none (crash first, client last).
PLAN_STAGES = ("crash", "memory", "scheduling", "graphs", "observability", "client")


@dataclass(frozen=True, slots=True)
class Profile:
    """A guide version's thresholds (resolved: inherited values filled in)."""

    name: str
    guide_files: tuple[str, ...]
    description: str
    inherits: str | None
    default: bool
    queue_band: tuple[float, float]


@dataclass(frozen=True, slots=True)
class Check:
    """One actionable guide rule (see checks.yaml for the meaning of each field)."""

    id: str
    alert: str
    title: str
    guide: tuple[GuideQuote, ...]
    signal: str
    comparison: str
    thresholds: dict[str, dict[str, float]]  # profile -> level -> value (every profile filled in)
    guard: tuple[Guard, ...]
    window_s: float
    for_s: float
    min_samples: int
    workloads: tuple[str, ...]
    workload_overrides: dict[str, dict[str, Any]]
    severity: str
    flag: str | None
    flags_by_version: tuple[VersionFlag, ...]
    action: str
    client_action: str
    suggest: Suggest
    suppressed_by: tuple[str, ...]
    summary: str
    description: str
    tradeoff: str
    runbook: dict[str, str]
    promql: dict[str, str | None]
    plan: PlanStep = PlanStep("scheduling", "", "")
    # {signal: text}: a sentence added to the evidence whenever the signal is known and non-zero (other
    # evidence of the same problem, e.g. SGLang's own CUDA-graph warning); `{value}` is the signal's value.
    evidence_notes: tuple[tuple[str, str], ...] = ()
    # {signal: text}: while the signal (a feature SGLang switched off, core/features) is non-zero the check
    # is not judged: its remedy needs that feature. The text says why the flag cannot help ({flag}).
    moot_when: tuple[tuple[str, str], ...] = ()
    # Checks this check's remedy can make worse (its trade-off as data): a change's verdict watches them.
    hurts: tuple[str, ...] = ()
    # The shortest span of data (seconds) over which the absence of the event the check counts is a
    # verdict: over less, `ok` is `unknown` (a firing verdict stands; docs/checks.md, "min_span_s").
    min_span_s: float = 0.0

    def thresholds_for(self, profile: str, workload: str | None = None) -> dict[str, float]:
        """Level -> threshold for a profile, with the workload's override applied."""
        out = dict(self.thresholds[profile])
        if workload is not None:
            out.update(self.workload_overrides.get(workload, {}).get("thresholds", {}))
        return out

    def suggest_params(self, workload: str | None = None) -> dict[str, Any]:
        """The suggest method's params, with the workload's override applied."""
        params = dict(self.suggest.params)
        if workload is not None:
            params.update(self.workload_overrides.get(workload, {}).get("suggest", {}))
        return params

    def severity_for(self, workload: str | None = None) -> str:
        """The highest level the check reaches under a workload."""
        if workload is not None:
            return str(self.workload_overrides.get(workload, {}).get("severity", self.severity))
        return self.severity

    def guide_text(self, flag: str | None = None) -> str:
        """The guide's reason in one line: the first quote that names `flag` (so the quote and the change
        never name different flags), else the first naming none of its other spellings, else the first."""
        if not self.guide:
            return ""
        if flag:
            names = {vf.flag for vf in self.flags_by_version} | ({self.flag} if self.flag else set())

            def names_flag(text: str, f: str) -> bool:
                return re.search(re.escape(f) + r"(?![\w-])", text) is not None

            for q in self.guide:
                if names_flag(q.text, flag):
                    return q.text
            for q in self.guide:
                if not any(names_flag(q.text, f) for f in names - {flag}):
                    return q.text
        return self.guide[0].text


@dataclass(frozen=True, slots=True)
class NonCheck:
    """An actionable guide sentence deliberately not checked, and why."""

    id: str
    guide: tuple[GuideQuote, ...]
    why: str


@dataclass(frozen=True, slots=True)
class CheckTable:
    """The whole validated table."""

    checks: list[Check]
    profiles: dict[str, Profile]
    non_checks: list[NonCheck]
    workloads: tuple[str, ...]
    defaults: dict[str, float]
    plan_stages: tuple[str, ...] = PLAN_STAGES

    def default_profile(self) -> str:
        """The profile used when none is chosen (the newest guide)."""
        for p in self.profiles.values():
            if p.default:
                return p.name
        return next(iter(self.profiles))

    def by_id(self) -> dict[str, Check]:
        """Checks keyed by id."""
        return {c.id: c for c in self.checks}

    def for_workload(self, workload: str) -> list[Check]:
        """The checks that apply to a workload, in table order."""
        return [c for c in self.checks if workload in c.workloads]


def flag_for_version(check: Check, version: str | None) -> str | None:
    """The flag name the SGLang `version` accepts (the guide's name when the version is unknown)."""
    if version is None or not check.flags_by_version:
        return check.flag
    v = version_tuple(version)
    for vf in check.flags_by_version:
        if vf.since is not None and v < version_tuple(vf.since):
            continue
        if vf.until is not None and v >= version_tuple(vf.until):
            continue
        return vf.flag
    return check.flag


def flag_choices(check: Check, version: str | None) -> tuple[str, ...]:
    """Every spelling of the check's flag the server may accept, oldest first: one for a known release;
    for a floor from the line formats (`>=0.4.7`) or no version at all, each spelling of a release at or
    above it (the excerpt's lines do not tell which side of a rename the server is)."""
    if not check.flags_by_version or check.flag is None:
        return (check.flag,) if check.flag else ()
    if version is not None and not version.startswith(">="):
        flag = flag_for_version(check, version)
        return (flag,) if flag else ()
    floor = version_tuple(version) if version else (0, 0, 0)
    out = [vf.flag for vf in check.flags_by_version if vf.until is None or version_tuple(vf.until) > floor]
    return tuple(dict.fromkeys(out)) or (check.flag,)


def spelling_note(check: Check, flags: tuple[str, ...]) -> str:
    """`--cuda-graph-max-bs-decode (--cuda-graph-max-bs before 0.5.14)`: the newest spelling, the others
    with the release that renamed them; the flag alone when it has one spelling."""
    if len(flags) < 2:
        return flags[0] if flags else ""
    newest, older = flags[-1], flags[:-1]
    since = {vf.flag: vf.until for vf in check.flags_by_version}
    return newest + " (" + ", ".join(f"{f} before {since.get(f) or '?'}" for f in older) + ")"


def default_path() -> Path:
    """The checks.yaml shipped inside the package."""
    return Path(str(resources.files("sglang_tuning_exporter.guide").joinpath("checks.yaml")))


def load_table(path: str | Path | None = None) -> CheckTable:
    """Load and validate a checks table (default: the packaged checks.yaml); raises TableError."""
    p = Path(path) if path is not None else default_path()
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise TableError([f"{p}: cannot read: {exc.strerror or exc}"]) from None
    # The packaged table is ours and read at every start: its build-time JSON copy when it is of this
    # text (tablecache), else libyaml's loader; any other file is a file we are handed, read with the
    # depth bound. YAML is imported only when it is parsed.
    raw = tablecache.cached_document(text, p.with_name(tablecache.CACHE_NAME)) if path is None else None
    if raw is None:
        import yaml

        from sglang_tuning_exporter.core import yamltext

        try:
            raw = tablecache.yaml_document(text) if path is None else yamltext.load(text)
        except yaml.YAMLError as exc:
            raise TableError([f"{p}: not valid YAML: {exc}"]) from None
    return parse_table(raw)


def is_number(v: Any) -> bool:
    """A finite number, not a bool (YAML's .inf and .nan are numbers no threshold or setting can take)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _quotes(raw: Any, where: str, problems: list[str]) -> tuple[GuideQuote, ...]:
    if not isinstance(raw, list) or not raw:
        problems.append(f"{where}: guide must be a non-empty list of {{versions, text}}")
        return ()
    out: list[GuideQuote] = []
    for i, q in enumerate(raw):
        if not isinstance(q, dict) or not isinstance(q.get("text"), str) or not q.get("text"):
            problems.append(f"{where}.guide[{i}]: needs a non-empty text")
            continue
        versions = q.get("versions")
        if not isinstance(versions, list) or not versions or not all(isinstance(v, str) for v in versions):
            problems.append(f"{where}.guide[{i}]: versions must be a non-empty list of guide file numbers")
            versions = []
        out.append(GuideQuote(tuple(versions), q["text"]))
    return tuple(out)


def _profiles(raw: Any, problems: list[str]) -> dict[str, Profile]:
    if not isinstance(raw, dict) or not raw:
        problems.append("profiles: must be a non-empty mapping")
        return {}
    resolved: dict[str, Profile] = {}

    def resolve(name: str, seen: tuple[str, ...]) -> Profile | None:
        if name in resolved:
            return resolved[name]
        spec = raw.get(name)
        if not isinstance(spec, dict):
            problems.append(f"profiles.{name}: must be a mapping")
            return None
        unknown = set(spec) - {"guide_files", "description", "inherits", "default", "queue_band"}
        if unknown:
            problems.append(f"profiles.{name}: unknown keys {sorted(unknown)}")
        parent: Profile | None = None
        inherits = spec.get("inherits")
        if inherits is not None:
            if inherits not in raw:
                problems.append(f"profiles.{name}: inherits unknown profile {inherits!r}")
            elif inherits in seen:
                problems.append(f"profiles.{name}: inheritance cycle {' -> '.join((*seen, inherits))}")
            else:
                parent = resolve(inherits, (*seen, inherits))
        band = spec.get("queue_band", parent.queue_band if parent else None)
        if not (isinstance(band, (list, tuple)) and len(band) == 2 and all(is_number(b) for b in band)
                and band[0] < band[1]):
            problems.append(f"profiles.{name}: queue_band must be [low, high] with low < high")
            band = (0.0, 0.0)
        prof = Profile(name=name, guide_files=tuple(str(g) for g in spec.get("guide_files", [])),
                       description=str(spec.get("description", "")), inherits=inherits,
                       default=bool(spec.get("default", False)),
                       queue_band=(float(band[0]), float(band[1])))
        resolved[name] = prof
        return prof

    for name in raw:
        resolve(str(name), (str(name),))
    if sum(1 for p in resolved.values() if p.default) != 1:
        problems.append("profiles: exactly one profile must have default: true")
    return resolved


_CHECK_KEYS = {"id", "alert", "title", "guide", "signal", "comparison", "thresholds", "profile_thresholds",
               "guard", "window_s", "for_s", "min_samples", "min_span_s", "workloads", "workload_overrides", "severity",
               "flag", "flags_by_version", "action", "client_action", "suggest", "suppressed_by", "summary",
               "evidence_notes", "moot_when",
               "description", "tradeoff", "runbook", "promql", "plan", "hurts"}


def parse_levels(raw: Any, where: str, problems: list[str]) -> dict[str, float]:
    """`{warning: x, critical: y}` -> floats; every problem appended to `problems` (shared with config.py)."""
    if not isinstance(raw, dict) or not raw:
        problems.append(f"{where}: must map warning/critical to numbers")
        return {}
    out: dict[str, float] = {}
    for level, v in raw.items():
        if level not in LEVELS:
            problems.append(f"{where}: unknown level {level!r} (warning|critical)")
        elif not is_number(v):
            problems.append(f"{where}.{level}: must be a finite number, got {v!r}")
        else:
            out[level] = float(v)
    return out


def _plan_step(raw: Any, where: str, stages: tuple[str, ...], problems: list[str]) -> PlanStep:
    if raw is None:  # optional: such a check's change goes with the scheduler's
        return PlanStep("scheduling", "", "")
    if not isinstance(raw, dict) or raw.get("stage") not in stages or set(raw) - {"stage", "watch", "watch_for"} \
            or not all(isinstance(raw.get(k), str) and raw.get(k) for k in ("watch", "watch_for")):
        problems.append(f"{where}.plan: needs stage (one of {list(stages)}), watch and watch_for")
        return PlanStep("scheduling", "", "")
    return PlanStep(str(raw["stage"]), str(raw["watch"]), str(raw["watch_for"]))


def _check(raw: Any, i: int, profiles: dict[str, Profile], workloads: tuple[str, ...],
           defaults: dict[str, float], problems: list[str],
           stages: tuple[str, ...] = PLAN_STAGES) -> Check | None:
    where = f"checks[{i}]"
    if not isinstance(raw, dict):
        problems.append(f"{where}: must be a mapping")
        return None
    cid = raw.get("id")
    if not isinstance(cid, str) or not _ID.match(cid):
        problems.append(f"{where}: id must be snake_case, got {cid!r}")
        cid = f"<{i}>"
    where = f"checks.{cid}"
    unknown = set(raw) - _CHECK_KEYS
    if unknown:
        problems.append(f"{where}: unknown keys {sorted(unknown)}")
    alert = raw.get("alert")
    if not isinstance(alert, str) or not _ALERT.match(alert):
        problems.append(f"{where}: alert must be CamelCase with the SGLang prefix, got {alert!r}")
    for key in ("title", "signal", "summary", "description", "tradeoff"):
        if not isinstance(raw.get(key), str) or not raw.get(key):
            problems.append(f"{where}: {key} must be a non-empty string")
    comparison = raw.get("comparison")
    if comparison not in COMPARISONS:
        problems.append(f"{where}: comparison must be one of {COMPARISONS}, got {comparison!r}")
    base = parse_levels(raw.get("thresholds"), f"{where}.thresholds", problems)
    if "warning" in base and "critical" in base and comparison in COMPARISONS:
        w, c = base["warning"], base["critical"]
        if (comparison in (">", ">=") and c < w) or (comparison in ("<", "<=") and c > w):
            problems.append(f"{where}.thresholds: critical must be more extreme than warning")
    per_profile_raw = raw.get("profile_thresholds") or {}
    if not isinstance(per_profile_raw, dict):
        problems.append(f"{where}.profile_thresholds: must be a mapping")
        per_profile_raw = {}
    for pname in per_profile_raw:
        if pname not in profiles:
            problems.append(f"{where}.profile_thresholds: unknown profile {pname!r}")
    thresholds: dict[str, dict[str, float]] = {}

    def prof_levels(pname: str) -> dict[str, float]:
        if pname in thresholds:
            return thresholds[pname]
        prof = profiles[pname]
        inherited = prof_levels(prof.inherits) if prof.inherits in profiles and prof.inherits != pname else base
        own = per_profile_raw.get(pname)
        levels = dict(inherited)
        if own is not None:
            levels.update(parse_levels(own, f"{where}.profile_thresholds.{pname}", problems))
        thresholds[pname] = levels
        return levels

    for pname in profiles:
        prof_levels(pname)
    guards: list[Guard] = []
    for j, g in enumerate(raw.get("guard") or []):
        if (not isinstance(g, dict) or not isinstance(g.get("signal"), str)
                or g.get("comparison") not in COMPARISONS or not is_number(g.get("value"))):
            problems.append(f"{where}.guard[{j}]: needs signal, comparison and a numeric value")
            continue
        guards.append(Guard(g["signal"], g["comparison"], float(g["value"])))
    nums: dict[str, float] = {}
    for key in ("window_s", "for_s", "min_samples", "min_span_s"):
        v = raw.get(key, defaults.get(key, 0.0 if key == "min_span_s" else None))
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            problems.append(f"{where}: {key} must be a number >= 0, got {v!r}")
            v = 0
        nums[key] = float(v)
    wl = raw.get("workloads")
    if not isinstance(wl, list) or not wl or any(w not in workloads for w in wl):
        problems.append(f"{where}: workloads must be a non-empty list from {list(workloads)}, got {wl!r}")
        wl = []
    overrides = raw.get("workload_overrides") or {}
    if not isinstance(overrides, dict):
        problems.append(f"{where}.workload_overrides: must be a mapping")
        overrides = {}
    for wname, ov in overrides.items():
        if wname not in workloads:
            problems.append(f"{where}.workload_overrides: unknown workload {wname!r}")
        if not isinstance(ov, dict) or set(ov) - {"thresholds", "suggest", "severity"}:
            problems.append(f"{where}.workload_overrides.{wname}: only thresholds, suggest, severity allowed")
        elif "thresholds" in ov:
            ov["thresholds"] = parse_levels(ov["thresholds"], f"{where}.workload_overrides.{wname}.thresholds",
                                       problems)
    severity = raw.get("severity")
    if severity not in SEVERITIES:
        problems.append(f"{where}: severity must be one of {SEVERITIES}, got {severity!r}")
    flag = raw.get("flag")
    action = raw.get("action")
    if action not in ACTIONS:
        problems.append(f"{where}: action must be one of {ACTIONS}, got {action!r}")
    if flag is None and action != "client":
        problems.append(f"{where}: a check without a flag must have action client")
    if flag is not None and (not isinstance(flag, str) or not flag.startswith("--")):
        problems.append(f"{where}: flag must start with --, got {flag!r}")
    if action == "client" and not raw.get("client_action"):
        problems.append(f"{where}: action client needs client_action")
    vflags: list[VersionFlag] = []
    for j, vf in enumerate(raw.get("flags_by_version") or []):
        ok = isinstance(vf, dict) and isinstance(vf.get("flag"), str) and vf["flag"].startswith("--")
        for key in ("since", "until"):
            if ok and vf.get(key) is not None and not _VERSION.match(str(vf[key])):
                ok = False
        if not ok:
            problems.append(f"{where}.flags_by_version[{j}]: needs flag (--name) and optional since/until X.Y.Z")
            continue
        vflags.append(VersionFlag(vf["flag"], None if vf.get("since") is None else str(vf["since"]),
                                  None if vf.get("until") is None else str(vf["until"])))
    sraw = raw.get("suggest")
    if not isinstance(sraw, dict) or sraw.get("method") not in SUGGEST_METHODS:
        problems.append(f"{where}: suggest.method must be one of {SUGGEST_METHODS}")
        sraw = {"method": "none"}
    params = sraw.get("params") or {}
    if not isinstance(params, dict):
        problems.append(f"{where}.suggest.params: must be a mapping")
        params = {}
    runbook = raw.get("runbook")
    if not isinstance(runbook, dict) or any(not isinstance(runbook.get(k), str) or not runbook.get(k)
                                            for k in RUNBOOK_PARTS):
        problems.append(f"{where}: runbook needs non-empty {', '.join(RUNBOOK_PARTS)}")
        runbook = {}
    promql = raw.get("promql")
    if not isinstance(promql, dict) or not isinstance(promql.get("exporter"), str):
        problems.append(f"{where}: promql needs an exporter expression (and sglang: expr or null)")
        promql = {"exporter": "", "sglang": None}
    return Check(
        id=cid, alert=str(alert), title=str(raw.get("title", "")),
        guide=_quotes(raw.get("guide"), where, problems), signal=str(raw.get("signal", "")),
        comparison=str(comparison), thresholds=thresholds, guard=tuple(guards),
        window_s=nums["window_s"], for_s=nums["for_s"], min_samples=int(nums["min_samples"]),
        min_span_s=nums["min_span_s"], workloads=tuple(wl), workload_overrides=dict(overrides), severity=str(severity),
        flag=flag if isinstance(flag, str) else None, flags_by_version=tuple(vflags),
        action=str(action), client_action=str(raw.get("client_action") or ""),
        suggest=Suggest(str(sraw["method"]), dict(params), sraw.get("guide_value")),
        suppressed_by=tuple(raw.get("suppressed_by") or ()), summary=str(raw.get("summary", "")),
        description=str(raw.get("description", "")), tradeoff=str(raw.get("tradeoff", "")),
        runbook={k: str(v) for k, v in runbook.items()},
        promql={"exporter": promql.get("exporter"), "sglang": promql.get("sglang")},
        plan=_plan_step(raw.get("plan"), where, stages, problems),
        evidence_notes=_notes(raw.get("evidence_notes"), f"{where}.evidence_notes", problems),
        moot_when=_notes(raw.get("moot_when"), f"{where}.moot_when", problems),
        hurts=tuple(str(x) for x in (raw.get("hurts") or ())))


def _notes(raw: Any, where: str, problems: list[str]) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        problems.append(f"{where}: must map signal names to sentences")
        return ()
    problems.extend(f"{where}.{k}: not a signal (docs/signals.md)" for k in raw if k not in SIGNAL_UNITS)
    return tuple(raw.items())


def parse_table(raw: Any) -> CheckTable:
    """Validate an already-loaded YAML document; raises TableError listing every problem."""
    problems: list[str] = []
    if not isinstance(raw, dict):
        raise TableError(["top level must be a mapping"])
    unknown = set(raw) - {"schema_version", "defaults", "workloads", "profiles", "checks", "non_checks",
                         "plan_stages"}
    if unknown:
        problems.append(f"unknown top-level keys {sorted(unknown)}")
    if raw.get("schema_version") != SCHEMA_VERSION:
        problems.append(f"schema_version must be {SCHEMA_VERSION}, got {raw.get('schema_version')!r}")
    defaults_raw = raw.get("defaults") or {}
    defaults = {k: float(v) for k, v in defaults_raw.items() if is_number(v)} if isinstance(defaults_raw, dict) else {}
    if isinstance(defaults_raw, dict) and len(defaults) != len(defaults_raw):
        problems.append("defaults: every value must be a number")
    workloads_raw = raw.get("workloads")
    if not isinstance(workloads_raw, list) or not workloads_raw:
        problems.append("workloads: must be a non-empty list")
        workloads_raw = []
    workloads = tuple(str(w) for w in workloads_raw)
    profiles = _profiles(raw.get("profiles"), problems)
    stages_raw = raw.get("plan_stages", list(PLAN_STAGES))
    if not isinstance(stages_raw, list) or not stages_raw or len(set(map(str, stages_raw))) != len(stages_raw):
        problems.append("plan_stages: must be a non-empty list of distinct names")
        stages_raw = list(PLAN_STAGES)
    stages = tuple(str(x) for x in stages_raw)
    checks: list[Check] = []
    raw_checks = raw.get("checks")
    if not isinstance(raw_checks, list) or not raw_checks:
        problems.append("checks: must be a non-empty list")
        raw_checks = []
    for i, rc in enumerate(raw_checks):
        c = _check(rc, i, profiles, workloads, defaults, problems, stages)
        if c is not None:
            checks.append(c)
    ids = [c.id for c in checks]
    for cid in {x for x in ids if ids.count(x) > 1}:
        problems.append(f"checks: duplicate id {cid!r}")
    alerts = [c.alert for c in checks]
    for a in {x for x in alerts if alerts.count(x) > 1}:
        problems.append(f"checks: duplicate alert {a!r}")
    for c in checks:
        for s in c.suppressed_by:
            if s not in ids:
                problems.append(f"checks.{c.id}: suppressed_by names unknown check {s!r}")
        for h in c.hurts:
            if h not in ids:
                problems.append(f"checks.{c.id}: hurts names unknown check {h!r}")
    non_checks: list[NonCheck] = []
    for i, nc in enumerate(raw.get("non_checks") or []):
        if not isinstance(nc, dict) or not isinstance(nc.get("id"), str) or not nc.get("why"):
            problems.append(f"non_checks[{i}]: needs id, guide and why")
            continue
        non_checks.append(NonCheck(nc["id"], _quotes(nc.get("guide"), f"non_checks.{nc['id']}", problems),
                                   str(nc["why"])))
    if problems:
        raise TableError(problems)
    return CheckTable(checks=checks, profiles=profiles, non_checks=non_checks, workloads=workloads,
                      defaults=defaults, plan_stages=stages)
