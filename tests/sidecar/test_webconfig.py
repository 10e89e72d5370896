"""Tests for --web.config.file (exporter-toolkit format): validation, basic auth, gzip, real HTTPS on loopback."""

from __future__ import annotations

import base64
import gzip
import http.client
import shutil
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import ThreadingHTTPServer
from pathlib import Path

import bcrypt
import pytest

from helpers.netutil import announced_port, free_port, stop_process
from helpers.tlscerts import self_signed
from sglang_tuning_exporter import cli
from sglang_tuning_exporter.core.model import Observation, Rank
from sglang_tuning_exporter.sidecar.collector import BuildInfo, TuningCollector, make_registry
from sglang_tuning_exporter.sidecar.state import LiveState
from sglang_tuning_exporter.sidecar.web import WebApp, start_http
from sglang_tuning_exporter.sidecar.webconfig import (
    AuthBusy,
    BasicAuth,
    TLSConfig,
    WebConfig,
    WebConfigError,
    accepts_gzip,
    gzip_body,
    load_web_config,
    needs_auth,
    parse_web_config,
)

BUILD = BuildInfo("0.0.0-test", "3.11")
# Cost 4 keeps the tests fast; the format is the same as the $2y$10$ hashes htpasswd writes.
ALICE_HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# --- validation (pure) ---------------------------------------------------------------------------
def test_full_config_parses_with_paths_relative_to_the_file(tmp_path: Path) -> None:
    """Every supported key is read; relative file names resolve against the config's directory."""
    doc = {"tls_server_config": {"cert_file": "server.crt", "key_file": "/abs/server.key",
                                 "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": "ca.crt",
                                 "min_version": "TLS13"},
           "basic_auth_users": {"alice": ALICE_HASH},
           "http_server_config": {"http2": False, "headers": {"X-Frame-Options": "deny"}}}
    cfg = parse_web_config(doc, tmp_path)
    assert cfg.tls == TLSConfig(cert_file=tmp_path / "server.crt", key_file=Path("/abs/server.key"),
                                client_auth_type="RequireAndVerifyClientCert", client_ca_file=tmp_path / "ca.crt",
                                min_version="TLS13", max_version="TLS13")
    assert cfg.users == (("alice", ALICE_HASH.encode()),)
    assert cfg.headers == (("X-Frame-Options", "deny"),)
    assert parse_web_config(None, tmp_path) == WebConfig()  # an empty file: plain HTTP, no auth


def test_every_problem_is_listed_by_key(tmp_path: Path) -> None:
    """Unknown and unsupported keys, bad values, bad hashes and headers: all reported at once."""
    doc = {"tls_server_config": {"cert_file": "c.pem", "client_auth_type": "Sometimes", "min_version": "SSL3",
                                 "cipher_suites": ["TLS_AES_128_GCM_SHA256"], "certfile": "x"},
           "basic_auth_users": {"bob": "plaintext", "carol": "$2y$03$" + "a" * 53},
           "http_server_config": {"headers": {"Server": "x", "X-Frame-Options": "deny\r\nSet-Cookie: a=b"}},
           "rate_limit": {"interval": "1s"}, "tls_config": {}}
    with pytest.raises(WebConfigError) as err:
        parse_web_config(doc, tmp_path)
    problems = err.value.problems
    expected = ["tls_server_config.cipher_suites: cipher suite lists not supported",
                "tls_server_config.certfile: unknown key", "tls_server_config.key_file: required",
                "tls_server_config.client_auth_type: 'Sometimes' is not one of",
                "tls_server_config.min_version: 'SSL3'", "basic_auth_users.bob: not a bcrypt hash",
                "basic_auth_users.carol: bcrypt cost 03", "http_server_config.headers.Server: cannot be set",
                "http_server_config.headers.X-Frame-Options: must be a one-line string",
                "rate_limit: rate limiting not supported", "tls_config: unknown key"]
    for text in expected:
        assert any(p.startswith(text) for p in problems), (text, problems)
    assert len(problems) == len(expected)


