"""A faulty SGLang must not blind, bloat or freeze the sidecar (issue 17).

Every failure an adversarial run found against `serve` is a test here: a source that fails is caught,
counted and visible (`source_up` 0 with a reason) and never stops the other sources or the evaluation;
a scrape has a whole-request deadline; label lengths, samples and bodies are bounded and what is cut is
counted. The HTTP cases use `hostile_sglang.HostileSGLang` on 127.0.0.1, bounded in time.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable

import pytest

from helpers.hostile_sglang import Body, Cut, Drip, HostileSGLang, Redirect, Stall, deep_json
from sglang_tuning_exporter.core import limits
from sglang_tuning_exporter.core.events import Event
from sglang_tuning_exporter.sidecar.collector import BuildInfo, build_families, encode_text
from sglang_tuning_exporter.sidecar.engine import Advisor, LogInput, Sidecar
from sglang_tuning_exporter.sidecar.jobs import ThreadJobs
from sglang_tuning_exporter.sidecar.serve import Loop, build_sidecar
from sglang_tuning_exporter.sidecar.serveconfig import add_serve_flags, build_config
from sglang_tuning_exporter.sources.scrape import ScrapeInterpreter, parse_exposition, rank_of, wanted
from sglang_tuning_exporter.sources.serverinfo import (
    HttpError,
    HttpGet,
    ServerInfoClient,
    parse_server_info,
    urllib_get,
)

GOOD_METRICS = b'sglang:num_queue_reqs{model_name="m",tp_rank="0"} 5\nsglang:num_running_reqs{tp_rank="0"} 7\n'
GOOD_INFO = json.dumps({"version": "0.5.23", "served_model_name": "m", "tp_size": 1}).encode()
BUILD = BuildInfo("0.0.0-test", "3.11")


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_serve_flags(p)
    return p.parse_args(list(argv))


def _advisor() -> Advisor:
    return Advisor(window=None, evaluate=lambda signals, server: [], document=None, to_observations=None)


def _sidecar(routes: dict[str, bytes | Exception]) -> Sidecar:
    def http(url: str, timeout: float) -> bytes:
        for path, answer in routes.items():
            if url.endswith(path):
                if isinstance(answer, Exception):
                    raise answer
                return answer
        raise HttpError("HTTP 404", 404, reason="http_status")

    cfg = build_config(_args("--sglang.url", "http://sglang:30000", "--sglang.scrape-interval", "1s",
                             "--evaluation-interval", "1s"))
    return build_sidecar(cfg, timer=lambda: 0.0, http_get=http, advisor=_advisor())


def _exposition(sc: Sidecar, now: float) -> str:
    return encode_text(build_families(sc.state.snapshot(now), BUILD)).decode()


def _failures(text: str, source: str) -> dict[str, float]:
    out: dict[str, float] = {}
    prefix = f'sglang_tuning_source_failures_total{{source="{source}",reason="'
    for line in text.splitlines():
        if line.startswith(prefix):
            reason, _, value = line[len(prefix):].partition('"} ')
            out[reason] = float(value)
    return out


# --- (1) blinded ----------------------------------------------------------------------------------
def test_deeply_nested_server_info_is_a_counted_source_failure() -> None:
    """`[` x 200000 from /server_info: no RecursionError escapes; server_info is down with the reason,
    the scrape and the evaluation go on, and /-/ready would be 200."""
    sc = _sidecar({"/server_info": deep_json(200_000), "/metrics": GOOD_METRICS})
    for t in range(3):
        sc.tick(float(t))
    snap = sc.state.snapshot(2.0)
    assert snap.sources["server_info"].up is False
    assert "nested too deeply" in snap.sources["server_info"].detail
    assert snap.sources["metrics"].up is True and sc.ready
    text = _exposition(sc, 2.0)
    assert 'sglang_tuning_source_up{source="server_info"} 0.0' in text
    assert _failures(text, "server_info")["invalid"] >= 1


def test_deep_json_alone_does_not_raise_from_the_client() -> None:
    """The client turns the decoder's RecursionError into a failed fetch."""
    client = ServerInfoClient("http://s", 1.0, get=lambda url, timeout: deep_json(200_000))
    res = client.fetch()
    assert res.info is None and res.reason == "invalid" and "nested too deeply" in (res.error or "")


