"""The packaged checks table read without YAML: setup.py writes checks.yaml's document as JSON beside it
(`_checks.json`, with the text it came from) at build time, and every start reads that
instead of importing and running a YAML parser (about 40 ms of a `diagnose` start).

The cache holds the checks.yaml text it was made from and is used only when that is the text read now: an
edited table (an editable install not rebuilt) is parsed as YAML, the same document either way. Only the standard library
is imported here: setup.py loads this file on its own, before the package is installed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CACHE_NAME = "_checks.json"  # beside checks.yaml; written at build time, not in git


def yaml_document(text: str) -> Any:
    """The packaged table as YAML: libyaml's safe loader where built (4x faster), else PyYAML's.
    Raises yaml.YAMLError."""
    import yaml  # only when there is no usable cache: a start that has one never imports YAML

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def cache_text(text: str, document: Any) -> str | None:
    """The cache of `document` (what yaml_document made of `text`), or None when JSON cannot hold that
    document exactly (a non-text key, a NaN): then no cache is written and starts read the YAML."""
    try:
        out = json.dumps({"text": text, "document": document}, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):  # a NaN or infinity, a value JSON has no type for
        return None
    return out if json.loads(out)["document"] == document else None


def cached_document(text: str, cache: Path) -> Any | None:
    """The document the cache file holds for exactly this checks.yaml text; None when the file is
    missing, unreadable or was written from another text."""
    try:
        held = json.loads(cache.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(held, dict) or held.get("text") != text:
        return None
    return held.get("document")


def write_cache(table: Path) -> bool:
    """Write the cache beside `table` (setup.py, at build time); False when none can be written (no
    PyYAML, a document JSON cannot hold) and any old cache is removed: a start then reads the YAML."""
    target = table.with_name(CACHE_NAME)
    text = table.read_text(encoding="utf-8")
    try:
        out = cache_text(text, yaml_document(text))
    except Exception:  # no PyYAML in the build environment, or a table YAML refuses: nothing to cache
        out = None
    if out is None:
        target.unlink(missing_ok=True)
        return False
    target.write_text(out, encoding="utf-8")
    return True
