"""A thin typed client for the Prometheus HTTP API (instant and range queries) with auth, TLS and timeouts.

Every failure becomes a `PrometheusError` whose message is one line a person can act on; callers never see
a `requests` exception or a traceback.
"""

from __future__ import annotations

import json
import math
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import requests

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
    """Runs PromQL against one Prometheus-compatible endpoint and counts the queries it sends."""

    def __init__(self, config: PromConfig, session: requests.Session | None = None) -> None:
        """Build from `config`; `session` is injectable so tests can point it anywhere."""
        self.config = config
        self.base = config.url.rstrip("/")
        self.session = session if session is not None else requests.Session()
        self.queries = 0
        self._lock = threading.Lock()  # queries may be sent from several threads
        self.session.headers["User-Agent"] = USER_AGENT
        for name, value in config.headers:
            self.session.headers[name] = value
        if config.bearer_token is not None:
            self.session.headers["Authorization"] = f"Bearer {config.bearer_token}"
        elif config.username is not None:
            self.session.auth = (config.username, config.password or "")
        # Passed on every request: a session-level `verify` loses to REQUESTS_CA_BUNDLE in requests.
        self.verify: bool | str = True
        if config.insecure_skip_verify:
            self.verify = False
        elif config.ca_file:
            self.verify = config.ca_file
        if config.cert_file:
            self.session.cert = (config.cert_file, config.key_file) if config.key_file else config.cert_file

    def instant(self, expr: str, at: float) -> list[Sample]:
        """Evaluate `expr` at unix time `at`; a scalar answer becomes one sample without labels."""
        data = self._post("/api/v1/query", {"query": expr, "time": _fmt_time(at)}, expr)
        kind, result = data.get("resultType"), data.get("result")
        if kind == "vector" and isinstance(result, list):
            out: list[Sample] = []
            for item in result:
                ts, raw = item["value"]
                out.append(Sample(labels=dict(item.get("metric", {})), value=_float(raw), time=float(ts)))
            return out
        if kind == "scalar" and isinstance(result, list):
            return [Sample(labels={}, value=_float(result[1]), time=float(result[0]))]
        raise PrometheusError(f"Prometheus answered {expr!r} with a {kind} result, expected a vector")

    def range(self, expr: str, start: float, end: float, step_s: float) -> list[Series]:
        """Evaluate `expr` from `start` to `end` every `step_s` seconds."""
        params = {"query": expr, "start": _fmt_time(start), "end": _fmt_time(end), "step": f"{step_s:g}"}
        data = self._post("/api/v1/query_range", params, expr)
        kind, result = data.get("resultType"), data.get("result")
        if kind != "matrix" or not isinstance(result, list):
            raise PrometheusError(f"Prometheus answered {expr!r} with a {kind} result, expected a matrix")
        return [Series(labels=dict(item.get("metric", {})),
                       points=tuple((float(t), _float(v)) for t, v in item.get("values", [])))
                for item in result]

    def _post(self, path: str, params: Mapping[str, str], expr: str) -> dict[str, Any]:
        # POST keeps long PromQL out of the URL (Prometheus, Thanos and Mimir all accept form bodies).
        with self._lock:
            self.queries += 1
        url = self.base + path
        try:
            with warnings.catch_warnings():
                # The user asked for --prometheus.insecure-skip-verify; do not print urllib3's warning per query.
                warnings.simplefilter("ignore")
                resp = self.session.post(url, data=dict(params), timeout=self.config.timeout_s, verify=self.verify)
        except requests.exceptions.Timeout:
            raise PrometheusError(
                f"Prometheus at {self.base} did not answer within {self.config.timeout_s:g} s "
                f"(raise --prometheus.timeout or shorten --range)") from None
        except requests.exceptions.SSLError as exc:
            raise PrometheusError(f"TLS error talking to Prometheus at {self.base}: {_reason(exc)}") from None
        except requests.exceptions.ConnectionError as exc:
            raise PrometheusError(f"cannot reach Prometheus at {self.base}: {_reason(exc)}") from None
        except requests.exceptions.RequestException as exc:
            raise PrometheusError(f"request to Prometheus at {self.base} failed: {_reason(exc)}") from None
        except OSError as exc:  # e.g. an unreadable CA or client-certificate file
            raise PrometheusError(f"cannot set up the connection to {self.base}: {_one_line(str(exc))}") from None
        return _decode(resp, self.base, expr)


def _decode(resp: requests.Response, base: str, expr: str) -> dict[str, Any]:
    """Turn an HTTP answer into the API's `data` object or a one-line PrometheusError."""
    body: Any = None
    try:
        body = resp.json()
    except (ValueError, json.JSONDecodeError):
        body = None
    if not isinstance(body, dict):
        ctype = resp.headers.get("Content-Type", "unknown content type")
        snippet = _one_line(resp.text, 120) if resp.text else "empty body"
        if resp.status_code >= 400:
            raise PrometheusError(f"Prometheus at {base} returned HTTP {resp.status_code}: {snippet}")
        raise PrometheusError(f"Prometheus at {base} returned a non-JSON answer (HTTP {resp.status_code}, "
                              f"{ctype}): {snippet}")
    if body.get("status") != "success" or resp.status_code >= 400:
        kind = body.get("errorType", "error")
        msg = _one_line(str(body.get("error", "no error message")))
        raise PrometheusError(f"Prometheus at {base} rejected the query (HTTP {resp.status_code}, {kind}): {msg}"
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


def _reason(exc: BaseException) -> str:
    # requests nests the real cause several levels deep; the innermost message is the useful one.
    inner: BaseException = exc
    while inner.__context__ is not None and inner.__context__ is not inner:
        inner = inner.__context__
    for arg in getattr(exc, "args", ()):
        reason = getattr(arg, "reason", None)
        if reason is not None:
            return _one_line(str(reason))
    return _one_line(str(inner) or type(inner).__name__)


def _fmt_time(t: float) -> str:
    if math.isnan(t) or math.isinf(t):
        raise PrometheusError(f"invalid query time {t}")
    return f"{t:.3f}"
