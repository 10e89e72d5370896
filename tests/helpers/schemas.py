"""The JSON contracts of docs/interfaces.md as JSON Schema (docs/schemas/*.schema.json): every test that holds
a document the product emits validates it here, so the published schema and the output cannot part."""

from __future__ import annotations

import functools
import json
from typing import Any

from jsonschema import Draft7Validator
from referencing import Registry, Resource

from helpers.paths import ROOT

SCHEMAS = ROOT / "docs" / "schemas"


@functools.cache
def _registry() -> Registry:
    resources = []
    for path in sorted(SCHEMAS.glob("*.schema.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        resources.append((doc["$id"], Resource.from_contents(doc)))
    return Registry().with_resources(resources)


@functools.cache
def validator(name: str) -> Draft7Validator:
    """The validator of docs/schemas/<name>.schema.json (its $refs resolved among the published files)."""
    doc = json.loads((SCHEMAS / f"{name}.schema.json").read_text(encoding="utf-8"))
    Draft7Validator.check_schema(doc)
    return Draft7Validator(doc, registry=_registry())


def problems(doc: Any, name: str) -> list[str]:
    """Every way `doc` breaks the schema, `path: message`; empty when it conforms."""
    return [f"{'/'.join(map(str, e.absolute_path)) or '.'}: {e.message}"
            for e in sorted(validator(name).iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]


def assert_valid(doc: Any, name: str) -> None:
    """Fail with every problem when `doc` does not follow docs/schemas/<name>.schema.json."""
    found = problems(doc, name)
    assert not found, f"{name}.schema.json:\n" + "\n".join(found[:20])
