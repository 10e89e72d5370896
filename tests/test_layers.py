"""The package's shape (docs/contracts.md): folders by flow, lower layers never import higher ones, no
import cycles, small modules."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.marker_rule import real_process
from helpers.paths import ROOT, TESTS

PKG = ROOT / "exporter" / "sglang_tuning_exporter"
MAX_LINES = 600
# Over the limit today, each with its reason; the list may only shrink.
LARGER: dict[str, int] = {}


def test_import_contracts_hold() -> None:
    """`lint-imports` (import-linter, contracts in pyproject.toml): the layers, the fleet report without
    the log parser, no cycles within a folder."""
    exe = shutil.which("lint-imports")
    if exe is None:
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    env_path = str(ROOT / "exporter")
    proc = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": env_path, "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 kept, 0 broken" in proc.stdout, proc.stdout


def test_type_only_imports_count() -> None:
    """The contracts see imports under `if TYPE_CHECKING:` too: a cycle cannot hide behind one."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert "exclude_type_checking_imports = false" in text
    uses = sorted(p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py") if "TYPE_CHECKING" in p.read_text())
    assert not uses, f"a type-only import hides a dependency: {uses}"


def test_folders_show_the_flow() -> None:
    """Only the entry points live at the top; everything else is in a folder that says what it holds."""
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "cli.py"], top
    folders = sorted(p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert folders == ["core", "fleet", "guide", "offline", "pipeline", "render", "sidecar", "sources"], folders


def test_modules_stay_small() -> None:
    """No module over MAX_LINES lines, but the listed ones (which may only get smaller)."""
    over = {}
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(PKG).as_posix()
        n = sum(1 for _ in p.open(encoding="utf-8"))
        if n > LARGER.get(rel, MAX_LINES):
            over[rel] = n
    assert not over, over


# Test folders that are not a package folder: cross-cutting suites, shared helpers, deploy artefacts.
TEST_ONLY = {"conformance", "deploy", "docs", "fixtures", "golden", "helpers", "integration"}


def test_tests_mirror_the_folders() -> None:
    """Each package folder has its tests in the folder of the same name; at the top only the tests of
    the entry point and of the package's shape; shared helpers in tests/helpers, imported from there
    (a test module never imports another)."""
    folders = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    test_folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert folders <= test_folders, folders - test_folders
    assert test_folders - folders <= TEST_ONLY, test_folders - folders - TEST_ONLY
    assert sorted(p.name for p in TESTS.glob("*.py")) == ["conftest.py", "test_cli.py", "test_layers.py"]
    for folder in folders:
        assert any((TESTS / folder).glob("test_*.py")), f"tests/{folder} holds no test"
    importers = sorted(p.relative_to(TESTS).as_posix() for p in TESTS.rglob("*.py") if _imports_a_test(p))
    assert not importers, importers


def _imports_a_test(path: Path) -> bool:
    """Whether a module imports a test module (`test_*`, absolute or relative, at any depth)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [f"{node.module or ''}.{a.name}" for a in node.names]
        else:
            continue
        if any(part.startswith("test_") for name in names for part in name.split(".")):
            return True
    return False


def test_a_real_process_makes_an_integration_test() -> None:
    """The marker rule (tests/helpers/marker_rule.py, applied by tests/conftest.py to every test): these
    start real components, so a test starting one is marked `integration`; one-shot build tools are not."""
    py = sys.executable
    for argv in (["promtool", "test", "rules", "x.yml"], ["/usr/bin/prometheus", "--config.file=p.yml"],
                 ["amtool", "check-config", "a.yml"], ["chromium", "--headless"], [py, "-m", "sglang_tuning_exporter",
                 "serve", "--log-file", "-"], ["kubectl", "kustomize", "k8s"]):
        assert real_process(argv), argv
    for argv in ([py, "-m", "sglang_tuning_exporter", "diagnose", "x.log"], ["lint-imports", "--no-cache"],
                 ["openssl", "req", "-x509"]):
        assert not real_process(argv), argv


# Private names (`_x`) imported from another module of the package: a name another module needs is
# public. The one exception is the compiled extension module itself (`_scan`, Python's `_json`/`json` idiom),
# loaded only by its wrapper.
PRIVATE_IMPORTS_LEFT = {
    "sources/accel.py": {"_scan"},
}


def test_no_new_private_name_crosses_a_module() -> None:
    """A name another module needs is public: no `from x import _y` between the package's modules but
    the listed ones (PRIVATE_IMPORTS_LEFT, which may only shrink)."""
    found: dict[str, set[str]] = {}
    for p in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang_tuning_exporter"):
                names = {a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")}
                if names:
                    found.setdefault(p.relative_to(PKG).as_posix(), set()).update(names)
    extra = {m: sorted(n - PRIVATE_IMPORTS_LEFT.get(m, set())) for m, n in found.items()}
    assert not {m: n for m, n in extra.items() if n}, "make these public or move them"
