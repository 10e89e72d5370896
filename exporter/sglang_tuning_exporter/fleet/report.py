"""The `report` subcommand: a fleet review from Prometheus, evaluated with the same checks as `diagnose`.

I/O lives here (flags, files, the Prometheus client); the PromQL plan and the folding of answers are pure
functions in fleet.py, the evaluation is the advisor's, and the output formats are in report_formats.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import functools
import re
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_tuning_exporter.core.durations import iso_time
from sglang_tuning_exporter.core.exit_codes import EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, UsageError
from sglang_tuning_exporter.core.flags import (
    add_flag,
    add_guide_flags,
    duration_flag,
    is_http_url,
    read_secret,
)
from sglang_tuning_exporter.core.model import Finding, rank_key
from sglang_tuning_exporter.core.redact import redact_text
from sglang_tuning_exporter.fleet import changes as fleet_changes
from sglang_tuning_exporter.fleet import latency as fleet_latency
from sglang_tuning_exporter.fleet import pairing
from sglang_tuning_exporter.fleet import queries as fleet
from sglang_tuning_exporter.fleet.document import FleetReport, InstanceReport, natural_key
from sglang_tuning_exporter.fleet.promapi import PromConfig, PrometheusClient, PrometheusError, Sample, Series
from sglang_tuning_exporter.guide.checks import CheckTable
from sglang_tuning_exporter.pipeline.signals import SignalParams

FORMATS = ("markdown", "html", "json")
# Worst first; `unknown` only wins when no check had data.


class OutputError(OSError):
    """The report could not be written (exit 1)."""


def parse_duration(text: str) -> float:
    """A Prometheus duration (`7d`, `12h`, `1d12h`, `90m`; a unit is required) in seconds, > 0."""
    try:
        return duration_flag(text, bare_seconds=False)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def parse_time(text: str | None, now: float) -> float:
    """`--end`: RFC 3339, unix seconds, or `now` (default)."""
    if text is None or text.strip() in ("", "now"):
        return now
    raw = text.strip()
    try:
        return float(raw)
    except ValueError:
        pass
    try:
        parsed = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"invalid time {text!r} (use RFC 3339 like 2026-10-31T00:00:00Z or unix seconds)") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.timezone.utc)
    return parsed.timestamp()


Evaluate = Callable[[Mapping[Any, dict[str, float | None]], fleet.InstanceData, float], list[Finding]]
Parts = Callable[[list[Finding], Mapping[Any, dict[str, float | None]], fleet.InstanceData], dict[str, Any]]


def evaluate_fleet(data: Mapping[str, fleet.InstanceData], evaluate: Evaluate,
                   overrides: Mapping[str, Any], window_s: float,
                   parts: Parts | None = None) -> list[InstanceReport]:
    """Run the advisor's evaluation once per instance on its per-rank signals (pure given `evaluate`)."""
    out: list[InstanceReport] = []
    for name in sorted(data, key=natural_key):
        # --server-arg overrides the advice's inputs, not what the servers run (drift uses the real args).
        d = dataclasses.replace(data[name], args={**data[name].args, **overrides})
        signals = fleet.derive_signals(d)
        findings = evaluate(signals, d, window_s)
        extra = parts(findings, signals, d) if parts is not None else {}
        out.append(InstanceReport(instance=name, model_name=d.model_name, version=d.version, args=dict(d.args),
                                  findings=tuple(findings),
                                  signals={rank_key(r): dict(s) for r, s in sorted(signals.items())},
                                  parts=extra))
    return out


@dataclass(frozen=True, slots=True)
class Guide:
    """The advisor bound to the checks table, profile, workload and config."""

    evaluate: Evaluate
    profile: str
    workload: str
    checks: tuple[str, ...]
    params: SignalParams
    server_args: dict[str, Any]
    parts: Parts | None = None  # coverage, indications and plan of one instance
    table: CheckTable | None = None  # judges the changes made within the range (None: no changes section)
    window_s: float = fleet.SIDECAR_WINDOW_S  # the sidecar's window (config window_s): how its signals are read
    slo: dict[str, float] = dataclasses.field(default_factory=dict)  # the config's `slo:` (ranks servers by burn)


