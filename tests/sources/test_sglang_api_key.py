"""SGLang started with --api-key: the sidecar sends the key from --sglang.api-key-file as a bearer token,
and no secret of the server (its --api-key, --admin-api-key, HF token, credentials in URLs, `*_secret`
arguments) reaches any output of ours: `parse`, `diagnose` in every format, the sidecar's pages, JSON,
metrics and log lines, and the fleet report (issue 23; the rule is core/redact)."""

from __future__ import annotations

import http.server
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_tuning_exporter import cli
from sglang_tuning_exporter.sidecar.serveconfig import ServeConfigError, add_serve_flags, build_config
from sglang_tuning_exporter.sources.serverinfo import HttpError, urllib_get

KEY = "s3cret-key"
# Every planted secret holds this marker: no output may show it. The server-info stand-in plants its own
# values (`-info`), distinct from the log's, so a leak names its way in.
MARK = "PLANTED"
INFO_FETCHES = [0]


def _info_document() -> bytes:
    """/server_info of a server started with every kind of secret; each fetch rotates the API key and
    moves a tracked flag (a change for /api/changes)."""
    n = INFO_FETCHES[0]
    INFO_FETCHES[0] += 1
    doc = {"version": "0.5.23", "model_path": f"https://hub:{MARK}-info-modelpass@models.internal/qwen",
           "tp_size": 1, "chunked_prefill_size": 8192 if n == 0 else 4096, "mem_fraction_static": 0.85,
           "api_key": f"sk-{MARK}-info-api-{n}", "admin_api_key": f"{MARK}-info-admin",
           "hf_token": f"hf_{MARK}infohf", "storage_secret": f"{MARK}-info-secret",
           "otlp_traces_endpoint": f"https://otel:{MARK}-info-urlpass@collector:4318",
           "load_publish_endpoint": f"https://hub/p?x=1&token={MARK}-info-querytok",
           "launch_command": f"python -m sglang.launch_server --api-key sk-{MARK}-info-cmd",
           "max_total_num_tokens": 421888}
    return json.dumps(doc).encode()


