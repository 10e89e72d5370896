"""Every JSON document the product emits follows the schema published in docs/schemas/ (docs/interfaces.md):
diagnose --format json (one input, several, with changes), the sidecar's /api/findings and /api/changes and
report --format json (here on a fleet the advisor judged; tests/conformance and tests/fleet validate the
report read from a real Prometheus)."""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers.paths import ROOT
from helpers.schemas import SCHEMAS, assert_valid, problems
from sglang_tuning_exporter.core.model import Rank
from sglang_tuning_exporter.fleet import queries as fleet
from sglang_tuning_exporter.fleet import report
from sglang_tuning_exporter.fleet.document import FleetReport
from sglang_tuning_exporter.sidecar.collector import BuildInfo
from sglang_tuning_exporter.sidecar.serve import build_sidecar, make_web
from sglang_tuning_exporter.sidecar.serveconfig import add_serve_flags, build_config

RECORDED = "examples/recorded.log"
IMPROVED = "tests/fixtures/changes/improved.log"


def diagnose_json(*files: str) -> Any:
    proc = subprocess.run([sys.executable, "-m", "sglang_tuning_exporter", "diagnose", "--format", "json", *files],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def documents() -> dict[str, Any]:
    return {"one": diagnose_json(RECORDED), "changes": diagnose_json(IMPROVED), "many": diagnose_json(RECORDED, IMPROVED)}


def test_every_schema_is_published_and_valid() -> None:
    """The schemas interfaces.md names are in docs/schemas/ and are JSON Schema themselves."""
    names = sorted(p.name.removesuffix(".schema.json") for p in SCHEMAS.glob("*.schema.json"))
    assert names == ["changes", "common", "diagnose", "findings", "report"]
    interfaces = (ROOT / "docs" / "interfaces.md").read_text(encoding="utf-8")
    assert all(f"docs/schemas/{n}.schema.json" in interfaces for n in names)


@pytest.mark.parametrize("which", ["one", "changes", "many"])
def test_diagnose_json_follows_the_schema(which: str, documents: dict[str, Any]) -> None:
    """diagnose --format json on one log, a log with a flag change (changes, last_change) and two logs."""
    doc = documents[which]
    assert_valid(doc, "diagnose")
    if which == "changes":
        assert doc["changes"] and doc["last_change"]["step"] == 0
        assert_valid({"changes": doc["changes"]}, "changes")
    if which == "many":
        for source in doc["sources"]:
            assert_valid(source, "findings")


def test_a_document_that_breaks_the_contract_is_caught(documents: dict[str, Any]) -> None:
    """The schemas are not vacuous: a renamed key, a status out of the list, a missing coverage, a plan step
    without `to`, a change with an unknown verdict each fail."""
    doc = documents["changes"]
    for mutate in (lambda d: d["findings"][0].pop("evidence"),
                   lambda d: d["findings"][0].__setitem__("status", "fine"),
                   lambda d: d.pop("coverage"),
                   lambda d: d["plan"][0].pop("to"),
                   lambda d: d["changes"][0].__setitem__("verdict", "better"),
                   lambda d: d["last_change"].__setitem__("step", 1),
                   lambda d: d.__setitem__("verdict", None)):
        broken = copy.deepcopy(doc)
        mutate(broken)
        assert problems(broken, "diagnose"), "the schema let a broken document pass"


def _serve_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_serve_flags(p)
    return p.parse_args(list(argv))


def test_the_sidecar_api_follows_the_schema(tmp_path: Path) -> None:
    """`serve --from-start` over a log with a flag change: /api/findings and /api/changes."""
    side = build_sidecar(build_config(_serve_args("--sglang.log-file", str(ROOT / IMPROVED), "--from-start")),
                         timer=lambda: 0.0)
    wall = 2_000_000_000.0
    for i in range(300):
        side.tick(wall + i * 1e-3)
    side.tick(wall + 6.0)
    web = make_web(build_config(_serve_args("--sglang.url", "http://x:1")), side, clock=lambda: wall + 6.0,
                   build=BuildInfo("0.0.0-test", "3.x"), process_metrics=False)
    findings = json.loads(web.handle("GET", "/api/findings").body)
    changes = json.loads(web.handle("GET", "/api/changes").body)
    assert_valid(findings, "findings")
    assert_valid(changes, "changes")
    assert changes["changes"] and findings["findings"]


def test_report_json_follows_the_schema() -> None:
    """report --format json of a judged fleet: every instance carries the findings-document parts."""
    parser = argparse.ArgumentParser()
    report.add_arguments(parser)
    guide = report.load_guide(parser.parse_args([]))
    data = {"a:1": fleet.InstanceData(instance="a:1", model_name="m", args={"schedule_conservativeness": 1.0},
                                      signals={Rank(): {"retractions_per_minute": 6.0, "decode_samples": 100.0}}),
            "b:1": fleet.InstanceData(instance="b:1", model_name="m", args={"schedule_conservativeness": 1.3})}
    instances = report.evaluate_fleet(data, guide.evaluate, {}, 3600.0, guide.parts)
    doc = FleetReport(prometheus="http://p:9090", start=0.0, end=3600.0, queries=28, profile=guide.profile,
                      workload=guide.workload, selector="", instances=tuple(instances),
                      drift=tuple(fleet.find_drift(data.values())), checks=guide.checks).to_json_dict()
    assert_valid(json.loads(json.dumps(doc, default=str)), "report")
    assert doc["instances"][0]["plan"] and doc["drift"]
    broken = json.loads(json.dumps(doc, default=str))
    broken["summary"]["by_status"].pop("unknown")
    assert problems(broken, "report")

