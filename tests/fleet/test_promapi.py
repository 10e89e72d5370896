"""Tests of the Prometheus HTTP API client against a tiny local HTTP server (loopback, no mocks)."""

from __future__ import annotations

import base64
import json
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import pytest
import requests

from helpers.netutil import free_port
from sglang_tuning_exporter.fleet.promapi import PromConfig, PrometheusClient, PrometheusError


@dataclass
class Canned:
    """One canned answer: status, content type, body."""

    status: int = 200
    body: str = ""
    ctype: str = "application/json"


@dataclass
class Recorder:
    """What the fake server answers and what it received."""

    answers: list[Canned] = field(default_factory=list)
    seen: list[tuple[str, dict[str, str], dict[str, list[str]]]] = field(default_factory=list)


def _handler(rec: Recorder) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length", "0"))
            form = parse_qs(self.rfile.read(n).decode())
            rec.seen.append((self.path, {k: v for k, v in self.headers.items()}, form))
            ans = rec.answers.pop(0) if rec.answers else Canned(404, "not found", "text/plain")
            data = ans.body.encode()
            self.send_response(ans.status)
            self.send_header("Content-Type", ans.ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    return H


@pytest.fixture
def server() -> Iterator[tuple[str, Recorder]]:
    """A loopback HTTP server with canned answers; yields (url, recorder)."""
    rec = Recorder()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(rec))
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", rec
    finally:
        httpd.shutdown()
        httpd.server_close()


def ok(result_type: str, result: object, warnings: list[str] | None = None) -> Canned:
    """A successful API answer."""
    body: dict[str, object] = {"status": "success", "data": {"resultType": result_type, "result": result}}
    if warnings:
        body["warnings"] = warnings
    return Canned(200, json.dumps(body))


def test_instant_vector_parsed_and_counted(server: tuple[str, Recorder]) -> None:
    """A vector answer becomes samples with labels and float values (NaN kept); queries are counted."""
    url, rec = server
    rec.answers.append(ok("vector", [{"metric": {"instance": "a:1"}, "value": [1700000000, "0.5"]},
                                     {"metric": {"instance": "b:1"}, "value": [1700000000, "NaN"]}]))
    c = PrometheusClient(PromConfig(url=url + "/"))
    out = c.instant('up{job="x"}', 1700000000.0)
    assert [s.labels["instance"] for s in out] == ["a:1", "b:1"]
    assert out[0].value == 0.5 and out[1].value != out[1].value
    assert c.queries == 1
    path, _, form = rec.seen[0]
    assert path == "/api/v1/query"
    assert form["query"] == ['up{job="x"}'] and form["time"] == ["1700000000.000"]


def test_scalar_and_range_answers(server: tuple[str, Recorder]) -> None:
    """Scalars become one unlabeled sample; matrices become series with points in order."""
    url, rec = server
    rec.answers.append(ok("scalar", [1700000000, "3"]))
    rec.answers.append(ok("matrix", [{"metric": {"instance": "a"}, "values": [[1, "1"], [2, "+Inf"]]}]))
    c = PrometheusClient(PromConfig(url=url))
    assert c.instant("3", 1.0)[0].value == 3.0
    series = c.range("x", 0.0, 2.0, 1.0)
    assert series[0].points[0] == (1.0, 1.0) and series[0].points[1][1] == float("inf")
    assert rec.seen[1][0] == "/api/v1/query_range" and rec.seen[1][2]["step"] == ["1"]
    assert c.queries == 2


def test_wrong_result_type_is_an_error(server: tuple[str, Recorder]) -> None:
    """An instant query answered with a matrix is refused with a clear message."""
    url, rec = server
    rec.answers.append(ok("matrix", []))
    with pytest.raises(PrometheusError, match="expected a vector"):
        PrometheusClient(PromConfig(url=url)).instant("x[5m]", 1.0)


