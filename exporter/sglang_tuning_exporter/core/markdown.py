"""Markdown escaping shared by every Markdown document we write (diagnose and the fleet report)."""

from __future__ import annotations

import html
from typing import Any


def md_text(s: Any) -> str:
    """Plain Markdown text that is safe in a table cell: a pipe or newline would break the row, and `<`,
    `>` and `&` must not become HTML."""
    return html.escape(str(s), quote=False).replace("|", "\\|").replace("\n", " ")
