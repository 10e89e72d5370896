"""Tests of the Prometheus HTTP API client against a tiny local HTTP server (loopback, no mocks)."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from helpers.hostile_sglang import Body, Drip, HostileSGLang, Redirect, Stall
from helpers.netutil import free_port
from sglang_tuning_exporter.cli import main
from sglang_tuning_exporter.core import limits
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
    PrometheusClient(cfg).instant("up", 1.0)
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


def test_credentials_in_the_url_are_sent_but_never_shown(server: tuple[str, Recorder],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """`--prometheus.url http://user:pass@host` authenticates, yet the password reaches no error line and no
    report: the client's `base` (what pages, JSON and errors show) reads `***@` (core/redact)."""
    url, rec = server
    rec.answers.append(Canned(500, "boom", "text/plain"))
    with_userinfo = url.replace("http://", "http://alice:s3cret@")
    client = PrometheusClient(PromConfig(url=with_userinfo))
    with pytest.raises(PrometheusError) as info:
        client.instant("up", 1.0)
    assert rec.seen[0][1]["Authorization"] == "Basic " + base64.b64encode(b"alice:s3cret").decode()
    assert "s3cret" not in str(info.value) and "s3cret" not in client.base and "***@127.0.0.1" in client.base
    port = free_port()  # a Prometheus that is down, and a URL the usage check refuses
    for argv in (["--prometheus.url", f"http://alice:s3cret@127.0.0.1:{port}"],
                 ["--prometheus.url", "alice:s3cret@prometheus:9090"]):
        assert main(["report", *argv, "--range", "1h", "--format", "json", "--prometheus.timeout", "2s"]) in (1, 2)
        out = capsys.readouterr()
        assert "s3cret" not in out.err + out.out, out.err


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


# --- a hostile Prometheus (issue 23): the report gives up in time, in bounded memory, in one line ----------
ANSWER = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
    {"metric": {"instance": "a:1"}, "value": [1700000000, "1"]}]}}).encode()


@pytest.mark.parametrize("route", [
    Drip(ANSWER, every_s=0.05),  # Content-Length, the body a byte at a time
    Drip(ANSWER, every_s=0.05, framing="close"),  # no length: the body ends when the server closes
    Drip(ANSWER, every_s=0.05, framing="chunked"),  # a one-byte chunk at a time
    Drip(ANSWER, every_s=0.05, headers=True),  # even the status line drips
    Stall(),  # headers, then nothing
], ids=["length", "close", "chunked", "headers", "stall"])
def test_timeout_holds_for_the_whole_answer(route: Drip | Stall) -> None:
    """`--prometheus.timeout` bounds the whole answer, not each read: a Prometheus dripping a byte every
    50 ms is cut off at the deadline with the one-line timeout error."""
    with HostileSGLang({"/api/v1/query": route}) as s:
        start = time.monotonic()
        with pytest.raises(PrometheusError, match=r"did not answer within 0.5 s .*--prometheus.timeout"):
            PrometheusClient(PromConfig(url=s.url, timeout_s=0.5)).instant("up", 1.0)
        took = time.monotonic() - start
    assert took < 1.5, took


def test_a_gzip_answer_is_inflated_within_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """gzip is asked for and inflated; a small gzip body that inflates past the cap is refused at the cap
    (never inflated whole in memory), with a line naming the cap."""
    monkeypatch.setattr(limits, "MAX_PROMETHEUS_ANSWER_BYTES", 1024 * 1024)
    zipped = (("Content-Encoding", "gzip"),)
    bomb = gzip.compress(b'{"status": "success", "data": {"resultType": "vector", "result": [' + b" " * (64 << 20))
    with HostileSGLang({"/api/v1/query": Body(gzip.compress(ANSWER), headers=zipped),
                        "/api/v1/query_range": Body(bomb, headers=zipped)}) as s:
        client = PrometheusClient(PromConfig(url=s.url, timeout_s=5))
        assert [x.labels["instance"] for x in client.instant("up", 1.0)] == ["a:1"]
        with pytest.raises(PrometheusError, match=r"more than 1 MiB \(1048576 bytes, the cap per answer\)"):
            client.range("up", 0.0, 1.0, 1.0)
        assert s.seen[0][1]["Accept-Encoding"] == "gzip"


