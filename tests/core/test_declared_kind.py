"""A log line that becomes a counted signal is one declaration (core/events.KindSpec with a Count): in a fresh
interpreter a kind is declared before the package loads, and the parser, `diagnose`, the sidecar replaying
and the sidecar live all read its rate, and our /metrics carries its rate and its raw counter
(docs/contracts.md, "How to add ...")."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers.paths import ROOT, TESTS

_SCRIPT = r'''
import json, sys, tempfile
from pathlib import Path
from sglang_tuning_exporter.core import events as ev

ev.declare(ev.KindSpec("toy_rejected", {"num_rejected_reqs": "requests"},
                       count=ev.Count("toy_rejected_requests", "Requests the toy line rejected.", "num_rejected_reqs"),
                       pattern=r"Toy rejected (?P<num_rejected_reqs>\d+) requests", gate="Toy rejected "))
# A Count without an amount field: one per line.
ev.declare(ev.KindSpec("toy_dropped", count=ev.Count("toy_drops", "Toy lines that dropped one request."),
                       pattern=r"Toy dropped a request", gate="Toy dropped "))

from conformance.evaluators import diagnose, live, replay
from conformance.scenarios import START, Scenario, _startup, _writer
from sglang_tuning_exporter.sources.logparse import parse_line

w = _writer(tp_size=2)
_startup(w)
toy = 0
for step in range(33 * 30):  # 33 minutes of Decode lines every 2 s; every 120 s both TP ranks print both lines
    w.decode(200, 0.95, 300, True)
    if step and step % 60 == 0:
        for tp in (0, 1):
            w.retract(1, tp=tp)
            w.add("Toy rejected 3 requests", tp=tp)
            w.add("Toy dropped a request", tp=tp)
        toy += 1
    w.tick(2.0)
event = parse_line(next(x for x in reversed(w.lines) if "Toy rejected" in x), 7)
out = {"event": None if event is None else event.to_json_dict(), "toy_lines": toy, "readings": {}}
with tempfile.TemporaryDirectory() as tmp:
    sc = Scenario("toy", w.lines, {}, {})
    for name, evaluator in (("diagnose", diagnose), ("replay", replay), ("live", live)):
        r = evaluator(sc, Path(tmp))
        out["readings"][name] = {s: r.worst_signal(s) for s in ("toy_rejected_requests_per_minute",
                                                               "toy_drops_per_minute", "retractions_per_minute")}
        if r.expositions:
            out["exposition"] = r.expositions[-1][1]
json.dump(out, sys.stdout)
'''


def _run() -> dict[str, object]:
    env = {"PYTHONPATH": f"{ROOT / 'exporter'}:{TESTS}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=TESTS, capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def test_one_declaration_makes_a_counted_signal_everywhere() -> None:
    got = _run()
    event = got["event"]
    assert isinstance(event, dict)
    assert event["kind"] == "toy_rejected" and event["fields"] == {"num_rejected_reqs": 3}, event
    assert event["rank"] == {"tp": 1}
    readings = got["readings"]
    assert isinstance(readings, dict) and set(readings) == {"diagnose", "replay", "live"}
    for who, signals in readings.items():
        # The span rules of retractions_per_minute, 3 requests per de-duplicated (TP) print.
        retractions, toy = signals["retractions_per_minute"], signals["toy_rejected_requests_per_minute"]
        assert retractions and toy is not None and abs(toy - 3 * retractions) < 1e-9, (who, signals)
        drops = signals["toy_drops_per_minute"]  # one per de-duplicated print, as a retraction line
        assert drops is not None and abs(drops - retractions) < 1e-9, (who, signals)
    text = got["exposition"]
    assert isinstance(text, str)
    per_rank = 3.0 * float(got["toy_lines"])  # type: ignore[arg-type]
    for tp in ("0", "1"):
        line = next(x for x in text.splitlines()
                    if x.startswith("sglang_tuning_toy_rejected_requests_total{") and f'tp_rank="{tp}"' in x)
        assert float(line.rsplit(" ", 1)[1]) == per_rank, line
        drops = next(x for x in text.splitlines()
                     if x.startswith("sglang_tuning_toy_drops_total{") and f'tp_rank="{tp}"' in x)
        assert float(drops.rsplit(" ", 1)[1]) == float(got["toy_lines"]), drops  # type: ignore[arg-type]
    assert "# TYPE sglang_tuning_toy_rejected_requests_total counter" in text
    rate = [x for x in text.splitlines() if x.startswith("sglang_tuning_signal_per_second{")
            and 'signal="toy_rejected_requests"' in x]
    assert rate and all(float(x.rsplit(" ", 1)[1]) > 0 for x in rate), rate