def test_client_auth_rules(tmp_path: Path) -> None:
    """A verifying client_auth_type needs a CA; a CA needs a verifying type; unverified types are refused."""
    base = {"cert_file": "c", "key_file": "k"}
    cases = {"RequireAndVerifyClientCert": "client_ca_file: required with client_auth_type",
             "RequireAnyClientCert": "accepts unverified certificates"}
    for auth, text in cases.items():
        with pytest.raises(WebConfigError) as err:
            parse_web_config({"tls_server_config": {**base, "client_auth_type": auth}}, tmp_path)
        assert text in err.value.problems[0]
    with pytest.raises(WebConfigError) as err:
        parse_web_config({"tls_server_config": {**base, "client_ca_file": "ca"}}, tmp_path)
    assert "without a client_auth_type that verifies" in err.value.problems[0]
    with pytest.raises(WebConfigError) as err:
        parse_web_config({"tls_server_config": {**base, "min_version": "TLS13", "max_version": "TLS12"}}, tmp_path)
    assert "above max_version" in err.value.problems[0]


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    """A list or scalar document is one clear problem."""
    with pytest.raises(WebConfigError) as err:
        parse_web_config(["tls_server_config"], tmp_path)
    assert err.value.problems == ["top level: must be a mapping, got list"]


# --- gzip negotiation and basic auth (pure) ------------------------------------------------------
@pytest.mark.parametrize(("header", "wanted"), [
    ("gzip", True), ("deflate, gzip;q=0.5", True), ("GZIP", True), ("*", True), ("x-gzip", True),
    (None, False), ("", False), ("identity", False), ("gzip;q=0", False), ("*, gzip;q=0", False),
    ("br;q=1, deflate", False), ("gzip;q=bad", False)])
def test_accepts_gzip(header: str | None, wanted: bool) -> None:
    """Accept-Encoding: gzip allowed explicitly or via `*`, q=0 refuses."""
    assert accepts_gzip(header) is wanted


def test_gzip_body_round_trips_deterministically() -> None:
    """The compressed body decodes to the original and does not depend on the time."""
    body = b"sglang_tuning_up 1.0\n" * 100
    assert gzip.decompress(gzip_body(body)) == body
    assert gzip_body(body) == gzip_body(body) and len(gzip_body(body)) < len(body) // 10


def test_only_the_probe_paths_skip_basic_auth() -> None:
    """/-/healthy and /-/ready (any query) are exempt; every other path, and look-alikes, need auth."""
    assert not needs_auth("/-/healthy") and not needs_auth("/-/ready") and not needs_auth("/-/ready?x=1")
    for path in ("/metrics", "/", "/api/findings", "/-/healthy/", "/-/healthyx", "//-/healthy", "/-/Ready"):
        assert needs_auth(path), path


def test_basic_auth_checks() -> None:
    """Right password passes; wrong password, unknown user, malformed or non-Basic headers fail."""
    auth = BasicAuth((("alice", ALICE_HASH.encode()),))
    assert auth.enabled and auth.check(_basic("alice", "s3cret"))
    for header in (None, "", _basic("alice", "wrong"), _basic("mallory", "s3cret"), "Bearer abc",
                   "Basic !!!notbase64", "Basic " + base64.b64encode(b"no-colon").decode(),
                   _basic("alice", "s3cret" + "x" * 80)):
        assert not auth.check(header), header
    assert BasicAuth(()).check(None)  # no users configured: open, as without a web config


