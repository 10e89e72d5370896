"""Environment mirrors of the flags: a mirrored value obeys the same choices as the flag."""

from __future__ import annotations

import pytest

from helpers.paths import ROOT
from sglang_tuning_exporter.cli import main

RECORDED = ROOT / "examples" / "recorded.log"


@pytest.mark.parametrize(("env", "value", "flag"), [
    ("SGLANG_TUNING_WORKLOAD", "bogus", "--workload"),
    ("SGLANG_TUNING_FAIL_ON", "bad", "--fail-on"),
    ("SGLANG_TUNING_FORMAT", "xml", "--format"),
    ("SGLANG_TUNING_COLOR", "rainbow", "--color"),
])
def test_bad_env_choice_is_a_usage_error(env: str, value: str, flag: str, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A mirrored value outside the flag's choices exits 2 naming the variable (it used to run unchecked)."""
    monkeypatch.setenv(env, value)
    with pytest.raises(SystemExit) as exc:
        main(["diagnose", str(RECORDED)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and flag in err and env in err and repr(value) in err
    assert "Traceback" not in err


def test_good_env_choice_applies_and_the_flag_wins(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A valid mirrored choice is used; the command-line flag still overrides a bad mirror."""
    monkeypatch.setenv("SGLANG_TUNING_FORMAT", "json")
    assert main(["diagnose", str(RECORDED)]) == 0
    assert capsys.readouterr().out.lstrip().startswith("{")
    monkeypatch.setenv("SGLANG_TUNING_FAIL_ON", "bad")
    assert main(["diagnose", str(RECORDED), "--fail-on", "critical"]) == 3


def test_help_names_every_guide_profile() -> None:
    """--help lists the checks table's profiles, the default first."""
    from sglang_tuning_exporter.core.flags import GUIDE_PROFILES
    from sglang_tuning_exporter.guide.checks import load_table

    table = load_table()
    assert set(GUIDE_PROFILES) == set(table.profiles) and GUIDE_PROFILES[0] == table.default_profile()
