"""SGLang release strings: `0.5.14`, or a floor `>=0.5.7` that line formats reveal."""

from __future__ import annotations

import re


def version_tuple(version: str) -> tuple[int, ...]:
    """'0.5.14' -> (0, 5, 14); non-numeric parts (rc, post, dev) and a `>=` floor mark are ignored."""
    parts: list[int] = []
    for piece in version.strip().lstrip(">=v").split("."):
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts)


def merge_version(known: str | None, seen: str | None) -> str | None:
    """What is known of the release after `seen`: a release (`0.5.23`) beats a floor from line formats
    (`>=0.5.7`), a higher floor beats a lower one, and between releases the later wins (a restart)."""
    if not seen:
        return known
    if known is None or not seen.startswith(">="):
        return seen
    if not known.startswith(">="):
        return known
    return seen if version_tuple(seen) > version_tuple(known) else known


__all__ = ["merge_version", "version_tuple"]