def _count_bcrypt(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    calls: list[bytes] = []
    real = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        calls.append(password)
        return real(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counting)
    return calls


def test_basic_auth_caches_results(monkeypatch: pytest.MonkeyPatch) -> None:
    """A repeated good login skips bcrypt, and so does a repeated bad one: 100 identical bad attempts
    (known or unknown user) cost one bcrypt each, not 100; a new password pays again."""
    calls = _count_bcrypt(monkeypatch)
    auth = BasicAuth((("alice", ALICE_HASH.encode()),))
    assert auth.check(_basic("alice", "s3cret")) and auth.check(_basic("alice", "s3cret"))
    assert len(calls) == 1
    for _ in range(100):
        assert not auth.check(_basic("alice", "nope"))
        assert not auth.check(_basic("mallory", "s3cret"))
    assert len(calls) == 3
    assert not auth.check(_basic("alice", "nope2"))
    assert len(calls) == 4
    assert auth.check(_basic("alice", "s3cret")) and len(calls) == 4  # the good entry was not pushed out


def test_basic_auth_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Distinct bad passwords fill a bounded cache (oldest out), never memory without end."""
    calls = _count_bcrypt(monkeypatch)
    auth = BasicAuth((("alice", ALICE_HASH.encode()),), cache_size=4)
    for i in range(10):
        assert not auth.check(_basic("alice", f"bad{i}"))
    assert auth.cached() == 4 and len(calls) == 10
    assert not auth.check(_basic("alice", "bad0"))  # pushed out: pays again
    assert len(calls) == 11


def test_bcrypt_runs_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flood of new passwords gets one bcrypt at a time: while one runs, another new password waits at
    most `busy_wait_s` and is then refused as busy (HTTP 429); cached answers are not held up."""
    auth = BasicAuth((("alice", ALICE_HASH.encode()),), busy_wait_s=0.05)
    assert auth.check(_basic("alice", "s3cret"))  # cached before the flood
    entered, release = threading.Event(), threading.Event()

    def stuck(password: bytes, hashed: bytes) -> bool:
        entered.set()
        release.wait(10)
        return False

    monkeypatch.setattr(bcrypt, "checkpw", stuck)
    first = threading.Thread(target=auth.check, args=(_basic("alice", "guess1"),))
    first.start()
    try:
        assert entered.wait(10)
        with pytest.raises(AuthBusy):
            auth.check(_basic("alice", "guess2"))
        assert auth.check(_basic("alice", "s3cret"))  # from the cache, while bcrypt is busy
    finally:
        release.set()
        first.join(10)
    assert not auth.check(_basic("alice", "guess1"))  # cached failure, no bcrypt


# --- real servers on 127.0.0.1 -------------------------------------------------------------------
def _app() -> WebApp:
    st = LiveState(window_s=600, max_ranks=8, expire_after_s=600, enabled={"log": True, "metrics": True})
    st.set_server(version="0.5.23", model_name="m", args={"schedule_conservativeness": 1.0})
    st.add_observations([Observation(1.0, "num_queue_reqs", 3, Rank(dp=0))], now=1.0)
    snapshot = lambda: st.snapshot(3.0)  # noqa: E731
    return WebApp(snapshot=snapshot, registry=make_registry(TuningCollector(snapshot, BUILD)),
                  ready=lambda: True, build=BUILD)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A server and a client self-signed certificate (each its own CA), made with Debian's openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: cannot make test certificates")
    d = tmp_path_factory.mktemp("certs")
    server_cert, server_key = self_signed(d, "server")
    client_cert, client_key = self_signed(d, "client")
    return {"server_cert": server_cert, "server_key": server_key, "client_cert": client_cert,
            "client_key": client_key, "dir": d}


@pytest.fixture
def serving() -> Iterator[list[ThreadingHTTPServer]]:
    """Servers started by a test; shut down and closed afterwards."""
    servers: list[ThreadingHTTPServer] = []
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


def _start(servers: list[ThreadingHTTPServer], web: WebConfig | None) -> int:
    server, _ = start_http(_app(), "127.0.0.1", 0, web)
    servers.append(server)
    return int(server.server_address[1])


def _https_get(port: int, path: str, ctx: ssl.SSLContext,
               headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _write_config(directory: Path, text: str) -> Path:
    path = directory / "web.yml"
    path.write_text(text)
    return path


def test_tls_and_basic_auth_on_loopback(certs: dict[str, Path], serving: list[ThreadingHTTPServer],
                                        tmp_path: Path) -> None:
    """HTTPS served with the configured cert; 401 without or with wrong credentials; 200 with right ones."""
    path = _write_config(tmp_path, f"tls_server_config:\n  cert_file: {certs['server_cert']}\n"
                                   f"  key_file: {certs['server_key']}\n"
                                   f"basic_auth_users:\n  alice: '{ALICE_HASH}'\n"
                                   "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n")
    port = _start(serving, load_web_config(path))
    ctx = ssl.create_default_context(cafile=str(certs["server_cert"]))
    status, headers, _ = _https_get(port, "/metrics", ctx)
    assert status == 401 and headers["www-authenticate"].startswith("Basic")
    for path_ in ("/", "/api/findings", "/metrics?x=1"):  # every data endpoint is protected
        assert _https_get(port, path_, ctx, {"Authorization": _basic("alice", "wrong")})[0] == 401
    # The probes answer without credentials (kubelet and compose healthchecks carry none), over TLS.
    assert _https_get(port, "/-/healthy", ctx)[0] == 200
    assert _https_get(port, "/-/ready?verbose", ctx, {"Authorization": _basic("alice", "wrong")})[0] in (200, 503)
    assert _https_get(port, "/-/healthy/../metrics", ctx)[0] in (401, 404)  # no path games past the exemption
    status, headers, body = _https_get(port, "/metrics", ctx, {"Authorization": _basic("alice", "s3cret")})
    assert status == 200 and b"sglang_tuning_queue_requests" in body
    assert headers["x-content-type-options"] == "nosniff"


def test_plain_http_is_refused_on_the_tls_port(certs: dict[str, Path], serving: list[ThreadingHTTPServer]) -> None:
    """A plain-HTTP request to the HTTPS listener gets no HTTP answer, and the server keeps serving."""
    port = _start(serving, WebConfig(tls=TLSConfig(certs["server_cert"], certs["server_key"])))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        conn.request("GET", "/-/healthy")
        conn.getresponse()
    conn.close()
    ctx = ssl.create_default_context(cafile=str(certs["server_cert"]))
    assert _https_get(port, "/-/healthy", ctx)[0] == 200


def test_client_certificates_required(certs: dict[str, Path], serving: list[ThreadingHTTPServer]) -> None:
    """RequireAndVerifyClientCert: no client certificate, no answer; the CA's certificate gets 200."""
    tls = TLSConfig(certs["server_cert"], certs["server_key"], client_auth_type="RequireAndVerifyClientCert",
                    client_ca_file=certs["client_cert"])
    port = _start(serving, WebConfig(tls=tls))
    ctx = ssl.create_default_context(cafile=str(certs["server_cert"]))
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
        _https_get(port, "/-/healthy", ctx)
    ctx.load_cert_chain(str(certs["client_cert"]), str(certs["client_key"]))
    assert _https_get(port, "/-/healthy", ctx)[0] == 200


def test_min_version_is_enforced(certs: dict[str, Path], serving: list[ThreadingHTTPServer]) -> None:
    """min_version TLS13 refuses a client capped at TLS 1.2."""
    port = _start(serving, WebConfig(tls=TLSConfig(certs["server_cert"], certs["server_key"], min_version="TLS13")))
    ctx = ssl.create_default_context(cafile=str(certs["server_cert"]))
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _https_get(port, "/-/healthy", ctx)


def test_gzip_metrics_decode_to_the_plain_exposition(serving: list[ThreadingHTTPServer]) -> None:
    """Accept-Encoding: gzip -> Content-Encoding gzip + Vary, same exposition once decoded; others untouched."""
    port = _start(serving, None)

    def get(path: str, headers: dict[str, str]) -> tuple[dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            return {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    plain_headers, plain = get("/metrics", {"Accept-Encoding": "identity"})
    zipped_headers, zipped = get("/metrics", {"Accept-Encoding": "gzip"})
    assert "content-encoding" not in plain_headers and plain_headers["vary"] == "Accept-Encoding"
    assert zipped_headers["content-encoding"] == "gzip" and zipped_headers["vary"] == "Accept-Encoding"
    assert int(zipped_headers["content-length"]) == len(zipped) < len(plain)
    # Without this process's own metrics: its CPU seconds move between the two requests.
    def stable(body: bytes) -> list[bytes]:
        return [line for line in body.splitlines() if not line.startswith(b"process_")]

    assert stable(gzip.decompress(zipped)) == stable(plain) and len(stable(plain)) > 20
    page_headers, _ = get("/", {"Accept-Encoding": "gzip"})
    assert "content-encoding" not in page_headers  # only /metrics is compressed


def test_load_reports_unreadable_and_mismatched_files(certs: dict[str, Path], tmp_path: Path) -> None:
    """Missing files are listed; a key that does not match the certificate is caught at load, not at serve."""
    path = _write_config(tmp_path, "tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n")
    with pytest.raises(WebConfigError) as err:
        load_web_config(path)
    assert [p.split(":")[0] for p in err.value.problems] == ["tls_server_config.cert_file",
                                                             "tls_server_config.key_file"]
    path = _write_config(tmp_path, f"tls_server_config:\n  cert_file: {certs['server_cert']}\n"
                                   f"  key_file: {certs['client_key']}\n")
    with pytest.raises(WebConfigError) as err:
        load_web_config(path)
    assert "cannot load certificate/key/CA" in err.value.problems[0]
    path = _write_config(tmp_path, "tls_server_config: [\n")
    with pytest.raises(WebConfigError) as err:
        load_web_config(path)
    assert str(path) in err.value.problems[0]


def test_serve_with_bad_web_config_exits_2_listing_every_problem(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`serve --web.config.file bad.yml` exits 2; each problem is one stderr line, other flag problems too."""
    path = _write_config(tmp_path, "tls_server_config:\n  cert_file: missing.crt\n  client_auth_type: Maybe\n"
                                   "basic_auth_users:\n  bob: hunter2\nhttp2: true\n")
    assert cli.main(["serve", "--sglang.url", "http://127.0.0.1:1", "--ranks.max", "0",
                     "--web.config.file", str(path)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("serve: --web.config.file: ")]
    assert len(lines) == 5, err
    for text in ("cert_file", "key_file: required", "client_auth_type", "bob: not a bcrypt hash", "http2: unknown"):
        assert any(text in line for line in lines), text
    assert "--ranks.max" in err and "Traceback" not in err
    assert cli.main(["serve", "--sglang.url", "http://127.0.0.1:1", "--web.config.file", str(tmp_path / "no.yml")]) == 2
    assert "--web.config.file: " in capsys.readouterr().err




@pytest.mark.integration
def test_serve_process_over_https_with_auth(certs: dict[str, Path], tmp_path: Path) -> None:
    """The real `serve` process with a web config answers HTTPS + basic auth on 127.0.0.1, gzip included."""
    path = _write_config(tmp_path, f"tls_server_config:\n  cert_file: {certs['server_cert']}\n"
                                   f"  key_file: {certs['server_key']}\nbasic_auth_users:\n  alice: '{ALICE_HASH}'\n")
    cmd = [sys.executable, "-m", "sglang_tuning_exporter", "serve", "--web.listen-address", "127.0.0.1:0",
           "--sglang.url", f"http://127.0.0.1:{free_port()}", "--sglang.scrape-timeout", "1s",
           "--web.config.file", str(path)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        # readline blocks: a watchdog ends the process if it never reports its port.
        watchdog = threading.Timer(30, proc.kill)
        watchdog.start()
        port = announced_port(proc.stderr, suffix=" (metrics /metrics, https, basic auth)")
        watchdog.cancel()
        assert port, "serve did not report listening with https and basic auth"
        ctx = ssl.create_default_context(cafile=str(certs["server_cert"]))
        assert _https_get(port, "/metrics", ctx)[0] == 401
        # What the shipped probes do: no credentials, and still an answer (docs/deploy.md, "Probes").
        assert _https_get(port, "/-/healthy", ctx)[0] == 200
        status, headers, body = _https_get(port, "/metrics", ctx, {"Authorization": _basic("alice", "s3cret"),
                                                                   "Accept-Encoding": "gzip"})
        assert status == 200 and headers["content-encoding"] == "gzip"
        assert b"sglang_tuning_up 0.0" in gzip.decompress(body)
    finally:
        stop_process(proc)
    assert proc.returncode == 0


def test_a_bcrypt_flood_gets_429_and_the_probes_still_answer(serving: list[ThreadingHTTPServer],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """While bcrypt is busy with one new password and another waits for it, a third new password is
    answered 429 with Retry-After at once, and /-/healthy answers meanwhile."""
    entered, release = threading.Event(), threading.Event()

    def stuck(password: bytes, hashed: bytes) -> bool:
        entered.set()
        release.wait(10)
        return False

    monkeypatch.setattr(bcrypt, "checkpw", stuck)
    port = _start(serving, WebConfig(users=(("alice", ALICE_HASH.encode()),)))

    def get(path: str, password: str | None = None) -> tuple[int, str | None]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("GET", path, headers={"Authorization": _basic("alice", password)} if password else {})
            resp = conn.getresponse()
            resp.read()
            return resp.status, resp.getheader("Retry-After")
        finally:
            conn.close()

    results: list[tuple[int, str | None]] = []
    first = threading.Thread(target=lambda: results.append(get("/metrics", "guess-1")))
    first.start()
    try:
        assert entered.wait(10)
        with ThreadPoolExecutor(max_workers=2) as pool:
            pending = [pool.submit(get, "/metrics", f"guess-{i}") for i in (2, 3)]
            assert get("/-/healthy") == (200, None)
            answers = [p.result(timeout=10) for p in pending]
        assert (429, "1") in answers, answers
    finally:
        release.set()
        first.join(10)
    assert results == [(401, None)]
    assert serving[0].stats.counts()[2][429] == answers.count((429, "1"))  # sglang_tuning_http_requests_total
