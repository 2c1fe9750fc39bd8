"""The outbox (outbox) on its own queue and worker pool, tenant signing secrets (secrets), Standard
Webhooks signatures (signing), webhook subscriptions (subscriptions), contracts (schemas)."""