def test_basic_auth_and_extra_headers_sent(server: tuple[str, Recorder]) -> None:
    """Basic auth and extra headers (e.g. X-Scope-OrgID for Mimir) reach the server."""
    url, rec = server
    rec.answers.append(ok("vector", []))
    cfg = PromConfig(url=url, username="alice", password="s3cret", headers=(("X-Scope-OrgID", "team-a"),))
    PrometheusClient(cfg, session=requests.Session()).instant("up", 1.0)
    headers = rec.seen[0][1]
    assert headers["Authorization"] == "Basic " + base64.b64encode(b"alice:s3cret").decode()
    assert headers["X-Scope-OrgID"] == "team-a"
    assert headers["User-Agent"].startswith("sglang-tuning-exporter")


def test_bearer_token_sent(server: tuple[str, Recorder]) -> None:
    """A bearer token becomes an Authorization: Bearer header."""
    url, rec = server
    rec.answers.append(ok("vector", []))
    PrometheusClient(PromConfig(url=url, bearer_token="tok")).instant("up", 1.0)
    assert rec.seen[0][1]["Authorization"] == "Bearer tok"


@pytest.mark.parametrize(("answer", "pattern"), [
    (Canned(500, "<html>boom</html>", "text/html"), r"HTTP 500: <html>boom</html>"),
    (Canned(200, "<html>login</html>", "text/html"), r"non-JSON answer \(HTTP 200, text/html\)"),
    (Canned(400, json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error at char 3"})),
     r"rejected the query \(HTTP 400, bad_data\): parse error at char 3"),
    (Canned(422, json.dumps({"status": "error", "errorType": "execution", "error": "query timed out\nin x"})),
     r"HTTP 422, execution\): query timed out in x"),
    (Canned(200, json.dumps({"status": "success", "warnings": ["store gateway down"],
                             "data": {"resultType": "vector", "result": []}})),
     r"partial answer \(warnings: store gateway down\)"),
    (Canned(200, json.dumps({"status": "success"})), r"no data object"),
    (Canned(503, ""), r"HTTP 503: empty body"),
])
def test_failures_are_one_line_errors(server: tuple[str, Recorder], answer: Canned, pattern: str) -> None:
    """Every failure mode gives one PrometheusError line naming what went wrong."""
    url, rec = server
    rec.answers.append(answer)
    with pytest.raises(PrometheusError, match=pattern) as info:
        PrometheusClient(PromConfig(url=url)).instant("up", 1.0)
    assert "\n" not in str(info.value)


def test_connection_refused_is_clear() -> None:
    """A Prometheus that is down gives 'cannot reach'."""
    port = free_port()
    with pytest.raises(PrometheusError, match=rf"cannot reach Prometheus at http://127.0.0.1:{port}"):
        PrometheusClient(PromConfig(url=f"http://127.0.0.1:{port}", timeout_s=2)).instant("up", 1.0)


def test_timeout_is_clear() -> None:
    """A server that accepts but never answers hits the timeout, reported with the flag to raise."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(4)  # the kernel completes the handshake; nobody ever answers
        port = s.getsockname()[1]
        with pytest.raises(PrometheusError, match=r"did not answer within 0.3 s .*--prometheus.timeout"):
            PrometheusClient(PromConfig(url=f"http://127.0.0.1:{port}", timeout_s=0.3)).instant("up", 1.0)


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path, Recorder]]:
    """An HTTPS loopback server with a fresh self-signed certificate; yields (url, ca file, recorder)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl not installed: cannot make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    rec = Recorder()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(rec))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    t.start()
    try:
        yield f"https://127.0.0.1:{httpd.server_address[1]}", cert, rec
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_tls_with_ca_file_and_skip_verify(tls_server: tuple[str, Path, Recorder]) -> None:
    """A private CA is trusted with ca_file, refused without it, and accepted with insecure_skip_verify."""
    url, ca, rec = tls_server
    rec.answers += [ok("vector", []), ok("vector", [])]
    assert PrometheusClient(PromConfig(url=url, ca_file=str(ca))).instant("up", 1.0) == []
    with pytest.raises(PrometheusError, match="TLS error talking to Prometheus"):
        PrometheusClient(PromConfig(url=url, timeout_s=5)).instant("up", 1.0)
    assert PrometheusClient(PromConfig(url=url, insecure_skip_verify=True)).instant("up", 1.0) == []