def test_empty_name_exposition_line_is_garbage_not_an_index_error() -> None:
    """`{} 1` (and friends) are counted garbage lines; the good lines around them are read."""
    body = '{} 1\n{a="b"} 2\n  \t{}\nsglang:num_queue_reqs{tp_rank="0"} 3\n'
    for keep in (None, wanted):
        exp = parse_exposition(body, keep=keep)
        assert exp.garbage_lines == 3, keep
        assert [s.name for s in exp.samples] == ["sglang:num_queue_reqs"]


def test_huge_rank_label_is_no_rank_and_the_scrape_goes_on() -> None:
    """A 4300-digit tp_rank is not a rank (int() would raise past Python's digit limit)."""
    assert rank_of({"tp_rank": "9" * 4300}).tp is None
    assert rank_of({"tp_rank": "-" + "9" * 30}).tp is None
    assert rank_of({"tp_rank": "12"}).tp == 12
    body = f'sglang:num_queue_reqs{{tp_rank="{"9" * 4300}"}} 3\nsglang:num_running_reqs{{tp_rank="0"}} 1\n'
    sc = _sidecar({"/server_info": GOOD_INFO, "/metrics": body.encode()})
    sc.tick(0.0)
    assert sc.state.source_up("metrics") is True and sc.ready


