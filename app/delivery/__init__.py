"""The outbox: callbacks and webhooks, one durable delivery (outbox) on its
own queue and worker pool; tenant signing secrets (secrets), Standard
Webhooks signatures (signing), webhook subscriptions (subscriptions), and
their contracts (schemas)."""
