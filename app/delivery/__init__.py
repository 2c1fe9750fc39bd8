"""The outbox: callbacks (the seed's GET on done) and webhooks (Standard
Webhooks POSTs on every terminal state), two kinds of one durable delivery
with leases, a hard deadline, an attempt cap and a per-tenant share
(outbox); the tenants' signing secrets (secrets) and Standard Webhooks
signatures (signing); the tenants' webhook subscriptions (subscriptions);
contracts (schemas).  Delivered by their own Celery queue and worker pool."""
