"""Webhooks on every terminal state (issue 16 item 5): a job's own webhook
and its tenant's subscriptions, each with an event filter; Standard
Webhooks JSON POSTs, signed, retried and logged as callbacks are
(delivery), the tenant's subscriptions (subscriptions), contracts
(schemas).  Delivered by the callback queue and worker pool."""
