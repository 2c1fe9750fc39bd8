"""Adapters with no business rules: the database (db, tables), Redis by
concept (redis/), storage, the broker (celery_config, publisher, outbox),
HTTP clients (http/), metrics recording, logs, caches, wake-ups, and
fork safety (process)."""
