"""Shared test fixtures: where the shared corpus lives, the golden-file update switch, and the marker rule:
a test that starts a real process carries the `integration` marker (README, "Development")."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from helpers.examples import FAST
from helpers.marker_rule import argv_of, real_process
from helpers.paths import SHARED

# `make test-fast` runs with --hypothesis-profile=fast: fewer examples per property test (helpers/examples).
settings.register_profile("fast", max_examples=FAST)


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


# The marker rule (helpers/marker_rule.py), enforced as the tests run: every process a test not marked
# `integration` starts, in its body or in a fixture it uses, is checked.
_running: list[pytest.Item] = []
_started: dict[str, list[str]] = {}
_popen_init = subprocess.Popen.__init__


def _guarded_init(self: subprocess.Popen[Any], args: Any, *a: Any, **kw: Any) -> None:
    item = _running[-1] if _running else None
    if item is not None and item.get_closest_marker("integration") is None:
        argv = argv_of(args)
        if real_process(argv):
            _started.setdefault(item.nodeid, []).append(" ".join(argv[:3]))
    _popen_init(self, args, *a, **kw)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _running.append(item)
    subprocess.Popen.__init__ = _guarded_init  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen.__init__ = _popen_init  # type: ignore[method-assign]
        _running.pop()


@pytest.fixture(autouse=True)
def _integration_marker_rule(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails a test not marked `integration` that started a real process (in it or in a fixture it used)."""
    yield
    started = _started.pop(request.node.nodeid, [])
    assert not started, f"starts a real process, so mark it @pytest.mark.integration: {started}"
