"""Degradation: SGLang down, log missing/rotated/truncated, huge lines, garbage /metrics, old endpoints.

A real HTTP stand-in for SGLang on 127.0.0.1 (ephemeral port) and the real log follower; the
sidecar is driven by `tick(now)` (no sleeps). Nothing may crash, nothing counted may be lost, and
each state must be visible as a metric.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers.netutil import announced_port, free_port, stop_process
from helpers.paths import FIXTURES
from sglang_tuning_exporter.sidecar.collector import BuildInfo
from sglang_tuning_exporter.sidecar.engine import Sidecar
from sglang_tuning_exporter.sidecar.serve import build_sidecar, make_web
from sglang_tuning_exporter.sidecar.serveconfig import add_serve_flags, build_config

FIX = FIXTURES
REAL_METRICS = (FIX / "metrics" / "sglang-0.5.23-metrics.txt").read_bytes()
SERVER_INFO = (FIX / "sglang-0.5.23-server_info-toplevel.json").read_bytes()
DECODE = ("[2025-11-11 04:06:27] Decode batch, #running-req: 46, #token: 34901, token usage: 0.19, "
          "cuda graph: False, gen throughput (token/s): 1447.08, #queue-req: 0, \n")
RETRACT = ("[2025-03-07 21:49:33] KV cache pool is full. Retract requests. #retracted_reqs: 2, "
           "#new_tokens_gained: 4608, #new_token_ratio: 0.3811 -> 0.5127\n")
BUILD = BuildInfo("test", "3")



class StandIn:
    """A stand-in SGLang HTTP server: `routes[path] = (status, body)`; unknown paths 404."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, bytes]] = {}
        routes = self.routes

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = routes.get(self.path, (404, b"Not Found"))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def standin() -> Iterator[StandIn]:
    """A running stand-in, shut down after the test."""
    s = StandIn()
    try:
        yield s
    finally:
        s.close()


def _closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there now


def _sidecar(*argv: str) -> Sidecar:
    p = argparse.ArgumentParser()
    add_serve_flags(p)
    cfg = build_config(p.parse_args(["--sglang.scrape-timeout", "2s", "--sglang.scrape-interval", "1s", *argv]))
    return build_sidecar(cfg)


def _metrics(sc: Sidecar, now: float) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    p = argparse.ArgumentParser()
    add_serve_flags(p)
    app = make_web(build_config(p.parse_args(["--sglang.url", "http://x:1"])), sc, clock=lambda: now, build=BUILD)
    resp = app.handle("GET", "/metrics")
    assert resp.status == 200
    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(resp.body.decode()) for s in f.samples}