class _KeyedHandler(http.server.BaseHTTPRequestHandler):
    """Answers like SGLang with --api-key: 401 unless `Authorization: Bearer <key>`."""

    def do_GET(self) -> None:
        ok = self.headers.get("Authorization") == f"Bearer {KEY}"
        body = b"sglang:num_queue_reqs 3\n" if ok else b"unauthorized"
        if ok and self.path == "/server_info":
            body = _info_document()
        self.send_response(200 if ok else 401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
        pass


@pytest.fixture
def keyed_server() -> Iterator[str]:
    """A loopback HTTP server that demands the API key."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KeyedHandler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_key_is_sent_as_bearer_token(keyed_server: str) -> None:
    """Without the key SGLang answers 401; with it, the body."""
    with pytest.raises(HttpError) as err:
        urllib_get(keyed_server + "/metrics", 2.0)
    assert err.value.args[0].startswith("HTTP 401")
    assert urllib_get(keyed_server + "/metrics", 2.0, api_key=KEY) == b"sglang:num_queue_reqs 3\n"


def _args(*argv: str) -> object:
    import argparse

    p = argparse.ArgumentParser()
    add_serve_flags(p)
    return p.parse_args(list(argv))


def test_key_file_is_read_and_stripped(tmp_path: Path) -> None:
    """The key file's trailing newline is not part of the key."""
    f = tmp_path / "key"
    f.write_text(KEY + "\n")
    cfg = build_config(_args("--sglang.url", "http://127.0.0.1:30000", "--sglang.api-key-file", str(f)))  # type: ignore[arg-type]
    assert cfg.sglang_api_key == KEY


def test_missing_or_empty_key_file_is_a_listed_problem(tmp_path: Path) -> None:
    """An unreadable or empty key file fails at start with the flag named."""
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for path in (tmp_path / "nope", empty):
        with pytest.raises(ServeConfigError) as err:
            build_config(_args("--sglang.url", "http://x:1", "--sglang.api-key-file", str(path)))  # type: ignore[arg-type]
        assert any(p.startswith("--sglang.api-key-file") for p in err.value.problems)


def test_serve_rejects_bad_key_file_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The whole command: exit 2, no traceback."""
    code = cli.main(["serve", "--sglang.url", "http://127.0.0.1:1", "--sglang.api-key-file", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert code == 2 and "--sglang.api-key-file" in err and "Traceback" not in err


def test_sidecar_scrapes_a_keyed_server(keyed_server: str, tmp_path: Path) -> None:
    """`serve` wiring: with the key file the scrape succeeds (metrics source up); without it, it fails."""
    from sglang_tuning_exporter.sidecar.serve import build_sidecar

    f = tmp_path / "key"
    f.write_text(KEY)
    for argv, expect_up in (((), False), (("--sglang.api-key-file", str(f)), True)):
        cfg = build_config(_args("--sglang.url", keyed_server, *argv))  # type: ignore[arg-type]
        sidecar = build_sidecar(cfg)
        sidecar.tick(1000.0)
        assert sidecar.state.snapshot(1000.0).sources["metrics"].up is expect_up, argv


# --- no secret reaches an output (issue 23) -------------------------------------------------------
LOG_SECRETS = {"api_key": f"sk-{MARK}-log-api", "admin_api_key": f"{MARK}-log-admin", "hf_token": f"hf_{MARK}loghf",
               "storage_secret": f"{MARK}-log-secret",
               "otlp_traces_endpoint": f"https://otel:{MARK}-log-urlpass@collector:4318",
               "load_publish_endpoint": f"https://hub/p?token={MARK}-log-querytok&x=1"}
CLI_ARGS = ("--server-arg", f"hf_token={MARK}-cli-hf", "--server-arg", f"db_password={MARK}-cli-pass")


def _secret_log(path: Path) -> Path:
    """Two startup sections of one server (the second with a rotated key and another chunked prefill
    size), traffic, an unparsable `server_args` line and an error quoting a URL with a token."""
    from helpers.scenario_logs import LogWriter, steady

    w = LogWriter("0.5.23")
    w.server_args(chunked_prefill_size=8192, mem_fraction_static=0.85, **LOG_SECRETS)
    w.startup(total=80.0, weights=15.3, kv=52.0, graph=1.1, available=8.0).tick(60)
    steady(w, 12, every_s=5.0, running=300, usage=0.95, queue=150)
    w.add(f"server_args= api_key='sk-{MARK}-unparsed' (not a dump we can read)")
    w.add(f"Scheduler hit an exception: 401 Client Error for url: https://hf.co/api/x?token={MARK}-errtok")
    w.server_args(chunked_prefill_size=4096, mem_fraction_static=0.85, **{**LOG_SECRETS, "api_key": f"sk-{MARK}-log-rotated"})
    w.startup(total=80.0, weights=15.3, kv=52.0, graph=1.1, available=8.0).tick(60)
    steady(w, 12, every_s=5.0, running=300, usage=0.95, queue=150)
    path.write_text(w.text(), encoding="utf-8")
    return path


def _clean(where: str, text: str) -> None:
    assert MARK not in text, f"{where} shows a secret: ...{text[max(0, text.find(MARK) - 80):text.find(MARK) + 40]}..."


def test_parse_shows_no_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`parse` (with --stats: its unparsed examples quote lines): the args are there, secrets as ***."""
    log = _secret_log(tmp_path / "s.log")
    cli.main(["parse", str(log), "--stats"])
    out, err = capsys.readouterr()
    _clean("parse", out + err)
    args = [json.loads(line)["fields"] for line in out.splitlines() if '"server_args"' in line]
    assert len(args) == 2 and all(a["api_key"] == a["hf_token"] == "***" for a in args)
    assert args[0]["otlp_traces_endpoint"] == "https://***@collector:4318"
    assert args[0]["load_publish_endpoint"] == "https://hub/p?token=***&x=1"
    assert "unparsed line" in err and "api_key='***'" in err


@pytest.mark.parametrize("fmt", ["text", "json", "markdown", "html"])
def test_diagnose_shows_no_secret(tmp_path: Path, fmt: str) -> None:
    """Every diagnose format, with a changes section (the key rotated between the two starts) and
    --server-arg secrets of our own command line."""
    from helpers.runners import diagnose_run

    log = _secret_log(tmp_path / "s.log")
    code, out, err = diagnose_run([str(log), "--format", fmt, "--jobs", "1", *CLI_ARGS])
    assert code == 0, err
    _clean(f"diagnose --format {fmt}", out + err)
    assert "4096" in out  # the changes section is there: a flag change it does show
    if fmt == "json":
        doc = json.loads(out)
        server = doc["server"]["args"]
        assert server["api_key"] == server["admin_api_key"] == server["storage_secret"] == "***"
        assert server["hf_token"] == server["db_password"] == "***"  # --server-arg's, redacted as the log's


def test_sidecar_shows_no_secret(keyed_server: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The sidecar following the log and fetching a keyed /server_info twice (the key rotated, a flag
    changed): `/`, `/api/findings`, `/api/changes`, `/metrics` and its own log lines show no secret."""
    from helpers.runners import get
    from sglang_tuning_exporter.sidecar.serve import build_sidecar, make_web

    log = _secret_log(tmp_path / "s.log")
    key = tmp_path / "key"
    key.write_text(KEY)
    caplog.set_level(logging.DEBUG)
    INFO_FETCHES[0] = 0
    cfg = build_config(_args("--sglang.url", keyed_server.replace("http://", f"http://u:{MARK}-url@"),
                             "--sglang.api-key-file", str(key), "--sglang.log-file", str(log), "--from-start",
                             "--sglang.scrape-interval", "1s", "--evaluation-interval", "1s",
                             *CLI_ARGS))  # type: ignore[arg-type]
    sidecar = build_sidecar(cfg)
    clock = {"t": 1000.0}
    app = make_web(cfg, sidecar, clock=lambda: clock["t"])
    for t in (1000.0, 1001.0, 1070.0, 1071.0, 1140.0):  # server info every 60 s: three fetches
        clock["t"] = t
        sidecar.tick(t)
    assert INFO_FETCHES[0] >= 2
    pages = {path: get(app, path) for path in ("/", "/api/findings", "/api/changes", "/metrics")}
    for path, (status, body) in pages.items():
        assert status == 200, path
        _clean(path, body)
    _clean("the sidecar's log", caplog.text)
    server = json.loads(pages["/api/findings"][1])["server"]["args"]
    assert server["api_key"] == server["admin_api_key"] == server["storage_secret"] == server["hf_token"] == "***"
    assert server["otlp_traces_endpoint"] == "https://***@collector:4318"
    assert "<td>***</td>" in pages["/"][1]  # shown present, never its value
    changes = json.loads(pages["/api/changes"][1])
    assert any(c["flag"] == "--chunked-prefill-size" and c["source"] == "server_info" for c in changes["changes"])
    assert 'sglang_tuning_server_info{' in pages["/metrics"][1]


def test_fleet_report_shows_no_secret() -> None:
    """The report reads the exporters' series (already redacted there); a series from elsewhere that
    carries a secret in a label or as an argument's value is redacted by the same rule."""
    from sglang_tuning_exporter.core.model import Finding
    from sglang_tuning_exporter.fleet import formats as report_formats
    from sglang_tuning_exporter.fleet import queries as fleet
    from sglang_tuning_exporter.fleet.document import FleetReport
    from sglang_tuning_exporter.fleet.promapi import Sample
    from sglang_tuning_exporter.fleet.report import evaluate_fleet

    def s(value: float, **labels: str) -> Sample:
        return Sample(labels=labels, value=value)

    data = fleet.collect({
        "args": [s(0.85, instance="a:1", arg="mem_fraction_static"), s(20261128, instance="a:1", arg="watermark_key"),
                 s(0.8, instance="b:1", arg="mem_fraction_static"), s(7, instance="b:1", arg="watermark_key")],
        "info": [s(1, instance="a:1", version="0.5.23", model_name=f"https://u:{MARK}-label@hub/m",
                   schedule_policy=f"lpm?token={MARK}-policy")],
        "models": [s(1, instance="b:1", model_name=f"https://u:{MARK}-label@hub/m")],
    })
    assert data["a:1"].args["watermark_key"] == "***"

    def fake(signals: object, d: fleet.InstanceData, window_s: float) -> list[Finding]:
        return [Finding(check="retractions_frequent", status="ok", rank={}, flag=None, action="a", current=None,
                        suggested=None, summary="s", evidence="e", tradeoff="t")]

    instances = evaluate_fleet(data, fake, {}, 3600.0)
    rep = FleetReport(prometheus="http://prom:9090", start=0.0, end=3600.0, queries=1, profile="docs-2025",
                      workload="throughput", selector="", instances=tuple(instances),
                      drift=tuple(fleet.find_drift(data.values())), checks=("retractions_frequent",))
    for fmt in ("json", "markdown", "html"):
        _clean(f"report --format {fmt}", report_formats.render(rep, fmt))


def test_model_name_from_sglang_metrics_is_redacted() -> None:
    """A sidecar without server info names the model from SGLang's `model_name` label: a served name
    given as a URL with credentials is shown without them (it labels every per-rank series)."""
    from sglang_tuning_exporter.sidecar.state import LiveState

    state = LiveState(window_s=600.0, max_ranks=8, expire_after_s=600.0,
                      enabled={"log": False, "metrics": True, "server_info": False})
    state.record_scrape(garbage_lines=0, samples=1, model_name=f"https://u:{MARK}-metrics@hub/m", restarted=False)
    assert state.snapshot(0.0).model_name == "https://***@hub/m"
