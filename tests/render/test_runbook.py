"""alerts/runbook.md: one section per alert (anchors parsed), each saying meaning, impact, how to confirm,
the change to make and its trade-off; every alert of every workload links an existing section."""

from __future__ import annotations

import re

import pytest
import yaml

from helpers.lookups import all_alerts, anchors
from helpers.paths import ROOT
from sglang_tuning_exporter.guide.checks import load_table
from sglang_tuning_exporter.render import rules as render_rules
from sglang_tuning_exporter.render import runbook as render_runbook
from sglang_tuning_exporter.render.annotations import anchor
from sglang_tuning_exporter.render.options import RenderOptions

RUNBOOK = ROOT / "alerts" / "runbook.md"


def sections(markdown: str) -> dict[str, str]:
    """Anchor -> the text of its section (up to the next anchor)."""
    parts = re.split(r'<a id="([^"]+)"></a>', markdown)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def missing_sections(alert_names: set[str], markdown: str) -> set[str]:
    """Alerts whose runbook anchor does not exist."""
    return {a for a in alert_names if anchor(a) not in anchors(markdown)}


def committed_alert_names() -> set[str]:
    """Every alert in the committed rule files."""
    names: set[str] = set()
    for f in (ROOT / "alerts").glob("*.yaml"):
        for g in yaml.safe_load(f.read_text(encoding="utf-8"))["groups"]:
            names |= {r["alert"] for r in g["rules"] if "alert" in r}
    return names


def test_every_committed_alert_has_a_section() -> None:
    """Parsing the anchors finds a section for each alert of alerts/*.yaml."""
    names = committed_alert_names()
    assert len(names) >= 15
    assert missing_sections(names, RUNBOOK.read_text(encoding="utf-8")) == set()


@pytest.mark.parametrize("workload", ["throughput", "latency", "long-context", "multi-turn"])
def test_every_workloads_alerts_have_sections(workload: str) -> None:
    """Rules rendered for any workload link sections of the same runbook."""
    table = load_table()
    alerts = all_alerts(table, RenderOptions(workload=workload))
    text = RUNBOOK.read_text(encoding="utf-8")
    assert missing_sections({a["alert"] for a in alerts}, text) == set()
    for a in alerts:
        assert a["annotations"]["runbook_url"].split("#", 1)[1] in anchors(text)


def test_the_lint_catches_an_alert_without_a_section() -> None:
    """A made-up alert is reported as missing (the lint can fail)."""
    text = RUNBOOK.read_text(encoding="utf-8")
    assert missing_sections({"SGLangQueueEmpty", "SGLangNotDocumented"}, text) == {"SGLangNotDocumented"}


def test_check_sections_carry_the_advice() -> None:
    """Each check section: meaning, impact, confirmation (panel or log line), change with flag, trade-off."""
    table = load_table()
    secs = sections(RUNBOOK.read_text(encoding="utf-8"))
    for c in table.checks:
        body = secs[anchor(c.alert)]
        assert f"## {c.alert}" in body
        for part in ("**Meaning.**", "**Impact.**", "**How to confirm.**", "**Change to make.**", "**Trade-off.**"):
            assert part in body, (c.alert, part)
        assert re.search(r"(?i)panel|log|`", body.split("**How to confirm.**")[1].split("\n")[0])
        change = body.split("**Change to make.**")[1].split("\n")[0]
        if c.flag:
            assert c.flag in change and c.action in change
        else:
            assert c.client_action in change
        assert " ".join(c.tradeoff.split()) in body


def test_guard_sections_exist_for_every_health_alert() -> None:
    """The health guards are documented too."""
    secs = sections(RUNBOOK.read_text(encoding="utf-8"))
    guards = [r.body["alert"] for r in render_rules.health_group(RenderOptions()).rules]
    assert len(guards) >= 5
    for name in guards:
        assert "**Change to make.**" in secs[anchor(name)]


def test_runbook_is_what_the_table_generates() -> None:
    """The committed runbook is the generated one (render --check covers it too)."""
    assert RUNBOOK.read_text(encoding="utf-8") == render_runbook.generate(load_table())
