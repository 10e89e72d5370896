"""Hand-checked expected values of the real-log corpus, parsed by our reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers.paths import FIXTURES
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.sources.logreader import read_events
from sglang_tuning_exporter.sources.tail import open_input

# truth.jsonl kind -> our kind (kind `metric` belongs to the scraper's tests)
KINDS = {"decode": "decode", "prefill": "prefill", "retract": "retract", "startup_mem": "startup_memory",
         "oom": "oom", "error": "error"}
RANKS = {"tp_rank": "tp", "dp_rank": "dp", "ep_rank": "ep", "pp_rank": "pp"}
# truth's short field names -> our canonical names, for batch and retraction lines
BATCH_NAMES = {
    "running_req": "num_running_reqs", "token": "num_used_tokens", "queue_req": "num_queue_reqs",
    "new_seq": "num_new_seqs", "new_token": "num_new_tokens", "cached_token": "num_cached_tokens",
    "full_token": "num_full_tokens", "swa_token": "num_swa_tokens", "prealloc_req": "num_prealloc_reqs",
    "transfer_req": "num_transfer_reqs", "retracted_req": "num_retracted_reqs", "inflight_req": "num_inflight_reqs",
    "pending_token": "num_pending_tokens", "unbootstrapped_req": "num_unbootstrapped_reqs",
    "transferring_req": "num_transferring_reqs", "retracted_reqs": "num_retracted_reqs",
    "new_tokens_gained": "num_new_tokens_gained", "npu_graph": "cuda_graph", "seq": "num_new_seqs",
    "remaining_req": "num_queue_reqs", "tree_cache_hit_rate": "cache_hit_rate",
}


def _expected_value(text: str) -> Any:
    """Truth values are strings as printed: compare as numbers/booleans where they are."""
    if text in ("True", "False"):
        return text == "True"
    if text.endswith("%"):
        return float(text[:-1]) / 100.0
    try:
        return float(text)
    except ValueError:
        return text


def _entries(truth: Path) -> list[dict[str, Any]]:
    out = []
    for line in truth.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        if entry["kind"] in KINDS:
            out.append(entry)
    return out


def _events_of(path: Path) -> dict[int, list[Event]]:
    by_line: dict[int, list[Event]] = {}
    with open_input(str(path)) as lines:
        for e in read_events(lines):
            by_line.setdefault(e.line, []).append(e)
    return by_line


def check_entry(root: Path, entry: dict[str, Any], cache: dict[str, dict[int, list[Event]]]) -> None:
    """Assert that the event at entry's line has exactly the expected values."""
    if entry["file"] not in cache:
        cache[entry["file"]] = _events_of(root / entry["file"])
    kind = KINDS[entry["kind"]]
    candidates = [e for e in cache[entry["file"]].get(entry["line_no"], []) if e.kind == kind]
    assert candidates, f"{entry['file']}:{entry['line_no']}: no {kind} event"
    e = candidates[0]
    for name, text in entry["fields"].items():
        where = f"{entry['file']}:{entry['line_no']} {name}"
        if name == "timestamp":
            assert e.time == text.replace(" ", "T"), where
        elif name in RANKS:
            assert e.rank.get(RANKS[name]) == int(text), where
        else:
            ours = name if kind in ("startup_memory", "error") else BATCH_NAMES.get(name, name)
            assert ours in e.fields, f"{where}: missing {ours} in {sorted(e.fields)}"
            want = _expected_value(text)
            got = e.fields[ours]
            if isinstance(want, (bool, str)):
                assert got == want, where
            else:
                assert isinstance(got, (int, float)) and not isinstance(got, bool), where
                assert got == pytest.approx(want, rel=1e-9, abs=1e-9), where
    # Ranks the truth does not name must not be invented (timestamps and ranks are checked both ways).
    named = {RANKS[k] for k in entry["fields"] if k in RANKS}
    assert set(e.rank) == named, f"{entry['file']}:{entry['line_no']} ranks {e.rank}"


SHARED_CACHE: dict[str, dict[int, list[Event]]] = {}
FIXTURE_CACHE: dict[str, dict[int, list[Event]]] = {}
FIXTURE_ENTRIES = _entries(FIXTURES / "logs" / "truth.jsonl")


def test_every_shared_truth_entry(shared_dir: Path) -> None:
    """Every decode/prefill/retract/startup/oom/error entry of ../shared truth.jsonl parses exactly."""
    entries = _entries(shared_dir / "corpus" / "truth.jsonl")
    assert len(entries) >= 50
    failures = []
    for entry in entries:
        try:
            check_entry(shared_dir / "corpus", entry, SHARED_CACHE)
        except AssertionError as exc:
            failures.append(str(exc))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("entry", FIXTURE_ENTRIES,
                         ids=[f"{e['file'].split('/')[-1][:3]}:{e['line_no']}" for e in FIXTURE_ENTRIES])
def test_fixture_truth_entry(entry: dict[str, Any]) -> None:
    """The truth subset carried in tests/fixtures/logs parses to its expected values."""
    check_entry(FIXTURES, entry, FIXTURE_CACHE)


def test_fixture_truth_covers_each_kind() -> None:
    """The carried subset exercises every kind the truth test checks except oom (none in the corpus)."""
    kinds = {e["kind"] for e in FIXTURE_ENTRIES}
    assert {"decode", "prefill", "retract", "startup_mem", "error"} <= kinds
