"""Process harness for the end-to-end suite: loopback ports, start/stop with timeouts, readiness, cleanup.

Every process started here is registered; `stop_all()` runs at interpreter exit, and each child asks
the kernel for SIGTERM when its parent dies, so even a killed test run leaves nothing listening. Output goes to a log file per process, quoted on failure.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import requests

from helpers.netutil import (
    free_port as free_port,  # re-exported: the one definition is tests/helpers/netutil.py
)
from helpers.paths import TESTS

LOOPBACK = "127.0.0.1"

_RUNNING: list[ManagedProcess] = []


def python_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for our Python children: `tests/` importable, no SGLANG_TUNING_* leaking in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_TUNING_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class ProcessError(RuntimeError):
    """A managed process failed to start, become ready, or exited early."""


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the parent dies (Linux), even if it is SIGKILLed."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: atexit and the fixtures still stop everything on a normal exit


class ManagedProcess:
    """One child process with its output captured to `log_path`."""

    def __init__(self, name: str, argv: Sequence[str], log_dir: Path, *, cwd: Path | None = None,
                 env: dict[str, str] | None = None, die_with_parent: bool = True) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_dir / f"{name}.log"
        self.cwd = cwd
        self.env = env
        self.die_with_parent = die_with_parent  # False only for `make stack`, which outlives its script
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ManagedProcess:
        """Start the process (its own process group, so a stop reaches its children too)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        out = self.log_path.open("ab")
        out.write(f"$ {' '.join(self.argv)}\n".encode())
        out.flush()
        try:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=self.cwd, env=self.env, start_new_session=True,
                                         preexec_fn=_die_with_parent if self.die_with_parent else None)
        except OSError as exc:
            raise ProcessError(f"{self.name}: cannot start {self.argv[0]}: {exc}") from exc
        finally:
            out.close()
        _RUNNING.append(self)
        return self

    @property
    def pid(self) -> int:
        """Process id."""
        assert self.proc is not None, f"{self.name} not started"
        return self.proc.pid

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc is not None and self.proc.poll() is None

    def output(self, tail_chars: int = 4000) -> str:
        """The end of the captured output, for failure messages."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no output captured)"
        return text[-tail_chars:]

    def describe(self) -> str:
        """Name, status and output tail."""
        status = "running" if self.alive() else f"exited with {self.proc.returncode if self.proc else '?'}"
        return f"--- {self.name} ({status}), output {self.log_path}:\n{self.output()}"

    def wait_ready(self, check: Callable[[], bool], timeout_s: float = 20.0, what: str = "ready") -> None:
        """Poll `check` until it is true; fail with the process output if it exits or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise ProcessError(f"{self.name} exited before it was {what}\n{self.describe()}")
            try:
                if check():
                    return
            except (requests.RequestException, OSError, ValueError):
                pass  # not listening yet
            time.sleep(0.1)
        raise ProcessError(f"{self.name} not {what} after {timeout_s:.0f}s\n{self.describe()}")

    def wait_http(self, url: str, timeout_s: float = 20.0) -> None:
        """Wait until `url` answers 200."""
        self.wait_ready(lambda: requests.get(url, timeout=1).status_code == 200, timeout_s, f"serving {url}")

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM the process group, SIGKILL after `timeout_s`; returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        if self in _RUNNING:
            _RUNNING.remove(self)
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the process group now (the crash case) and reap it."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self in _RUNNING:
            _RUNNING.remove(self)


def stop_all() -> None:
    """Stop every process still registered (newest first)."""
    for p in reversed(list(_RUNNING)):
        p.stop(timeout_s=5)


atexit.register(stop_all)


def detach(p: ManagedProcess) -> None:
    """Let `p` outlive this interpreter (`make stack` detached); whoever detaches must record its pid."""
    if p in _RUNNING:
        _RUNNING.remove(p)


def python_module(module: str, *args: str) -> list[str]:
    """argv to run `python -m module args...` with this interpreter."""
    return [sys.executable, "-m", module, *args]
