"""The `render` subcommand: regenerate alerts, runbook, dashboards and Kubernetes manifests from the table.

`--check` writes nothing and exits 1 listing every generated file that differs from the tree (drift).
`--rules-only --out DIR --override-for 15s --override-window 1m` renders a short-window copy of the
rule files for end-to-end tests; the committed files stay as generated with the defaults.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from sglang_tuning_exporter.core import yamltext
from sglang_tuning_exporter.core.exit_codes import EXIT_DRIFT, EXIT_OK, EXIT_USAGE, UsageError
from sglang_tuning_exporter.core.flags import WORKLOADS, add_flag
from sglang_tuning_exporter.guide.checks import Check, CheckTable, TableError, load_table
from sglang_tuning_exporter.render import dashboards as render_dashboards
from sglang_tuning_exporter.render import helmchart as render_helm
from sglang_tuning_exporter.render import kubernetes as render_kubernetes
from sglang_tuning_exporter.render import options as render_options
from sglang_tuning_exporter.render import rules as render_rules
from sglang_tuning_exporter.render import runbook as render_runbook
from sglang_tuning_exporter.render.expressions import profile_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `render`."""
    add_flag(parser, "--out", default=".", metavar="DIR",
             help="project root to write into (alerts/, dashboards/, deploy/ are created under it)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 and list the files that differ from what would be generated")
    parser.add_argument("--rules-only", action="store_true", help="only the Prometheus rule files")
    add_flag(parser, "--table", default=None, metavar="FILE", help="checks table (default: the packaged checks.yaml)")
    add_flag(parser, "--guide-profile", default=None, metavar="NAME",
             help="guide version whose thresholds the rules use; default the newest")
    add_flag(parser, "--workload", default=None, choices=WORKLOADS,
             help="the guide's workload recipe the rules follow (default throughput)")
    add_flag(parser, "--config", default=None, metavar="FILE",
             help="the exporter's YAML config: its threshold/window/for overrides and disabled checks apply")
    add_flag(parser, "--render-options", default=None, metavar="FILE",
             help="YAML render options: exporter_job, sglang_job, runbook_url, grafana_url, selector, override_for, "
                  "override_window, min_for, dedup_on, log_stale, native (and keys for other renderers)")
    add_flag(parser, "--exporter-job", default=None, metavar="JOB",
             help="job label of the exporter's scrape ('' for no job matcher; default sglang-tuning-exporter)")
    add_flag(parser, "--sglang-job", default=None, metavar="JOB",
             help="job label of SGLang's own /metrics scrape ('' for no job matcher; default sglang)")
    add_flag(parser, "--runbook-url", default=None, metavar="URL", help="base URL of alerts/runbook.md")
    add_flag(parser, "--selector", default=None, metavar="MATCHERS",
             help='label matchers added to every rule and dashboard query, e.g. \'cluster="prod",namespace=~"llm-.*"\'')
    add_flag(parser, "--grafana-url", default=None, metavar="URL",
             help="base URL of Grafana for each alert's dashboard_url (default http://localhost:3000)")
    add_flag(parser, "--override-for", default=None, metavar="DURATION",
             help="use this `for:` on every alert (tests), e.g. 15s")
    add_flag(parser, "--override-window", default=None, metavar="DURATION",
             help="use this range window in every expression (tests), e.g. 1m")


def build_options(args: argparse.Namespace, table: CheckTable) -> render_options.RenderOptions:
    """Render options from the options file, then the command line; raises UsageError."""
    problems: list[str] = []
    opts = render_options.RenderOptions()
    if args.render_options:
        try:
            raw = yamltext.load(Path(args.render_options).read_text(encoding="utf-8"))
            if isinstance(raw, dict) and isinstance(raw.get("render"), dict):
                raw = raw["render"]
            opts = render_options.options_from_mapping(raw, opts)
        except OSError as exc:
            problems.append(f"{args.render_options}: cannot read: {exc.strerror or exc}")
        except yaml.YAMLError as exc:
            problems.append(f"{args.render_options}: not valid YAML: {exc}")
        except render_options.OptionsError as exc:
            problems.extend(f"{args.render_options}: {p}" for p in exc.problems)
    cli: dict[str, Any] = {}
    for attr in ("exporter_job", "sglang_job", "runbook_url", "workload", "selector", "grafana_url"):
        if getattr(args, attr) is not None:
            cli[attr] = getattr(args, attr)
    if args.guide_profile is not None:
        cli["profile"] = args.guide_profile
    for flag, key in (("override_for", "override_for"), ("override_window", "override_window")):
        if getattr(args, flag) is not None:
            cli[key] = getattr(args, flag)
    # One flag at a time, so that a bad --override-for does not hide a bad --guide-profile.
    for key, value in cli.items():
        try:
            opts = render_options.options_from_mapping({key: value}, opts)
        except render_options.OptionsError as exc:
            problems.extend(exc.problems)
    problems.extend(render_options.validate_options(table, opts))
    unknown = sorted(set(opts.extra) - render_kubernetes.OPTION_KEYS)
    problems.extend(f"{args.render_options}: {k}: unknown render option" for k in unknown)
    problems.extend(f"{args.render_options}: {p}" for p in render_kubernetes.option_problems(opts.extra))
    if problems:
        raise UsageError("\n".join(problems))
    return opts


