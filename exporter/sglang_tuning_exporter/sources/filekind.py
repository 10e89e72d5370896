"""What kind of file a log path is: the tests the follower and `serve`'s start-up share (a device or FIFO
would be read for ever, a gzip-compressed log is a rotated one, not the live log)."""

from __future__ import annotations

import io
import os
import stat
from typing import IO

GZIP_MAGIC = b"\x1f\x8b"


def special_kind(mode: int) -> str | None:
    """Why a file of this st_mode is no log file (read for ever, or blocks without a writer), or None."""
    if stat.S_ISFIFO(mode):
        return "a named pipe, not a log file (pipe it to standard input: -)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device, not a log file"
    if stat.S_ISSOCK(mode):
        return "a socket, not a log file"
    return None


def special_file(path: str) -> str | None:
    """special_kind of `path` (None when it is a regular file, or cannot be stat'ed)."""
    try:
        return special_kind(os.stat(path).st_mode)
    except (OSError, ValueError):
        return None


def refused(fh: IO[bytes]) -> str | None:
    """Why the follower will not read an opened file: not a regular file (/dev/zero would burn a core), or
    gzip-compressed (a rotated, compressed log is not the live one; `diagnose` reads it)."""
    try:
        why = special_kind(os.fstat(fh.fileno()).st_mode)
    except (OSError, ValueError, io.UnsupportedOperation, AttributeError):
        why = None  # a test's in-memory file
    if why is not None:
        return why
    try:
        magic = fh.read(2)
        fh.seek(0)
    except OSError:
        return None
    return GZIP_REFUSAL if magic == GZIP_MAGIC else None


GZIP_REFUSAL = "gzip-compressed, not a live log (diagnose reads .gz files)"


def unfollowable(path: str) -> str | None:
    """Why `serve` cannot follow `path` (the follower's own test, asked at start), or None; a missing or
    unreadable file is None: the follower waits for it to appear."""
    try:
        with open(path, "rb") as fh:
            return refused(fh)
    except OSError:
        return special_file(path)