def load_guide(args: argparse.Namespace) -> Guide:
    """Load the checks table and config named by the guide flags; raises UsageError with every problem."""
    from sglang_tuning_exporter.guide import advisor, checks, settings
    from sglang_tuning_exporter.guide import config as config_mod

    try:
        table = checks.load_table()
    except checks.TableError as exc:
        raise UsageError(str(exc)) from None
    try:
        config = config_mod.load_config(args.config, table)
    except config_mod.ConfigError as exc:
        raise UsageError(str(exc)) from None
    profile, workload = settings.resolve(table, config, profile=args.guide_profile, workload=args.workload)
    overrides, problems = config_mod.parse_server_arg_overrides(list(args.server_arg or []))
    if profile not in table.profiles:
        problems = [f"unknown --guide-profile {profile!r} (known: {', '.join(table.profiles)})", *problems]
    if problems:
        raise UsageError("\n".join(problems))
    params = advisor.signal_params(table, profile, config)

    def run(signals: Mapping[Any, dict[str, float | None]], d: fleet.InstanceData, window_s: float) -> list[Finding]:
        # The evidence names the reviewed range, not the sidecar's 10-minute window.
        cfg = dataclasses.replace(config, window_s=window_s)
        return list(advisor.evaluate(table, dict(signals), d.server_state(), profile=profile,
                                     workload=workload, config=cfg, words=fleet.PROMETHEUS_WORDS))

    def parts(findings: list[Finding], signals: Mapping[Any, dict[str, float | None]],
              d: fleet.InstanceData) -> dict[str, Any]:
        from sglang_tuning_exporter.guide import plan

        return plan.document_parts(table, findings, signals, d.server_state(), profile=profile, workload=workload,
                                   config=config)

    return Guide(evaluate=run, profile=profile, workload=workload,
                 checks=tuple(c.id for c in table.for_workload(workload)), params=params,
                 server_args={**config.server_args, **overrides}, parts=parts, table=table,
                 window_s=config.window_s, slo=dict(config.slo))


# --------------------------------------------------------------------------------------------- driver


def run_queries(jobs: list[tuple[str, Callable[[], Any]]], concurrency: int) -> dict[str, Any]:
    """Run independent queries, `concurrency` at a time; the first failure cancels the rest and is raised."""
    if concurrency <= 1:
        return {key: job() for key, job in jobs}
    out: dict[str, Any] = {}
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = {pool.submit(job): key for key, job in jobs}
        try:
            for fut in as_completed(futures):
                out[futures[fut]] = fut.result()
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    return out


def build_report(client: PrometheusClient, window: fleet.Window, guide: Guide, *, with_charts: bool,
                 concurrency: int = 1, clock: Callable[[], float] = time.monotonic) -> FleetReport:
    """Query Prometheus with the fixed plan, evaluate every instance and find drift."""
    t0 = clock()
    planned = (fleet.plan(window, guide.params, guide.window_s) + fleet.identity_queries(window)
               + fleet_latency.slo_queries(window, guide.slo))
    step = fleet.chart_step(window)
    jobs: list[tuple[str, Callable[[], list[Sample] | list[Series]]]] = [
        (q.key, functools.partial(client.instant, q.expr, window.end)) for q in planned]
    if guide.table is not None:
        jobs.append(("changes:moved", functools.partial(client.instant, fleet_changes.moved_query(window), window.end)))
    if with_charts:
        jobs += [("chart:" + name, functools.partial(client.range, expr, window.start, window.end, step))
                 for name, expr in fleet.chart_queries(window)]
    answers = run_queries(jobs, concurrency)
    results = {k: v for k, v in answers.items() if ":" not in k}
    data = fleet.collect(results)
    # A server scraped as two targets (its SGLang and its sidecar) is one row (fleet/pairing.py).
    pairs = pairing.pair(data, pairing.sidecar_instances(results))
    data = pairing.merge(data, pairs)
    ratios = pairing.merge_by_instance(fleet_latency.slo_ratios(answers), pairs)
    charts = pairing.merge_by_instance(
        fleet.charts_by_instance({k[6:]: v for k, v in answers.items() if k.startswith("chart:")}), pairs)
    changes = judge_changes(client, window, guide, data, answers.get("changes:moved", []), concurrency, pairs)
    instances = evaluate_fleet(data, guide.evaluate, guide.server_args, window.length_s, guide.parts)
    paired = {sidecar: native for native, sidecar in pairs.items()}
    instances = [dataclasses.replace(i, parts={**i.parts, "sglang_instance": paired[i.instance]})
                 if i.instance in paired else i for i in instances]
    if guide.table is not None:
        instances = [dataclasses.replace(i, parts={**i.parts, "changes": changes.get(i.instance, []),
                                                   **last_change_part(changes.get(i.instance, []))})
                     for i in instances]
    instances = [dataclasses.replace(i, latency=fleet_latency.latency_of(i.signals, ratios.get(i.instance, {}),
                                                                         guide.slo)) for i in instances]
    order, why = fleet_latency.rank([i.instance for i in instances], {i.instance: i.latency for i in instances},
                                    guide.slo)
    by_name = {i.instance: i for i in instances}
    instances = [by_name[n] for n in order]
    drift = fleet.find_drift(data.values())
    return FleetReport(prometheus=client.base, start=window.start, end=window.end, queries=client.queries,
                       profile=guide.profile, workload=guide.workload, selector=window.selector,
                       instances=tuple(instances), drift=tuple(drift), checks=guide.checks, charts=charts,
                       elapsed_s=clock() - t0, lagging=tuple(fleet_changes.find_lagging(changes, data)),
                       notes=tuple(n for n in (fleet.window_note(window.length_s, guide.window_s),) if n),
                       order=why, slo=dict(guide.slo))


