"""Tests for reading SGLang's server-info endpoint (pure parse + endpoint fallback with a fake HTTP)."""

from __future__ import annotations

import json

import pytest

from helpers.netutil import oversized_body_server
from helpers.paths import FIXTURES
from sglang_tuning_exporter.sources.serverinfo import HttpError, ServerInfoClient, parse_server_info

DOC = json.loads((FIXTURES / "sglang-0.5.23-server_info-toplevel.json").read_text())


class FakeHttp:
    """Answers from a dict path -> body or status; records the URLs asked."""

    def __init__(self, routes: dict[str, bytes | int]) -> None:
        self.routes = routes
        self.asked: list[str] = []

    def __call__(self, url: str, timeout: float) -> bytes:
        self.asked.append(url)
        for path, answer in self.routes.items():
            if url.endswith(path):
                if isinstance(answer, int):
                    raise HttpError(f"HTTP {answer}", answer)
                return answer
        raise HttpError("HTTP 404", 404)


def test_parse_real_0523_server_info() -> None:
    """Version, the tuning knobs and capacity come out of the real 0.5.23 document."""
    info = parse_server_info(DOC)
    assert info.version == "0.5.23"
    assert info.args["mem_fraction_static"] == 0.85
    assert info.args["schedule_conservativeness"] == 0.3
    assert info.args["chunked_prefill_size"] == 4096
    assert info.args["schedule_policy"] == "fcfs"
    assert "internal_states" not in info.args
    assert info.model_name


def test_parse_internal_states_memory() -> None:
    """internal_states[i] (one per DP rank) gives each rank's startup headroom, largest captured decode
    batch and effective max running requests; max_total_num_tokens is server-wide."""
    doc = {"version": "0.5.23", "served_model_name": "m", "max_total_num_tokens": 1000, "max_running_requests": None,
           "internal_states": [
               {"memory_usage": {"startup_available": 6.5}, "decode_cuda_graph_bs": [1, 2, 4],
                "effective_max_running_requests_per_dp": 2048},
               {"memory_usage": {"startup_available": 4.25}, "decode_cuda_graph_bs": [1, 2, 4, 8, True],
                "effective_max_running_requests_per_dp": 1024}]}
    info = parse_server_info(doc)
    assert info.max_total_num_tokens == 1000
    assert [dict(f) for f in info.rank_facts] == [
        {"max_total_num_tokens": 1000.0, "available_gpu_mem_gb": 6.5, "cuda_graph_max_bs_captured": 4.0,
         "max_running_requests": 2048.0},
        {"max_total_num_tokens": 1000.0, "available_gpu_mem_gb": 4.25, "cuda_graph_max_bs_captured": 8.0,
         "max_running_requests": 1024.0}]


def test_rank_facts_of_older_documents() -> None:
    """Before `effective_max_running_requests_per_dp` (0.5.8) the flag's value stands in when set; 0.4.4-0.4.6
    merged the internal state into the top level; odd values are skipped, never raised."""
    old = parse_server_info({"version": "0.4.5", "max_running_requests": 512, "max_total_num_tokens": 9000,
                             "memory_usage": {"startup_available": 7.0}})
    assert [dict(f) for f in old.rank_facts] == [
        {"max_total_num_tokens": 9000.0, "available_gpu_mem_gb": 7.0, "max_running_requests": 512.0}]
    odd = parse_server_info({"version": "x", "internal_states": ["?", {"memory_usage": "full",
                                                                      "decode_cuda_graph_bs": "1,2"}]})
    assert [dict(f) for f in odd.rank_facts] == [{}, {}]


def test_parse_rejects_non_object() -> None:
    """A JSON list is not server info: a clear ValueError."""
    with pytest.raises(ValueError, match="not a JSON object"):
        parse_server_info([1, 2])


def test_fallback_to_get_server_info_on_404_and_remembered() -> None:
    """An older release 404s /server_info: /get_server_info is used and tried first next time."""
    http = FakeHttp({"/server_info": 404, "/get_server_info": json.dumps({"version": "0.4.10"}).encode()})
    client = ServerInfoClient("http://sglang:30000/", 1.0, get=http, timer=lambda: 0.0)
    res = client.fetch()
    assert res.info is not None and res.info.version == "0.4.10"
    assert res.endpoint == "/get_server_info"
    assert http.asked == ["http://sglang:30000/server_info", "http://sglang:30000/get_server_info"]
    http.asked.clear()
    client.fetch()
    assert http.asked == ["http://sglang:30000/get_server_info"]