def _get(m: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float | None:
    want = set(labels.items())
    found = [v for (n, lab), v in m.items() if n == name and want <= set(lab)]
    return sum(found) if found else None


def test_sglang_down_still_serves_and_keeps_counts(standin: StandIn) -> None:
    """SGLang unreachable: our /metrics answers with up 0; counts from before survive the outage."""
    standin.routes.update({"/metrics": (200, REAL_METRICS), "/server_info": (200, SERVER_INFO)})
    sc = _sidecar("--sglang.url", standin.url)
    sc.tick(0.0)
    line = (b'sglang:num_retracted_requests_total{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",'
            b'moe_ep_rank="0",pp_rank="0",tp_rank="0"} ')
    bumped = REAL_METRICS.replace(line + b"3.0", line + b"7.0")
    assert bumped != REAL_METRICS
    standin.routes["/metrics"] = (200, bumped)
    sc.tick(1.0)
    m = _metrics(sc, 1.0)
    assert _get(m, "sglang_tuning_up") == 1.0
    assert _get(m, "sglang_tuning_retracted_requests_total") == 4.0
    standin.close()
    sc.tick(2.0)
    m = _metrics(sc, 2.0)
    assert _get(m, "sglang_tuning_up") == 0.0
    assert _get(m, "sglang_tuning_source_up", source="metrics") == 0.0
    assert _get(m, "sglang_tuning_retracted_requests_total") == 4.0  # nothing counted is lost
    assert "failed" in sc.state.snapshot(2.0).sources["metrics"].detail


def test_sglang_never_up() -> None:
    """Nothing listening: every tick completes, up 0, server_info down, ready after the first evaluation."""
    sc = _sidecar("--sglang.url", _closed_port_url())
    sc.tick(0.0)
    sc.tick(1.0)
    m = _metrics(sc, 1.0)
    assert _get(m, "sglang_tuning_up") == 0.0
    assert _get(m, "sglang_tuning_source_up", source="server_info") == 0.0
    assert sc.ready


def test_garbage_metrics_are_counted(standin: StandIn) -> None:
    """Garbage lines in SGLang's /metrics are skipped and counted; an all-garbage body is 'down'."""
    standin.routes["/metrics"] = (200, b"<html>\nnot metrics at all {{{\n" + REAL_METRICS + b"\x00\x01\x02\n")
    sc = _sidecar("--sglang.url", standin.url)
    sc.tick(0.0)
    m = _metrics(sc, 0.0)
    assert _get(m, "sglang_tuning_up") == 1.0
    assert _get(m, "sglang_tuning_scrape_garbage_lines_total") == 3.0
    assert _get(m, "sglang_tuning_queue_requests") == 412.0
    standin.routes["/metrics"] = (200, b"<html><body>proxy error</body></html>\n")
    sc.tick(1.0)
    m = _metrics(sc, 1.0)
    assert _get(m, "sglang_tuning_up") == 0.0
    assert _get(m, "sglang_tuning_scrape_garbage_lines_total") == 4.0


def test_older_release_server_info_fallback(standin: StandIn) -> None:
    """/server_info 404 (release < 0.5.6): /get_server_info is read and named in a metric."""
    doc = json.loads(SERVER_INFO)
    doc["version"] = "0.4.10"
    standin.routes.update({"/metrics": (200, REAL_METRICS), "/get_server_info": (200, json.dumps(doc).encode())})
    sc = _sidecar("--sglang.url", standin.url)
    sc.tick(0.0)
    m = _metrics(sc, 0.0)
    assert _get(m, "sglang_tuning_sglang_endpoint_info", endpoint="/get_server_info") == 1.0
    assert _get(m, "sglang_tuning_server_info", version="0.4.10") == 1.0
    assert _get(m, "sglang_tuning_source_up", source="server_info") == 1.0


def test_log_missing_then_appearing(tmp_path: Path) -> None:
    """No log yet: source_up{log} 0; once it appears its lines are read from the start."""
    path = tmp_path / "sglang.log"
    sc = _sidecar("--sglang.log-file", str(path))
    sc.tick(0.0)
    m = _metrics(sc, 0.0)
    assert _get(m, "sglang_tuning_source_up", source="log") == 0.0
    path.write_text(DECODE + RETRACT)
    sc.tick(1.0)
    m = _metrics(sc, 1.0)
    assert _get(m, "sglang_tuning_source_up", source="log") == 1.0
    assert _get(m, "sglang_tuning_log_lines_total", kind="decode") == 1.0
    assert _get(m, "sglang_tuning_retracted_requests_total") == 2.0


def test_log_rotated_and_truncated_while_serving(tmp_path: Path) -> None:
    """Rotation (new inode) and truncation are followed and counted; counters keep growing."""
    path = tmp_path / "sglang.log"
    path.write_text("")
    sc = _sidecar("--sglang.log-file", str(path))
    sc.tick(0.0)
    with path.open("a") as f:
        f.write(DECODE * 3)
    sc.tick(1.0)
    os.rename(path, tmp_path / "sglang.log.1")
    path.write_text(DECODE * 2 + RETRACT)
    sc.tick(2.0)
    m = _metrics(sc, 2.0)
    assert _get(m, "sglang_tuning_log_rotations_total") == 1.0
    assert _get(m, "sglang_tuning_decode_samples_total") == 5.0
    path.write_text(DECODE)  # truncated in place, then one new line
    sc.tick(3.0)
    m = _metrics(sc, 3.0)
    assert _get(m, "sglang_tuning_log_truncations_total") == 1.0
    assert _get(m, "sglang_tuning_decode_samples_total") == 6.0
    assert _get(m, "sglang_tuning_retracted_requests_total") == 2.0
    assert _get(m, "sglang_tuning_source_up", source="log") == 1.0


def test_ten_megabyte_line(tmp_path: Path) -> None:
    """A 10 MB line is cut and counted, and the following lines are still read."""
    path = tmp_path / "sglang.log"
    path.write_text("")
    sc = _sidecar("--sglang.log-file", str(path))
    sc.tick(0.0)
    with path.open("a") as f:
        f.write("[2025-11-11 04:06:26] " + "x" * (10 * 1024 * 1024) + "\n")
        f.write(DECODE)
    sc.tick(1.0)
    m = _metrics(sc, 1.0)
    assert _get(m, "sglang_tuning_log_oversized_lines_total") == 1.0
    assert _get(m, "sglang_tuning_log_lines_total", kind="decode") == 1.0
    assert _get(m, "sglang_tuning_decode_samples_total", cuda_graph="false") == 1.0


@pytest.mark.integration
def test_serve_process_answers_while_sglang_is_down(tmp_path: Path) -> None:
    """The real `serve` process on 127.0.0.1: /metrics, /-/healthy and / answer with SGLang down."""
    cmd = [sys.executable, "-m", "sglang_tuning_exporter", "serve", "--web.listen-address", "127.0.0.1:0",
           "--sglang.url", _closed_port_url(), "--sglang.scrape-interval", "1s", "--sglang.scrape-timeout", "1s",
           "--sglang.log-file", str(tmp_path / "missing.log")]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        port = announced_port(proc.stderr)
        assert port, "serve did not report its port"
        base = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(base + "/-/healthy", timeout=10) as r:
            assert r.status == 200
        with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
            text = r.read().decode()
        assert "sglang_tuning_up 0.0" in text
        assert 'sglang_tuning_source_enabled{source="log"} 1.0' in text
        with urllib.request.urlopen(base + "/", timeout=10) as r:
            assert b"SGLang tuning status" in r.read()
    finally:
        stop_process(proc)
    assert proc.returncode == 0
