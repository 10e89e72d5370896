"""This build's identity: the package version and the git revision setup.py recorded at build time."""

from __future__ import annotations

import importlib

from sglang_tuning_exporter import __version__


def build_revision() -> str:
    """The git revision setup.py recorded in `_build.py` at build time; "unknown" without one."""
    try:
        module = importlib.import_module("sglang_tuning_exporter.core._build")
    except ImportError:
        return "unknown"
    rev = getattr(module, "REVISION", None)
    return rev if isinstance(rev, str) and rev else "unknown"


def version_text() -> str:
    """`0.1.0 (revision 3d27691)`: what `--version` prints, the same facts as build_info."""
    return f"{__version__} (revision {build_revision()})"
