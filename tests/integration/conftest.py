"""Fixtures of the end-to-end suite: one stack per test module, torn down whatever happens."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from integration.stack import Stack, TargetSpec, missing_binaries
from integration.webhook import WebhookReceiver

# One simulated SGLang server per case the suite asserts on; both metric spellings are covered.
# With our exporter (the alerts come from the exporter's signals; the native rules stay silent for them):
WITH_EXPORTER = (
    TargetSpec("storm-colon", "retraction_storm", "colon"),
    TargetSpec("storm-underscore", "retraction_storm", "underscore"),
    TargetSpec("headroom_low-colon", "memory_headroom_low", "colon"),
    TargetSpec("headroom_high-underscore", "memory_headroom_high", "underscore"),
    TargetSpec("graph-underscore", "cuda_graph_uncovered", "underscore"),
    TargetSpec("oom-colon", "prefill_oom", "colon"),
    TargetSpec("healthy-colon", "healthy", "colon"),
    TargetSpec("healthy-underscore", "healthy", "underscore"),
    TargetSpec("killed", "healthy", "colon"),  # its SGLang is killed by a test
    TargetSpec("restart", "retraction_storm", "colon"),  # its exporter is restarted by a test
    TargetSpec("switch", "healthy", "underscore"),  # a test switches it into a storm and back
    TargetSpec("change", "healthy", "colon"),  # a test restarts it with other flags, then it OOMs
)
# SGLang alone, another model name (the native rules are for servers without the exporter, and they
# stay silent for a model the exporter already covers):
NATIVE_ONLY = tuple(TargetSpec(f"native-{scenario}-{spelling}", scenario, spelling, exporter=False,
                               model_name=f"native/{scenario}-{spelling}")
                    for scenario, spelling in (("retraction_storm", "underscore"), ("retraction_storm", "colon"),
                                               ("cuda_graph_uncovered", "colon"),
                                               ("memory_headroom_low", "underscore"),
                                               ("healthy", "underscore"), ("healthy", "colon")))
# SGLang alone but serving the same model as servers that have the exporter (a partly migrated fleet):
SAME_MODEL_NATIVE = (TargetSpec("native-same-model-storm", "retraction_storm", "colon", exporter=False),)
TARGETS = WITH_EXPORTER + NATIVE_ONLY + SAME_MODEL_NATIVE


class RunningStack:
    """The started stack, its webhook receiver and when it started."""

    def __init__(self, stack: Stack, webhook: WebhookReceiver) -> None:
        self.stack = stack
        self.webhook = webhook
        self.started = time.monotonic()

    def deadline(self, seconds: float) -> float:
        """Seconds left until `seconds` after the stack started (at least 1)."""
        return max(1.0, self.started + seconds - time.monotonic())


@pytest.fixture(scope="package")
def running_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """Webhook, Alertmanager, Prometheus, and one stand-in SGLang (+ exporter) per target.

    Package scope: started once for all integration tests, stopped when the run leaves this folder,
    so ~30 idle processes do not slow the rest of the test run.
    """
    missing = missing_binaries()
    if missing:
        pytest.skip(f"Debian binaries not installed: {', '.join(missing)} (apt-get install prometheus "
                    "prometheus-alertmanager)")
    webhook = WebhookReceiver().serve_in_thread()
    stack = Stack(tmp_path_factory.mktemp("e2e"), list(TARGETS), webhook.url)
    try:
        stack.start()
        yield RunningStack(stack, webhook)
    finally:
        stack.stop()
        webhook.close()
