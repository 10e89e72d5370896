"""An in-process SGLang for `build_sidecar(http_get=...)`: recorded /metrics answers in order, one
/server_info document, 404 for anything else."""

from __future__ import annotations

from collections.abc import Callable

from sglang_tuning_exporter.sources.serverinfo import HttpError


def recorded_sglang(texts: list[str], server_info: bytes) -> Callable[[str, float], bytes]:
    """A getter answering /metrics with `texts` one scrape each (the last one again once they run out)."""
    def get(url: str, timeout: float) -> bytes:
        if url.endswith("/metrics"):
            return (texts.pop(0) if len(texts) > 1 else texts[0]).encode()
        if url.endswith("/server_info"):
            return server_info
        raise HttpError("HTTP 404", 404)
    return get
