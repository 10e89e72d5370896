"""Where the tests find the checkout, their fixtures and golden files (one place, whatever the folder)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
FIXTURES = TESTS / "fixtures"
GOLDEN = TESTS / "golden"
SHARED = ROOT.parent / "shared"
