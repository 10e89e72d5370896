"""The products run in-process the way the tests drive them: `diagnose` with captured output, a sidecar
replaying a log minute by minute at its own times (with its web app), and the `report` subcommand."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

from helpers.schemas import assert_valid
from sglang_tuning_exporter.cli import command_parser
from sglang_tuning_exporter.core.timeparse import plausible_seconds
from sglang_tuning_exporter.fleet import report
from sglang_tuning_exporter.offline import diagnose
from sglang_tuning_exporter.sidecar.serve import (
    add_serve_flags,
    build_config,
    build_sidecar,
    log_input_for,
    make_web,
)
from sglang_tuning_exporter.sources.logreader import EventReader


def diagnose_run(argv: list[str]) -> tuple[int, str, str]:
    parser, _ = command_parser("diagnose")
    out, err = io.StringIO(), io.StringIO()
    code = diagnose.run(parser.parse_args(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def diagnose_json(*paths: Path, same_server: bool = False) -> dict[str, Any]:
    argv = [*map(str, paths), "--format", "json", "--jobs", "1"]
    if same_server:
        argv.append("--same-server")
    code, out, err = diagnose_run(argv)
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


class Follower:
    """Hands out the lines queued since the last poll."""

    def __init__(self) -> None:
        self.pending: list[str] = []
        self.exists = True
        self.rotations = 0
        self.truncations = 0

    def poll(self) -> list[str]:
        out, self.pending = self.pending, []
        return out


def serve_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_serve_flags(p)
    return p.parse_args(list(argv))


def _stamp(line: str) -> float | None:
    if line.startswith("[") and len(line) > 20 and line[5] == "-":
        return plausible_seconds(line[1:20].replace(" ", "T"))
    return None


def replay(text: str) -> tuple[Any, Any]:
    """Follow `text` minute by minute at its own times; (sidecar, web app)."""
    follower = Follower()
    cfg = build_config(serve_args("--sglang.log-file", "/nonexistent/x.log", "--evaluation-interval", "1s"))
    sc = build_sidecar(cfg, timer=lambda: 0.0, log_input=log_input_for(follower, EventReader()))
    clock = {"t": 0.0}
    app = make_web(cfg, sc, clock=lambda: clock["t"])
    batch: list[str] = []
    minute: float | None = None
    for line in text.splitlines():
        t = _stamp(line)
        if t is not None and minute is not None and t >= minute + 60:
            follower.pending = batch
            clock["t"] = minute + 60
            sc.tick(minute + 60)
            batch = []
        if t is not None and (minute is None or t >= minute + 60):
            minute = t - t % 60
        batch.append(line)
    follower.pending = batch
    assert minute is not None
    for k in range(1, 4):  # quiet ticks: a crashed server's last record is closed after a while
        clock["t"] = minute + 60 * k
        sc.tick(minute + 60 * k)
    return sc, app


def get(app: Any, path: str) -> tuple[int, str]:
    res = app.handle("GET", path)
    return res.status, res.body.decode()


def report_main(argv: list[str]) -> int:
    """The report subcommand alone (the other subcommands are other engineers' work in progress)."""
    parser = argparse.ArgumentParser(prog="report")
    report.add_arguments(parser)
    return report.run(parser.parse_args(argv))


def report_output(url: str, out_dir: Path, fmt: str, *, length: str, end: float, extra: tuple[str, ...] = ()
                  ) -> tuple[int, str]:
    """`report` on `url` over `length` ending at `end`, written to a file; (exit code, output text)."""
    out = out_dir / f"report.{fmt}"
    code = report_main(["--prometheus.url", url, "--range", length, "--end", str(end), "--format", fmt,
                        "--output", str(out), *extra])
    return code, out.read_text(encoding="utf-8") if out.exists() else ""


def report_json(url: str, out_dir: Path, *, length: str, end: float, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """The JSON report document of a run that must succeed."""
    code, text = report_output(url, out_dir, "json", length=length, end=end, extra=extra)
    assert code == 0, text
    doc: dict[str, Any] = json.loads(text)
    assert_valid(doc, "report")  # the published contract, docs/schemas/report.schema.json
    return doc