def test_an_answer_past_the_cap_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A million series (or any answer past the cap) is refused by a line naming the cap, read no further."""
    monkeypatch.setattr(limits, "MAX_PROMETHEUS_ANSWER_BYTES", 1024 * 1024)
    items = ",".join(json.dumps({"metric": {"instance": f"i{i}"}, "value": [1, "1"]}) for i in range(40_000))
    big = ('{"status": "success", "data": {"resultType": "vector", "result": [' + items + "]}}").encode()
    with HostileSGLang({"/api/v1/query": Drip(big, every_s=0.0, chunk=1 << 16, framing="close")}) as s, \
            pytest.raises(PrometheusError, match=r"the cap per answer\) to 'up': narrow --selector"):
        PrometheusClient(PromConfig(url=s.url, timeout_s=5)).instant("up", 1.0)


def test_no_header_or_credential_crosses_a_redirect_to_another_host() -> None:
    """A 307 to another host is not followed: the tenant header, the API key and the password stay home.
    A redirect on the same host (a path prefix) is followed."""
    with HostileSGLang({"/api/v1/query": Body(ANSWER)}) as other:
        with HostileSGLang({"/api/v1/query": Redirect(other.url + "/api/v1/query"),
                            "/prom/api/v1/query": Redirect("/real/api/v1/query", 308),
                            "/real/api/v1/query": Body(ANSWER)}) as s:
            cfg = PromConfig(url=s.url, username="alice", password="s3cret",
                             headers=(("X-Scope-OrgID", "team-a"), ("X-Api-Key", "k3y")))
            with pytest.raises(PrometheusError, match=r"redirected \(HTTP 307\) to another host"):
                PrometheusClient(cfg).instant("up", 1.0)
            moved = PrometheusClient(dataclasses.replace(cfg, url=s.url + "/prom"))
            assert len(moved.instant("up", 1.0)) == 1
            assert s.seen[-1][0] == "/real/api/v1/query" and s.seen[-1][1]["X-Scope-OrgID"] == "team-a"
        assert other.seen == []


@pytest.mark.parametrize(("body", "pattern"), [
    ("[]", r"JSON that is not an API answer \(HTTP 200, a list"),
    ("{}", r"JSON that is not an API answer \(HTTP 200, no `status`\)"),
    ('{"status": "success"}', r"no data object"),
    ('{"status": "success", "data": []}', r"no data object"),
    ('{"status": "success", "data": {"resultType": "vector", "result": {}}}', r"`result` is an object, not a list"),
    ('{"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}}',
     r"`value` holds null where a \[time, value\] pair belongs"),
    ('{"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "2", 3]}]}}',
     r"`value` holds a list where a \[time, value\] pair belongs"),
    ('{"status": "success", "data": {"resultType": "vector", "result": [{"metric": 5, "value": [1, "2"]}]}}',
     r"`metric` is not an object of string labels"),
    ('{"status": "success", "data": {"resultType": "vector", "result": [7]}}', r"a `result` item is not an object"),
    ('{"status": "success", "data": {"resultType": "scalar", "result": "x"}}', r"`result` holds a string"),
    ('{"status": "success", "data": {"resultType": 3, "result": []}}', r"non-string \(int\) result"),
])
def test_json_of_the_wrong_shape_is_one_line(server: tuple[str, Recorder], body: str, pattern: str) -> None:
    """Valid JSON that is not the API's shape gives one PrometheusError line, never a traceback."""
    url, rec = server
    rec.answers.append(Canned(200, body))
    with pytest.raises(PrometheusError, match=pattern) as info:
        PrometheusClient(PromConfig(url=url)).instant("up", 1.0)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("result", "pattern"), [
    ('[{"metric": {}}]', r"a series without its `values` list"),
    ('[{"metric": {}, "values": [[1, "1"], [2]]}]', r"`values` holds a list where a \[time, value\] pair"),
    ('[{"metric": {}, "values": [["t", "1"]]}]', r"a sample time is a string, not a number"),
    ('[{"metric": {}, "values": [[1, {}]]}]', r"sample value that is not a number"),
    ('"x"', r"`result` is a string, not a list"),
])
def test_range_answers_of_the_wrong_shape_are_one_line(server: tuple[str, Recorder], result: str,
                                                       pattern: str) -> None:
    """The same for matrices: a series without values or with values that are not pairs."""
    url, rec = server
    rec.answers.append(Canned(200, '{"status": "success", "data": {"resultType": "matrix", "result": ' + result + "}}"))
    with pytest.raises(PrometheusError, match=pattern):
        PrometheusClient(PromConfig(url=url)).range("up", 0.0, 1.0, 1.0)


SHAPES = ["[]", "{}", '{"status": "success"}', '{"status": "success", "data": []}',
          '{"status": "success", "data": {"resultType": "vector", "result": 5}}',
          '{"status": "success", "data": {"resultType": "vector", "result": [{"values": 1}]}}',
          '{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": [1, 2]}]}}']


@pytest.mark.parametrize("body", SHAPES)
def test_report_exits_1_with_one_line_on_any_shape(body: str, capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    """`report` against a Prometheus answering valid JSON of the wrong shape to every query: exit 1, one
    line on stderr, no traceback, no report written."""
    routes = {p: Body(body.encode(), content_type="application/json")
              for p in ("/api/v1/query", "/api/v1/query_range")}
    with HostileSGLang(routes) as s:
        code = main(["report", "--prometheus.url", s.url, "--prometheus.timeout", "2s",
                     "--output", str(tmp_path / "r.json"), "--format", "json"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith("report: Prometheus ") and "Traceback" not in err[0]
    assert not (tmp_path / "r.json").exists()


def test_report_gives_up_on_a_drip_at_its_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    """The whole `report` against a Prometheus that drips its answers: done by the deadline, exit 1."""
    with HostileSGLang({"/api/v1/query": Drip(ANSWER * 50, every_s=0.05, framing="close")}) as s:
        start = time.monotonic()
        code = main(["report", "--prometheus.url", s.url, "--prometheus.timeout", "500ms", "--format", "json"])
        took = time.monotonic() - start
    assert code == 1 and "did not answer within 0.5 s" in capsys.readouterr().err
    assert took < 3.0, took
