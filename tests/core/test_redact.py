"""core/redact: the one rule for what a server argument or a text may not show (issue 23)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from helpers.paths import FIXTURES
from sglang_tuning_exporter.core.redact import MASK, is_secret_name, redact_args, redact_text, redact_value


@pytest.mark.parametrize("name", ["api_key", "admin_api_key", "hf_token", "ssl_keyfile_password", "watermark_key",
                                  "storage_secret", "db_passwd", "aws_credentials", "auth_token", "apiKey",
                                  "HF_TOKEN", "private_key", "enable_auth"])
def test_secret_names(name: str) -> None:
    """SGLang's own secrets and the usual spellings of others are secret names."""
    assert is_secret_name(name)


@pytest.mark.parametrize(("name", "value"), [
    ("max_total_tokens", 421888), ("max_prefill_tokens", 16384), ("kt_max_deferred_experts_per_token", 3),
    ("tbo_token_distribution_threshold", 0.48), ("ssl_keyfile", "/etc/tls/key.pem"), ("tokenizer_path", "/m"),
    ("speculative_token_map", "/maps/t.json"), ("model_path", "Qwen/Qwen2.5-7B"), ("chunked_prefill_size", 8192)])
def test_tuning_args_keep_their_values(name: str, value: object) -> None:
    """A token count, a path or a tokenizer is no secret: the checks read them as they are."""
    assert redact_value(name, value) == value


def test_values_under_secret_names() -> None:
    """Text is masked; None, booleans and empty text say nothing and stay; a number is masked under an
    always-secret name, kept under `token` (a token count)."""
    args = {"api_key": "sk-1", "admin_api_key": None, "hf_token": "hf_x", "watermark_key": 42, "enable_auth": True,
            "kt_max_deferred_experts_per_token": 3, "ssl_keyfile_password": "", "x_token": "12",
            "lora_paths": ["https://u:p@h/a", "/local"], "extra": {"token": "t", "n": 1}}
    assert redact_args(args) == {
        "api_key": MASK, "admin_api_key": None, "hf_token": MASK, "watermark_key": MASK, "enable_auth": True,
        "kt_max_deferred_experts_per_token": 3, "ssl_keyfile_password": "", "x_token": "12",
        "lora_paths": ["https://***@h/a", "/local"], "extra": {"token": MASK, "n": 1}}


@pytest.mark.parametrize(("text", "shown"), [
    ("https://user:pa%20ss@host/x", "https://***@host/x"),  # the userinfo goes whole
    ("git clone https://ghp_abc@github.com/o/r", "git clone https://***@github.com/o/r"),
    ("https://hub/p?x=1&token=abc&y=2", "https://hub/p?x=1&token=***&y=2"),
    ("ServerArgs(api_key='sk-1 2', hf_token=None, tp_size=2)", "ServerArgs(api_key='***', hf_token=None, tp_size=2)"),
    ('{"password": "p", "url": "https://h/?access_token=t"}', '{"password": "***", "url": "https://h/?access_token=***"}'),
    ("launch --api-key sk-9 --hf-token=hf_8 --tp 2", "launch --api-key *** --hf-token=*** --tp 2"),
    ("Authorization: Bearer abcdefghijkl", "Authorization: *** ***"),
    ("cut short: api_key='sk-abc", "cut short: api_key='***"),
    ("#token: 1234, token usage: 0.50, #queue-req: 3", "#token: 1234, token usage: 0.50, #queue-req: 3"),
    ("git@github.com:o/r.git", "git@github.com:o/r.git"),
])
def test_text(text: str, shown: str) -> None:
    """Credentials in URLs, values after secret names, command-line flags and bearer tokens; batch lines
    and plain text untouched."""
    assert redact_text(text) == shown


@pytest.mark.parametrize("text", ["a" * 1_000_000, "a=" * 500_000, "x://" * 250_000, "api_key=x " * 100_000,
                                  "a." * 500_000, "--a " * 250_000])
def test_text_costs_linear_time(text: str) -> None:
    """A 1 MiB log line (the follower's cap) of the worst shapes: well under a few seconds each."""
    start = time.perf_counter()
    redact_text(text)
    assert time.perf_counter() - start < 5.0


def test_real_server_info_keeps_every_tuning_value() -> None:
    """SGLang 0.5.23's /server_info: only the secret names change (api_key, admin_api_key, the SSL
    password, the watermark keys), every other value is the server's."""
    doc = json.loads(Path(FIXTURES / "sglang-0.5.23-server_info-toplevel.json").read_text(encoding="utf-8"))
    doc.update(api_key="sk-live", admin_api_key="adm", ssl_keyfile_password="pw", watermark_key=7)
    out = redact_args(doc)
    changed = sorted(k for k in doc if out[k] != doc[k])
    assert changed == ["admin_api_key", "api_key", "ssl_keyfile_password", "watermark_key"]
