"""Shared test fixtures: where the shared corpus lives, and the golden-file update switch."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.paths import SHARED


def pytest_addoption(parser: pytest.Parser) -> None:
    """`pytest --update-golden` rewrites golden files instead of comparing."""
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite golden files from the current output")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    """True when golden files should be rewritten."""
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture
def shared_dir() -> Path:
    """The ../shared folder (corpus, reference); skips the test when this clone has none."""
    if not (SHARED / "corpus" / "truth.jsonl").is_file():
        pytest.skip(f"shared corpus not found at {SHARED}: run from a checkout with ../shared beside it")
    return SHARED
