#!/usr/bin/env python3
"""`make stack`: the integration suite's stack, started locally for a person to look at (no Docker).

  python scripts/stack.py up [--detach]   start stand-in SGLang servers, our exporters, Prometheus,
                                          Alertmanager and a webhook receiver on 127.0.0.1
  python scripts/stack.py status          what runs where
  python scripts/stack.py down            stop everything `up --detach` started

State (configs, logs, data, pids) lives in `.stack/` at the repository root.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from integration import harness  # noqa: E402  (needs tests/ on sys.path first)
from integration.scenario_log import SCENARIOS  # noqa: E402
from integration.stack import Stack, TargetSpec, Timing, missing_binaries  # noqa: E402

STATE_DIR = ROOT / ".stack"
STATE_FILE = STATE_DIR / "state.json"
DEFAULT_TARGETS = ("retraction_storm:colon", "memory_headroom_low:colon", "cuda_graph_uncovered:underscore",
                   "memory_headroom_high:underscore", "healthy:colon")


def parse_target(text: str) -> TargetSpec:
    """`scenario[:spelling]` -> TargetSpec keyed `scenario-spelling`."""
    scenario, _, spelling = text.partition(":")
    spelling = spelling or "colon"
    if scenario not in SCENARIOS:
        raise argparse.ArgumentTypeError(f"unknown scenario {scenario!r}; one of {', '.join(sorted(SCENARIOS))}")
    if spelling not in ("colon", "underscore"):
        raise argparse.ArgumentTypeError(f"spelling must be colon or underscore, not {spelling!r}")
    return TargetSpec(f"{scenario}-{spelling}", scenario, spelling)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_state() -> dict[str, object] | None:
    try:
        data = json.loads(STATE_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def cmd_up(args: argparse.Namespace) -> int:
    """Start the stack; in the foreground until Ctrl-C, or detached with a state file for `down`."""
    missing = missing_binaries()
    if missing:
        print(f"stack: not installed: {', '.join(missing)} (apt-get install prometheus prometheus-alertmanager)",
              file=sys.stderr)
        return 1
    state = _read_state()
    if state and any(_alive(int(p)) for p in state.get("pids", [])):  # type: ignore[attr-defined]
        print("stack: already running (make stack-down first); see .stack/state.json", file=sys.stderr)
        return 1
    specs: list[TargetSpec] = args.target or [parse_target(t) for t in DEFAULT_TARGETS]
    ports = {"prometheus": args.prometheus_port, "alertmanager": args.alertmanager_port}
    for i, spec in enumerate(specs):
        ports[f"sglang-{spec.key}"] = args.sglang_port + i
        ports[f"exporter-{spec.key}"] = args.exporter_port + i
    STATE_DIR.mkdir(exist_ok=True)
    workdir = STATE_DIR / time.strftime("run-%Y%m%d-%H%M%S")
    webhook = harness.ManagedProcess("webhook", harness.python_module(
        "integration.webhook", "--port", str(args.webhook_port), "--out", str(workdir / "webhook.jsonl")),
        workdir / "logs", env=harness.python_env(), die_with_parent=not args.detach).start()
    webhook_url = f"http://{harness.LOOPBACK}:{args.webhook_port}"
    timing = Timing(window_s=args.window, for_s=args.for_, exporter_window_s=args.window, exporter_poll_s=1.0)
    stack = Stack(workdir, specs, webhook_url, timing=timing, ports=ports, detached=args.detach)
    try:
        stack.start()
    except Exception as exc:
        webhook.stop()
        print(f"stack: failed to start: {exc}", file=sys.stderr)
        return 1
    procs = [webhook, *stack.processes()]
    lines = [f"Prometheus    {stack.prom_url}  (alerts: {stack.prom_url}/alerts)",
             f"Alertmanager  {stack.am_url}",
             f"Webhook       {webhook_url}  -> {workdir / 'webhook.jsonl'}"]
    for t in stack.targets:
        lines.append(f"{t.spec.key:32} SGLang stand-in http://{t.sglang_instance}  exporter "
                     f"http://{t.exporter_instance}/  log {t.log_file}")
    lines.append(f"Rules rendered with window {args.window}s and for {args.for_}s; process output in {workdir / 'logs'}")
    print("\n".join(lines))
    if args.detach:
        STATE_FILE.write_text(json.dumps({"workdir": str(workdir), "pids": [p.pid for p in procs],
                                          "summary": lines}, indent=1))
        for p in procs:
            harness.detach(p)
        print("detached; stop with: make stack-down")
        return 0
    print("Ctrl-C stops everything")
    try:
        while all(p.alive() for p in procs):
            time.sleep(1)
        print("stack: a process exited:\n" + "\n".join(p.describe() for p in procs if not p.alive()),
              file=sys.stderr)
    except KeyboardInterrupt:
        pass
    finally:
        stack.stop()
        webhook.stop()
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    """Stop the process groups `up --detach` recorded (TERM, then KILL after 5 s)."""
    state = _read_state()
    if not state:
        print("stack: nothing recorded in .stack/state.json")
        return 0
    pids = [int(p) for p in state.get("pids", [])]  # type: ignore[attr-defined]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
    STATE_FILE.unlink(missing_ok=True)
    print(f"stack: stopped {len(pids)} processes (files kept in {state.get('workdir')})")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Print what `up --detach` started and whether it still runs."""
    state = _read_state()
    if not state:
        print("stack: not running")
        return 0
    pids = [int(p) for p in state.get("pids", [])]  # type: ignore[attr-defined]
    print("\n".join(state.get("summary", [])))  # type: ignore[arg-type]
    print(f"{sum(_alive(p) for p in pids)}/{len(pids)} processes alive")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start the stack")
    up.add_argument("--detach", action="store_true", help="return after start; stop with `down`")
    up.add_argument("--target", action="append", type=parse_target, metavar="SCENARIO[:SPELLING]",
                    help=f"a simulated SGLang server (repeatable); scenarios: {', '.join(sorted(SCENARIOS))}")
    up.add_argument("--window", type=int, default=60, help="rule and exporter window, seconds")
    up.add_argument("--for", dest="for_", type=int, default=10, help="every alert's `for:`, seconds")
    up.add_argument("--prometheus-port", type=int, default=9090)
    up.add_argument("--alertmanager-port", type=int, default=9093)
    up.add_argument("--webhook-port", type=int, default=5001)
    up.add_argument("--sglang-port", type=int, default=30000, help="first stand-in port (one per target)")
    up.add_argument("--exporter-port", type=int, default=9470, help="first exporter port (one per target)")
    up.set_defaults(func=cmd_up)
    sub.add_parser("down", help="stop the detached stack").set_defaults(func=cmd_down)
    sub.add_parser("status", help="show the detached stack").set_defaults(func=cmd_status)
    args = p.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
