"""What a node tells its operators: plain counters kept where the work happens, and the Prometheus
exposition, readiness probe and log format built from them."""