def test_any_exception_in_a_source_is_caught_counted_and_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unexpected error inside one source's code marks that source down (reason `internal`), counts
    it, and neither the other sources nor the evaluation stop."""
    sc = _sidecar({"/server_info": GOOD_INFO, "/metrics": GOOD_METRICS})

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("interpreter bug")

    monkeypatch.setattr(ScrapeInterpreter, "interpret", boom)
    for t in range(3):
        sc.tick(float(t))
    snap = sc.state.snapshot(2.0)
    assert snap.sources["metrics"].up is False and "interpreter bug" in snap.sources["metrics"].detail
    assert snap.sources["server_info"].up is True and sc.evaluations == 3
    text = _exposition(sc, 2.0)
    assert "sglang_tuning_up 0.0" in text
    assert _failures(text, "metrics") == {"internal": 3.0}


def test_http_failures_are_counted_by_reason() -> None:
    """Refused, HTTP status, over-size and timeout each have their reason; a good scrape counts none."""
    sc = _sidecar({"/server_info": GOOD_INFO, "/metrics": HttpError("GET failed: refused", reason="connection")})
    sc.tick(0.0)
    sc.metrics.get = lambda url, timeout: (_ for _ in ()).throw(  # type: ignore[union-attr]
        HttpError("deadline", reason="timeout")) if url.endswith("/metrics") else GOOD_INFO
    sc.tick(1.0)
    text = _exposition(sc, 1.0)
    assert _failures(text, "metrics") == {"connection": 1.0, "timeout": 1.0}
    assert _failures(text, "server_info") == {}


# --- (2) frozen: a deadline for the whole request -------------------------------------------------
@pytest.mark.parametrize("route", [
    Drip(b"sglang:num_queue_reqs 1\n" * 100, every_s=0.05),  # the body, a byte at a time
    Drip(b"sglang:num_queue_reqs 1\n", every_s=0.05, headers=True),  # even the status line drips
    Stall(),  # headers, then nothing
    # No Content-Length: the body ends when the server closes (http.client hands such a socket to the
    # response, out of the connection's reach), or chunked, a one-byte chunk at a time.
    Drip(b"sglang:num_queue_reqs 1\n" * 100, every_s=0.05, framing="close"),
    Drip(b"sglang:num_queue_reqs 1\n" * 100, every_s=0.05, framing="close", headers=True),
    Drip(b"sglang:num_queue_reqs 1\n" * 100, every_s=0.05, framing="chunked"),
], ids=["body-drip", "header-drip", "stall", "close-drip", "close-header-drip", "chunked-drip"])
def test_scrape_has_a_whole_request_deadline(route: Drip | Stall) -> None:
    """`--sglang.scrape-timeout` bounds the request, not each socket read: a server dripping a byte
    every 50 ms (each read well inside the timeout) is cut off at the deadline, as a timeout."""
    with HostileSGLang({"/metrics": route}) as s:
        start = time.monotonic()
        with pytest.raises(HttpError) as exc:
            urllib_get(s.url + "/metrics", 0.5)
        took = time.monotonic() - start
    assert exc.value.reason == "timeout"
    assert took < 1.5, took


@pytest.mark.parametrize("route", [
    Cut(GOOD_METRICS * 20, sent=len(GOOD_METRICS) * 9),  # fewer bytes than Content-Length said
    Cut(GOOD_METRICS * 20, sent=len(GOOD_METRICS) * 9, framing="chunked"),  # a chunk cut short
    Cut(GOOD_METRICS * 20, sent=len(GOOD_METRICS) * 20 + 7, framing="chunked"),  # no last chunk
], ids=["length", "chunked-mid", "chunked-end"])
def test_a_body_cut_short_is_a_failed_request(route: Cut) -> None:
    """A body shorter than its framing promised is no answer: reason `invalid`, never a partial scrape."""
    with HostileSGLang({"/metrics": route}) as s, pytest.raises(HttpError) as exc:
        urllib_get(s.url + "/metrics", 2.0)
    assert exc.value.reason == "invalid" and "cut short" in str(exc.value)


@pytest.mark.parametrize("body", [
    GOOD_METRICS * 9 + b"sglang:num_running_reqs{tp_rank=",  # close-delimited, ends mid-line
    GOOD_METRICS * 9 + b"sglang:num_running_reqs 4",  # the last line without its newline
], ids=["mid-line", "no-final-newline"])
def test_an_exposition_that_ends_mid_line_is_a_failed_scrape(body: bytes) -> None:
    """A close-delimited /metrics has no length to check: an exposition whose last line is not ended
    was cut (the format ends every line with a newline). The scrape fails (`invalid`) and reads nothing."""
    with HostileSGLang({"/metrics": Drip(body, every_s=0.0, chunk=1 << 16, framing="close"),
                        "/server_info": Body(GOOD_INFO)}) as s:
        cfg = build_config(_args("--sglang.url", s.url, "--sglang.scrape-timeout", "2s"))
        sc = build_sidecar(cfg, timer=time.perf_counter, advisor=_advisor())
        sc.tick(0.0)
    snap = sc.state.snapshot(0.0)
    assert snap.sources["metrics"].up is False and "newline" in snap.sources["metrics"].detail
    assert _failures(_exposition(sc, 0.0), "metrics") == {"invalid": 1.0}
    assert snap.scrape_samples is None  # nothing of it was read


def test_redirects_stay_on_the_configured_host() -> None:
    """A redirect to the same host is followed; one to another host is refused (`http_status`), and the
    API key never reaches the other host."""
    with HostileSGLang({"/metrics": Body(GOOD_METRICS)}) as other:
        with HostileSGLang({"/metrics": Redirect(other.url + "/metrics"), "/moved": Redirect("/real"),
                            "/real": Body(GOOD_METRICS)}) as s:
            assert urllib_get(s.url + "/moved", 2.0, api_key="k3y") == GOOD_METRICS
            with pytest.raises(HttpError) as exc:
                urllib_get(s.url + "/metrics", 2.0, api_key="k3y")
        assert exc.value.reason == "http_status" and "another host" in str(exc.value)
        assert other.seen == []


def test_a_dripping_endpoint_does_not_freeze_the_tick() -> None:
    """Through the sidecar: the tick returns by the deadline, `up` is 0 with a timeout reason."""
    with HostileSGLang({"/metrics": Drip(b"x" * 1000, every_s=0.05), "/server_info": Body(GOOD_INFO)}) as s:
        cfg = build_config(_args("--sglang.url", s.url, "--sglang.scrape-timeout", "500ms",
                                 "--sglang.scrape-interval", "1s"))
        sc = build_sidecar(cfg, timer=time.perf_counter, advisor=_advisor())
        start = time.monotonic()
        sc.tick(0.0)
        took = time.monotonic() - start
    assert took < 2.0, took
    snap = sc.state.snapshot(0.0)
    assert snap.sources["metrics"].up is False and "deadline" in snap.sources["metrics"].detail
    assert _failures(_exposition(sc, 0.0), "metrics") == {"timeout": 1.0}
    assert snap.sources["server_info"].up is True


class _Lines:
    """A log follower that hands out one new line per poll and counts the polls."""

    rotations = truncations = 0

    def __init__(self) -> None:
        self.polls = 0

    def poll(self) -> list[str]:
        self.polls += 1
        return [f"line {self.polls}"]


class _NoEvents:
    def feed(self, line: str) -> list[Event]:
        return []


def _threaded(url: str, timeout: str, get: HttpGet | None = None) -> tuple[Sidecar, _Lines, threading.Event]:
    wake = threading.Event()
    lines = _Lines()
    cfg = build_config(_args("--sglang.url", url, "--sglang.scrape-timeout", timeout, "--sglang.scrape-interval",
                             "1s", "--evaluation-interval", "1s"))
    sc = build_sidecar(cfg, timer=time.perf_counter, advisor=_advisor(),
                       log_input=LogInput(follower=lines, reader=_NoEvents(), exists=lambda: True),
                       **({"http_get": get} if get is not None else {}))
    sc.jobs = ThreadJobs(notify=wake.set)
    return sc, lines, wake


def _run_loop(sc: Sidecar, wake: threading.Event, until: Callable[[], bool], limit_s: float) -> tuple[float, float]:
    """Tick like serve's loop (woken by jobs, else every 50 ms) until `until()`; (time taken, longest tick)."""
    start = longest = time.monotonic()
    longest = 0.0
    while not until() and time.monotonic() - start < limit_s:
        t0 = time.monotonic()
        sc.tick(time.time(), t0)
        longest = max(longest, time.monotonic() - t0)
        wake.wait(0.05)
        wake.clear()
    return time.monotonic() - start, longest


