"""What operators look at: live numbers per model and series (live), the
cluster gauges (cluster), the gunicorn hooks of the metrics process group,
and their contracts (schemas)."""
