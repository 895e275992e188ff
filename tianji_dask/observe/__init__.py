"""Watching a run: the dashboard page, Prometheus metrics, plots."""
