"""Issue 16 in the sidecar: flag changes seen in the followed log and in server info, their verdicts on
/api/changes, the status page and /metrics."""

from __future__ import annotations

import json

from helpers import change_logs
from helpers.runners import get, replay, serve_args
from sglang_tuning_exporter.sidecar.serve import (
    build_config,
    build_sidecar,
    make_web,
)


def test_a_new_startup_section_in_the_followed_log_is_judged() -> None:
    _, app = replay(change_logs.improved())
    status, body = get(app, "/api/changes")
    assert status == 200
    (c,) = json.loads(body)["changes"]
    assert (c["flag"], c["from"], c["to"], c["source"], c["verdict"]) == (
        "--schedule-conservativeness", 1.0, 1.3, "log", "improved")
    assert c["checks"]["retractions_frequent"]["before"] == "critical"
    assert c["at"] == "2025-03-01T10:33:00Z"
    _, metrics = get(app, "/metrics")
    assert 'sglang_tuning_change_verdict{flag="--schedule-conservativeness",verdict="improved"} 1.0' in metrics
    assert 'sglang_tuning_change_verdict{flag="--schedule-conservativeness",verdict="worse"} 0.0' in metrics
    assert ('sglang_tuning_change_info{flag="--schedule-conservativeness",from_value="1",to_value="1.3",'
            'source="log"} 1.0') in metrics
    _, page = get(app, "/")
    assert "Flag changes (1)" in page and "--schedule-conservativeness" in page and "improved" in page


def test_an_oom_after_a_memory_change_is_worse_live() -> None:
    _, app = replay(change_logs.worse_oom())
    (c,) = json.loads(get(app, "/api/changes")[1])["changes"]
    assert (c["flag"], c["verdict"]) == ("--mem-fraction-static", "worse")
    assert "go back to --mem-fraction-static 0.85" in c["why"]


def test_a_restart_with_the_same_args_is_no_change_entry() -> None:
    _, app = replay(change_logs.same_args())
    assert json.loads(get(app, "/api/changes")[1]) == {"changes": []}
    assert "sglang_tuning_change_" not in get(app, "/metrics")[1]


def test_server_info_changing_under_the_sidecar() -> None:
    """No log: the server info answers another --max-running-requests; with no traffic the verdict waits."""
    docs = [{"version": "0.5.23", "max_running_requests": 256, "mem_fraction_static": 0.8},
            {"version": "0.5.23", "max_running_requests": 512, "mem_fraction_static": 0.8}]

    def http(url: str, timeout: float) -> bytes:
        if url.endswith("/metrics"):
            return b'sglang:num_queue_reqs{tp_rank="0"} 5\n'
        return json.dumps(docs[0]).encode()

    cfg = build_config(serve_args("--sglang.url", "http://sglang:30000", "--sglang.scrape-interval", "1s",
                             "--evaluation-interval", "1s"))
    sc = build_sidecar(cfg, timer=lambda: 0.0, http_get=http)
    app = make_web(cfg, sc, clock=lambda: 0.0)
    sc.tick(1_740_823_200.0)
    assert json.loads(get(app, "/api/changes")[1]) == {"changes": []}
    docs.pop(0)
    sc.tick(1_740_823_200.0 + 1000)  # past the periodic refresh
    (c,) = json.loads(get(app, "/api/changes")[1])["changes"]
    assert (c["flag"], c["from"], c["to"], c["source"]) == ("--max-running-requests", 256, 512, "server_info")
    assert c["verdict"] == "inconclusive" and "too little traffic" in c["why"]
    assert ('sglang_tuning_change_verdict{flag="--max-running-requests",verdict="inconclusive"} 1.0'
            in get(app, "/metrics")[1])


def test_a_change_without_a_restart_in_the_followed_log_is_judged() -> None:
    """`Config updated via context override: {...}` updates the server's known arguments and enters the
    changes as a `log` change (0.5.22-0.5.23's format string)."""
    sc, app = replay(change_logs.runtime_update())
    (c,) = json.loads(get(app, "/api/changes")[1])["changes"]
    assert (c["flag"], c["from"], c["to"], c["source"]) == ("--pp-max-micro-batch-size", 8, 4, "log")
    assert sc.state.server_state().args["pp_max_micro_batch_size"] == 4