@pytest.mark.parametrize("framing", ["close", "length", "chunked"])
def test_a_dripping_source_never_holds_the_loop(framing: str) -> None:
    """A /metrics dripped a byte every 50 ms (for 30 s), scrape timeout 0.5 s: the loop keeps reading the
    log every tick (no tick takes 100 ms), evaluations go on (/-/ready), and the metrics source is down with
    reason `timeout` within twice its timeout."""
    body = GOOD_METRICS * 6
    with HostileSGLang({"/metrics": Drip(body, every_s=0.05, framing=framing),
                        "/server_info": Body(GOOD_INFO)}) as s:
        sc, lines, wake = _threaded(s.url, "500ms")
        took, longest = _run_loop(sc, wake, lambda: sc.state.source_up("metrics") is False, 3.0)
    assert sc.state.source_up("metrics") is False and took < 1.0, took
    assert longest < 0.1, longest
    assert lines.polls >= 8 and sc.ready and sc.state.source_up("server_info") is True
    text = _exposition(sc, time.time())
    assert "sglang_tuning_up 0.0" in text and _failures(text, "metrics") == {"timeout": 1.0}


def test_a_getter_that_never_returns_is_failed_at_twice_the_timeout() -> None:
    """A getter without a deadline of its own (it blocks until released): the source is down (reason
    `timeout`) once its job ran twice the timeout, the loop never waits for it, and its late answer is
    dropped; the next scrape runs as usual."""
    release = threading.Event()
    calls: list[str] = []

    def get(url: str, timeout: float) -> bytes:
        calls.append(url)
        if url.endswith("/metrics") and len(calls) <= 2:
            release.wait(5.0)
        return GOOD_INFO if "info" in url else GOOD_METRICS

    sc, lines, wake = _threaded("http://sglang:30000", "200ms", get)
    took, longest = _run_loop(sc, wake, lambda: sc.state.source_up("metrics") is False, 3.0)
    assert 0.4 <= took < 0.8, took
    assert longest < 0.1 and lines.polls >= 5
    assert "still waiting" in sc.state.snapshot(time.time()).sources["metrics"].detail
    release.set()
    _run_loop(sc, wake, lambda: sc.state.source_up("metrics") is True, 3.0)
    assert sc.state.source_up("metrics") is True
    assert _failures(_exposition(sc, time.time()), "metrics") == {"timeout": 1.0}


def test_a_wall_clock_stepped_back_stops_nothing() -> None:
    """Scrapes and evaluations are scheduled on the monotonic clock: the wall clock stepped back an hour
    (NTP, a VM resumed) after the first tick, every later tick still scrapes and evaluates when due."""
    hits: list[str] = []

    def get(url: str, timeout: float) -> bytes:
        hits.append(url.rsplit("/", 1)[1])
        return GOOD_INFO if "info" in url else GOOD_METRICS

    cfg = build_config(_args("--sglang.url", "http://sglang:30000", "--sglang.scrape-interval", "1s",
                             "--evaluation-interval", "1s"))
    sc = build_sidecar(cfg, timer=lambda: 0.0, http_get=get, advisor=_advisor())
    wall = 1_800_000_000.0
    sc.tick(wall, 100.0)
    for i in range(1, 6):
        sc.tick(wall - 3600 + i, 100.0 + i)  # one hour back, then on
    assert hits.count("metrics") == 6 and sc.evaluations == 6