def apply_config(table: CheckTable, path: str, opts: render_options.RenderOptions, *, workload_flag: bool = False
                 ) -> tuple[CheckTable, render_options.RenderOptions]:
    """The exporter's config file applied to the table: overrides, disabled checks, profile, workload
    (a --workload or --guide-profile given on the command line wins over the file)."""
    from sglang_tuning_exporter.guide.config import (  # the advisor's module; only needed with --config
        ConfigError,
        load_config,
    )

    try:
        cfg = load_config(path, table)
    except ConfigError as exc:
        # config.py names the file in most problems already; name it once.
        raise UsageError("\n".join(p if p.startswith(f"{path}:") else f"{path}: {p}"
                                   for p in exc.problems)) from None
    if cfg.guide_profile and opts.profile is None:
        opts = replace(opts, profile=cfg.guide_profile)
    if cfg.slo:
        opts = replace(opts, slo=dict(cfg.slo))
    if cfg.workload and not workload_flag and opts.workload == render_options.RenderOptions().workload:
        opts = replace(opts, workload=cfg.workload)
    profile = profile_of(table, opts)
    checks: list[Check] = []
    for c in table.checks:
        ov = cfg.override(c.id)
        if not ov.enabled:
            continue
        thresholds = dict(c.thresholds)
        if ov.thresholds:
            thresholds[profile] = {**thresholds[profile], **ov.thresholds}
        checks.append(replace(ov.on(c), thresholds=thresholds,
                              window_s=ov.window_s if ov.window_s is not None else c.window_s,
                              min_samples=ov.min_samples if ov.min_samples is not None else c.min_samples,
                              for_s=ov.for_s if ov.for_s is not None else c.for_s))
    profiles = dict(table.profiles)
    for name, band in cfg.queue_bands.items():
        if name in profiles:
            profiles[name] = replace(profiles[name], queue_band=band)
    return replace(table, checks=checks, profiles=profiles), opts


def generate_all(table: CheckTable, opts: render_options.RenderOptions, *, rules_only: bool = False
                 ) -> dict[str, str]:
    """Every generated artefact as `{path relative to the project root: text}`."""
    out = render_rules.generate(table, opts)
    if rules_only:
        return out
    out[render_runbook.RUNBOOK_PATH] = render_runbook.generate(table, opts)
    profile = profile_of(table, opts)
    out.update(render_dashboards.generate(table, profile, opts.selector))
    out.update(render_kubernetes.generate(table, render_rules.rule_groups(table, opts), profile=profile,
                                          options=opts, **opts.extra))
    out.update(render_helm.generate(table, opts))
    return out


def drift(root: Path, files: dict[str, str]) -> list[str]:
    """Generated paths whose file is missing or differs under `root`."""
    bad = []
    for rel, text in sorted(files.items()):
        p = root / rel
        try:
            if p.read_text(encoding="utf-8") != text:
                bad.append(rel)
        except OSError:
            bad.append(rel)
    return bad


def write(root: Path, files: dict[str, str]) -> list[str]:
    """Write every file whose content changed; returns the changed paths."""
    changed = drift(root, files)
    for rel in changed:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(files[rel], encoding="utf-8")
    return changed


def run(args: argparse.Namespace) -> int:
    """Render, or with --check compare."""
    try:
        table = load_table(args.table)
    except TableError as exc:
        print(f"render: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # The options and the config file are both checked, so that every problem is listed at once.
    problems: list[str] = []
    try:
        opts = build_options(args, table)
    except UsageError as exc:
        problems.append(str(exc))
        opts = render_options.RenderOptions()
    if args.config:
        try:
            table, opts = apply_config(table, args.config, opts, workload_flag=args.workload is not None)
        except UsageError as exc:
            problems.append(str(exc))
    if problems:
        print("render: invalid options:\n  " + "\n".join(problems).replace("\n", "\n  "), file=sys.stderr)
        return EXIT_USAGE
    files = generate_all(table, opts, rules_only=args.rules_only)
    root = Path(args.out)
    if args.check:
        bad = drift(root, files)
        if bad:
            print(f"render --check: {len(bad)} generated file(s) differ from the checks table; "
                  "run `sglang-tuning-exporter render`:", file=sys.stderr)
            for rel in bad:
                print(f"  {rel}", file=sys.stderr)
            return EXIT_DRIFT
        print(f"render --check: {len(files)} generated files up to date")
        return EXIT_OK
    try:
        changed = write(root, files)
    except OSError as exc:
        print(f"render: cannot write under {root}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"render: {len(files)} files, {len(changed)} changed" + "".join(f"\n  {c}" for c in changed))
    return EXIT_OK
