"""Exit status of every command (README, "Commands"): one definition."""

EXIT_OK = 0
EXIT_RUNTIME = 1  # a runtime failure (unreadable input, Prometheus unreachable, nothing judged)
EXIT_DRIFT = 1  # render --check: a generated file differs from what the table gives
EXIT_USAGE = 2  # usage or configuration error, every problem listed
EXIT_FINDINGS = 3  # diagnose --fail-on: a finding at or above that level


class UsageError(ValueError):
    """Bad flags, options or inputs (exit EXIT_USAGE); the message lists every problem."""
