"""diagnose --format html: several inputs open with a summary (one row per input, linking to its section),
and the page reads on a phone (390 px, headless chromium: nothing sticks out, tables scroll in their box)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.browser import CHROMIUM, layout
from helpers.paths import ROOT, SHARED

INPUTS = ["examples/recorded.log", "tests/fixtures/changes/improved.log", "tests/fixtures/changes/worse_oom.log"]


def diagnose_html(*files: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "sglang_tuning_exporter", "diagnose", "--format", "html", *files],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_many_inputs_open_with_a_summary() -> None:
    """The summary comes before the first input's section: each input once, its status, verdict line and
    first plan step, linked to its section."""
    files = [f for f in INPUTS if (ROOT / f).exists()]
    assert len(files) >= 2
    page = diagnose_html(*files)
    summary = page.split('<section id="summary">', 1)[1].split("</section>", 1)[0]
    assert page.index('<section id="summary">') < page.index('id="input-1"')
    assert f"{len(files)} inputs" in summary
    for i, f in enumerate(files, 1):
        assert f'<a href="#input-{i}"><code>{f}</code></a>' in summary and f'id="input-{i}"' in page
    assert len(re.findall(r"<tr data-status=\"\w+\"><td><a href=", summary)) == len(files)
    assert "checks fired" in summary and "critical" in summary


def test_one_input_has_no_summary() -> None:
    assert '<section id="summary">' not in diagnose_html(INPUTS[0])


@pytest.mark.integration
@pytest.mark.browser
def test_diagnose_html_fits_a_phone(tmp_path: Path) -> None:
    """At 390 px wide the page never scrolls sideways (tables in their own scrolling box, charts shrink)."""
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium not installed (Debian package chromium)")
    files = [f for f in INPUTS if (ROOT / f).exists()]
    corpus = SHARED / "corpus" / "logs" / "003-sglang4184-decode-oom-retract-tp16-dsr1.log"
    if corpus.exists():
        files.append(str(corpus))
    page = diagnose_html(*files)
    for width in (390, 1200):
        got = layout(tmp_path, page, width)
        assert got["scroll"] <= width and got["outside"] == [], (width, got)
        assert got["tables"] >= len(files) + 1
