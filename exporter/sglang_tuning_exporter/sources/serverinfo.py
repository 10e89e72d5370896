"""SGLang's server-info endpoint: the running server's arguments and version.

`/server_info` (0.5.6+), falling back to `/get_server_info` (0.4.0-0.5.23) and `/get_server_args`
(0.3.x) on 404. Parsing is pure (`parse_server_info`); fetching goes through an injected `HttpGet`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from sglang_tuning_exporter.core import limits, outbound
from sglang_tuning_exporter.core.durations import duration_text
from sglang_tuning_exporter.core.model import finite_number
from sglang_tuning_exporter.core.redact import redact_args, redact_text

ENDPOINTS = ("/server_info", "/get_server_info", "/get_server_args")


class HttpError(Exception):
    """A failed HTTP request; `reason` is the `reason` label of sglang_tuning_source_failures_total (docs/sidecar.md)."""

    def __init__(self, message: str, status: int | None = None, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason or ("http_status" if status is not None else "connection")


class HttpGet(Protocol):
    """GET `url` within `timeout` seconds; returns the body or raises HttpError."""

    def __call__(self, url: str, timeout: float) -> bytes: ...


def urllib_get(url: str, timeout: float, *, api_key: str | None = None, max_bytes: int | None = None) -> bytes:
    """The real HttpGet: one GET whose WHOLE request (connect, headers, body) ends within `timeout`,
    whatever the framing (core/outbound.py). The body is read up to `max_bytes` (default: the /metrics
    limit); past it, cut short or late, the request fails. `api_key` is SGLang's --api-key."""
    cap = limits.MAX_METRICS_BODY_BYTES if max_bytes is None else max_bytes
    headers = {"Accept": "text/plain, application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        answer = outbound.request(url, timeout_s=timeout, max_bytes=cap, headers=headers)
    except outbound.OutboundError as exc:
        raise HttpError(str(exc), exc.status, reason="connection" if exc.reason == "tls" else exc.reason) from None
    if answer.status >= 400:
        raise HttpError(f"HTTP {answer.status} from {outbound.origin(url)}{urlsplit(url).path}", answer.status)
    return answer.body


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """The facts the exporter uses from the server-info document."""

    version: str | None
    model_name: str | None
    args: Mapping[str, Any]  # scalar server args (numbers, bools, strings, None)
    max_total_num_tokens: int | None = None
    start_marker: str | None = None  # changes when SGLang restarts (startup_time / launch record)
    # Startup facts per DP rank (internal_states[i], one per DP rank), the server-wide ones repeated
    # in each: what a log's startup lines would give, for a sidecar that sees no log.
    rank_facts: tuple[Mapping[str, float], ...] = ()
    # What the limits cut (docs/sidecar.md, "Limits"): "string" -> strings cut to the label limit,
    # "server_args" -> names past MAX_SERVER_ARGS (or too long for a label) dropped,
    # "internal_states" -> 1 when entries past MAX_INTERNAL_STATES were ignored.
    truncated: Mapping[str, int] = field(default_factory=dict)


def _rank_facts(doc: Mapping[str, Any], states: list[Any], mtt: float | None) -> tuple[dict[str, float], ...]:
    common: dict[str, float] = {} if mtt is None else {"max_total_num_tokens": mtt}
    cap = finite_number(doc.get("max_running_requests"))  # the flag; None when SGLang sized it
    dp = finite_number(doc.get("dp_size"))
    if cap is not None and doc.get("enable_dp_attention") is True and dp is not None and dp > 1:
        cap = float(int(cap) // int(dp))  # with DP attention SGLang splits the flag across DP ranks
    out = []
    for st in states or [doc]:  # 0.4.4-0.4.6 merged the one internal state into the top level
        facts = dict(common)
        st = st if isinstance(st, dict) else {}
        memory = st.get("memory_usage")
        avail = finite_number(memory.get("startup_available")) if isinstance(memory, dict) else None
        if avail is not None:
            facts["available_gpu_mem_gb"] = avail
        if isinstance(memory, dict):  # 0.5.18+: the start-up split of GPU memory, GB
            for key, fact in (("weight", "weights_gb"), ("kvcache", "kv_cache_gb")):
                v = finite_number(memory.get(key))
                if v is not None:
                    facts[fact] = v
        listed = st.get("decode_cuda_graph_bs")
        bs = [b for b in listed if isinstance(b, int) and not isinstance(b, bool)] if isinstance(listed, list) else []
        if bs:
            facts["cuda_graph_max_bs_captured"] = float(max(bs))
        eff = finite_number(st.get("effective_max_running_requests_per_dp"))  # 0.5.8+: what the summary line prints
        running = eff if eff is not None else cap
        if running is not None:
            facts["max_running_requests"] = running
        out.append(facts)
    return tuple(out)


def parse_server_info(doc: Any) -> ServerInfo:
    """Extract version, model, scalar args and capacity from any release's server-info JSON.

    At most MAX_SERVER_ARGS scalar arguments are read (limits.merge_args), their secrets redacted
    (core/redact: `api_key`, `hf_token`, credentials in URLs); strings (they become label values and
    status-page text) are then cut to MAX_LABEL_VALUE_CHARS and internal_states to MAX_INTERNAL_STATES
    entries; `truncated` says how many of each were cut."""
    if not isinstance(doc, dict):
        raise ValueError("server info is not a JSON object")
    cut = {"string": 0}

    def clip(v: Any) -> Any:
        if isinstance(v, str):
            v, was_cut = limits.clip_text(v)
            cut["string"] += was_cut
        return v

    scalars = {k: v for k, v in doc.items()
               if isinstance(k, str) and (v is None or isinstance(v, (int, float, str, bool)))
               and k not in ("version", "launch_command")}
    kept: dict[str, Any] = {}
    cut["server_args"] = limits.merge_args(kept, scalars)  # at most MAX_SERVER_ARGS names, counted
    args = {k: clip(v) for k, v in redact_args(kept).items()}
    states = doc.get("internal_states")
    states = states if isinstance(states, list) else []
    if len(states) > limits.MAX_INTERNAL_STATES:
        cut["internal_states"] = 1
        states = states[:limits.MAX_INTERNAL_STATES]
    if args.get("mem_fraction_static") is None:
        # The flag defaults to None (computed at start-up): the internal state holds the resolved value.
        for st in states:
            v = finite_number(st.get("mem_fraction_static")) if isinstance(st, dict) else None
            if v is not None:
                args["mem_fraction_static"] = v
                break
    model = args.get("served_model_name") or args.get("model_path")
    mtt = finite_number(doc.get("max_total_num_tokens"))
    version = doc.get("version")
    marker = doc.get("startup_time")
    return ServerInfo(
        version=clip(redact_text(str(version))) if version is not None else None,
        model_name=limits.clip_text(str(model))[0] if model is not None else None,  # an arg too: counted there
        args=args,
        max_total_num_tokens=int(mtt) if mtt is not None else None,
        start_marker=limits.clip_text(json.dumps(marker, sort_keys=True))[0] if marker is not None else None,
        rank_facts=_rank_facts(doc, states, mtt),
        truncated={k: v for k, v in cut.items() if v},
    )


@dataclass(frozen=True, slots=True)
class FetchResult:
    """Outcome of one server-info fetch."""

    info: ServerInfo | None
    endpoint: str | None  # the endpoint that answered
    error: str | None
    duration_s: float
    reason: str | None = None  # one of REASONS when it failed


@dataclass(slots=True)
class ServerInfoClient:
    """Fetches server info, remembering which endpoint the running release serves."""

    base_url: str
    timeout: float
    get: HttpGet = urllib_get
    timer: Callable[[], float] = time.perf_counter
    endpoint: str | None = None
    _order: tuple[str, ...] = field(default=ENDPOINTS)

    def fetch(self) -> FetchResult:
        """Try the known endpoint first, then the others; 404 means 'older release, try the next'.

        One deadline (`timeout`) covers every endpoint tried. Never raises: a body that is not a
        document we can read (too large, not JSON, nested past the decoder's recursion) is a failure
        with its reason."""
        start = self.timer()
        order = ((self.endpoint,) if self.endpoint else ()) + tuple(
            e for e in self._order if e != self.endpoint)
        last_error, reason = "no endpoint answered", "connection"
        for path in order:
            left = self.timeout - (self.timer() - start)
            if left <= 0:
                last_error, reason = f"{path}: no answer within the {duration_text(self.timeout)} deadline", "timeout"
                break
            try:
                body = self.get(self.base_url.rstrip("/") + path, left)
            except HttpError as exc:
                last_error, reason = str(exc), exc.reason
                if exc.status in (404, 405):
                    continue
                break  # server down or erroring: other endpoints will not do better
            if len(body) > limits.MAX_SERVER_INFO_BYTES:
                last_error = f"{path}: server info larger than {limits.MAX_SERVER_INFO_BYTES} bytes"
                reason = "too_large"
                break
            try:
                info = parse_server_info(json.loads(body))
            except RecursionError:
                last_error, reason = f"{path}: invalid server info: {limits.MAX_JSON_DEPTH_HINT}", "invalid"
                break
            except (ValueError, UnicodeDecodeError) as exc:
                last_error, reason = f"{path}: invalid server info: {str(exc)[:200]}", "invalid"
                break
            self.endpoint = path
            return FetchResult(info, path, None, self.timer() - start)
        if reason == "http_status" and self.timer() - start >= self.timeout:  # 404s until time ran out
            last_error, reason = f"no endpoint answered within the {duration_text(self.timeout)} deadline", "timeout"
        return FetchResult(None, None, last_error, self.timer() - start, reason)
