"""YAML files we are handed (--config, --web.config.file, render options): safe_load with a depth bound.

PyYAML composes nodes recursively: a document nested a few thousand levels deep ends in a
RecursionError traceback instead of a configuration error. `load` refuses nesting deeper than
MAX_DEPTH with a yaml.YAMLError (so callers' existing `except yaml.YAMLError` name the file) whose
text is one line.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_DEPTH = 64  # far beyond any configuration file; far below the interpreter's recursion limit


class TooDeepError(yaml.YAMLError):
    """The document nests collections deeper than MAX_DEPTH."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts collection nesting while composing."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise TooDeepError(f"nested deeper than {MAX_DEPTH} levels (line {mark.line + 1}, "
                                   f"column {mark.column + 1})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load(text: str) -> Any:
    """`yaml.safe_load(text)`, refusing nesting deeper than MAX_DEPTH (TooDeepError, a yaml.YAMLError)."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