def last_change_part(changes: list[dict[str, Any]]) -> dict[str, Any]:
    """`last_change` (the plan's step 0) for an instance whose flags changed within the range, else nothing."""
    from sglang_tuning_exporter.guide.changes import last_change

    note = last_change(changes)
    return {"last_change": note} if note is not None else {}


def judge_changes(client: PrometheusClient, window: fleet.Window, guide: Guide, data: Mapping[str, fleet.InstanceData],
                  moved: list[Sample], concurrency: int,
                  pairs: Mapping[str, str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Instance -> `changes[]`: flag changes of the servers whose arguments moved (`moved`), read from their
    arguments over the range and judged on slices of it (the plan again, as range queries, only for the servers
    that changed and only when some did, with the SGLang targets `pairs` merges into them)."""
    names = [n for n in fleet_changes.moved_instances(moved) if n in data]
    if guide.table is None or not names:
        return {}
    arg_series = client.range(fleet_changes.args_query(window, names), window.start, window.end, window.step_s)
    found = {k: v for k, v in fleet_changes.detect_changes(arg_series, guide.table).items() if k in data}
    if not found:
        return {}
    pairs = pairs or {}
    sw = fleet_changes.slice_window(window, [*found, *pairing.partners(pairs, found)])
    first, last, step = fleet_changes.slice_times(window)
    if first > last:
        return {name: fleet_changes.judge_instance(cs, [], guide.table) for name, cs in found.items()}
    jobs: list[tuple[str, Callable[[], list[Series]]]] = [
        (q.key, functools.partial(client.range, q.expr, first, last, step)) for q in fleet.plan(sw, guide.params, guide.window_s)]
    slices = pairing.merge_slices(fleet_changes.fold_slices(run_queries(jobs, concurrency)), pairs)
    args = fleet_changes.args_at(arg_series)
    out: dict[str, list[dict[str, Any]]] = {}
    for name, cs in found.items():
        windows = fleet_changes.summaries(data[name], slices.get(name, {}), args.get(name, {}), step,
                                          guide.evaluate, guide.server_args)
        out[name] = fleet_changes.judge_instance(cs, windows, guide.table, margin_s=window.step_s)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The report's flags (exporter style, with SGLANG_TUNING_* mirrors)."""
    add_flag(parser, "--prometheus.url", dest="prometheus_url", default=None, metavar="URL",
             help="base URL of the Prometheus (or Thanos/Mimir) HTTP API, e.g. http://prometheus:9090")
    add_flag(parser, "--range", dest="range", default="7d", metavar="DURATION",
             help="how far back to review, ending at --end")
    add_flag(parser, "--end", dest="end", default=None, metavar="TIME",
             help="end of the reviewed range: RFC 3339, unix seconds or now (default now)")
    add_flag(parser, "--selector", dest="selector", default=None, metavar="MATCHERS",
             help='label matchers added to every metric, e.g. \'{job="sglang"}\'')
    add_flag(parser, "--resolution", dest="resolution", default=None, metavar="DURATION",
             help="step of the subqueries that turn gauges into ratios (default: range/2000, at least 60s)")
    add_flag(parser, "--format", dest="format", default="markdown", choices=FORMATS, help="output format")
    add_flag(parser, "--output", dest="output", default="-", metavar="FILE", help="where to write; - for stdout")
    add_flag(parser, "--prometheus.timeout", dest="prometheus_timeout", default="30s", metavar="DURATION",
             help="timeout of each HTTP request to Prometheus")
    add_flag(parser, "--prometheus.concurrency", dest="prometheus_concurrency", default="4", metavar="N",
             help="queries in flight at once (the number of queries does not depend on the fleet size)")
    add_flag(parser, "--prometheus.username", dest="prometheus_username", default=None, metavar="USER",
             help="basic-auth user name")
    add_flag(parser, "--prometheus.password", dest="prometheus_password", default=None, metavar="PASSWORD",
             help="basic-auth password (prefer --prometheus.password-file)")
    add_flag(parser, "--prometheus.password-file", dest="prometheus_password_file", default=None, metavar="FILE",
             help="file holding the basic-auth password")
    add_flag(parser, "--prometheus.bearer-token-file", dest="prometheus_bearer_token_file", default=None,
             metavar="FILE", help="file holding a bearer token (sent as Authorization: Bearer)")
    add_flag(parser, "--prometheus.ca-file", dest="prometheus_ca_file", default=None, metavar="FILE",
             help="CA bundle to verify the server certificate")
    add_flag(parser, "--prometheus.cert-file", dest="prometheus_cert_file", default=None, metavar="FILE",
             help="client certificate for mutual TLS")
    add_flag(parser, "--prometheus.key-file", dest="prometheus_key_file", default=None, metavar="FILE",
             help="client key for mutual TLS")
    add_flag(parser, "--prometheus.insecure-skip-verify", dest="prometheus_insecure_skip_verify",
             action="store_true", default=False, help="do not verify the server certificate")
    add_flag(parser, "--prometheus.header", dest="prometheus_header", action="append", default=[],
             metavar="'NAME: VALUE'", help="extra HTTP header, e.g. 'X-Scope-OrgID: team-a' for Mimir (repeatable)")
    add_guide_flags(parser)


def _positive_int(raw: Any, flag: str) -> int:
    try:
        n = int(raw)
    except (TypeError, ValueError):
        raise UsageError(f"{flag} must be a whole number, got {raw!r}") from None
    if not 1 <= n <= 64:
        raise UsageError(f"{flag} must be between 1 and 64, got {n}")
    return n


def _read_secret(path: str, what: str) -> str:
    try:
        return read_secret(path, what)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _headers(raw: list[str]) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for item in raw:
        name, sep, value = item.partition(":")
        if not sep or not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name.strip()):
            raise UsageError(f"invalid --prometheus.header {item!r} (use 'Name: value')")
        out.append((name.strip(), value.strip()))
    return tuple(out)


def prom_config(args: argparse.Namespace) -> PromConfig:
    """Build the client configuration from the flags; raises UsageError listing every problem."""
    problems: list[str] = []

    def check(make: Callable[[], Any]) -> Any:
        # Each flag is validated on its own so that one bad flag does not hide the next.
        try:
            return make()
        except UsageError as exc:
            problems.append(str(exc))
            return None

    url = args.prometheus_url
    if not url:
        problems.append("--prometheus.url is required (or set SGLANG_TUNING_PROMETHEUS_URL)")
    elif not is_http_url(url):
        # Shown without anything before an `@` (a password, even in a URL without a scheme).
        problems.append(f"--prometheus.url {redact_text(url.rpartition('@')[2])!r} is not an http:// or https:// "
                        "URL with a host")
    password = args.prometheus_password
    if args.prometheus_password_file:
        password = check(lambda: _read_secret(args.prometheus_password_file, "password file"))
    token = None
    if args.prometheus_bearer_token_file:
        token = check(lambda: _read_secret(args.prometheus_bearer_token_file, "bearer token file"))
    if token and args.prometheus_username:
        problems.append("use either basic auth (--prometheus.username) or a bearer token, not both")
    if bool(args.prometheus_cert_file) != bool(args.prometheus_key_file) and args.prometheus_key_file:
        problems.append("--prometheus.key-file needs --prometheus.cert-file")
    for flag, path in (("--prometheus.ca-file", args.prometheus_ca_file),
                       ("--prometheus.cert-file", args.prometheus_cert_file),
                       ("--prometheus.key-file", args.prometheus_key_file)):
        if path and not Path(path).is_file():
            problems.append(f"{flag} {path}: no such file")
    timeout = check(lambda: parse_duration(args.prometheus_timeout))
    if timeout is None:
        problems[-1] = f"--prometheus.timeout: {problems[-1]}"
    headers = check(lambda: _headers(list(args.prometheus_header or [])))
    if problems:
        raise UsageError("\n".join(problems))
    return PromConfig(url=url, timeout_s=timeout,
                      username=args.prometheus_username, password=password, bearer_token=token,
                      ca_file=args.prometheus_ca_file, cert_file=args.prometheus_cert_file,
                      key_file=args.prometheus_key_file,
                      insecure_skip_verify=bool(args.prometheus_insecure_skip_verify),
                      headers=headers)


def window_from_args(args: argparse.Namespace, now: float) -> fleet.Window:
    """The reviewed window and subquery resolution from the flags; raises UsageError listing every problem."""
    problems: list[str] = []

    def check(flag: str, make: Callable[[], Any]) -> Any:
        try:
            return make()
        except UsageError as exc:
            problems.append(f"{flag}: {exc}")
            return None

    length = check("--range", lambda: parse_duration(args.range))
    end = check("--end", lambda: parse_time(args.end, now))
    step = check("--resolution", lambda: parse_duration(args.resolution)) if args.resolution else (
        max(60.0, round(length / 2000)) if length is not None else None)
    if step is not None and length is not None and step > length:
        problems.append(f"--resolution {args.resolution} is longer than --range {args.range}")
    try:
        selector = fleet.parse_selector(args.selector)
    except fleet.SelectorError as exc:
        problems.append(str(exc))
    if problems or step is None:
        raise UsageError("\n".join(problems))
    return fleet.Window(start=end - length, end=end, step_s=step, selector=selector)


def write_output(text: str, output: str) -> None:
    """Write to a file or stdout."""
    if output in ("-", ""):
        sys.stdout.write(text)
        return
    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise OutputError(f"cannot write {output}: {exc.strerror or exc}") from None


def run(args: argparse.Namespace) -> int:
    """Entry point of `sglang-tuning-exporter report`."""
    from sglang_tuning_exporter.fleet import formats as report_formats

    problems: list[str] = []
    # Every stage is validated even after one fails, so that all problems are listed at once.
    results: list[Any] = []
    for stage in (lambda: prom_config(args), lambda: window_from_args(args, time.time()),
                  lambda: load_guide(args),
                  lambda: _positive_int(args.prometheus_concurrency, "--prometheus.concurrency")):
        try:
            results.append(stage())
        except UsageError as exc:
            problems.extend(line.strip() for line in str(exc).splitlines() if line.strip())
    if problems:
        for problem in problems:
            print(f"report: {problem}", file=sys.stderr)
        return EXIT_USAGE
    config, window, guide, concurrency = results
    client = PrometheusClient(config)
    try:
        report = build_report(client, window, guide, with_charts=args.format == "html",
                              concurrency=concurrency)
        blind = no_data(report)
        if blind and not report.instances:  # nothing to render: an empty report would read as a healthy fleet
            print(f"report: {blind}", file=sys.stderr)
            return EXIT_RUNTIME
        write_output(report_formats.render(report, args.format), args.output)
    except (PrometheusError, OutputError) as exc:
        print(f"report: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    if blind:
        print(f"report: {blind}", file=sys.stderr)
        return EXIT_RUNTIME
    return EXIT_OK


def no_data(report: FleetReport) -> str:
    """One line when the report judged nothing (no data is not health); empty when it judged something."""
    sel = f"{{{report.selector}}}" if report.selector else "the exporter's series"
    if not report.instances:
        return (f"no sglang_tuning series matched {sel} on {report.prometheus} between {iso_time(report.start)} and "
                f"{iso_time(report.end)}: nothing to judge")
    if all(i.status == "unknown" for i in report.instances):
        return (f"all {len(report.instances)} instances matching {sel} are unknown: no check had enough data "
                "to judge (see each instance's coverage)")
    return ""
