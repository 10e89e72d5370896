"""The `render` subcommand: writes every artefact, `--check` passes on a clean tree and fails (exit 1,
listing files) on drift, test overrides, options files, the exporter config, and clear usage errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from helpers.paths import ROOT
from sglang_tuning_exporter.render import command as render


def run(argv: list[str]) -> int:
    """Parse `render` flags as the CLI does and run the command."""
    parser = argparse.ArgumentParser(prog="render")
    render.add_arguments(parser)
    return render.run(parser.parse_args(argv))


def test_check_passes_on_the_committed_tree(capsys: pytest.CaptureFixture[str]) -> None:
    """Every generated file in the checkout is what the table produces now."""
    assert run(["--check", "--out", str(ROOT)]) == 0, capsys.readouterr().err
    assert "up to date" in capsys.readouterr().out


def test_render_then_check_then_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A fresh render checks clean; an edited and a deleted file are both listed with exit 1."""
    assert run(["--out", str(tmp_path)]) == 0
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert "alerts/checks.rules.yaml" in written and "alerts/runbook.md" in written
    capsys.readouterr()
    assert run(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "alerts/checks.rules.yaml").write_text("groups: []\n", encoding="utf-8")
    (tmp_path / "alerts/runbook.md").unlink()
    capsys.readouterr()
    assert run(["--check", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "alerts/checks.rules.yaml" in err and "alerts/runbook.md" in err
    assert "alerts/native.rules.yaml" not in err
    # --check writes nothing
    assert not (tmp_path / "alerts/runbook.md").exists()


def test_rules_only_with_short_windows(tmp_path: Path) -> None:
    """The end-to-end copy: only rule files, every for: 15s, 1m windows."""
    assert run(["--rules-only", "--out", str(tmp_path), "--override-for", "15s", "--override-window", "1m"]) == 0
    files = sorted(p.name for p in (tmp_path / "alerts").iterdir())
    assert files == ["changes.rules.yaml", "checks.rules.yaml", "health.rules.yaml", "native.rules.yaml", "recording.rules.yaml"]
    text = (tmp_path / "alerts/checks.rules.yaml").read_text(encoding="utf-8")
    assert "for: 15s" in text and "for: 15m" not in text
    assert "[1m]" in text and "[10m]" not in text
    assert "rate1m" in (tmp_path / "alerts/recording.rules.yaml").read_text(encoding="utf-8")


def test_options_file_and_flags(tmp_path: Path) -> None:
    """A YAML options file sets job selectors and the runbook URL; flags win over the file."""
    opts = tmp_path / "render.yaml"
    opts.write_text("render:\n  exporter_job: tuning\n  sglang_job: llm\n"
                    "  runbook_url: https://runbooks.example/sglang.md\n", encoding="utf-8")
    out = tmp_path / "out"
    assert run(["--rules-only", "--out", str(out), "--render-options", str(opts), "--sglang-job", "engine"]) == 0
    text = (out / "alerts/checks.rules.yaml").read_text(encoding="utf-8")
    assert 'job="tuning"' in text and "https://runbooks.example/sglang.md#sglangqueueempty" in text
    native = (out / "alerts/native.rules.yaml").read_text(encoding="utf-8")
    assert 'job="engine"' in native and 'job="llm"' not in native


def test_exporter_config_overrides_reach_the_rules(tmp_path: Path) -> None:
    """The exporter's --config (thresholds, for, disabled checks) renders into the alerts."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text("checks:\n  retractions_frequent: {thresholds: {warning: 2}, for_s: 120}\n"
                   "  queue_empty: {enabled: false}\n", encoding="utf-8")
    assert run(["--rules-only", "--out", str(tmp_path), "--config", str(cfg)]) == 0
    text = (tmp_path / "alerts/checks.rules.yaml").read_text(encoding="utf-8")
    assert 'signal="retractions"} * 60) > 2\n' in text and "for: 2m" in text
    assert "alert: SGLangQueueEmpty" not in text


def test_bad_render_options_are_listed_not_dropped_or_crashing(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A typo in a render option and an invalid release label: exit 2, both listed, no traceback."""
    opts = tmp_path / "render.yaml"
    opts.write_text('render:\n  release_labl: x\n  release_label: "bad label"\n', encoding="utf-8")
    assert run(["--out", str(tmp_path), "--render-options", str(opts)]) == 2
    err = capsys.readouterr().err
    assert "release_labl: unknown render option" in err
    assert "release_label: 'bad label' is not a valid Kubernetes label value" in err
    assert "Traceback" not in err


def test_workload_flag_wins_over_the_config_file(tmp_path: Path) -> None:
    """`--workload` on the command line beats the config file's workload (which applies without it)."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text("workload: latency\n", encoding="utf-8")
    from_file, from_flag = tmp_path / "file", tmp_path / "flag"
    assert run(["--rules-only", "--out", str(from_file), "--config", str(cfg)]) == 0
    assert run(["--rules-only", "--out", str(from_flag), "--config", str(cfg), "--workload", "throughput"]) == 0
    assert "alert: SGLangQueueEmpty" not in (from_file / "alerts/checks.rules.yaml").read_text(encoding="utf-8")
    assert "alert: SGLangQueueEmpty" in (from_flag / "alerts/checks.rules.yaml").read_text(encoding="utf-8")


@pytest.mark.parametrize(("argv", "message"), [
    (["--override-for", "soon"], "override_for: not a duration"),
    (["--guide-profile", "nope"], "unknown guide profile 'nope'"),
    (["--table", "/nonexistent/checks.yaml"], "cannot read"),
    (["--render-options", "/nonexistent/render.yaml"], "cannot read"),
])
def test_usage_errors_are_clear(argv: list[str], message: str, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    """Bad input: exit 2 with the problem named, no traceback, nothing written."""
    assert run([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())


def test_bad_config_lists_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An invalid exporter config is a usage error naming the file."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text("checks:\n  no_such_check: {enabled: false}\n", encoding="utf-8")
    assert run(["--rules-only", "--out", str(tmp_path / "out"), "--config", str(cfg)]) == 2
    assert str(cfg) in capsys.readouterr().err


def test_every_problem_listed_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Bad flags and a bad config together: every problem listed (the profile and config were hidden)."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text("window: 10m\n", encoding="utf-8")
    argv = ["--check", "--out", str(tmp_path), "--override-for", "soon", "--guide-profile", "nope",
            "--config", str(cfg)]
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert "override_for: not a duration" in err and "unknown guide profile 'nope'" in err
    assert "unknown key 'window'" in err and err.count(str(cfg)) == 1
