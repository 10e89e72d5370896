"""The one rule for secrets: what a server argument or a piece of text may not show (docs/sidecar.md, "Secrets").

Every input that can carry a server's secrets redacts them where it enters (the `server_args=` log line,
the server-info document, `--server-arg` and the configuration file's `server_args`, the text of log
lines we keep as examples or messages), so no page, JSON document, metric label, report or log line of
ours can show one. A redacted value reads `***`: its presence shows, its value never.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

MASK = "***"

# Words of an argument name that make ANY value of it a secret (SGLang's --api-key, --admin-api-key,
# --ssl-keyfile-password, --watermark-key; a `*_secret`, `*_credentials` of a newer release).
_ALWAYS = frozenset({"key", "apikey", "secret", "secrets", "password", "passwd", "passphrase", "pwd",
                     "credential", "credentials", "privatekey", "cookie", "authorization", "bearer"})
# Words that mark a secret only when the value is text: `hf_token` and `auth` hold strings, while
# `kt_max_deferred_experts_per_token` or `tbo_token_distribution_threshold` are numbers to tune.
_TEXT_ONLY = frozenset({"auth", "authentication"})  # and "token" as the last word: `hf_token`, not `token_map`
_GLUED = ("apikey", "secret", "passw", "credential", "accesstoken", "authtoken", "privatekey")

_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_WORD_SPLIT = re.compile(r"[^a-z0-9]+")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")

# Every pattern starts only where a word starts (a look-behind), so a 1 MiB line costs linear time.
# `scheme://user:pass@host` or `scheme://token@host`: the whole userinfo goes.
_URL_USERINFO = re.compile(r"(?<![A-Za-z0-9+.-])(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@?#'\"]+@")
# A value: quoted (to its closing quote, or the end of a cut text) or bare.
_VALUE = r"(?P<value>\"[^\"]*\"?|'[^']*'?|[^\s\"'&,;}\])]+)"
# A name before its value: `name=value`, `name: value`, `"name": "value"`, `?name=value&...`, and
# `--api-key VALUE` / `--hf-token=VALUE` in a command line. Only the name is matched: a value is read
# (and skipped) only after a secret name, so `url='https://h/?token=x'` still has its token found.
_NAME = re.compile(r"(?<![A-Za-z0-9_.-])(?P<name>--[A-Za-z][A-Za-z0-9_-]*(?:=|[ \t]+(?=[^-\s]))"
                   r"|[A-Za-z_][A-Za-z0-9_.-]*[\"']?[ \t]*[:=][ \t]*)")
_VALUE_AT = re.compile(_VALUE)
_BEARER = re.compile(r"(?i)(?<![A-Za-z0-9_])(?P<scheme>bearer|basic)[ \t]+[A-Za-z0-9._~+/=-]{8,}")
# Values that say nothing of a secret, in text as in data.
_EMPTY = frozenset({"", "None", "none", "null", "True", "False", "true", "false", "''", '""', MASK})


def _words(name: str) -> list[str]:
    return [w for w in _WORD_SPLIT.split(_CAMEL.sub(r"\1_\2", name).lower()) if w]


@functools.lru_cache(maxsize=4096)
def _kind(name: str) -> str | None:
    """How `name` marks a secret: "always" (any value), "text" (a text value) or None (no secret)."""
    words = _words(name)
    if not words:
        return None
    if _ALWAYS.intersection(words):
        return "always"
    glued = "".join(words)
    if any(g in glued for g in _GLUED):
        return "always"
    if _TEXT_ONLY.intersection(words) or words[-1] == "token":
        return "text"
    return None


def is_secret_name(name: str) -> bool:
    """Whether an argument called `name` may hold a secret (its value is redacted, at least when text)."""
    return _kind(name) is not None


def _hide(value: Any, kind: str) -> Any:
    """A secret argument's value: None, booleans and empty text say nothing; numbers only under
    an "always" name (a token count is no token)."""
    if value is None or isinstance(value, bool) or value == "":
        return value
    if isinstance(value, (int, float)):
        return MASK if kind == "always" else value
    if isinstance(value, (list, tuple)):
        return [_hide(v, kind) for v in value]
    if isinstance(value, Mapping):
        return {k: _hide(v, kind) for k, v in value.items()}
    if kind == "text" and isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        return value
    return MASK


def redact_value(name: str, value: Any) -> Any:
    """`value` as argument `name` may show it: a secret's value masked, secrets inside text removed
    (URL credentials, `token=` parameters), nested lists and mappings walked."""
    kind = _kind(name)
    if kind is not None:
        return _hide(value, kind)
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, (list, tuple)):
        return [redact_value(name, v) for v in value]
    if isinstance(value, Mapping):
        return {k: redact_value(str(k), v) for k, v in value.items()}
    return value


def redact_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """Server arguments with every secret redacted (redact_value on each)."""
    return {k: redact_value(str(k), v) for k, v in args.items()}


def _masked(value: str) -> str:
    """A matched value replaced by MASK, its quotes kept."""
    quote = value[0] if value[:1] in ("'", '"') else ""
    return quote + MASK + (quote if len(value) > 1 and value.endswith(quote) and quote else "")


def _keep(kind: str | None, value: str) -> bool:
    bare = value.strip("\"'")
    return kind is None or value in _EMPTY or bare in _EMPTY or (kind == "text" and _NUMBER.fullmatch(bare) is not None)


def redact_text(text: str) -> str:
    """`text` without the secrets it may carry: credentials in URLs, the value after a secret name
    (`api_key='...'`, `?token=...`, `"password": "..."`, `--api-key ...`) and bearer tokens."""
    if not text:
        return text
    text = _URL_USERINFO.sub(lambda m: m.group("scheme") + MASK + "@", text)
    text = _BEARER.sub(lambda m: m.group("scheme") + " " + MASK, text)
    parts: list[str] = []
    pos = 0
    for m in _NAME.finditer(text):
        if m.start() < pos:
            continue  # inside a value already masked
        kind = _kind(m.group("name").rstrip(" \t:=\"'"))
        value = _VALUE_AT.match(text, m.end()) if kind is not None else None
        if value is None or _keep(kind, value.group("value")):
            continue
        parts += (text[pos:m.end()], _masked(value.group("value")))
        pos = value.end()
    return "".join(parts) + text[pos:] if parts else text
