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
