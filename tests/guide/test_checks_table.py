"""The checks table: schema validation, profiles, version-aware flags, guide coverage."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from sglang_tuning_exporter.guide.checks import (
    TableError,
    default_path,
    flag_for_version,
    load_table,
    parse_table,
    version_tuple,
)

REQUIRED_IDS = {"queue_empty", "queue_overloaded", "kv_underused", "retractions_frequent",
                "gpu_mem_headroom_high", "gpu_mem_headroom_low", "prefill_oom", "decode_oom",
                "cuda_graph_uncovered", "running_capped", "schedule_policy_lpm_no_reuse",
                "schedule_policy_fcfs_with_reuse", "latency_batch_too_large", "metrics_disabled",
                "startup_mem_fraction_too_small", "cuda_graph_ceiling_low", "oom_unknown_phase",
                "startup_headroom_oom"}


def _raw() -> dict[str, Any]:
    return dict(yaml.safe_load(default_path().read_text(encoding="utf-8")))


def test_packaged_table_has_every_required_check() -> None:
    """Every check id of interfaces.md (and the incident-driven ones) is in the table."""
    table = load_table()
    assert set(table.by_id()) >= REQUIRED_IDS


def test_alert_names_are_camelcase_with_prefix_and_unique() -> None:
    """Alert names follow the mixin convention."""
    alerts = [c.alert for c in load_table().checks]
    assert len(alerts) == len(set(alerts))
    assert all(a.startswith("SGLang") and "_" not in a for a in alerts)


def test_profiles_carry_the_guide_bands() -> None:
    """Each guide version's queue band; 000 states none and inherits the newest."""
    profiles = load_table().profiles
    assert profiles["upstream-2026"].queue_band == (100, 2000)
    assert profiles["docs-2025"].queue_band == (100, 2000)
    assert profiles["older-web"].queue_band == (50, 1000)
    assert profiles["older-md"].queue_band == (50, 500)
    assert profiles["older-fragment"].queue_band == (100, 2000)
    assert load_table().default_profile() == "upstream-2026"
    assert profiles["upstream-2026"].guide_files == ("005",)


def test_thresholds_resolved_for_every_profile() -> None:
    """Inheritance fills every profile for every check."""
    table = load_table()
    for c in table.checks:
        assert set(c.thresholds) == set(table.profiles), c.id
        assert c.thresholds["older-md"], c.id


def test_workload_override_changes_threshold_and_suggest() -> None:
    """Per-workload variations: fcfs threshold for multi-turn, 1.2 target for latency."""
    by = load_table().by_id()
    assert by["schedule_policy_fcfs_with_reuse"].thresholds_for("docs-2025", "multi-turn") == {"warning": 0.3}
    assert by["retractions_frequent"].suggest_params("latency")["target"] == 1.2
    assert by["retractions_frequent"].suggest_params("throughput")["target"] == 1.3
    assert by["queue_empty"].workloads == ("throughput",)
    assert by["latency_batch_too_large"].workloads == ("latency",)


@pytest.mark.parametrize(("version", "expected"), [
    ("0.4.7", "--cuda-graph-max-bs"), ("0.5.13", "--cuda-graph-max-bs"),
    ("0.5.14", "--cuda-graph-max-bs-decode"), ("0.5.23", "--cuda-graph-max-bs-decode"),
    (None, "--cuda-graph-max-bs")])
def test_cuda_graph_flag_by_version(version: str | None, expected: str) -> None:
    """--cuda-graph-max-bs became --cuda-graph-max-bs-decode in 0.5.14."""
    assert flag_for_version(load_table().by_id()["cuda_graph_uncovered"], version) == expected


def test_prefill_flag_on_v02() -> None:
    """v0.2 servers had --max-prefill-tokens, not --chunked-prefill-size."""
    c = load_table().by_id()["prefill_oom"]
    assert flag_for_version(c, "0.2.13") == "--max-prefill-tokens"
    assert flag_for_version(c, "0.4.6") == "--chunked-prefill-size"


def test_version_tuple_ignores_suffixes() -> None:
    """Release strings with rc/post suffixes compare numerically."""
    assert version_tuple("0.5.14rc1") == (0, 5, 14)
    assert version_tuple("v0.4") == (0, 4, 0)


def test_every_guide_file_is_quoted() -> None:
    """All six guide versions are encoded somewhere (checks or non-checks)."""
    table = load_table()
    seen = {v for c in table.checks for q in c.guide for v in q.versions}
    seen |= {v for n in table.non_checks for q in n.guide for v in q.versions}
    assert seen >= {"000", "001", "002", "003", "004", "005"}
    assert all(n.why for n in table.non_checks)


def test_every_check_has_runbook_and_promql() -> None:
    """The renderer needs runbook parts and an exporter expression for each check."""
    for c in load_table().checks:
        assert set(c.runbook) >= {"meaning", "impact", "confirm", "mitigation"}, c.id
        assert c.promql["exporter"], c.id


def test_invalid_table_lists_every_problem() -> None:
    """Several mistakes are all reported at once."""
    raw = _raw()
    bad = copy.deepcopy(raw)
    bad["checks"][0]["comparison"] = "~"
    bad["checks"][1]["alert"] = "queue_alert"
    bad["checks"][2]["workloads"] = ["batch"]
    bad["checks"][3]["bogus"] = 1
    bad["profiles"]["older-md"]["inherits"] = "nope"
    with pytest.raises(TableError) as err:
        parse_table(bad)
    text = "\n".join(err.value.problems)
    for needle in ("comparison", "alert must be CamelCase", "workloads", "unknown keys ['bogus']",
                   "inherits unknown profile"):
        assert needle in text


def test_notes_name_only_declared_signals() -> None:
    """A misspelt moot_when / evidence_notes signal is a listed table problem, not a query matching nothing."""
    bad = _raw()
    noted = next(c for c in bad["checks"] if c.get("moot_when"))
    noted["moot_when"] = {"no_such_signal": "never"}
    noted["evidence_notes"] = {"queue_p50x": "typo"}
    with pytest.raises(TableError) as err:
        parse_table(bad)
    flagged = [p for p in err.value.problems if "not a signal" in p]
    assert len(flagged) == 2 and any(".moot_when.no_such_signal:" in p for p in flagged) \
        and any(".evidence_notes.queue_p50x:" in p for p in flagged), err.value.problems


def test_duplicate_ids_and_inverted_levels_rejected() -> None:
    """Duplicate ids and a critical level less extreme than warning are errors."""
    bad = _raw()
    bad["checks"].append(copy.deepcopy(bad["checks"][0]))
    bad["checks"][1]["thresholds"] = {"warning": 0.9, "critical": 0.5}
    with pytest.raises(TableError) as err:
        parse_table(bad)
    text = "\n".join(err.value.problems)
    assert "duplicate id" in text and "more extreme" in text


def test_unreadable_table_is_a_clear_error(tmp_path: Path) -> None:
    """A missing or broken file raises TableError, not a traceback from yaml."""
    with pytest.raises(TableError, match="cannot read"):
        load_table(tmp_path / "none.yaml")
    broken = tmp_path / "b.yaml"
    broken.write_text("checks: [\n", encoding="utf-8")
    with pytest.raises(TableError, match="not valid YAML"):
        load_table(broken)
