"""How many examples a property test draws: its full count in `python -m pytest` (CI), a tenth of it under
`make test-fast`, which loads the `fast` hypothesis profile (tests/conftest.py registers it)."""

from __future__ import annotations

from hypothesis import settings

FULL = 100  # hypothesis' own max_examples: the profile the full run keeps
FAST = 10  # the `fast` profile's max_examples (and the count of a property test that names none)


def examples(n: int) -> int:
    """`n` in the full run; n scaled as the loaded profile is to the default (at least 10) otherwise."""
    return n if settings.default.max_examples >= FULL else max(10, n * settings.default.max_examples // FULL)
