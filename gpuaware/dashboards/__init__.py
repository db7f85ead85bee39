"""Grafana dashboards as code and Prometheus rules for gpuaware (see docs/dashboards.md)."""
