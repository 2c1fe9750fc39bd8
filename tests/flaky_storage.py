"""Test-only fault injection for a Celery worker process: the first upload
try of every result carrying ``"flaky_upload": true`` fails.

Loaded with ``celery worker --include flaky_storage`` (tests/ on PYTHONPATH),
it wraps whatever storage the worker's settings name, so no production code
knows about it.  Each injected failure appends a line to $FLAKY_STORAGE_LOG.
"""
from __future__ import annotations

import os

from app.infra import storage

MARK = b'"flaky_upload": true'
_real_factory = storage.storage_from_url
_failed_once: set[str] = set()


class FirstTryFails:
    def __init__(self, inner):
        self.inner = inner

    def put(self, key, data, content_type, context=None):
        if MARK in data and key not in _failed_once:
            _failed_once.add(key)
            with open(os.environ["FLAKY_STORAGE_LOG"], "a") as f:
                f.write(key + "\n")
            raise storage.StorageError("injected: first upload try fails")
        return self.inner.put(key, data, content_type, context)

    def get(self, location):
        return self.inner.get(location)

    def stream(self, location):
        return self.inner.stream(location)

    def presign(self, location, seconds):
        return self.inner.presign(location, seconds)

    def delete(self, location):
        return self.inner.delete(location)

    def delete_many(self, locations):
        return self.inner.delete_many(locations)


storage.storage_from_url = lambda url, settings: FirstTryFails(_real_factory(url, settings))
