"""Stale, quiet and ended sources (sidecar/freshness.py; issue #24): a replayed log keeps the log's own
figures after it ended and says so; a quiet log says so; a metrics outage marks its last values stale."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from helpers.paths import ROOT
from helpers.runners import Follower
from sglang_tuning_exporter.sidecar.serve import build_sidecar, log_input_for, make_web
from sglang_tuning_exporter.sidecar.serveconfig import add_serve_flags, build_config
from sglang_tuning_exporter.sources.logreader import EventReader
from sglang_tuning_exporter.sources.serverinfo import HttpError

RECORDED = ROOT / "examples" / "recorded.log"
WALL = 2_000_000_000.0


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_serve_flags(p)
    return p.parse_args(list(argv))


def _get(app: Any, path: str) -> str:
    res = app.handle("GET", path)
    assert res.status == 200
    return str(res.body.decode())


def _retractions(sc: Any, wall: float) -> float | None:
    sig = dict(sc.state.snapshot(wall).signals)
    return next(iter(sig.values())).get("retractions_per_minute") if sig else None


def test_replayed_log_is_judged_at_its_end_and_says_it_ended() -> None:
    """The quick start (`serve --sglang.log-file examples/recorded.log --from-start`): 1.45 retractions a
    minute (what diagnose says), still 1.45 half an hour of wall time later, and the page and
    /api/findings say the replay ended instead of drifting to 0.3/min and 8 of 17 unknown."""
    cfg = build_config(_args("--sglang.log-file", str(RECORDED), "--from-start", "--evaluation-interval", "1s"))
    sc = build_sidecar(cfg, timer=lambda: 0.0)
    clock = {"t": WALL}
    app = make_web(cfg, sc, clock=lambda: clock["t"], process_metrics=False)
    for i in range(20):  # until the follower has handed out the whole file, then a quiet poll
        clock["t"] = WALL + i * 0.5
        sc.tick(clock["t"])
    first = _retractions(sc, clock["t"])
    assert first is not None and abs(first - 1.45) < 0.01, first
    doc = json.loads(_get(app, "/api/findings"))
    judged = doc["coverage"]["judged"]
    for later in (WALL + 600.0, WALL + 1800.0):
        clock["t"] = later
        sc.tick(later)
        assert _retractions(sc, later) == first, "the replayed log's figures drifted with the wall clock"
    doc = json.loads(_get(app, "/api/findings"))
    assert doc["coverage"]["judged"] == judged
    log = doc["freshness"]["log"]
    assert log["state"] == "replay_ended" and log["log_end"] == "2026-01-12T10:08:58Z", log
    page = _get(app, "/")
    assert 'data-state="replay_ended"' in page and "the replayed log ended at 2026-01-12T10:08:58Z" in page


def test_quiet_log_says_so() -> None:
    """A followed log (not a replay) with no line for 5 minutes: its figures age, and the page says why."""
    follower = Follower()
    cfg = build_config(_args("--sglang.log-file", "/nonexistent/x.log", "--evaluation-interval", "1s"))
    sc = build_sidecar(cfg, timer=lambda: 0.0, log_input=log_input_for(follower, EventReader()))
    clock = {"t": WALL}
    app = make_web(cfg, sc, clock=lambda: clock["t"], process_metrics=False)
    follower.pending = [f"[2033-05-18 03:33:{s:02d}] Decode batch, #running-req: 8, #token: 900, token usage: "
                        f"0.50, cuda graph: True, gen throughput (token/s): 400.00, #queue-req: 0" for s in range(20)]
    sc.tick(WALL)
    assert json.loads(_get(app, "/api/findings"))["freshness"]["log"]["state"] == "live"
    clock["t"] = WALL + 300.0
    sc.tick(clock["t"])
    log = json.loads(_get(app, "/api/findings"))["freshness"]["log"]
    assert log["state"] == "quiet" and log["quiet_s"] == 300 and "quiet for 5 min" in log["note"], log
    assert 'data-state="quiet"' in _get(app, "/")


def test_metrics_outage_marks_its_last_values_stale() -> None:
    """SGLang's /metrics answers, then stops: the values it gave stay, marked stale with when they were
    last fresh, on the page and in /api/findings; back up, they are fresh again."""
    up = {"ok": True}

    def http(url: str, timeout: float) -> bytes:
        if not up["ok"]:
            raise HttpError("connection refused", reason="connection")
        return b'sglang:num_queue_reqs{tp_rank="0"} 5\n' if url.endswith("/metrics") else b"{}"

    cfg = build_config(_args("--sglang.url", "http://s:1", "--sglang.scrape-interval", "1s"))
    sc = build_sidecar(cfg, timer=lambda: 0.0, http_get=http)
    clock = {"t": WALL}
    app = make_web(cfg, sc, clock=lambda: clock["t"], process_metrics=False)
    sc.tick(WALL)
    assert json.loads(_get(app, "/api/findings"))["freshness"]["metrics"]["state"] == "fresh"
    up["ok"] = False
    for k in (10.0, 70.0):
        clock["t"] = WALL + k
        sc.tick(clock["t"])
    m = json.loads(_get(app, "/api/findings"))["freshness"]["metrics"]
    assert m["state"] == "stale" and m["last_ok"] == "2033-05-18T03:33:20Z", m
    assert m["down_since"] == "2033-05-18T03:33:30Z" and "stale, the last from 2033-05-18T03:33:20Z" in m["note"]
    assert sc.state.snapshot(clock["t"]).ranks[0].gauges["num_queue_reqs"] == 5  # still shown, marked stale
    assert 'data-source="metrics" data-state="stale"' in _get(app, "/")
    up["ok"] = True
    clock["t"] = WALL + 80.0
    sc.tick(clock["t"])
    assert json.loads(_get(app, "/api/findings"))["freshness"]["metrics"]["state"] == "fresh"


def test_freshness_of_an_unread_source_is_waiting(tmp_path: Path) -> None:
    """Before the first read nothing is called stale or fresh."""
    cfg = build_config(_args("--sglang.log-file", str(tmp_path / "none.log")))
    sc = build_sidecar(cfg, timer=lambda: 0.0)
    app = make_web(cfg, sc, clock=lambda: WALL, process_metrics=False)
    assert json.loads(_get(app, "/api/findings"))["freshness"]["log"]["state"] == "waiting"
