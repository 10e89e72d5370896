"""sglang-tuning-exporter: SGLang's tuning guide as live Prometheus signals, alerts and dashboards."""

__version__ = "0.1.0"