def test_the_loop_passes_the_monotonic_clock() -> None:
    """serve's Loop ticks with the wall clock and the monotonic one; a wall clock stepped back an hour
    does not stop its scrapes."""
    walls = iter([1_800_000_000.0] + [1_800_000_000.0 - 3600] * 10_000)
    hits: list[float] = []

    def get(url: str, timeout: float) -> bytes:
        hits.append(time.monotonic())
        return GOOD_INFO if "info" in url else GOOD_METRICS

    cfg = build_config(_args("--sglang.url", "http://sglang:30000", "--sglang.scrape-interval", "100ms"))
    sc = build_sidecar(cfg, http_get=get, advisor=_advisor())
    mono = [0.0]

    def step() -> float:
        mono[0] += 0.05  # 50 ms of monotonic time per tick, however fast the ticks come
        return mono[0]

    loop = Loop(sc, lambda: next(walls), 0.001, mono=step)
    loop.start()
    try:
        deadline = time.monotonic() + 5
        while len(hits) < 8 and time.monotonic() < deadline:
            loop.wake.wait(0.01)
    finally:
        loop.stop()
    assert len(hits) >= 8


def test_real_client_reports_status_and_refusal_reasons() -> None:
    """Over loopback: a 500 is `http_status` with its code, a closed port is `connection`."""
    with HostileSGLang({"/metrics": Body(b"oops", 500)}) as s:
        with pytest.raises(HttpError) as exc:
            urllib_get(s.url + "/metrics", 2.0)
        url = s.url
    assert exc.value.status == 500 and exc.value.reason == "http_status"
    with pytest.raises(HttpError) as exc2:
        urllib_get(url + "/metrics", 2.0)
    assert exc2.value.reason == "connection"


