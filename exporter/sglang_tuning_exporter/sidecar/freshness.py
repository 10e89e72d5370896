"""How fresh each source's figures are (issue #24): `freshness` of `/api/findings` and the status page.

A source that went down leaves its last values in place (the window, the rank gauges): they are marked
stale with when they were last fresh. A log that went quiet says so; a replayed log (`--from-start`) that
was read to its end says it ended, and its figures are the log's own (judged at its end). Pure: a
function of one Snapshot.
"""

from __future__ import annotations

from typing import Any

from sglang_tuning_exporter.core.durations import duration_text, time_text
from sglang_tuning_exporter.sidecar.state import SOURCES, Snapshot

# A log with no line for this long is called quiet (an idle server prints nothing; a busy one prints a
# Decode line every 1-2.5 s): its window ages with the wall clock, so its figures cover less and less.
QUIET_S = 60.0
# What each source feeds, in the words of the page (what turns stale when it goes down).
FEEDS = {"log": "the Decode/Prefill figures, retractions and OOMs read from the log",
         "metrics": "the queue, running requests, token usage and counters scraped from SGLang's /metrics",
         "server_info": "the server arguments and version from /server_info"}


def freshness(snap: Snapshot) -> dict[str, dict[str, Any]]:
    """Per enabled source: `state` (live|quiet|replay_ended|fresh|stale|down|waiting), when it was last
    fresh, and a `note` a person reads."""
    out: dict[str, dict[str, Any]] = {}
    for name in SOURCES:
        st = snap.sources[name]
        if not st.enabled:
            continue
        entry: dict[str, Any] = {"state": "fresh", "last_ok": time_text(st.last_ok)}
        if st.up is None:
            entry.update(state="waiting", note=f"{name}: not read yet")
        elif st.up is False:
            since = st.down_since if st.down_since is not None else st.last_attempt
            entry["down_since"] = time_text(since)
            if st.last_ok is None:
                entry.update(state="down", note=f"{name} down since {time_text(since)}: it gave nothing yet")
            else:
                entry.update(state="stale", note=(
                    f"{name} down since {time_text(since)} ({st.detail or 'the last read failed'}): "
                    f"{FEEDS[name]} are stale, the last from {time_text(st.last_ok)} "
                    f"({duration_text(snap.now - st.last_ok)} ago)"))
        if name == "log" and st.up is not False:
            entry.update(_log_entry(snap))
        out[name] = entry
    return out


def _log_entry(snap: Snapshot) -> dict[str, Any]:
    last = snap.log_last_line_time
    entry: dict[str, Any] = {"last_line": time_text(last)}
    if snap.log_replay_end is not None:
        end = time_text(snap.log_replay_end)
        entry.update(state="replay_ended", log_end=end, note=(
            f"the replayed log ended at {end} (log time): every figure is the log's own, judged at its end "
            f"and not aged by the wall clock; a new line would make it a live log"))
    elif last is None:
        entry.update(state="waiting", note="no log line read yet")
    elif snap.now - last >= QUIET_S:
        entry.update(state="quiet", quiet_s=round(snap.now - last), note=(
            f"the log has been quiet for {duration_text(snap.now - last)} (last line read at {time_text(last)}): the "
            f"window ages with the wall clock, so its rates and ratios cover less and less"))
    else:
        entry["state"] = "live"
    return entry


def notes(fresh: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """The entries a person must read first (not live/fresh): the status page's banner lines."""
    return [{"name": n, "state": e["state"], "note": e["note"]} for n, e in fresh.items()
            if e["state"] not in ("live", "fresh") and e.get("note")]
