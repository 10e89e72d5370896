"""SGLang's server-info endpoint: the running server's arguments and version.

`/server_info` (0.5.6+), falling back to `/get_server_info` (0.4.0-0.5.23) and `/get_server_args`
(0.3.x) on 404. Parsing is pure (`parse_server_info`); fetching goes through an injected `HttpGet`.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

ENDPOINTS = ("/server_info", "/get_server_info", "/get_server_args")
MAX_BODY_BYTES = 16 * 1024 * 1024


class HttpError(Exception):
    """A failed HTTP request (connection, timeout, or a non-2xx status)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class HttpGet(Protocol):
    """GET `url` within `timeout` seconds; returns the body or raises HttpError."""

    def __call__(self, url: str, timeout: float) -> bytes: ...


def urllib_get(url: str, timeout: float, *, api_key: str | None = None) -> bytes:
    """The real HttpGet: urllib with a timeout and a body-size cap; `api_key` for SGLang's --api-key."""
    headers = {"User-Agent": "sglang-tuning-exporter", "Accept": "text/plain, application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body: bytes = resp.read(MAX_BODY_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise HttpError(f"HTTP {exc.code} from {url}", exc.code) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise HttpError(f"GET {url} failed: {reason}") from None
    if len(body) > MAX_BODY_BYTES:
        raise HttpError(f"GET {url}: body larger than {MAX_BODY_BYTES} bytes")
    return body


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


def _rank_facts(doc: Mapping[str, Any], states: list[Any], mtt: float | None) -> tuple[dict[str, float], ...]:
    common: dict[str, float] = {} if mtt is None else {"max_total_num_tokens": mtt}
    cap = _num(doc.get("max_running_requests"))  # the flag; None when SGLang sized it
    dp = _num(doc.get("dp_size"))
    if cap is not None and doc.get("enable_dp_attention") is True and dp is not None and dp > 1:
        cap = float(int(cap) // int(dp))  # with DP attention SGLang splits the flag across DP ranks
    out = []
    for st in states or [doc]:  # 0.4.4-0.4.6 merged the one internal state into the top level
        facts = dict(common)
        st = st if isinstance(st, dict) else {}
        memory = st.get("memory_usage")
        avail = _num(memory.get("startup_available")) if isinstance(memory, dict) else None
        if avail is not None:
            facts["available_gpu_mem_gb"] = avail
        if isinstance(memory, dict):  # 0.5.18+: the start-up split of GPU memory, GB
            for key, fact in (("weight", "weights_gb"), ("kvcache", "kv_cache_gb")):
                v = _num(memory.get(key))
                if v is not None:
                    facts[fact] = v
        listed = st.get("decode_cuda_graph_bs")
        bs = [b for b in listed if isinstance(b, int) and not isinstance(b, bool)] if isinstance(listed, list) else []
        if bs:
            facts["cuda_graph_max_bs_captured"] = float(max(bs))
        eff = _num(st.get("effective_max_running_requests_per_dp"))  # 0.5.8+: what the summary line prints
        running = eff if eff is not None else cap
        if running is not None:
            facts["max_running_requests"] = running
        out.append(facts)
    return tuple(out)


def _num(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def parse_server_info(doc: Any) -> ServerInfo:
    """Extract version, model, scalar args and capacity from any release's server-info JSON."""
    if not isinstance(doc, dict):
        raise ValueError("server info is not a JSON object")
    args = {k: v for k, v in doc.items()
            if isinstance(k, str) and (v is None or isinstance(v, (int, float, str, bool)))
            and k not in ("version", "launch_command")}
    states = doc.get("internal_states")
    if args.get("mem_fraction_static") is None and isinstance(states, list):
        # The flag defaults to None (computed at start-up): the internal state holds the resolved value.
        for st in states:
            v = _num(st.get("mem_fraction_static")) if isinstance(st, dict) else None
            if v is not None:
                args["mem_fraction_static"] = v
                break
    model = doc.get("served_model_name") or doc.get("model_path")
    mtt = _num(doc.get("max_total_num_tokens"))
    version = doc.get("version")
    marker = doc.get("startup_time")
    return ServerInfo(
        version=str(version) if version is not None else None,
        model_name=str(model) if model is not None else None,
        args=args,
        max_total_num_tokens=int(mtt) if mtt is not None else None,
        start_marker=json.dumps(marker, sort_keys=True) if marker is not None else None,
        rank_facts=_rank_facts(doc, states if isinstance(states, list) else [], mtt),
    )


@dataclass(frozen=True, slots=True)
class FetchResult:
    """Outcome of one server-info fetch."""

    info: ServerInfo | None
    endpoint: str | None  # the endpoint that answered
    error: str | None
    duration_s: float


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
        """Try the known endpoint first, then the others; 404 means 'older release, try the next'."""
        start = self.timer()
        order = ((self.endpoint,) if self.endpoint else ()) + tuple(
            e for e in self._order if e != self.endpoint)
        last_error = "no endpoint answered"
        for path in order:
            try:
                body = self.get(self.base_url.rstrip("/") + path, self.timeout)
            except HttpError as exc:
                last_error = str(exc)
                if exc.status in (404, 405):
                    continue
                break  # server down or erroring: other endpoints will not do better
            try:
                info = parse_server_info(json.loads(body))
            except (ValueError, UnicodeDecodeError) as exc:
                last_error = f"{path}: invalid server info: {exc}"
                break
            self.endpoint = path
            return FetchResult(info, path, None, self.timer() - start)
        return FetchResult(None, None, last_error, self.timer() - start)
