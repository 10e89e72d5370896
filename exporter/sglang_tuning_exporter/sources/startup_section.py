"""The startup section of the server a log describes now: its last `server_args` line and the startup
lines after it, up to the first batch line.  A sidecar that follows a log from its end reads this first,
so the running server's startup facts (headroom, captured CUDA graphs, args) are known at once."""

from __future__ import annotations

import os
from typing import Any

MARKER = b"server_args="
BATCH_HEADS = (b"Decode batch", b"Prefill batch", b"Decode out of memory", b"KV cache pool is full")
BLOCK = 1 << 20
MAX_LINES = 2000  # a startup section is a few hundred lines; a runaway one is cut here


def last_startup_offset(path: str, end: int | None = None) -> int | None:
    """Byte offset of the start of the last line holding `server_args=` before `end`, or None."""
    with open(path, "rb") as fh:
        pos = fh.seek(0, os.SEEK_END) if end is None else end
        carry = b""
        while pos > 0:
            step = min(BLOCK, pos)
            pos -= step
            fh.seek(pos)
            block = fh.read(step) + carry
            i = block.rfind(MARKER)
            if i >= 0:
                return pos + block.rfind(b"\n", 0, i) + 1
            carry = block[: len(MARKER)]
    return None


def startup_lines(path: str, end: int | None = None) -> list[str]:
    """The last startup section's lines (before `end`, the follower's start), up to the first batch."""
    try:
        start = last_startup_offset(path, end)
        if start is None:
            return []
        out: list[str] = []
        with open(path, "rb") as fh:
            fh.seek(start)
            limit = (end if end is not None else fh.seek(0, os.SEEK_END)) - start
            fh.seek(start)
            for raw in fh.read(min(limit, 8 * BLOCK)).split(b"\n")[:MAX_LINES]:
                if any(h in raw for h in BATCH_HEADS):
                    break
                out.append(raw.decode("utf-8", "replace"))
        return out
    except OSError:
        return []


class WithStartup:
    """A follower whose first poll returns the startup section before its own new lines."""

    def __init__(self, follower: Any, lines: list[str]) -> None:
        self._follower = follower
        self._pending: list[str] | None = lines

    def poll(self) -> list[str]:
        """The startup lines once, then the follower's."""
        first, self._pending = self._pending, None
        lines: list[str] = self._follower.poll()
        return first + lines if first else lines

    def __getattr__(self, name: str) -> Any:
        return getattr(self._follower, name)
