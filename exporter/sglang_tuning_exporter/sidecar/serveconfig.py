"""`serve` options: flags (with env mirrors) validated into one frozen ServeConfig, every problem listed."""

from __future__ import annotations

import argparse
import resource
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_tuning_exporter.core import limits
from sglang_tuning_exporter.core.flags import (
    add_flag,
    add_guide_flags,
    duration_flag,
    is_http_url,
    read_secret,
)
from sglang_tuning_exporter.core.problems import ProblemsError
from sglang_tuning_exporter.core.redact import redact_text
from sglang_tuning_exporter.guide.checks import CheckTable, TableError, load_table
from sglang_tuning_exporter.guide.config import Config, ConfigError, load_config, parse_server_arg_overrides
from sglang_tuning_exporter.sidecar.webconfig import WebConfig, WebConfigError, load_web_config
from sglang_tuning_exporter.sources.filekind import unfollowable

DEFAULT_PORT = 9470
LOG_LEVELS = ("debug", "info", "warn", "error")
LOG_FORMATS = ("logfmt", "json")


class ServeConfigError(ProblemsError):
    """Invalid `serve` options; `problems` lists every one."""

    what = "serve options"


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """Validated `serve` settings."""

    listen_host: str
    listen_port: int
    telemetry_path: str
    sglang_url: str | None
    sglang_api_key: str | None
    log_file: Path | None
    from_start: bool
    scrape_timeout_s: float
    scrape_interval_s: float
    evaluation_interval_s: float
    window_s: float
    ranks_max: int
    ranks_expire_after_s: float
    log_level: str
    log_format: str
    guide_profile: str | None
    workload: str | None  # None: the --config file's, else throughput (guide/settings.py)
    config_file: Path | None
    server_args: Mapping[str, Any]  # --server-arg overrides, typed as diagnose and report type them
    table: CheckTable  # the checks table (loaded once by build_config)
    guide_config: Config  # the --config file, or the defaults
    web_config: WebConfig | None = None  # --web.config.file: TLS, basic auth, headers
    web_max_connections: int = limits.MAX_CONNECTIONS
    web_idle_timeout_s: float = limits.IDLE_TIMEOUT_S
    web_header_timeout_s: float = limits.HEADER_TIMEOUT_S
    web_write_timeout_s: float = limits.WRITE_TIMEOUT_S


def _stdin_open() -> bool:
    try:
        return sys.stdin is not None and not sys.stdin.closed and sys.stdin.fileno() >= 0
    except (OSError, ValueError, AttributeError):
        return False


