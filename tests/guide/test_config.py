"""The --config file: validated, every problem listed, unknown keys are errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_tuning_exporter.guide.checks import load_table
from sglang_tuning_exporter.guide.config import (
    Config,
    ConfigError,
    load_config,
    parse_config,
    parse_server_arg_overrides,
)

TABLE = load_table()


def test_no_file_gives_defaults() -> None:
    """Without --config the defaults apply (10 min window)."""
    assert load_config(None, TABLE) == Config()
    assert Config().window_s == 600


def test_full_config_is_read(tmp_path: Path) -> None:
    """Every supported key ends up in the Config."""
    p = tmp_path / "c.yaml"
    p.write_text("""
guide_profile: older-md
workload: latency
window_s: 900
max_ranks: 64
expire_s: 1800
signals: {usage_good: 0.85, capped_fraction: 0.9, min_samples: 5}
profiles:
  older-md: {queue_band: [50, 400]}
checks:
  retractions_frequent: {thresholds: {warning: 2, critical: 10}, min_samples: 1, for_s: 0}
  queue_empty: {enabled: false}
server_args: {mem_fraction_static: 0.85}
""", encoding="utf-8")
    c = load_config(p, TABLE)
    assert (c.guide_profile, c.workload, c.window_s, c.max_ranks, c.expire_s) == ("older-md", "latency", 900, 64, 1800)
    assert (c.usage_good, c.capped_fraction, c.min_samples) == (0.85, 0.9, 5)
    assert c.queue_bands == {"older-md": (50.0, 400.0)}
    assert c.override("retractions_frequent").thresholds == {"warning": 2.0, "critical": 10.0}
    assert c.override("queue_empty").enabled is False
    assert c.override("kv_underused").enabled is True
    assert c.server_args == {"mem_fraction_static": 0.85}


def test_every_problem_is_listed() -> None:
    """Unknown keys, bad values, unknown checks and profiles: all reported at once."""
    raw = {"window": 5, "window_s": -1, "workload": "batch", "guide_profile": "v9",
           "signals": {"usage_good": 2, "bogus": 1},
           "profiles": {"older-md": {"queue_band": [500, 50]}, "nope": {}},
           "checks": {"no_such_check": {}, "queue_empty": {"enabled": "yes", "thresholds": {"severe": 1},
                                                           "min_samples": 0.5, "colour": "red"}},
           "server_args": [1]}
    with pytest.raises(ConfigError) as err:
        parse_config(raw, TABLE)
    text = "\n".join(err.value.problems)
    for needle in ("unknown key 'window'", "window_s", "workload", "unknown profile 'v9'", "signals.usage_good",
                   "'bogus'", "queue_band", "unknown profile 'nope'", "unknown check 'no_such_check'",
                   "enabled", "'severe'", "min_samples", "colour", "server_args"):
        assert needle in text, needle
    assert len(err.value.problems) >= 14


def test_server_args_the_advice_reads_are_checked() -> None:
    """`server_args` in the file obey the same kinds as --server-arg: every wrong value is listed."""
    raw = {"server_args": {"mem_fraction_static": "abc", "max_running_requests": 2.5, "enable_metrics": "yes",
                           "chunked_prefill_size": -1, "some_future_arg": "anything"}}
    with pytest.raises(ConfigError) as err:
        parse_config(raw, TABLE)
    assert err.value.problems == ["server_args.mem_fraction_static: 'abc' is not a finite number",
                                  "server_args.max_running_requests: 2.5 is not an integer",
                                  "server_args.enable_metrics: 'yes' is not true or false"]


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    """Missing file, broken YAML, non-mapping: clear ConfigError, no traceback from yaml."""
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml", TABLE)
    bad = tmp_path / "bad.yaml"
    bad.write_text("checks: [", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad, TABLE)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(lst, TABLE)


def test_empty_file_is_defaults(tmp_path: Path) -> None:
    """An empty YAML document changes nothing."""
    p = tmp_path / "empty.yaml"
    p.write_text("", encoding="utf-8")
    assert load_config(p) == Config()


def test_server_arg_overrides() -> None:
    """KEY=VALUE strings become typed values; malformed ones are problems."""
    args, problems = parse_server_arg_overrides(["mem-fraction-static=0.85", "--schedule-policy=lpm",
                                                 "enable_metrics=true", "broken"])
    assert args == {"mem_fraction_static": 0.85, "schedule_policy": "lpm", "enable_metrics": True}
    assert problems == ["--server-arg 'broken': expected KEY=VALUE"]


def test_deep_nesting_is_one_clear_problem(tmp_path: Path) -> None:
    """100k-deep YAML nesting is a ConfigError of one line, not a RecursionError traceback."""
    p = tmp_path / "deep.yaml"
    p.write_text("checks: " + "[" * 100_000 + "]" * 100_000 + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(p, TABLE)
    assert len(err.value.problems) == 1
    assert "nested deeper than" in err.value.problems[0] and "\n" not in err.value.problems[0]


def test_non_finite_and_negative_numbers_are_problems() -> None:
    """.inf, .nan and negative values are refused in every numeric setting, each one listed."""
    inf, nan = float("inf"), float("nan")
    raw = {"window_s": inf, "max_ranks": nan, "expire_s": -5,
           "signals": {"usage_good": nan, "capped_fraction": inf, "min_samples": inf},
           "profiles": {"older-md": {"queue_band": [0, inf]}},
           "checks": {"queue_empty": {"window_s": nan, "for_s": inf, "min_samples": -1,
                                      "thresholds": {"warning": nan, "critical": inf}}}}
    with pytest.raises(ConfigError) as err:
        parse_config(raw, TABLE)
    text = "\n".join(err.value.problems)
    for needle in ("window_s", "max_ranks", "expire_s", "signals.usage_good", "signals.capped_fraction",
                   "signals.min_samples", "older-md.queue_band", "checks.queue_empty.window_s",
                   "checks.queue_empty.for_s", "checks.queue_empty.min_samples",
                   "checks.queue_empty.thresholds.warning", "checks.queue_empty.thresholds.critical"):
        assert needle in text, needle
    assert len(err.value.problems) == 12, err.value.problems


@pytest.mark.parametrize("item", ["api_key sk-PLANTED-1", "--api-key sk-PLANTED-1", "hf_token", "api_key:sk-PLANTED-1"])
def test_a_malformed_server_arg_never_echoes_a_secret(item: str) -> None:
    """A secret given without its `=` is refused without quoting its value (it used to echo the item)."""
    _, problems = parse_server_arg_overrides([item, "mem_fraction_static=abc"])
    assert len(problems) == 2 and "expected KEY=VALUE" in problems[0]
    assert "PLANTED" not in "\n".join(problems)
    assert "mem_fraction_static=abc" in problems[1]
