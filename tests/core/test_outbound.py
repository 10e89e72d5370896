"""core/outbound.py against a loopback hostile server: framing, caps, gzip, redirects, auth (issue 23)."""

from __future__ import annotations

import base64
import gzip
import time

import pytest

from helpers.hostile_sglang import Body, Drip, HostileSGLang, Redirect
from sglang_tuning_exporter.core import outbound

BODY = b"sglang:num_queue_reqs 1\n" * 40


@pytest.mark.parametrize("framing", ["length", "close", "chunked"])
def test_every_framing_reads_the_whole_body(framing: str) -> None:
    """Content-Length, close-delimited and chunked answers all give the same complete body."""
    with HostileSGLang({"/m": Drip(BODY, every_s=0.0, chunk=100, framing=framing)}) as s:
        answer = outbound.request(s.url + "/m", timeout_s=2.0, max_bytes=1 << 20)
    assert answer.status == 200 and answer.body == BODY


@pytest.mark.parametrize("framing", ["length", "close", "chunked"])
def test_the_deadline_holds_whatever_the_framing(framing: str) -> None:
    """A drip of 20 bytes/s for a 960-byte body is cut at the 0.3 s deadline, as `timeout`."""
    with HostileSGLang({"/m": Drip(BODY, every_s=0.05, framing=framing)}) as s:
        start = time.monotonic()
        with pytest.raises(outbound.OutboundError) as exc:
            outbound.request(s.url + "/m", timeout_s=0.3, max_bytes=1 << 20)
        took = time.monotonic() - start
    assert exc.value.reason == "timeout" and "0.3 s deadline" in str(exc.value)
    assert took < 0.8, took


def test_a_gzip_body_is_inflated_and_a_bomb_stops_at_the_cap() -> None:
    """gzip is inflated (even unasked); 32 MiB of zeros in a 32 KiB gzip body stops at a 1 MiB cap."""
    zipped = (("Content-Encoding", "gzip"),)
    with HostileSGLang({"/ok": Body(gzip.compress(BODY), headers=zipped),
                        "/bomb": Body(gzip.compress(b"\0" * (32 << 20)), headers=zipped),
                        "/br": Body(b"x", headers=(("Content-Encoding", "br"),))}) as s:
        assert outbound.request(s.url + "/ok", timeout_s=2.0, max_bytes=1 << 20).body == BODY
        with pytest.raises(outbound.OutboundError, match=r"larger than 1048576 bytes \(the cap\)") as exc:
            outbound.request(s.url + "/bomb", timeout_s=5.0, max_bytes=1 << 20)
        assert exc.value.reason == "too_large"
        with pytest.raises(outbound.OutboundError, match="unsupported Content-Encoding 'br'"):
            outbound.request(s.url + "/br", timeout_s=2.0, max_bytes=1 << 20)


def test_a_gzip_stream_cut_short_is_invalid() -> None:
    """A gzip body whose stream ends early (its framing complete) is no answer."""
    truncated = gzip.compress(BODY * 10)[:-20]
    with HostileSGLang({"/m": Body(truncated, headers=(("Content-Encoding", "gzip"),))}) as s, \
            pytest.raises(outbound.OutboundError, match="gzip body cut short") as exc:
        outbound.request(s.url + "/m", timeout_s=2.0, max_bytes=1 << 20)
    assert exc.value.reason == "invalid"


def test_redirects_same_host_only_and_at_most_three() -> None:
    """Same host: followed (a POST turned into a GET by 303); a loop ends after 3 hops."""
    with HostileSGLang({"/a": Redirect("/b", 303), "/b": Body(b"done"), "/loop": Redirect("/loop")}) as s:
        answer = outbound.request(s.url + "/a", method="POST", body=b"q=1", timeout_s=2.0, max_bytes=100)
        assert answer.body == b"done" and [p for p, _ in s.seen] == ["/a", "/b"]
        with pytest.raises(outbound.OutboundError, match="more than 3 redirects"):
            outbound.request(s.url + "/loop", timeout_s=2.0, max_bytes=100)


def test_user_info_in_the_url_is_basic_auth_and_never_printed() -> None:
    """`http://u:p@host` sends basic auth; error messages name the origin without the user info."""
    with HostileSGLang({"/m": Body(b"ok"), "/slow": Drip(BODY, every_s=0.05)}) as s:
        url = s.url.replace("http://", "http://alice:s%3Acret@")
        outbound.request(url + "/m", timeout_s=2.0, max_bytes=100)
        assert s.seen[0][1]["Authorization"] == "Basic " + base64.b64encode(b"alice:s:cret").decode()
        with pytest.raises(outbound.OutboundError) as exc:
            outbound.request(url + "/slow", timeout_s=0.2, max_bytes=1 << 20)
    assert "alice" not in str(exc.value) and "cret" not in str(exc.value)


def test_a_url_that_is_not_http_is_named_without_its_secrets() -> None:
    """The one-line error names what was configured, its user info and secret-looking query values redacted."""
    with pytest.raises(outbound.OutboundError, match="not an http") as exc:
        outbound.request("ftp://alice:pw@host/m?token=s3cret&x=1", timeout_s=1.0, max_bytes=100)
    assert "s3cret" not in str(exc.value) and "pw" not in str(exc.value) and "x=1" in str(exc.value)
