"""The `server_args=` startup dump: `ServerArgs(...)` repr (<= 0.5.18) and dict repr (0.5.19+).

Values are read with `ast.literal_eval` piece by piece, never `eval`; a value that is not a Python
literal (an enum repr, an object) is kept as its source text so one odd field never loses the rest.
"""

from __future__ import annotations

import ast
import warnings
from collections.abc import Iterator
from typing import Any

from sglang_tuning_exporter.core.redact import redact_args

_OPEN = {"(": ")", "[": "]", "{": "}"}
_CLOSE = {")", "]", "}"}


def _literal(text: str) -> Any:
    text = text.strip()
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def _outside_quotes(text: str, start: int = 0) -> Iterator[tuple[int, str, int]]:
    """(index, char, bracket depth after it) for every char outside string literals, from `start`."""
    depth = 0
    quote = ""
    i = start
    n = len(text)
    while i < n:
        c = text[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        else:
            if c in _OPEN:
                depth += 1
            elif c in _CLOSE:
                depth = max(0, depth - 1)  # a stray closer must not hide the commas after it
            yield i, c, depth
        i += 1


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are outside quotes and brackets."""
    parts: list[str] = []
    begin = 0
    for i, c, depth in _outside_quotes(text):
        if c == "," and depth == 0:
            parts.append(text[begin:i])
            begin = i + 1
    tail = text[begin:]
    if tail.strip():
        parts.append(tail)
    return parts


def _matching_end(text: str, open_at: int) -> int:
    """Index of the bracket closing the one at `open_at`, or len(text) when the text is cut."""
    for i, c, depth in _outside_quotes(text, open_at):
        if c in _CLOSE and depth == 0:
            return i
    return len(text)


def _from_repr(inner: str) -> dict[str, Any]:
    """`model_path='x', tp_size=1, ...` (the inside of `ServerArgs(...)`)."""
    try:
        node = ast.parse(f"f({inner})", mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        node = None
    out: dict[str, Any] = {}
    if isinstance(node, ast.Call) and node.keywords:
        for kw in node.keywords:
            if kw.arg is None:
                continue
            try:
                out[kw.arg] = ast.literal_eval(kw.value)
            except (ValueError, SyntaxError, TypeError, RecursionError):
                out[kw.arg] = ast.unparse(kw.value)
        return out
    for piece in _split_top_level(inner):
        key, sep, value = piece.partition("=")
        key = key.strip()
        if sep and key.isidentifier():
            out[key] = _literal(value)
    return out


def _from_dict(text: str) -> dict[str, Any]:
    """`{'model_path': 'x', ...}`, literal as a whole or, failing that, pair by pair."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        value = None
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}
    out: dict[str, Any] = {}
    body = text.strip()
    if body.startswith("{"):
        body = body[1:]
    if body.endswith("}"):
        body = body[:-1]
    for piece in _split_top_level(body):
        key, sep, val = piece.partition(":")
        if not sep:
            continue
        k = _literal(key)
        if isinstance(k, str) and k.isidentifier():
            out[k] = _literal(val)
    return out


def parse_server_args(text: str) -> dict[str, Any] | None:
    """Parse the text from `server_args` onwards; None when no argument could be read. Secrets
    (`api_key`, `hf_token`, credentials in URLs...) are redacted here, where they enter (core/redact)."""
    # A stray backslash in a logged value (`'a\d'`) makes the compiler warn (a SyntaxWarning on
    # stderr from Python 3.12): the value is read all the same, so the warning is only noise.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        args = _parse_server_args(text)
    return redact_args(args) if args else None


def _parse_server_args(text: str) -> dict[str, Any] | None:
    at = text.find("ServerArgs(")
    brace = text.find("{")
    if at >= 0 and (brace < 0 or at < brace):
        open_at = at + len("ServerArgs")
        end = _matching_end(text, open_at)
        args = _from_repr(text[open_at + 1:end])
    elif brace >= 0:
        end = _matching_end(text, brace)
        args = _from_dict(text[brace:end + 1])
    else:
        return None
    return args or None
