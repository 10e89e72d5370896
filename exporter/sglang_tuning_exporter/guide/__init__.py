"""The tuning guide as data (checks.yaml) and what it concludes: checks, config, suggested values,
findings, coverage and the plan, verdicts of flag changes."""
