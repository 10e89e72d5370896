"""What a reader learns (sources/grammar.Grammar): its own layouts, never shared, never a change of meaning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import ModuleType
from typing import Any

import pytest

from helpers.paths import FIXTURES
from sglang_tuning_exporter.sources import grammar, logline, logmessages, logparse
from sglang_tuning_exporter.sources.grammar import Grammar
from sglang_tuning_exporter.sources.logparse import LineClassifier, parse_line
from sglang_tuning_exporter.sources.logreader import EventReader

DECODE = ("[2025-11-22 23:24:43 DP0] Decode batch, #running-req: 3, #token: 9, token usage: 0.10, "
          "cuda graph: True, gen throughput (token/s): 1.50, #queue-req: 1, ")


def _fixture_lines() -> list[str]:
    lines: list[str] = []
    for path in sorted((FIXTURES / "logs").glob("*.log")):
        lines.extend(path.read_text(encoding="utf-8").split("\n"))
    return lines


def _parsed(lines: list[str], g: Grammar | None = None) -> list[dict[str, Any] | None]:
    out = []
    for n, line in enumerate(lines, 1):
        e = parse_line(line, n, g)
        out.append(None if e is None else e.to_json_dict())
    return out


def test_reader_shortcut_gives_the_same_events_as_parse_line() -> None:
    """fast_batch (the reader's shortcut for learnt layouts) agrees with parse_line on real lines."""
    g = Grammar()
    hits = 0
    for path in sorted((FIXTURES / "logs").glob("*.log")):
        text = path.read_text(encoding="utf-8")
        for _ in range(2):  # the first pass teaches the layouts, the second uses them
            for n, line in enumerate(text.split("\n"), 1):
                fast = g.fast_batch(line, n)
                if fast is not None:
                    hits += 1
                    assert fast == parse_line(line, n), line
                parse_line(line, n, g)
    assert hits > 50


def test_a_known_layout_that_cannot_read_a_line_is_not_learnt_again() -> None:
    """A batch line whose value the layout regex refuses (a comma inside) goes the generic way every
    time, without compiling the same layout again and evicting real ones."""
    g = Grammar()
    line = ("[2025-11-22 23:24:43 DP0] Decode batch, #running-req: 3, #token: 9, token usage: 0.10, "
            "note: a,b, #queue-req: 1")
    for n in range(20):
        e = parse_line(line, n + 1, g)
        assert e is not None and e.fields["note"] == "a,b" and e.fields["num_queue_reqs"] == 1
    keys = ("#running-req", "#token", "token usage", "note", "#queue-req")
    assert sum(1 for layout in g.layouts["decode"] if layout.keys == keys) == 1


def test_one_off_batch_layouts_compile_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines whose keys are all different (a mutated or hostile log) are read on the general path and
    compile no layout regex; a layout seen twice is learnt (the fast path of a real server's log)."""
    built: list[tuple[str, ...]] = []
    real = grammar.Layout

    def counting(raw_keys: list[str]) -> grammar.Layout:
        built.append(tuple(raw_keys))
        return real(raw_keys)

    monkeypatch.setattr(grammar, "Layout", counting)
    g = Grammar()
    for i in range(300):
        line = f"[2026-01-01 00:00:00] Decode batch, #running-req: 3, #token: 10, odd key {i}: 1, token usage: 0.10, "
        e = parse_line(line, i, g)
        assert e is not None and e.fields["num_running_reqs"] == 3
    assert built == []
    twice = "[2026-01-01 00:00:00] Decode batch, #running-req: 4, #token: 10, stable key: 2, token usage: 0.20, "
    parse_line(twice, 1, g)
    parse_line(twice, 2, g)
    assert len(built) == 1 and "stable key" in built[0]


def test_two_readers_do_not_share_learnt_layouts() -> None:
    """What one reader (or classifier) learns stays its own: another starts with nothing learnt."""
    a = EventReader()
    for n in range(3):
        assert len(a.feed_lines([DECODE] * 3)) == 3, n
    # The C drop-in reads these lines itself; the Python path learnt the layout at its second line.
    a.feed_lines([line for line in _fixture_lines() if "HTTP/1." not in line])
    assert any(a.classifier.grammar.layouts.values())
    b = EventReader()
    assert b.classifier.grammar is not a.classifier.grammar
    assert not any(b.classifier.grammar.layouts.values()) and b.classifier.grammar.line_batches() is None
    c1, c2 = LineClassifier(), LineClassifier()
    for n in range(3):
        c1.classify(DECODE, n + 1)
    assert len(c1.grammar.layouts["decode"]) == 1 and not c2.grammar.layouts["decode"]
    assert c2.classify(DECODE, 1) == c1.classify(DECODE, 1)


def test_a_warm_grammar_never_changes_an_event() -> None:
    """Every fixture line gives the same event with no grammar, a fresh one, and one warmed on all of
    them twice over (learnt layouts and remembered prefixes are a speed cache only)."""
    lines = _fixture_lines()
    warm = Grammar()
    _parsed(lines, warm)
    _parsed(lines, warm)
    assert any(warm.layouts.values())
    assert _parsed(lines) == _parsed(lines, Grammar()) == _parsed(lines, warm)


_PARSER_MODULES: tuple[ModuleType, ...] = (grammar, logline, logmessages, logparse)


def _module_state() -> dict[str, int]:
    """Sizes of every module-level container of the parser's modules."""
    return {f"{m.__name__}.{name}": len(v) for m in _PARSER_MODULES for name, v in vars(m).items()
            if isinstance(v, (dict, list, set))}


def test_parse_line_keeps_nothing_between_calls() -> None:
    """Module-level parse_line learns nothing: no module container grows, and each line's event is
    what a fresh process gives, whatever this process parsed before."""
    lines = [line for line in _fixture_lines() if line.strip()]
    before = _module_state()
    _parsed(lines)
    here = _parsed(lines)  # every line already seen once
    assert _module_state() == before
    script = ("import json, sys\nfrom sglang_tuning_exporter.sources.logparse import parse_line\n"
              "lines = json.load(sys.stdin)\n"
              "out = []\nfor n, line in enumerate(lines, 1):\n"
              "    e = parse_line(line, n)\n    out.append(None if e is None else e.to_json_dict())\n"
              "print(json.dumps(out))\n")
    proc = subprocess.run([sys.executable, "-c", script], input=json.dumps(lines), capture_output=True,
                          text=True, check=True, env=dict(os.environ))
    fresh = json.loads(proc.stdout)
    assert sum(1 for e in fresh if e is not None) > 200
    assert json.loads(json.dumps(here)) == fresh
