"""The `sglang-tuning-exporter` command line: one subcommand per module."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import NamedTuple

from sglang_tuning_exporter.core.build import version_text
from sglang_tuning_exporter.core.exit_codes import EXIT_OK, EXIT_RUNTIME, EXIT_USAGE

PROG = "sglang-tuning-exporter"


class Command(NamedTuple):
    """A subcommand: the module implementing `add_arguments(parser)` and `run(args) -> int`, and its help."""

    module: str
    help: str


# The help lives here so that `--help` and each command import only the module they run.
COMMANDS: dict[str, Command] = {
    "serve": Command("sglang_tuning_exporter.sidecar.serve",
                     "run the sidecar: follow the log, scrape SGLang, serve /metrics, the status page "
                     "and /api/findings"),
    "parse": Command("sglang_tuning_exporter.offline.parse_cmd",
                     "print every recognised event of an SGLang log (plain, .gz or - for stdin) as JSON lines"),
    "diagnose": Command("sglang_tuning_exporter.offline.diagnose",
                        "diagnose whole SGLang logs offline (plain, .gz or -) and print the tuning guide's findings"),
    "report": Command("sglang_tuning_exporter.fleet.report",
                      "fleet review from a Prometheus server: every instance x check, drift, mis-tuned servers "
                      "and their flags"),
    "render": Command("sglang_tuning_exporter.render.command",
                      "regenerate alerts/, the runbook, dashboards/ and Kubernetes manifests from the checks table"),
}


def command_parser(name: str) -> tuple[argparse.ArgumentParser, ModuleType]:
    """The parser of one command alone (its usage errors name it), with only its own module imported."""
    command = COMMANDS[name]
    module = importlib.import_module(command.module)
    parser = argparse.ArgumentParser(prog=f"{PROG} {name}", description=command.help)
    parser.set_defaults(command=name)
    module.add_arguments(parser)
    return parser, module


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="SGLang's hyperparameter-tuning guide as live signals, alerts and reports.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version_text()}")
    return parser


def _overview() -> argparse.ArgumentParser:
    """`--help` without a command: the commands and their help, nothing imported."""
    parser = _top_parser()
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in COMMANDS.items():
        sub.add_parser(name, help=command.help)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status (interfaces.md)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        overview = _overview()
        overview.parse_args(argv)  # --help, --version, or an unknown command: argparse says which (exit 2)
        overview.print_help(sys.stderr)
        return EXIT_USAGE
    parser, module = command_parser(argv[0])
    args = parser.parse_args(argv[1:])
    try:
        return int(module.run(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except OSError as exc:
        # Output that cannot be written (disk full, I/O error): one line, not a traceback.
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"{PROG} {args.command}: I/O error: {exc.strerror or exc}{where}", file=sys.stderr)
        _discard_stdout()
        return EXIT_RUNTIME


def _discard_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush of the failed buffer stays quiet."""
    try:
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
