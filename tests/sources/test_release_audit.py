"""The release audit's catalogue (audit/sglang-catalogue.yaml, written by scripts/audit_release.py from the
wheels) against today's parser, offline: every format string marked `read` is rendered and must still be
read as its event with every number; the relevant messages left `unread` are reported; README's figures
are the catalogue's."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest
import yaml

from helpers import release_audit as ra
from helpers.paths import ROOT

CATALOGUE = ROOT / "audit" / "sglang-catalogue.yaml"
# safe_load in libyaml (several times faster: read at collection by every xdist worker)
SITES: list[dict[str, Any]] = yaml.load(CATALOGUE.read_text(encoding="utf-8"), Loader=yaml.CSafeLoader)["sites"]
AUDITED = ("0.5.15", "0.5.18", "0.5.20", "0.5.22", "0.5.23")
READ = [s for s in SITES if s["status"] == "read"]


def _id(site: dict[str, Any]) -> str:
    release = max(site["releases"])
    return f"{site['file']}:{site['releases'][release]}"


def test_catalogue_is_reviewed() -> None:
    """Every site is reviewed: read (kind, fields), unread (why it matters) or not_relevant (reason)."""
    assert SITES
    for s in SITES:
        assert s["status"] in ("read", "unread", "not_relevant"), s
        assert s["releases"] and set(s["releases"]) <= set(AUDITED), s
        if s["status"] == "read":
            assert s.get("kind") and isinstance(s.get("fields"), list), s
        else:
            assert s.get("reason"), s
    assert {r for s in SITES for r in s["releases"]} == set(AUDITED)


@pytest.mark.parametrize("site", READ, ids=_id)
def test_a_message_marked_read_is_read_with_its_numbers(site: dict[str, Any]) -> None:
    """Rendered with plausible values, with SGLang's prefix and bare: the same event kind, every number
    in its fields, and at least the fields the audit recorded."""
    for prefix in (ra.PREFIX, ""):
        r = ra.check(site["format"], prefix=prefix, exception=site.get("exception"))
        assert r.read, (prefix, site["format"], r)
        assert r.kind == site["kind"], (site["format"], r.kinds)
        assert set(site["fields"]) <= set(r.fields) or prefix == "", (site["format"], sorted(r.fields))


def test_unread_relevant_messages_are_reported() -> None:
    """The count of relevant messages the parser does not read (or reads without their numbers), per
    release; a site marked unread that is read now must be marked read (the catalogue stays true)."""
    now_read = []
    for s in SITES:
        if s["status"] == "unread" and ra.check(s["format"], exception=s.get("exception")).read \
                and ra.check(s["format"], prefix="", exception=s.get("exception")).read:
            now_read.append(_id(s))
    assert not now_read, f"read now: mark them read in {CATALOGUE.name} (scripts/audit_release.py): {now_read}"
    per_release = {r: Counter(s["status"] for s in SITES if r in s["releases"]) for r in AUDITED}
    print("unread relevant messages: " + ", ".join(f"{r} {c['unread']}" for r, c in per_release.items()))


def figures(release: str) -> tuple[int, int, int]:
    """(relevant, read, unread) of one release in the catalogue."""
    c = Counter(s["status"] for s in SITES if release in s["releases"])
    return c["read"] + c["unread"], c["read"], c["unread"]


def test_readme_figures_are_the_catalogues() -> None:
    """README's "Supported SGLang releases" gives the audit's figures for 0.5.23 and 0.5.15."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for release in ("0.5.15", "0.5.23"):
        relevant, read, unread = figures(release)
        m = re.search(rf"{re.escape(release)}: (\d+) tuning-relevant messages, (\d+) read, (\d+) unread", text)
        assert m is not None, f"README gives no audit figures for {release}"
        assert tuple(int(g) for g in m.groups()) == (relevant, read, unread), (release, m.group(0))
