"""Issue 16, the plan link: after the plan's step 1 was applied (the server restarted with the value it
proposed), the next document says first whether that change helped (`last_change`, the plan's step 0)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers import change_logs
from helpers.runners import diagnose_json, diagnose_run, get, replay
from helpers.scenario_logs import LogWriter
from sglang_tuning_exporter.guide.changes import last_change, last_change_text


def _before() -> LogWriter:
    """The retraction storm of change_logs.improved at the starting flags."""
    w = change_logs._start(LogWriter("0.5.23"))
    return change_logs._traffic(w, 30, retract_every=2)


def _first_step(tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "before.log"
    path.write_text(_before().text(), encoding="utf-8")
    doc = diagnose_json(path)
    assert "last_change" not in doc, "a log without a restart has no last change (the contract is unchanged)"
    step: dict[str, Any] = doc["plan"][0]
    return step


def _applied(step: dict[str, Any]) -> str:
    """The same server restarted with the plan's first suggested value, under the same load, storm gone."""
    w = _before()
    w.tick(120)
    change_logs._start(w, **{step["flag"].lstrip("-").replace("-", "_"): step["to"]})
    return change_logs._traffic(w, 30, running=290, queue=160, usage=0.93).text()


def test_the_applied_first_step_is_judged_first(tmp_path: Path) -> None:
    step = _first_step(tmp_path)
    assert (step["step"], step["flag"], step["action"]) == (1, "--schedule-conservativeness", "increase")
    log = tmp_path / "applied.log"
    log.write_text(_applied(step), encoding="utf-8")
    doc = diagnose_json(log)
    note = doc["last_change"]
    assert (note["step"], note["flag"], note["from"], note["to"], note["verdict"]) == (
        0, step["flag"], step["current"], step["to"], "improved")
    assert note["then"].startswith("keep it") and note["with"] == []
    assert note["why"] == doc["changes"][0]["why"]
    # text, markdown and html say it before anything else
    code, text, _ = diagnose_run([str(log), "--jobs", "1"])
    assert code == 0
    assert text.splitlines()[0].startswith(f"== last change: {step['flag']} 1 -> {step['to']:g} at ")
    assert "IMPROVED" in text.splitlines()[0]
    _, md, _ = diagnose_run([str(log), "--jobs", "1", "--format", "markdown"])
    assert md.startswith(f"> **last change: {step['flag']}")
    _, page, _ = diagnose_run([str(log), "--jobs", "1", "--format", "html"])
    assert page.index('id="last-change"') < page.index("<h2")


def test_the_status_page_and_api_findings_lead_with_the_last_change(tmp_path: Path) -> None:
    step = _first_step(tmp_path)
    _, app = replay(_applied(step))
    doc = json.loads(get(app, "/api/findings")[1])
    assert (doc["last_change"]["flag"], doc["last_change"]["verdict"]) == (step["flag"], "improved")
    page = get(app, "/")[1]
    assert 'id="last-change"' in page and page.index('id="last-change"') < page.index('id="verdict"')
    assert "IMPROVED" in page


def test_a_worse_change_says_go_back_before_the_next_step() -> None:
    _, app = replay(change_logs.worse_oom())
    note = json.loads(get(app, "/api/findings")[1])["last_change"]
    assert note["verdict"] == "worse" and note["then"] == "go back to --mem-fraction-static 0.85 before any other step"


def test_no_change_no_note() -> None:
    _, app = replay(change_logs.same_args())
    assert "last_change" not in json.loads(get(app, "/api/findings")[1])
    assert 'id="last-change"' not in get(app, "/")[1]


def test_several_flags_at_one_restart_lead_with_the_worst() -> None:
    def c(flag: str, verdict: str, at: str = "2026-01-01T00:10:00Z") -> dict[str, Any]:
        return {"at": at, "flag": flag, "from": 1, "to": 2, "verdict": verdict, "why": "w"}

    note = last_change([c("--a", "improved", "2026-01-01T00:00:00Z"), c("--b", "improved"), c("--c", "worse")])
    assert note is not None
    assert (note["flag"], note["verdict"], note["with"]) == ("--c", "worse", ["--b"])
    assert last_change_text(note).startswith("last change: --c 1 -> 2 (with --b) at 2026-01-01T00:10:00Z: WORSE")
    assert last_change([]) is None
