"""Every input limit of the sidecar in one place (docs/sidecar.md, "Limits", says what happens past each).

A faulty or hostile SGLang, a busy log or a crowd of clients must not blind, bloat or freeze the
sidecar: each input is bounded here, and what a bound cuts is counted
(`sglang_tuning_input_truncations_total`, `sglang_tuning_log_unread_bytes_total`). Read the values
through the module (`limits.X`), not `from limits import X`, so tests can lower them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# --- SGLang HTTP -------------------------------------------------------------------------------
MAX_METRICS_BODY_BYTES = 16 * 1024 * 1024  # a /metrics body past this is refused (reason too_large)
MAX_SERVER_INFO_BYTES = 4 * 1024 * 1024  # a server-info document past this is refused (too_large)
MAX_EXPOSITION_LINE_CHARS = 16 * 1024  # a longer exposition line is skipped, counted (limit=line)
MAX_LABEL_VALUE_CHARS = 256  # longer label values / server strings are cut, counted (label_value/string)
MAX_SCRAPE_SAMPLES = 200_000  # samples of the families we read, per scrape; the rest skipped (samples)
MAX_INTERNAL_STATES = 1024  # internal_states entries (one per DP rank) read; the rest ignored
MAX_RAY_REPLICAS = 1024  # Ray Serve replicas a scrape interpreter tells apart; the oldest is forgotten first
# Server arguments kept per server: SGLang 0.5.23's /server_info has 555 top-level keys (its
# `server_args=` line fewer); past this a document's names are dropped, counted (limit=server_args).
MAX_SERVER_ARGS = 1024
MAX_JSON_DEPTH_HINT = "nested too deeply"  # the reason a server-info document hit the decoder's recursion

# --- the report's Prometheus API answers --------------------------------------------------------
MAX_PROMETHEUS_ANSWER_BYTES = 64 * 1024 * 1024  # one answer (inflated) past this fails the report, naming it

# --- our HTTP server ---------------------------------------------------------------------------
LISTEN_BACKLOG = 512  # pending connections the kernel holds while we hold MAX_CONNECTIONS
MAX_CONNECTIONS = 512  # connections held at once (--web.max-connections); idle ones cost no thread
EVICT_IDLE_AFTER_S = 1.0  # at MAX_CONNECTIONS, one idle this long is closed for a new connection
HTTP_WORKERS = 4  # threads answering requests (rendering only: they never wait on a client)
IDLE_TIMEOUT_S = 15.0  # a kept-alive connection with no new request is closed after this
HEADER_TIMEOUT_S = 5.0  # TLS handshake + first request head from accept; a later head from its first byte
WRITE_TIMEOUT_S = 30.0  # a client that does not take the whole answer within this is dropped
MAX_REQUEST_HEAD_BYTES = 64 * 1024  # request line + headers; past it: 431 and closed
MAX_REQUEST_BODY_BYTES = 64 * 1024  # a body up to this is skipped; larger or chunked: closed after the answer
ACCEPT_BACKOFF_S = 0.5  # pause of the accept loop when the process is out of file descriptors

# --- log follower ------------------------------------------------------------------------------
ROTATED_DRAIN_QUIET_S = 10.0  # a rotated-away file is read until it has been quiet this long
FINGERPRINT_BYTES = 64  # bytes before the read offset compared each poll (copytruncate + regrowth)


def clip_text(value: str) -> tuple[str, bool]:
    """`value` cut to MAX_LABEL_VALUE_CHARS, and whether it was cut."""
    if len(value) > MAX_LABEL_VALUE_CHARS:
        return value[:MAX_LABEL_VALUE_CHARS], True
    return value, False


def merge_args(held: dict[str, Any], snapshot: Mapping[str, Any]) -> int:
    """Merge a snapshot of server arguments into `held`, which then has at most MAX_SERVER_ARGS names;
    returns how many names of the snapshot were dropped.

    Of the snapshot, the first MAX_SERVER_ARGS names in its own order are kept (a name longer than
    MAX_LABEL_VALUE_CHARS never: it would become a label). The snapshot is the newest word, so names held
    from earlier snapshots that it lacks make room for it, oldest first: a server naming ever new
    arguments cannot grow the state, and the names it sends now are the ones kept."""
    cap = MAX_SERVER_ARGS
    fresh: dict[str, Any] = {}
    dropped = 0
    for name, value in snapshot.items():
        if len(fresh) >= cap or len(name) > MAX_LABEL_VALUE_CHARS:
            dropped += 1
        else:
            fresh[name] = value
    stale = [name for name in held if name not in fresh]
    for name in stale[:max(0, len(stale) - (cap - len(fresh)))]:
        del held[name]
    held.update(fresh)
    return dropped
