"""`report`: the fleet review from a Prometheus-compatible store."""
