"""Environment mirrors of the flags: a mirrored value obeys the same choices as the flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.paths import ROOT
from sglang_tuning_exporter.cli import main
from sglang_tuning_exporter.core.flags import duration_flag, is_http_url, read_secret
from sglang_tuning_exporter.fleet import report
from sglang_tuning_exporter.sidecar import serveconfig

RECORDED = ROOT / "examples" / "recorded.log"


@pytest.mark.parametrize(("env", "value", "flag"), [
    ("SGLANG_TUNING_WORKLOAD", "bogus", "--workload"),
    ("SGLANG_TUNING_FAIL_ON", "bad", "--fail-on"),
    ("SGLANG_TUNING_DIAGNOSE_FORMAT", "xml", "--format"),
    ("SGLANG_TUNING_DIAGNOSE_WORKLOAD", "bogus", "--workload"),
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
    monkeypatch.setenv("SGLANG_TUNING_DIAGNOSE_FORMAT", "json")
    assert main(["diagnose", str(RECORDED)]) == 0
    assert capsys.readouterr().out.lstrip().startswith("{")
    monkeypatch.setenv("SGLANG_TUNING_FAIL_ON", "bad")
    assert main(["diagnose", str(RECORDED), "--fail-on", "critical"]) == 3


def test_mirrors_are_per_command(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A format meant for diagnose no longer breaks report: --format and --output read only the command's own
    mirror; a flag with one meaning everywhere reads the shared mirror, and the command's own wins over it."""
    monkeypatch.setenv("SGLANG_TUNING_FORMAT", "text")  # diagnose's format, no report format
    monkeypatch.setenv("SGLANG_TUNING_REPORT_PROMETHEUS_URL", "not a url")
    assert main(["report"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice" not in err and "--prometheus.url" in err
    monkeypatch.setenv("SGLANG_TUNING_WORKLOAD", "bogus")
    monkeypatch.setenv("SGLANG_TUNING_DIAGNOSE_WORKLOAD", "latency")
    monkeypatch.setenv("SGLANG_TUNING_DIAGNOSE_FORMAT", "json")
    assert main(["diagnose", str(RECORDED)]) == 0
    assert '"workload": "latency"' in capsys.readouterr().out


def test_help_names_every_guide_profile() -> None:
    """--help lists the checks table's profiles, the default first."""
    from sglang_tuning_exporter.core.flags import GUIDE_PROFILES
    from sglang_tuning_exporter.guide.checks import load_table

    table = load_table()
    assert set(GUIDE_PROFILES) == set(table.profiles) and GUIDE_PROFILES[0] == table.default_profile()


def test_duration_flags_have_a_floor_and_are_never_zero() -> None:
    """serve's intervals have a minimum, report's ranges need a unit; zero is refused by both."""
    assert duration_flag("15s", minimum=0.01) == 15 and duration_flag("2") == 2
    with pytest.raises(ValueError, match="below the minimum of 1s"):
        duration_flag("500ms", minimum=1.0)
    with pytest.raises(ValueError, match="must be more than 0"):
        duration_flag("0s", bare_seconds=False)
    with pytest.raises(ValueError, match="a unit is required"):
        duration_flag("7", bare_seconds=False)


@pytest.mark.parametrize(("url", "ok"), [
    ("http://127.0.0.1:30000", True), ("https://prometheus.example/prefix", True), ("HTTP://p:9090", True),
    ("prometheus:9090", False), ("ftp://p", False), ("http://", False), ("http:// p", False), ("", False)])
def test_http_urls(url: str, ok: bool) -> None:
    """The SGLang and the Prometheus URL are checked alike: http(s) with a host."""
    assert is_http_url(url) is ok


def test_secret_files(tmp_path: Path) -> None:
    """A secret is read stripped; an unreadable file is named with the reason, never a traceback."""
    path = tmp_path / "token"
    path.write_text("  s3cret\n", encoding="utf-8")
    assert read_secret(str(path), "token file") == "s3cret"
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match=f"cannot read token file {path}"):
        read_secret(str(path), "token file")
    with pytest.raises(ValueError, match="cannot read key file /nonexistent/k: No such file"):
        read_secret("/nonexistent/k", "key file")


def test_serve_and_report_share_the_flag_helpers() -> None:
    """One home for duration, URL and secret flags (core/flags): both commands call it."""
    for helper in (duration_flag, is_http_url, read_secret):
        assert getattr(serveconfig, helper.__name__) is helper and getattr(report, helper.__name__) is helper

