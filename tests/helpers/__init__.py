"""Helpers shared by the tests of every folder (paths, log builders, PromQL lint, loopback servers)."""
