"""SGLang started with --api-key: the sidecar sends the key from --sglang.api-key-file as a bearer token."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_tuning_exporter import cli
from sglang_tuning_exporter.sidecar.serveconfig import ServeConfigError, add_serve_flags, build_config
from sglang_tuning_exporter.sources.serverinfo import HttpError, urllib_get

KEY = "s3cret-key"


class _KeyedHandler(http.server.BaseHTTPRequestHandler):
    """Answers like SGLang with --api-key: 401 unless `Authorization: Bearer <key>`."""

    def do_GET(self) -> None:
        ok = self.headers.get("Authorization") == f"Bearer {KEY}"
        body = b"sglang:num_queue_reqs 3\n" if ok else b"unauthorized"
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
