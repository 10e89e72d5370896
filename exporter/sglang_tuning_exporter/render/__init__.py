"""`render`: alert rules, runbook, dashboards and Kubernetes manifests generated from the checks table."""
