"""A thin typed client for the Prometheus HTTP API (instant and range queries) with auth, TLS and timeouts.

Every failure becomes a `PrometheusError` whose message is one line a person can act on, whatever the
server answers (a drip, a flood, JSON of the wrong shape); callers never see a traceback.
"""

from __future__ import annotations

import base64
import json
import math
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from sglang_tuning_exporter.core import limits, outbound
from sglang_tuning_exporter.core.durations import duration_text
from sglang_tuning_exporter.core.redact import redact_text

USER_AGENT = "sglang-tuning-exporter-report"


class PrometheusError(Exception):
    """A query could not be answered completely; `str(err)` is one line."""


@dataclass(frozen=True, slots=True)
class PromConfig:
    """Where Prometheus is and how to talk to it."""

    url: str
    timeout_s: float = 30.0
    username: str | None = None
    password: str | None = None
    bearer_token: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure_skip_verify: bool = False
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Sample:
    """One element of an instant vector."""

    labels: Mapping[str, str]
    value: float
    time: float = 0.0


@dataclass(frozen=True, slots=True)
class Series:
    """One element of a range matrix: labels and (time, value) points in time order."""

    labels: Mapping[str, str]
    points: tuple[tuple[float, float], ...] = field(default_factory=tuple)


def _one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _float(raw: Any) -> float:
    # Prometheus encodes sample values as strings, including "NaN", "+Inf" and "-Inf".
    try:
        return float(raw)
    except (TypeError, ValueError) as exc:
        raise PrometheusError(f"Prometheus returned a sample value that is not a number: {raw!r}") from exc


class PrometheusClient:
    """Runs PromQL against one Prometheus-compatible endpoint and counts the queries it sends.

    Each query is one request (core/outbound.py) with `timeout_s` for the WHOLE exchange, however the
    answer is framed or dripped, and at most MAX_PROMETHEUS_ANSWER_BYTES of answer (inflated)."""

    def __init__(self, config: PromConfig) -> None:
        """Build from `config` (auth, headers, TLS)."""
        self.config = config
        self.url = config.url.rstrip("/")  # what requests go to (user:pass@ in it authenticates)
        self.base = redact_text(self.url)  # what errors, pages and JSON show: never the URL's credentials
        self.queries = 0
        self._lock = threading.Lock()  # queries may be sent from several threads
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json", **dict(config.headers)}
        if config.bearer_token is not None:
            headers["Authorization"] = f"Bearer {config.bearer_token}"
        elif config.username is not None:
            pair = f"{config.username}:{config.password or ''}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        self.headers = headers
        self._tls: ssl.SSLContext | None = None

    def _context(self) -> ssl.SSLContext | None:
        """The TLS context of an https URL, built once (CA, client certificate, or no verification)."""
        if not self.url.lower().startswith("https:"):
            return None
        with self._lock:
            if self._tls is None:
                cfg = self.config
                try:
                    ctx = ssl.create_default_context(cafile=cfg.ca_file or None)
                    if cfg.insecure_skip_verify:
                        ctx.check_hostname = False
                        ctx.verify_mode = ssl.CERT_NONE
                    if cfg.cert_file:
                        ctx.load_cert_chain(cfg.cert_file, cfg.key_file or None)
                except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
                    raise PrometheusError(f"cannot set up the connection to {self.base}: "
                                          f"{_one_line(str(exc))}") from None
                self._tls = ctx
            return self._tls

    def instant(self, expr: str, at: float) -> list[Sample]:
        """Evaluate `expr` at unix time `at`; a scalar answer becomes one sample without labels."""
        data = self._post("/api/v1/query", {"query": expr, "time": _fmt_time(at)}, expr)
        kind, result = data.get("resultType"), data.get("result")
        shape = _Shape(self.base, expr, kind)
        if kind == "vector":
            out: list[Sample] = []
            for item in shape.items(result):
                ts, raw = shape.point(item.get("value"), "value")
                out.append(Sample(labels=shape.labels(item), value=raw, time=ts))
            return out
        if kind == "scalar":
            ts, raw = shape.point(result, "result")
            return [Sample(labels={}, value=raw, time=ts)]
        raise PrometheusError(f"Prometheus answered {_one_line(expr, 120)!r} with a {_kind(kind)} result, "
                              "expected a vector")

    def range(self, expr: str, start: float, end: float, step_s: float) -> list[Series]:
        """Evaluate `expr` from `start` to `end` every `step_s` seconds."""
        params = {"query": expr, "start": _fmt_time(start), "end": _fmt_time(end), "step": f"{step_s:g}"}
        data = self._post("/api/v1/query_range", params, expr)
        kind, result = data.get("resultType"), data.get("result")
        if kind != "matrix":
            raise PrometheusError(f"Prometheus answered {_one_line(expr, 120)!r} with a {_kind(kind)} result, "
                                  "expected a matrix")
        shape = _Shape(self.base, expr, kind)
        out: list[Series] = []
        for item in shape.items(result):
            values = item.get("values")
            if not isinstance(values, list):
                raise shape.error("a series without its `values` list")
            out.append(Series(labels=shape.labels(item), points=tuple(shape.point(v, "values") for v in values)))
        return out

    def _post(self, path: str, params: Mapping[str, str], expr: str) -> dict[str, Any]:
        # POST keeps long PromQL out of the URL (Prometheus, Thanos and Mimir all accept form bodies).
        with self._lock:
            self.queries += 1
        cfg, cap = self.config, limits.MAX_PROMETHEUS_ANSWER_BYTES
        try:
            answer = outbound.request(self.url + path, method="POST", body=urlencode(params).encode(),
                                      headers=self.headers, timeout_s=cfg.timeout_s, max_bytes=cap,
                                      context=self._context(), accept_gzip=True)
        except outbound.OutboundError as exc:
            raise PrometheusError(_failure(exc, self.base, cfg.timeout_s, cap, expr)) from None
        return _decode(answer, self.base, expr)


