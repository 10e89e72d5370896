"""The sidecar says so when its log clock takes stamps as outliers: one warning naming the count and an
example stamp, rate-limited (issue #23; docs/signals.md, "Clocks")."""

from __future__ import annotations

import argparse
import logging

import pytest

from helpers.scenario_logs import LogWriter
from sglang_tuning_exporter.sidecar import outlierwarn
from sglang_tuning_exporter.sidecar.serve import build_sidecar, log_input_for
from sglang_tuning_exporter.sidecar.serveconfig import add_serve_flags, build_config
from sglang_tuning_exporter.sources.logreader import EventReader


class Batches:
    """A follower handing out prepared batches of lines, one per poll."""

    def __init__(self, batches: list[list[str]]) -> None:
        self.batches = batches
        self.rotations = self.truncations = 0
        self.exists = True

    def poll(self) -> list[str]:
        return self.batches.pop(0) if self.batches else []


def _stray(line: str) -> str:
    return line.replace(line[1:5], "2099", 1)


def test_outlier_stamps_are_warned_once_then_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    w = LogWriter("0.5.23")
    for _ in range(30):
        w.decode(300, 0.9, 150)
        w.tick(2)
    lines = w.lines
    secret = "sk-live-DO-NOT-LOG"
    batches = [lines[:10], [*lines[10:12], _stray(lines[12]) + f" api_key={secret}", *lines[13:15]],
               [*lines[15:17], _stray(lines[17]), *lines[18:20]], [], [_stray(lines[20]), *lines[21:25]]]
    p = argparse.ArgumentParser()
    add_serve_flags(p)
    cfg = build_config(p.parse_args(["--sglang.log-file", "/nonexistent.log"]))
    sc = build_sidecar(cfg, timer=lambda: 0.0, log_input=log_input_for(Batches(batches), EventReader()))
    wall = 0.0  # no real wall clock (before 2015): stamps are judged against each other only
    caplog.set_level(logging.WARNING, logger="sglang_tuning_exporter.sidecar.engine")
    ticks = [0.0, 1.0, 2.0, 3.0, 3.0 + outlierwarn.OUTLIER_WARN_EVERY_S]  # the last batch after the quiet time

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "far off the log's clock" in r.getMessage()]

    for i, mono in enumerate(ticks):
        sc.tick(wall + mono, mono)
        if i == 0:
            assert warnings() == []  # no outlier yet: no warning
        if i == 1:
            assert len(warnings()) == 1
            assert "1 timestamp far off" in warnings()[0] and "e.g. 2099-" in warnings()[0], warnings()
        if i in (2, 3):
            assert len(warnings()) == 1  # a second outlier within the quiet time: counted, not logged
    got = warnings()
    assert len(got) == 2 and "3 timestamps far off" in got[1], got
    assert all(secret not in r.getMessage() for r in caplog.records)
