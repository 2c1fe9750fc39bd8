"""Jobs: admission (service.submit), reads and cancel (service), the worker's
attempt (execution), the seed's batch claim (claims), usage counts (stats),
and their contracts (schemas)."""