def _failure(exc: outbound.OutboundError, base: str, timeout_s: float, cap: int, expr: str) -> str:
    """The one line a failed request becomes (what to change, where there is something to change)."""
    if exc.reason == "timeout":
        return (f"Prometheus at {base} did not answer within {duration_text(timeout_s)} (the whole answer, however slowly "
                "it comes; raise --prometheus.timeout or shorten --range)")
    if exc.reason == "too_large":
        return (f"Prometheus at {base} answered more than {cap // (1024 * 1024)} MiB ({cap} bytes, the cap per "
                f"answer) to {_one_line(expr, 120)!r}: narrow --selector or shorten --range")
    if exc.reason == "tls":
        return f"TLS error talking to Prometheus at {base}: {_one_line(exc.detail)}"
    if exc.reason == "invalid":
        return f"Prometheus at {base} sent an incomplete or undecodable answer: {_one_line(exc.detail)}"
    if exc.reason == "http_status":
        return f"Prometheus at {base}: {_one_line(exc.detail)}"
    return f"cannot reach Prometheus at {base}: {_one_line(exc.detail)}"


def _kind(kind: Any) -> str:
    return kind if isinstance(kind, str) else "missing" if kind is None else f"non-string ({type(kind).__name__})"


@dataclass(frozen=True, slots=True)
class _Shape:
    """Checks one answer's result against the API's shape; every mismatch is one PrometheusError line."""

    base: str
    expr: str
    kind: Any

    def error(self, what: str) -> PrometheusError:
        return PrometheusError(f"Prometheus at {self.base} returned a malformed {_kind(self.kind)} answer "
                               f"({what}) [query: {_one_line(self.expr, 120)}]")

    def items(self, result: Any) -> list[dict[str, Any]]:
        if not isinstance(result, list):
            raise self.error(f"`result` is {_type(result)}, not a list")
        if not all(isinstance(item, dict) for item in result):
            raise self.error("a `result` item is not an object")
        return result

    def labels(self, item: Mapping[str, Any]) -> dict[str, str]:
        metric = item.get("metric", {})
        if not isinstance(metric, dict) or not all(isinstance(v, str) for v in metric.values()):
            raise self.error("a series' `metric` is not an object of string labels")
        return metric

    def point(self, pair: Any, name: str) -> tuple[float, float]:
        if not isinstance(pair, list) or len(pair) != 2:
            raise self.error(f"`{name}` holds {_type(pair)} where a [time, value] pair belongs")
        ts, raw = pair
        if not isinstance(ts, (int, float)) or isinstance(ts, bool):
            raise self.error(f"a sample time is {_type(ts)}, not a number")
        return float(ts), _float(raw)


def _type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", type(None): "null"}.get(type(value), "a number")


def _decode(answer: outbound.Answer, base: str, expr: str) -> dict[str, Any]:
    """Turn an HTTP answer into the API's `data` object or a one-line PrometheusError."""
    body: Any = None
    text = answer.body.decode("utf-8", errors="replace")
    try:
        body = json.loads(text)
    except RecursionError:
        raise PrometheusError(f"Prometheus at {base} returned JSON nested too deeply to read") from None
    except ValueError:
        body = None
    status = answer.status
    if not isinstance(body, dict):
        ctype = answer.headers.get("content-type", "unknown content type")
        snippet = _one_line(text, 120) if text else "empty body"
        if status >= 400:
            raise PrometheusError(f"Prometheus at {base} returned HTTP {status}: {snippet}")
        if body is not None:
            raise PrometheusError(f"Prometheus at {base} returned JSON that is not an API answer (HTTP {status}, "
                                  f"{_type(body)} where an object with `status` and `data` belongs)")
        raise PrometheusError(f"Prometheus at {base} returned a non-JSON answer (HTTP {status}, "
                              f"{_one_line(ctype, 60)}): {snippet}")
    if "status" not in body and status < 400:
        raise PrometheusError(f"Prometheus at {base} returned JSON that is not an API answer (HTTP {status}, "
                              "no `status`)")
    if body.get("status") != "success" or status >= 400:
        kind = _one_line(str(body.get("errorType", "error")), 40)
        msg = _one_line(str(body.get("error", "no error message")))
        raise PrometheusError(f"Prometheus at {base} rejected the query (HTTP {status}, {kind}): {msg}"
                              f" [query: {_one_line(expr, 120)}]")
    partial = body.get("warnings")
    if partial:
        # A partial answer would make healthy servers look unknown or mis-tuned; refuse it.
        text = "; ".join(str(w) for w in partial) if isinstance(partial, list) else str(partial)
        raise PrometheusError(f"Prometheus at {base} returned a partial answer (warnings: {_one_line(text)})")
    data = body.get("data")
    if not isinstance(data, dict):
        raise PrometheusError(f"Prometheus at {base} returned no data object")
    return data


def _fmt_time(t: float) -> str:
    if math.isnan(t) or math.isinf(t):
        raise PrometheusError(f"invalid query time {t}")
    return f"{t:.3f}"
