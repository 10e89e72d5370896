"""The optional C accelerator, the build's git revision and the checks table's JSON copy; everything else is
in pyproject.toml."""

import importlib.util
import subprocess
import zlib
from pathlib import Path

from setuptools import Extension, setup

BUILD_FILE = Path(__file__).parent / "exporter" / "sglang_tuning_exporter" / "core" / "_build.py"
SCAN_C = Path(__file__).parent / "exporter" / "sglang_tuning_exporter" / "sources" / "_scan.c"
GUIDE = Path(__file__).parent / "exporter" / "sglang_tuning_exporter" / "guide"


def write_revision() -> None:
    """Record `git rev-parse --short HEAD` for sglang_tuning_build_info{revision} (read by sidecar/collector)."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=BUILD_FILE.parent, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    if rev or not BUILD_FILE.exists():  # an sdist has no .git: keep the revision it was made with
        BUILD_FILE.write_text('"""Written by setup.py at build time; not in git."""\n\n'
                              f"REVISION = {(rev or 'unknown')!r}\n")


def scan_source_digest() -> str:
    """The digest of _scan.c (accel.source_digest's: CRC-32 and length), built into the module so that accel.load
    refuses a build from another source."""
    data = SCAN_C.read_bytes()
    return f"{zlib.crc32(data):08x}{len(data):08x}"


def write_table_cache() -> None:
    """checks.yaml's document as JSON beside it, read at every start instead of the YAML (guide/tablecache.py,
    loaded from its file: the package is not installed yet)."""
    spec = importlib.util.spec_from_file_location("tablecache", GUIDE / "tablecache.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_cache(GUIDE / "checks.yaml")


write_revision()
write_table_cache()
# optional=True: without a compiler the install still succeeds and the reader runs in pure Python.
setup(ext_modules=[Extension("sglang_tuning_exporter.sources._scan", ["exporter/sglang_tuning_exporter/sources/_scan.c"],
                             optional=True, extra_compile_args=["-O2"],
                             define_macros=[("SCAN_SOURCE", f'"{scan_source_digest()}"')])])
