"""Jobs: admission (service.submit, batch.submit_batch), reads and cancel (service), the worker's
attempt (execution), the seed's batch claim (service), usage counts (stats),
and their contracts (schemas)."""
