"""The marker rule: a test that starts a real process carries the `integration` marker, so that
`make test-fast` (`-m "not integration"`) never waits for Prometheus, Alertmanager, promtool, amtool,
kubectl, docker-compose, chromium or a `serve` subprocess. tests/conftest.py applies it to every process a
test starts; one-shot tools of the build (the Python interpreter running a CLI command other than `serve`,
lint-imports, openssl for a test certificate, a C compiler) are not real processes in this sense."""

from __future__ import annotations

import os
import sys
from typing import Any

ONE_SHOT_TOOLS = frozenset({"lint-imports", "openssl", "cc", "gcc", "clang"})


def argv_of(args: Any) -> list[str]:
    """Popen's `args` as a list of strings (a string or path is one program without arguments)."""
    if isinstance(args, (str, bytes, os.PathLike)):
        return [os.fsdecode(args)]
    return [os.fsdecode(a) for a in args]


def real_process(argv: list[str]) -> bool:
    """Whether `argv` starts a real component (a server, promtool, a browser) rather than a one-shot tool."""
    exe = os.path.basename(argv[0]) if argv else ""
    if exe in ONE_SHOT_TOOLS:
        return False
    if argv and (argv[0] == sys.executable or exe.startswith("python")):
        return "serve" in argv[1:] or any(a.endswith("stack.py") for a in argv[1:])
    return True
