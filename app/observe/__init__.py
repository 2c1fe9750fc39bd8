"""What operators look at: live numbers (live), cluster gauges (cluster), the console's pages (ops),
the metrics group's gunicorn hooks (gunicorn_conf), contracts (schemas)."""