def parse_listen_address(text: str) -> tuple[str, int]:
    """`:9470`, `0.0.0.0:9470`, `127.0.0.1:0` or `[::1]:9470` -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen address {text!r} is not [host]:port")
    return host.strip("[]"), int(port)


def add_serve_flags(parser: argparse.ArgumentParser) -> None:
    """Every `serve` flag (exporter style, env mirrors) plus the shared guide flags."""
    add_flag(parser, "--web.listen-address", dest="listen_address", default=f":{DEFAULT_PORT}",
             metavar="[HOST]:PORT", help="address to serve /metrics, the status page and the API on")
    add_flag(parser, "--web.telemetry-path", dest="telemetry_path", default="/metrics", metavar="PATH",
             help="path of our Prometheus metrics")
    add_flag(parser, "--web.config.file", dest="web_config_file", default=None, metavar="FILE",
             help="exporter-toolkit web configuration file enabling TLS and/or basic auth (docs/sidecar.md)")
    add_flag(parser, "--web.max-connections", dest="web_max_connections", default=str(limits.MAX_CONNECTIONS),
             metavar="N", help="client connections held at once; at the bound the longest-idle one is closed "
             "for a new one (needs N + 64 file descriptors)")
    add_flag(parser, "--web.idle-timeout", dest="web_idle_timeout", default=f"{limits.IDLE_TIMEOUT_S:g}s",
             metavar="DURATION", help="close a kept-alive connection that sends no new request for this long")
    add_flag(parser, "--web.header-timeout", dest="web_header_timeout", default=f"{limits.HEADER_TIMEOUT_S:g}s",
             metavar="DURATION", help="a new connection's TLS handshake and first request head must complete "
             "within this, a later request head within this of its first byte")
    add_flag(parser, "--web.write-timeout", dest="web_write_timeout", default=f"{limits.WRITE_TIMEOUT_S:g}s",
             metavar="DURATION", help="drop a client that does not take a whole answer within this")
    add_flag(parser, "--sglang.url", dest="sglang_url", default=None, metavar="URL",
             help="SGLang HTTP base URL to scrape /metrics and read server info from, e.g. http://127.0.0.1:30000")
    add_flag(parser, "--sglang.api-key-file", dest="sglang_api_key_file", default=None, metavar="FILE",
             help="file holding the key SGLang was started with (--api-key), sent as a bearer token")
    add_flag(parser, "--sglang.log-file", dest="log_file", default=None, metavar="FILE",
             help="SGLang server log to follow (rotation and truncation are handled), or - for standard input "
             "(read as it arrives: pipe only new lines, e.g. kubectl logs -f --tail=0)")
    add_flag(parser, "--from-start", dest="from_start", action="store_true", default=False,
             help="read the log from its beginning instead of its end")
    add_flag(parser, "--sglang.scrape-timeout", dest="scrape_timeout", default="5s", metavar="DURATION",
             help="timeout of each HTTP request to SGLang")
    add_flag(parser, "--sglang.scrape-interval", dest="scrape_interval", default="15s", metavar="DURATION",
             help="how often to scrape SGLang's /metrics")
    add_flag(parser, "--window", dest="window", default="10m", metavar="DURATION",
             help="window over which the guide's signals are computed")
    # Signals are windowed over minutes: re-evaluating faster than Prometheus scrapes us buys nothing.
    add_flag(parser, "--evaluation-interval", dest="evaluation_interval", default="15s", metavar="DURATION",
             help="how often signals and checks are re-evaluated")
    add_flag(parser, "--ranks.max", dest="ranks_max", default="256", metavar="N",
             help="maximum number of scheduler ranks tracked (least recently seen are dropped)")
    add_flag(parser, "--ranks.expire-after", dest="ranks_expire_after", default="10m", metavar="DURATION",
             help="drop a rank's series when it has not been seen for this long")
    add_flag(parser, "--log.level", dest="log_level", default="info", choices=LOG_LEVELS,
             help="level of the exporter's own logs")
    add_flag(parser, "--log.format", dest="log_format", default="logfmt", choices=LOG_FORMATS,
             help="format of the exporter's own logs")
    add_guide_flags(parser)


def build_config(args: argparse.Namespace) -> ServeConfig:
    """Validate parsed flags; raises ServeConfigError listing every problem."""
    problems: list[str] = []

    def duration(flag: str, value: str, minimum: float) -> float:
        try:
            return duration_flag(value, minimum=minimum)
        except ValueError as exc:
            problems.append(f"{flag}: {exc}")
            return minimum

    host, port = "", DEFAULT_PORT
    try:
        host, port = parse_listen_address(args.listen_address)
    except ValueError as exc:
        problems.append(f"--web.listen-address: {exc}")
    path = str(args.telemetry_path)
    if not path.startswith("/") or path in ("/", "/api/findings", "/-/healthy", "/-/ready"):
        problems.append(f"--web.telemetry-path: {path!r} must start with / and not clash with another endpoint")
    url = args.sglang_url or None
    if url is not None and not is_http_url(url):
        problems.append(f"--sglang.url: {redact_text(url)!r} is not an http(s) URL like http://127.0.0.1:30000")
    api_key: str | None = None
    if args.sglang_api_key_file:
        try:
            api_key = read_secret(args.sglang_api_key_file, "key file") or None
            if api_key is None:
                problems.append(f"--sglang.api-key-file: {args.sglang_api_key_file} is empty")
        except ValueError as exc:
            problems.append(f"--sglang.api-key-file: {exc}")
    log_file = Path(args.log_file) if args.log_file else None
    if log_file is not None and str(log_file) == "-" and not _stdin_open():
        problems.append("--sglang.log-file -: standard input is closed")
    if log_file is not None and str(log_file) != "-":
        why = "is a directory" if log_file.is_dir() else unfollowable(str(log_file))
        if why is not None:
            problems.append(f"--sglang.log-file: {log_file}: {why}")
    if url is None and log_file is None:
        problems.append("nothing to watch: give --sglang.log-file, --sglang.url, or both")
    timeout = duration("--sglang.scrape-timeout", args.scrape_timeout, 0.001)
    interval = duration("--sglang.scrape-interval", args.scrape_interval, 0.01)
    window = duration("--window", args.window, 1.0)
    evaluation = duration("--evaluation-interval", args.evaluation_interval, 0.01)
    expire = duration("--ranks.expire-after", args.ranks_expire_after, 1.0)
    idle = duration("--web.idle-timeout", args.web_idle_timeout, 0.01)
    header = duration("--web.header-timeout", args.web_header_timeout, 0.01)
    write = duration("--web.write-timeout", args.web_write_timeout, 0.01)
    max_connections = _max_connections(str(args.web_max_connections), problems)
    ranks_max = 0
    try:
        ranks_max = int(args.ranks_max)
        if ranks_max < 1:
            problems.append(f"--ranks.max: {ranks_max} must be at least 1")
    except (TypeError, ValueError):
        problems.append(f"--ranks.max: {args.ranks_max!r} is not an integer")
    config_file = Path(args.config) if args.config else None
    if config_file is not None and not config_file.is_file():
        problems.append(f"--config: {config_file} does not exist")
    # The checks table and the guide config are loaded once, here, so that their problems are listed
    # with the flags' and serve does not read them again.
    table: CheckTable | None = None
    guide_config: Config | None = None
    try:
        table = load_table()
    except TableError as exc:
        problems.extend(exc.problems)
    if table is not None and config_file is not None and config_file.is_file():
        try:
            guide_config = load_config(config_file, table)
        except ConfigError as exc:
            problems.extend(exc.problems)
        except (OSError, ValueError) as exc:
            problems.append(f"--config: {exc}")
    elif table is not None and config_file is None:
        guide_config = Config()
    if table is not None and args.guide_profile and args.guide_profile not in table.profiles:
        problems.append(f"--guide-profile: unknown profile {args.guide_profile!r} "
                        f"(known: {', '.join(sorted(table.profiles))})")
    server_args, arg_problems = parse_server_arg_overrides(list(args.server_arg or []))
    problems.extend(arg_problems)
    if args.log_level not in LOG_LEVELS:
        problems.append(f"--log.level: {args.log_level!r} is not one of {', '.join(LOG_LEVELS)}")
    if args.log_format not in LOG_FORMATS:
        problems.append(f"--log.format: {args.log_format!r} is not one of {', '.join(LOG_FORMATS)}")
    web_config = None
    web_file = getattr(args, "web_config_file", None)
    if web_file:
        try:
            web_config = load_web_config(Path(web_file))
        except WebConfigError as exc:
            problems.extend(f"--web.config.file: {p}" for p in exc.problems)
    if problems:
        raise ServeConfigError(problems)
    assert table is not None and guide_config is not None  # else a problem was listed above
    return ServeConfig(
        listen_host=host, listen_port=port, telemetry_path=path, sglang_url=url, sglang_api_key=api_key, log_file=log_file,
        from_start=bool(args.from_start), scrape_timeout_s=timeout, scrape_interval_s=interval,
        evaluation_interval_s=evaluation, window_s=window, ranks_max=ranks_max, ranks_expire_after_s=expire, log_level=args.log_level,
        log_format=args.log_format, guide_profile=args.guide_profile, workload=args.workload,
        config_file=config_file, server_args=server_args, web_config=web_config, table=table,
        guide_config=guide_config, web_max_connections=max_connections, web_idle_timeout_s=idle,
        web_header_timeout_s=header, web_write_timeout_s=write)


def _max_connections(text: str, problems: list[str]) -> int:
    """--web.max-connections: at least 1, and within the file descriptors the process may open."""
    try:
        value = int(text)
    except ValueError:
        problems.append(f"--web.max-connections: {text!r} is not an integer")
        return limits.MAX_CONNECTIONS
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if value < 1:
        problems.append(f"--web.max-connections: {value} must be at least 1")
    elif soft != resource.RLIM_INFINITY and value + _SPARE_FDS > soft:
        problems.append(f"--web.max-connections: {value} needs {value + _SPARE_FDS} file descriptors, the "
                        f"limit is {soft} (raise ulimit -n or lower the flag)")
    return value


_SPARE_FDS = 64  # log files, SGLang requests, the listening socket: what the process needs besides clients
