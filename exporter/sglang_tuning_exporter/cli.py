"""The `sglang-tuning-exporter` command line: one subcommand per module."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from sglang_tuning_exporter import __version__
from sglang_tuning_exporter.core.exit_codes import EXIT_OK, EXIT_RUNTIME, EXIT_USAGE

# subcommand -> module implementing `HELP`, `add_arguments(parser)` and `run(args) -> int`.
COMMANDS: dict[str, str] = {
    "serve": "sglang_tuning_exporter.sidecar.serve",
    "parse": "sglang_tuning_exporter.offline.parse_cmd",
    "diagnose": "sglang_tuning_exporter.offline.diagnose",
    "report": "sglang_tuning_exporter.fleet.report",
    "render": "sglang_tuning_exporter.render.command",
}



def _load(module: str) -> ModuleType | None:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module:
            return None  # command not built yet
        raise


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, ModuleType]]:
    """The top-level parser with every available subcommand."""
    parser = argparse.ArgumentParser(
        prog="sglang-tuning-exporter",
        description="SGLang's hyperparameter-tuning guide as live signals, alerts and reports.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules: dict[str, ModuleType] = {}
    for name, path in COMMANDS.items():
        mod = _load(path)
        if mod is None:
            continue
        p = sub.add_parser(name, help=getattr(mod, "HELP", ""), description=getattr(mod, "HELP", ""))
        mod.add_arguments(p)
        modules[name] = mod
    return parser, modules


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status (interfaces.md)."""
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(modules[args.command].run(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except OSError as exc:
        # Output that cannot be written (disk full, I/O error): one line, not a traceback.
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"sglang-tuning-exporter {args.command}: I/O error: {exc.strerror or exc}{where}", file=sys.stderr)
        _discard_stdout()
        return EXIT_RUNTIME


def _discard_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush of the failed buffer stays quiet."""
    try:
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
