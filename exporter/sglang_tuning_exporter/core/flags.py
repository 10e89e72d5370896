"""Exporter-style command-line flags with SGLANG_TUNING_* environment-variable mirrors."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sglang_tuning_exporter.core.durations import parse_duration

ENV_PREFIX = "SGLANG_TUNING_"
WORKLOADS = ("throughput", "latency", "long-context", "multi-turn")
# The checks table's profiles, newest first, named in --help (a test keeps them equal to checks.yaml).
GUIDE_PROFILES = ("upstream-2026", "docs-2025", "older-web", "older-md", "older-fragment")


# Flags whose values mean different things per command (diagnose's `text` format is no report format):
# only their per-command mirror is read, so one variable set for one command cannot break another.
PER_COMMAND_ONLY = frozenset({"--format", "--output"})


def env_name(flag: str, command: str | None = None) -> str:
    """`--sglang.log-file` -> `SGLANG_TUNING_SGLANG_LOG_FILE`; with `command="serve"`,
    `SGLANG_TUNING_SERVE_SGLANG_LOG_FILE`."""
    words = re.sub(r"[^A-Za-z0-9]+", "_", flag.lstrip("-")).upper()
    return ENV_PREFIX + (f"{command.upper()}_" if command else "") + words


def env_names(flag: str, command: str | None) -> list[str]:
    """The mirrors of `flag` in `command`, the first set wins: the per-command one, then the shared one."""
    names = [env_name(flag, command)] if command else []
    if command is None or flag not in PER_COMMAND_ONLY:
        names.append(env_name(flag))
    return names


def add_flag(parser: argparse.ArgumentParser, flag: str, *, help: str, **kwargs: Any) -> None:
    """Add `flag`; its default comes from an environment mirror when set, shown in --help.

    The command is the parser's `command` default (cli sets it before the command adds its flags)."""
    command = parser.get_default("command")
    names = env_names(flag, command if isinstance(command, str) else None)
    env = next((n for n in names if n in os.environ), None)
    if env is not None:
        raw = os.environ[env]
        if kwargs.get("action") == "store_true":
            kwargs["default"] = raw.strip().lower() in ("1", "true", "yes", "on")
        elif kwargs.get("action") == "append":
            kwargs["default"] = [v for v in raw.split(",") if v]
        else:
            kwargs["default"] = raw
            choices = kwargs.get("choices")
            if choices is not None and "type" not in kwargs:
                # argparse never checks a default against `choices`: check the mirrored value here.
                kwargs["type"] = _choice_of(tuple(choices), env, raw)
    default = kwargs.get("default")
    shown = f" (default: {default})" if default not in (None, False, []) else ""
    parser.add_argument(flag, help=f"{help}{shown} [env {' or '.join(names)}]", **kwargs)


def _choice_of(choices: tuple[str, ...], env: str, raw: str) -> Any:
    """An argparse type that rejects a value outside `choices`, naming the variable it came from."""
    def check(value: str) -> str:
        if value not in choices:
            source = f" (from {env})" if value == raw else ""
            raise argparse.ArgumentTypeError(
                f"invalid choice: {value!r}{source} (choose from {', '.join(choices)})")
        return value
    return check


def add_guide_flags(parser: argparse.ArgumentParser) -> None:
    """The options every guide-evaluating command shares (interfaces.md)."""
    add_flag(parser, "--guide-profile", default=None, metavar="NAME",
             help=f"which tuning-guide version's thresholds to apply: {', '.join(GUIDE_PROFILES)}; "
                  f"default the newest, {GUIDE_PROFILES[0]}")
    add_flag(parser, "--workload", default=None, choices=WORKLOADS,
             help="the guide's workload recipe the checks follow (default: the --config file's, else throughput)")
    add_flag(parser, "--config", default=None, metavar="FILE",
             help="YAML file overriding thresholds, windows and options")
    add_flag(parser, "--server-arg", action="append", default=[], metavar="KEY=VALUE",
             help="override a server argument the advice is computed from (repeatable)")


# --- values of flags, shared by serve and report: ValueError with the reason, the caller names the flag


def duration_flag(value: str, *, minimum: float = 0.0, bare_seconds: bool = True) -> float:
    """A duration flag in seconds (core/durations grammar; `bare_seconds=False`: a unit is required),
    at least `minimum` and more than 0: a zero interval, timeout or range is never a setting."""
    seconds = parse_duration(value, bare_seconds=bare_seconds)
    if seconds < minimum:
        raise ValueError(f"{value!r} is below the minimum of {minimum:g}s")
    if seconds <= 0:
        raise ValueError(f"invalid duration {value!r}: must be more than 0")
    return seconds


def is_http_url(url: str) -> bool:
    """An http(s) URL with a host, as both servers we talk to (SGLang, Prometheus) are reached."""
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.netloc) and not any(c.isspace() for c in parts.netloc)


def read_secret(path: str, what: str) -> str:
    """The stripped content of a file holding a secret (password, token, API key), never logged."""
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ValueError(f"cannot read {what} {path}: {reason}") from None

