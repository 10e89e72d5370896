"""The checks table's build-time JSON copy (guide/tablecache.py): the same table as the YAML, used only
for the text it was written from, and a start that has it never imports YAML."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_tuning_exporter.guide import tablecache
from sglang_tuning_exporter.guide.checks import default_path, load_table, parse_table

TEXT = default_path().read_text(encoding="utf-8")
CACHE = default_path().with_name(tablecache.CACHE_NAME)
built = pytest.mark.skipif(tablecache.cached_document(TEXT, CACHE) is None,
                           reason="no current guide/_checks.json: setup.py writes it (pip install -e . or "
                                  "python3 setup.py build_ext --inplace)")


def test_the_copy_is_the_yaml_document(tmp_path: Path) -> None:
    """What setup.py writes reads back as exactly the YAML's document, hence the same table."""
    table = tmp_path / "checks.yaml"
    table.write_text(TEXT, encoding="utf-8")
    assert tablecache.write_cache(table)
    document = tablecache.cached_document(TEXT, tmp_path / tablecache.CACHE_NAME)
    assert document == tablecache.yaml_document(TEXT)
    assert parse_table(document) == parse_table(tablecache.yaml_document(TEXT))


def test_a_copy_of_another_text_is_not_used(tmp_path: Path) -> None:
    """An edited checks.yaml (an editable install not rebuilt) is read as YAML, not from the old copy."""
    table = tmp_path / "checks.yaml"
    table.write_text(TEXT, encoding="utf-8")
    assert tablecache.write_cache(table)
    edited = TEXT.replace("schema_version: 1", "schema_version: 1  # edited", 1)
    assert edited != TEXT
    assert tablecache.cached_document(edited, tmp_path / tablecache.CACHE_NAME) is None
    (tmp_path / tablecache.CACHE_NAME).write_text("{not json", encoding="utf-8")
    assert tablecache.cached_document(TEXT, tmp_path / tablecache.CACHE_NAME) is None
    assert tablecache.cached_document(TEXT, tmp_path / "missing.json") is None


def test_a_document_json_cannot_hold_is_not_cached(tmp_path: Path) -> None:
    """A non-text key or a NaN would come back changed: no copy then (any old one removed)."""
    assert tablecache.cache_text("x", {1: "a"}) is None
    assert tablecache.cache_text("x", {"a": float("nan")}) is None
    assert json.loads(tablecache.cache_text("x", {"a": [1, 2.5, True, None]}) or "")["document"] == {
        "a": [1, 2.5, True, None]}
    table = tmp_path / "checks.yaml"
    (tmp_path / tablecache.CACHE_NAME).write_text("old", encoding="utf-8")
    table.write_text("1: a\n", encoding="utf-8")
    assert not tablecache.write_cache(table)
    assert not (tmp_path / tablecache.CACHE_NAME).exists()


@built
def test_the_packaged_table_is_read_from_the_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """load_table() takes the copy when it is current (no YAML parsed) and gives the YAML's table."""
    from_yaml = parse_table(tablecache.yaml_document(TEXT))

    def no_yaml(text: str) -> object:
        raise AssertionError("parsed the YAML although the copy is current")

    monkeypatch.setattr(tablecache, "yaml_document", no_yaml)
    assert load_table() == from_yaml


@built
@pytest.mark.parametrize("command", ["diagnose", "parse"])
def test_an_offline_command_never_imports_yaml(command: str) -> None:
    """Start-up (bench/bench_start.py): the table comes from its copy, so YAML is not even imported."""
    log = Path(__file__).parents[2] / "examples" / "recorded.log"
    code = ("import contextlib, io, sys\n"
            "from sglang_tuning_exporter import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    cli.main([{command!r}, {str(log)!r}])\n"
            "print('yaml' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.split()[-1] == "False", proc.stderr[-400:]