def test_server_down_stops_at_first_failure() -> None:
    """A connection failure is not a 404: no pointless fallbacks, a clear error."""
    asked: list[str] = []

    def down(url: str, timeout: float) -> bytes:
        asked.append(url)
        raise HttpError(f"GET {url} failed: connection refused")
    res = ServerInfoClient("http://x", 1.0, get=down, timer=lambda: 0.0).fetch()
    assert res.info is None and res.error is not None and "connection refused" in res.error
    assert asked == ["http://x/server_info"]  # no fallback to older endpoints
    http = FakeHttp({"/server_info": 500})
    res = ServerInfoClient("http://sglang:30000", 1.0, get=http, timer=lambda: 0.0).fetch()
    assert res.info is None and http.asked == ["http://sglang:30000/server_info"]  # only a 404 falls back


def test_invalid_json_is_an_error_not_a_crash() -> None:
    """Garbage from the endpoint is reported as an error."""
    http = FakeHttp({"/server_info": b"<html>"})
    res = ServerInfoClient("http://x", 1.0, get=http, timer=lambda: 0.0).fetch()
    assert res.info is None and res.error is not None and "invalid server info" in res.error


def test_non_finite_numbers_are_ignored() -> None:
    """`Infinity` (which Python's json accepts) does not crash the parse."""
    info = parse_server_info(json.loads('{"version": "x", "max_total_num_tokens": Infinity}'))
    assert info.max_total_num_tokens is None


def test_max_running_requests_per_dp_rank_under_dp_attention() -> None:
    """Before `effective_max_running_requests_per_dp` (0.5.8), DP attention splits the flag across the DP
    ranks as SGLang does (max_running_requests // dp_size); without DP attention each rank has it whole."""
    doc = {"version": "0.5.4", "max_running_requests": 1024, "dp_size": 8, "enable_dp_attention": True,
           "internal_states": [{"decode_cuda_graph_bs": [1, 128]} for _ in range(8)]}
    assert {f["max_running_requests"] for f in parse_server_info(doc).rank_facts} == {128.0}
    plain = {**doc, "enable_dp_attention": False}
    assert {f["max_running_requests"] for f in parse_server_info(plain).rank_facts} == {1024.0}
    newer = {**doc, "internal_states": [{"effective_max_running_requests_per_dp": 100}]}
    assert [f["max_running_requests"] for f in parse_server_info(newer).rank_facts] == [100.0]


def test_default_mem_fraction_none_takes_the_resolved_value_and_memory_split() -> None:
    """--mem-fraction-static defaults to None (computed at start-up): the internal state's resolved value is
    the current one; memory_usage's weight and kvcache become the weights and KV-size facts."""
    doc = {"version": "0.5.24", "served_model_name": "m", "mem_fraction_static": None,
           "internal_states": [{"mem_fraction_static": 0.872,
                                "memory_usage": {"weight": 15.3, "kvcache": 48.31, "startup_available": 6.2,
                                                 "graph": {"decode": 0.3}}}]}
    info = parse_server_info(doc)
    assert info.args["mem_fraction_static"] == 0.872
    assert dict(info.rank_facts[0]) == {"available_gpu_mem_gb": 6.2, "weights_gb": 15.3, "kv_cache_gb": 48.31}
    doc["internal_states"] = [{}]
    assert parse_server_info(doc).args["mem_fraction_static"] is None  # unknown stays unknown (never printed)


def test_a_long_string_is_clipped_as_a_scraped_label_is() -> None:
    """One rule (core/limits.clip_text) for server-info strings and /metrics label values: the same
    long text comes out the same, and each source counts the cut."""
    from sglang_tuning_exporter.core import limits
    from sglang_tuning_exporter.sources.scrape import parse_exposition

    long = "m" * (limits.MAX_LABEL_VALUE_CHARS + 40)
    info = parse_server_info({"version": long, "served_model_name": long, "model_path": long})
    expo = parse_exposition(f'sglang:num_queue_reqs{{model_name="{long}"}} 3\n')
    label = dict(expo.samples[0].labels)["model_name"]
    assert info.version == info.model_name == label == limits.clip_text(long)[0]
    assert len(label) == limits.MAX_LABEL_VALUE_CHARS
    assert info.truncated["string"] == 3 and expo.clipped_labels == 1  # version and the two args


def test_the_body_is_read_no_further_than_one_byte_past_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body larger than the cap is refused (too_large) after reading at most cap + 1 bytes of it."""
    from sglang_tuning_exporter.sources.serverinfo import urllib_get

    cap, body = 100_000, b"x" * 1_000_000
    with oversized_body_server(body, monkeypatch) as (url, read), pytest.raises(HttpError) as err:
        urllib_get(f"{url}/server_info", 5.0, max_bytes=cap)
    assert err.value.reason == "too_large"
    assert read[0] == cap + 1
