"""The command-line entry point: output that cannot be written ends with one line, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers.paths import ROOT

RECORDED = ROOT / "examples" / "recorded.log"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("command", ["parse", "diagnose"])
def test_full_disk_is_one_line_exit_1(command: str) -> None:
    """stdout on a full device: exit 1 with one 'I/O error' line on stderr (it was an OSError traceback)."""
    with open("/dev/full", "w", encoding="utf-8") as full:
        proc = subprocess.run([sys.executable, "-m", "sglang_tuning_exporter", command, str(RECORDED)],
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"sglang-tuning-exporter {command}: I/O error: No space left on device"]


def _cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sglang_tuning_exporter", *argv], capture_output=True, text=True,
                          timeout=60, check=False, env={**os.environ, **(env or {})})


def test_a_bad_flag_prints_its_commands_usage() -> None:
    """`diagnose --bogus` says which command refused it, with that command's usage (it printed the top-level one)."""
    proc = _cli("diagnose", "x.log", "--bogus")
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: sglang-tuning-exporter diagnose ")
    assert "sglang-tuning-exporter diagnose: error: unrecognized arguments: --bogus" in proc.stderr


def test_version_names_the_revision() -> None:
    """--version prints the revision build_info carries, not the package version alone."""
    from sglang_tuning_exporter.core.build import build_revision

    proc = _cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"sglang-tuning-exporter 0.1.0 (revision {build_revision()})"


@pytest.mark.parametrize("value", ["abc", "2", "-0.5", ".nan"])
def test_a_server_arg_the_advice_reads_must_be_a_value_sglang_accepts(value: str) -> None:
    """`--server-arg mem_fraction_static=abc` exited 0 silently (the advice then computed from 'abc')."""
    proc = _cli("diagnose", str(RECORDED), "--server-arg", f"mem_fraction_static={value}")
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"--server-arg 'mem_fraction_static={value}'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", ["diagnose", "parse"])
def test_offline_commands_import_no_http_template_or_prometheus_code(command: str) -> None:
    """Each command imports only what it uses: diagnose and parse load no HTTP, Jinja or Prometheus client."""
    code = ("import contextlib, io, sys\n"
            "from sglang_tuning_exporter import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    cli.main([{command!r}, {str(RECORDED)!r}])\n"
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
            "print(' '.join(m for m in sys.modules if m.startswith('sglang_tuning_exporter.')))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    top, ours = (set(line.split()) for line in proc.stdout.splitlines()[-2:])
    assert not top & {"requests", "urllib3", "jinja2", "prometheus_client", "bcrypt", "http"}, top
    assert not {m for m in ours if m.split(".")[1] in ("sidecar", "fleet", "render")}, ours
    # Start-up (bench/bench_start.py): a one-job run loads no process pool, logging or statistics
    # (statistics pulls fractions and decimal); offline/parallel.py holds the pool.
    assert not top & {"multiprocessing", "concurrent", "logging", "statistics"}, top
    assert "hashlib" not in top  # the accelerator's source digest is a CRC-32 (zlib is loaded anyway)
    assert "sglang_tuning_exporter.offline.parallel" not in ours