def test_body_over_the_limit_is_too_large(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body past the cap is refused as `too_large`, read no further than the cap."""
    monkeypatch.setattr(limits, "MAX_METRICS_BODY_BYTES", 1000)
    with HostileSGLang({"/metrics": Body(b"# x\n" * 1000)}) as s, pytest.raises(HttpError) as exc:
        urllib_get(s.url + "/metrics", 2.0, max_bytes=limits.MAX_METRICS_BODY_BYTES)
    assert exc.value.reason == "too_large"


# --- (3) bloated: bounded labels, samples and documents -----------------------------------------------
def _counted(text: str) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    prefix = "sglang_tuning_input_truncations_total{"
    for line in text.splitlines():
        if line.startswith(prefix):
            labels, _, value = line[len(prefix):].partition("} ")
            pairs = dict(p.split("=", 1) for p in labels.split(","))
            out[(pairs["source"].strip('"'), pairs["limit"].strip('"'))] = float(value)
    return out


def test_a_huge_model_name_does_not_bloat_our_metrics() -> None:
    """One upstream sample with a 256 KiB model_name: our /metrics stays small (the name is cut to the
    label limit on every series), and the cut is counted."""
    huge = "M" * (256 * 1024)
    lines = [f'sglang:num_queue_reqs{{model_name="{huge}",tp_rank="{r}"}} 1' for r in range(8)]
    sc = _sidecar({"/server_info": GOOD_INFO.replace(b'"m"', json.dumps(huge).encode()),
                   "/metrics": ("\n".join(lines) + "\n").encode()})
    sc.tick(0.0)
    text = _exposition(sc, 0.0)
    assert len(text) < 100_000, len(text)
    assert "M" * limits.MAX_LABEL_VALUE_CHARS in text and "M" * (limits.MAX_LABEL_VALUE_CHARS + 1) not in text
    counted = _counted(text)
    assert counted[("metrics", "line")] == 8  # each line past the line limit is skipped, counted
    assert counted[("server_info", "string")] >= 1


def test_label_values_past_the_limit_are_cut_and_counted() -> None:
    """A label value longer than the limit (in a line within the line limit) is cut, counted."""
    long = "x" * (limits.MAX_LABEL_VALUE_CHARS + 10)
    exp = parse_exposition(f'sglang:num_queue_reqs{{model_name="{long}",tp_rank="0"}} 1\n', keep=wanted)
    assert exp.samples[0].label_map()["model_name"] == "x" * limits.MAX_LABEL_VALUE_CHARS
    assert exp.clipped_labels == 1


def test_samples_past_the_limit_are_dropped_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """More wanted samples than the limit: the rest are skipped, counted."""
    monkeypatch.setattr(limits, "MAX_SCRAPE_SAMPLES", 10)
    body = "".join(f'sglang:num_queue_reqs{{tp_rank="{r}"}} 1\n' for r in range(25))
    exp = parse_exposition(body, keep=wanted)
    assert len(exp.samples) == 10 and exp.dropped_samples == 15


def test_ranks_past_the_cap_in_one_scrape_are_dropped_and_counted() -> None:
    """An exposition naming 3000 ranks with --ranks.max 8: the first 8 ranks are kept (never evicted and
    re-added scrape after scrape), the other 2992 are counted (`limit="ranks"`), not tracked."""
    body = "".join(f'sglang:num_queue_reqs{{dp_rank="{r}"}} 1\nsglang:num_running_reqs{{dp_rank="{r}"}} 2\n'
                   for r in range(3000)).encode()
    cfg = build_config(_args("--sglang.url", "http://sglang:30000", "--sglang.scrape-interval", "1s",
                             "--ranks.max", "8"))
    sc = build_sidecar(cfg, timer=lambda: 0.0, http_get=lambda url, t: body if url.endswith("/metrics") else GOOD_INFO,
                       advisor=_advisor())
    sc.tick(0.0)
    sc.tick(1.0)
    snap = sc.state.snapshot(1.0)
    assert sorted(r.rank.dp or 0 for r in snap.ranks) == list(range(8))
    assert _counted(_exposition(sc, 1.0))[("metrics", "ranks")] == 2 * 2992
    assert "sglang_tuning_ranks_expired_total 0.0" in _exposition(sc, 1.0)


def test_internal_states_past_the_limit_are_cut() -> None:
    """A million internal_states entries: only the first MAX_INTERNAL_STATES are read, the cut noted."""
    doc = {"version": "0.5.23", "internal_states": [{"memory_usage": {"startup_available": 1.0}}] * 1_000_000}
    info = parse_server_info(doc)
    assert len(info.rank_facts) == limits.MAX_INTERNAL_STATES
    assert info.truncated == {"internal_states": 1}


def test_long_strings_in_server_info_are_cut() -> None:
    """Version, model and string args are cut to the label limit (they become label values)."""
    long = "v" * 5000
    info = parse_server_info({"version": long, "served_model_name": long, "schedule_policy": long,
                              "tp_size": 1})
    assert info.version == long[:limits.MAX_LABEL_VALUE_CHARS]
    assert info.model_name == long[:limits.MAX_LABEL_VALUE_CHARS]
    assert info.args["schedule_policy"] == long[:limits.MAX_LABEL_VALUE_CHARS]
    assert info.truncated == {"string": 3}


def _flooding_sidecar(keys: int) -> tuple[Sidecar, list[int]]:
    """A sidecar whose /server_info names `keys` new arguments at every fetch (after the real ones)."""
    fetches = [0]

    def http(url: str, timeout: float) -> bytes:
        if url.endswith("/metrics"):
            return GOOD_METRICS
        if not url.endswith("/server_info"):
            raise HttpError("HTTP 404", 404, reason="http_status")
        n = fetches[0]
        fetches[0] += 1
        doc: dict[str, object] = {"version": "0.5.23", "served_model_name": "m", "tp_size": 1,
                                  "mem_fraction_static": 0.85}
        doc.update({f"flood{n}_{i}": i for i in range(keys)})
        return json.dumps(doc).encode()

    cfg = build_config(_args("--sglang.url", "http://sglang:30000", "--sglang.scrape-interval", "1s",
                             "--evaluation-interval", "1s"))
    return build_sidecar(cfg, timer=lambda: 0.0, http_get=http, advisor=_advisor()), fetches


@pytest.mark.slow  # 600,000 argument names: seconds (make test-fast skips it)
def test_a_flood_of_server_args_keeps_the_state_bounded() -> None:
    """150,000 new argument names per server-info fetch (an adversarial run grew the sidecar from 77 to
    949 MB in 60 s, then the page answered 500): the arguments kept stay within MAX_SERVER_ARGS, the real
    ones first in the document are kept, every name dropped is counted, and the page answers 200."""
    from helpers.runners import get
    from sglang_tuning_exporter.sidecar.serve import make_web

    sc, fetches = _flooding_sidecar(150_000)
    cfg = build_config(_args("--sglang.url", "http://sglang:30000"))
    clock = {"t": 0.0}
    app = make_web(cfg, sc, clock=lambda: clock["t"])
    for k in range(4):  # a fetch every 60 s
        clock["t"] = 61.0 * k
        sc.tick(clock["t"])
    assert fetches[0] == 4
    args = sc.state.server_state().args
    assert len(args) <= limits.MAX_SERVER_ARGS and args["mem_fraction_static"] == 0.85
    assert sc.changes is not None and len(sc.changes._args or {}) <= limits.MAX_SERVER_ARGS  # the tracker's copy
    dropped = _counted(_exposition(sc, clock["t"]))[("server_info", "server_args")]
    assert dropped == 4 * (150_003 - limits.MAX_SERVER_ARGS)
    for path in ("/", "/api/findings", "/metrics"):
        status, body = get(app, path)
        assert status == 200 and len(body) < 2_000_000, (path, len(body))


def test_a_changing_key_set_keeps_the_latest_document(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys that change at every fetch (each set under the limit): the kept arguments are the latest
    document's, the older names evicted first, the total never past the limit."""
    monkeypatch.setattr(limits, "MAX_SERVER_ARGS", 50)
    sc, fetches = _flooding_sidecar(30)
    for k in range(5):
        sc.tick(61.0 * k)
    assert fetches == [5]
    args = sc.state.server_state().args
    assert len(args) == 50
    assert {f"flood4_{i}" for i in range(30)} <= set(args) and args["mem_fraction_static"] == 0.85
    assert ("server_info", "server_args") not in _counted(_exposition(sc, 300.0))  # nothing of a document dropped


def test_log_server_args_past_the_limit_are_dropped_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """`server_args=` lines naming ever new arguments (a log line can hold tens of thousands): the
    state keeps at most MAX_SERVER_ARGS, names too long for a label are dropped, and both are counted."""
    from helpers.runners import replay
    from helpers.scenario_logs import LogWriter, steady

    monkeypatch.setattr(limits, "MAX_SERVER_ARGS", 40)
    w = LogWriter("0.5.23")
    for n in range(3):
        w.server_args(mem_fraction_static=0.85, **{f"flood{n}_{i}": i for i in range(60)},
                      **{"x" * (limits.MAX_LABEL_VALUE_CHARS + 1): 1})
        steady(w, 2, every_s=10.0)
    sc, _ = replay(w.text())
    args = sc.state.server_state().args
    assert len(args) <= 40 and args["mem_fraction_static"] == 0.85
    # each line names 63 arguments and one too long for a label: the 23 past the 40th and the long one
    assert _counted(_exposition(sc, 0.0))[("log", "server_args")] == 3 * 24


def test_a_large_exposition_costs_bounded_time() -> None:
    """A body of the maximum size made of hostile lines (`}` repeated, long unwanted families) is read
    in bounded time: no quadratic regex backtracking (a loose bound; bench/ measures precisely)."""
    evil = ("sglang:num_queue_reqs{" + "}" * 4000 + " x\n") * 200
    unwanted = "".join(f'other_family{{a="{i}"}} {i}\n' for i in range(20_000))
    start = time.monotonic()
    exp = parse_exposition(evil + unwanted, keep=wanted)
    took = time.monotonic() - start
    assert exp.garbage_lines == 200
    assert took < 2.0, took


def test_server_info_fallbacks_share_one_deadline() -> None:
    """Trying /server_info, /get_server_info and /get_server_args spends one timeout in all, not one each."""
    clock = [0.0]
    asked: list[float] = []

    def get(url: str, timeout: float) -> bytes:
        asked.append(timeout)
        clock[0] += 0.2  # each endpoint takes 200 ms to say 404
        raise HttpError("HTTP 404", 404, reason="http_status")

    res = ServerInfoClient("http://s", 0.5, get=get, timer=lambda: clock[0]).fetch()
    assert res.info is None and res.reason == "timeout"
    assert asked == pytest.approx([0.5, 0.3, 0.1])
