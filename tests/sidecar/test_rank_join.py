"""One server is one rank whatever the order its sources arrive in: a TP=1 SGLang 0.5.23 prints no rank tag in
its log while its /metrics label every scheduler series `pp_rank="0",tp_rank="0",moe_ep_rank="0"`; a sidecar
reading both must judge one rank (one finding per check, one set of signal series), with or without the
server info that names the sizes, the log first or the metrics first. A TP=2 server keeps its two TP ranks."""

from __future__ import annotations

import json
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers.paths import FIXTURES
from helpers.runners import serve_args
from sglang_tuning_exporter.core.model import Rank
from sglang_tuning_exporter.sidecar.engine import Sidecar
from sglang_tuning_exporter.sidecar.serve import build_sidecar, log_input_for, make_web
from sglang_tuning_exporter.sidecar.serveconfig import build_config
from sglang_tuning_exporter.sources.logreader import EventReader
from sglang_tuning_exporter.sources.serverinfo import HttpError

REAL = (FIXTURES / "metrics" / "sglang-0.5.23-metrics.txt").read_text()
INFO = json.loads((FIXTURES / "sglang-0.5.23-server_info-toplevel.json").read_text())  # tp, pp, ep sizes 1
T0 = 1_790_208_000.0
TICKS = 13  # 15 s apart
LATE = 4  # the source that comes second answers from this tick on
RANK_KEYS = ("dp_rank", "pp_rank", "tp_rank", "moe_ep_rank")
SCHED = 'moe_ep_rank="0",pp_rank="0",tp_rank="0"'


def _tp2_metrics() -> str:
    """The 0.5.23 exposition of a TP=2 server run with --enable-metrics-for-all-schedulers: every scheduler
    series twice, tp_rank 0 and 1."""
    out = []
    for line in REAL.splitlines():
        out.append(line)
        if SCHED in line and not line.startswith("#"):
            out.append(line.replace(SCHED, 'moe_ep_rank="0",pp_rank="0",tp_rank="1"'))
    return "\n".join(out) + "\n"


class _Log:
    """A live log: each poll hands over the lines stamped up to the current tick (none before `start`)."""

    def __init__(self, lines: list[tuple[float, str]]) -> None:
        self.lines, self.now, self.rotations, self.truncations, self.exists = lines, 0.0, 0, 0, True

    def poll(self) -> list[str]:
        out = [text for t, text in self.lines if t <= self.now]
        self.lines = [(t, text) for t, text in self.lines if t > self.now]
        return out


def _log(tp_ranks: tuple[int | None, ...], start: float) -> list[tuple[float, str]]:
    """Decode lines every 2 s from `start` (a TP0/TP1 tag per line with TP=2; none with TP=1)."""
    out = []
    t = start
    while t < T0 + TICKS * 15.0:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))
        for tp in tp_ranks:
            tag = "" if tp is None else f" TP{tp}"
            out.append((t, f"[{stamp}{tag}] Decode batch, #running-req: 187, #token: 60000, token usage: 0.93, "
                           "cuda graph: True, gen throughput (token/s): 310.00, #queue-req: 412"))
        t += 2.0
    return out


def _run(*, metrics: str, info: dict[str, object] | None, tp_ranks: tuple[int | None, ...],
         first: str, info_late: bool = False) -> tuple[Sidecar, str, list[dict[str, int]]]:
    """A sidecar on the log and /metrics; `first` names the source that answers from the first tick (the
    other from tick LATE on; "both": both at once); the server info answers from tick LATE on if `info_late`,
    never if None."""
    state = {"tick": 0}

    def get(url: str, timeout: float) -> bytes:
        if url.endswith("/metrics"):
            if first == "log" and state["tick"] < LATE:
                raise HttpError("HTTP 503", 503)
            return metrics.encode()
        if url.endswith("/server_info") and info is not None and not (info_late and state["tick"] < LATE):
            return json.dumps(info).encode()
        raise HttpError("HTTP 404", 404)

    log = _Log(_log(tp_ranks, T0 + (LATE * 15.0 if first == "metrics" else 0.0)))
    cfg = build_config(serve_args("--sglang.url", "http://127.0.0.1:30000", "--sglang.scrape-interval", "15s",
                                  "--evaluation-interval", "15s", "--sglang.log-file", "/nonexistent/sglang.log"))
    sc: Sidecar = build_sidecar(cfg, timer=lambda: 0.0, http_get=get,
                                log_input=log_input_for(log, EventReader()))
    end = T0
    for i in range(TICKS):
        state["tick"], end = i, T0 + 15.0 * i
        log.now = end
        sc.tick(end)
    web = make_web(cfg, sc, clock=lambda: end, process_metrics=False)
    body = web.handle("GET", "/metrics").body.decode()
    findings = json.loads(web.handle("GET", "/api/findings").body)["findings"]
    return sc, body, [f["rank"] for f in findings]


def _ranks_of(body: str, family: str) -> set[tuple[str, ...]]:
    """The rank label sets of one family's series on /metrics."""
    return {tuple(s.labels[k] for k in RANK_KEYS) for fam in text_string_to_metric_families(body)
            if fam.name == family for s in fam.samples}


INFO_MODES = ["server_info", "late_server_info", "no_server_info"]


@pytest.mark.parametrize("first", ["both", "log", "metrics"])
@pytest.mark.parametrize("info", INFO_MODES)
def test_a_tp1_server_read_from_log_and_metrics_is_one_rank(first: str, info: str) -> None:
    sc, body, finding_ranks = _run(metrics=REAL, info=None if info == "no_server_info" else INFO, tp_ranks=(None,),
                                   first=first, info_late=info == "late_server_info")
    assert sc.state.source_up("log") and sc.state.source_up("metrics")
    assert set(sc.state._signals) == {Rank()}
    assert _ranks_of(body, "sglang_tuning_signal_ratio") == {("", "", "", "")}
    assert finding_ranks and all(r == {} for r in finding_ranks)  # one finding per check, on the server's one rank
    # the per-rank gauges too: the log's and the scrape's queue are one series
    assert _ranks_of(body, "sglang_tuning_queue_requests") == {("", "", "", "")}


@pytest.mark.parametrize("info", INFO_MODES)
def test_a_tp2_server_keeps_its_two_tp_ranks(info: str) -> None:
    """TP0/TP1 tags in the log, tp_rank 0/1 on /metrics: two ranks, each one series (no third from a
    rank dimension dropped on one source only); the signals are per DP replica (TP ranks print the same
    batch), as a log-only sidecar has them."""
    sc, body, finding_ranks = _run(metrics=_tp2_metrics(), info=None if info == "no_server_info" else {**INFO, "tp_size": 2},
                                   tp_ranks=(0, 1), first="both", info_late=info == "late_server_info")
    assert _ranks_of(body, "sglang_tuning_queue_requests") == {("", "", "0", ""), ("", "", "1", "")}
    assert set(sc.state._signals) == {Rank()}
    assert _ranks_of(body, "sglang_tuning_signal_ratio") == {("", "", "", "")}
    assert finding_ranks and all(r == {} for r in finding_ranks)
