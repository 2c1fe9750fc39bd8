"""Callbacks on done: durable delivery with leases, a hard deadline and an
attempt cap (delivery), per-tenant signing secrets (secrets), contracts
(schemas).  Delivered by their own Celery queue and worker pool."""
