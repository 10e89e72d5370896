"""docs/contracts.md, "How to add ...": every file and symbol it names exists (a rename that forgets the
page fails here)."""

from __future__ import annotations

import re

from helpers.paths import ROOT

PKG = ROOT / "exporter" / "sglang_tuning_exporter"
SECTION = "## How to add a log line, a signal, a check, a metric, an output format"
# `path` or `path:Symbol.attr`, where path is a package path or a repository one (docs/, tests/...).
REF = re.compile(r"`((?:[\w-]+/)+[\w.-]+\.(?:py|yaml|md))(?::([\w.]+))?`")


def _section() -> str:
    text = (ROOT / "docs" / "contracts.md").read_text(encoding="utf-8")
    assert SECTION in text
    return text.split(SECTION, 1)[1].split("\n## ", 1)[0]


def test_every_named_file_and_symbol_exists() -> None:
    refs = REF.findall(_section())
    assert len(refs) >= 25, refs
    missing = []
    for path, symbol in refs:
        top = path.split("/", 1)[0]
        f = ROOT / path if top in ("docs", "tests", "bench", "alerts", "dashboards", "deploy") else PKG / path
        if not f.is_file():
            missing.append(path)
            continue
        text = f.read_text(encoding="utf-8")
        for part in symbol.split(".") if symbol else ():
            if not re.search(rf"\b{re.escape(part)}\b", text):
                missing.append(f"{path}:{part}")
    assert not missing, missing
