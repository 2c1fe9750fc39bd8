"""Adapters with no business rules: the database (db, tables), Redis (redis/), storage, the broker
(celery_config, publisher), HTTP clients (http/), metrics, logs, caches, wake-ups, fork safety."""
