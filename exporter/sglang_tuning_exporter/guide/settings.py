"""Which guide profile and workload apply: one precedence rule for every product (serve, diagnose, report,
render) — a flag given on the command line (or its SGLANG_TUNING_* environment mirror), else the `--config`
file, else the defaults (the newest guide profile, the throughput workload)."""

from __future__ import annotations

from sglang_tuning_exporter.guide.checks import CheckTable
from sglang_tuning_exporter.guide.config import Config

DEFAULT_WORKLOAD = "throughput"


def resolve(table: CheckTable, config: Config, *, profile: str | None, workload: str | None) -> tuple[str, str]:
    """(profile, workload) for the flags as given (None: not given), the loaded --config and the table."""
    return (profile or config.guide_profile or table.default_profile(),
            workload or config.workload or DEFAULT_WORKLOAD)
