"""Issue 16 in the sidecar: flag changes seen in the followed log and in server info, their verdicts on
/api/changes, the status page and /metrics."""

from __future__ import annotations

import argparse
import json
from typing import Any

import change_logs
from sglang_tuning_exporter.core.timeparse import plausible_seconds
from sglang_tuning_exporter.sidecar.serve import (
    add_serve_flags,
    build_config,
    build_sidecar,
    log_input_for,
    make_web,
)
from sglang_tuning_exporter.sources.logreader import EventReader


class Follower:
    """Hands out the lines queued since the last poll."""

    def __init__(self) -> None:
        self.pending: list[str] = []
        self.exists = True
        self.rotations = 0
        self.truncations = 0

    def poll(self) -> list[str]:
        out, self.pending = self.pending, []
        return out


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_serve_flags(p)
    return p.parse_args(list(argv))


def _stamp(line: str) -> float | None:
    if line.startswith("[") and len(line) > 20 and line[5] == "-":
        return plausible_seconds(line[1:20].replace(" ", "T"))
    return None


def replay(text: str) -> tuple[Any, Any]:
    """Follow `text` minute by minute at its own times; (sidecar, web app)."""
    follower = Follower()
    cfg = build_config(_args("--sglang.log-file", "/nonexistent/x.log", "--evaluation-interval", "1s"))
    sc = build_sidecar(cfg, timer=lambda: 0.0, log_input=log_input_for(follower, EventReader()))
    clock = {"t": 0.0}
    app = make_web(cfg, sc, clock=lambda: clock["t"])
    batch: list[str] = []
    minute: float | None = None
    for line in text.splitlines():
        t = _stamp(line)
        if t is not None and minute is not None and t >= minute + 60:
            follower.pending = batch
            clock["t"] = minute + 60
            sc.tick(minute + 60)
            batch = []
        if t is not None and (minute is None or t >= minute + 60):
            minute = t - t % 60
        batch.append(line)
    follower.pending = batch
    assert minute is not None
    for k in range(1, 4):  # quiet ticks: a crashed server's last record is closed after a while
        clock["t"] = minute + 60 * k
        sc.tick(minute + 60 * k)
    return sc, app


def _get(app: Any, path: str) -> tuple[int, str]:
    res = app.handle("GET", path)
    return res.status, res.body.decode()


def test_a_new_startup_section_in_the_followed_log_is_judged() -> None:
    _, app = replay(change_logs.improved())
    status, body = _get(app, "/api/changes")
    assert status == 200
    (c,) = json.loads(body)["changes"]
    assert (c["flag"], c["from"], c["to"], c["source"], c["verdict"]) == (
        "--schedule-conservativeness", 1.0, 1.3, "log", "improved")
    assert c["checks"]["retractions_frequent"]["before"] == "critical"
    assert c["at"] == "2025-03-01T10:33:00Z"
    _, metrics = _get(app, "/metrics")
    assert 'sglang_tuning_change_verdict{flag="--schedule-conservativeness",verdict="improved"} 1.0' in metrics
    assert 'sglang_tuning_change_verdict{flag="--schedule-conservativeness",verdict="worse"} 0.0' in metrics
    assert ('sglang_tuning_change_info{flag="--schedule-conservativeness",from_value="1",to_value="1.3",'
            'source="log"} 1.0') in metrics
    _, page = _get(app, "/")
    assert "Flag changes (1)" in page and "--schedule-conservativeness" in page and "improved" in page


def test_an_oom_after_a_memory_change_is_worse_live() -> None:
    _, app = replay(change_logs.worse_oom())
    (c,) = json.loads(_get(app, "/api/changes")[1])["changes"]
    assert (c["flag"], c["verdict"]) == ("--mem-fraction-static", "worse")
    assert "go back to --mem-fraction-static 0.85" in c["why"]


def test_a_restart_with_the_same_args_is_no_change_entry() -> None:
    _, app = replay(change_logs.same_args())
    assert json.loads(_get(app, "/api/changes")[1]) == {"changes": []}
    assert "sglang_tuning_change_" not in _get(app, "/metrics")[1]


def test_server_info_changing_under_the_sidecar() -> None:
    """No log: the server info answers another --max-running-requests; with no traffic the verdict waits."""
    docs = [{"version": "0.5.23", "max_running_requests": 256, "mem_fraction_static": 0.8},
            {"version": "0.5.23", "max_running_requests": 512, "mem_fraction_static": 0.8}]

    def http(url: str, timeout: float) -> bytes:
        if url.endswith("/metrics"):
            return b'sglang:num_queue_reqs{tp_rank="0"} 5\n'
        return json.dumps(docs[0]).encode()

    cfg = build_config(_args("--sglang.url", "http://sglang:30000", "--sglang.scrape-interval", "1s",
                             "--evaluation-interval", "1s"))
    sc = build_sidecar(cfg, timer=lambda: 0.0, http_get=http)
    app = make_web(cfg, sc, clock=lambda: 0.0)
    sc.tick(1_740_823_200.0)
    assert json.loads(_get(app, "/api/changes")[1]) == {"changes": []}
    docs.pop(0)
    sc.tick(1_740_823_200.0 + 1000)  # past the periodic refresh
    (c,) = json.loads(_get(app, "/api/changes")[1])["changes"]
    assert (c["flag"], c["from"], c["to"], c["source"]) == ("--max-running-requests", 256, 512, "server_info")
    assert c["verdict"] == "inconclusive" and "too little traffic" in c["why"]
    assert ('sglang_tuning_change_verdict{flag="--max-running-requests",verdict="inconclusive"} 1.0'
            in _get(app, "/metrics")[1])
