"""The per-process TTL caches of the admission path (API keys, model rows), on cachetools, and the one switch that
clears them all.

Invariants: a revoked key or a changed model is seen by every API process within the TTL (at once by the process
that changed it, and by the others when the invalidation message reaches their listener: app/infra/wakeups.py).  A
lookup that raced an invalidation never re-caches what it read: a reader takes ``token()`` before it reads and
passes it to ``set``, which drops the value if a ``clear``/``pop`` came in between.  Each cache has a lock
(cachetools' are not thread-safe) and is built from the settings on first use (``clear_all`` rebuilds them).
"""
from __future__ import annotations

import threading
from typing import Any, Callable

from cachetools import Cache

MISSING = object()


class ProcessCache:
    def __init__(self, factory: Callable[[], Cache], enabled: Callable[[], bool]) -> None:
        self._factory, self._enabled = factory, enabled
        self._lock = threading.Lock()
        self._cache: Cache | None = None
        self._generation = 0  # bumped by every invalidation

    def token(self) -> int:
        """Take before reading the source; pass to ``set``."""
        return self._generation

    def _get_cache(self) -> Cache:
        if self._cache is None:
            self._cache = self._factory()
        return self._cache

    def get(self, key: Any, default: Any = MISSING) -> Any:
        with self._lock:
            return self._get_cache().get(key, default)

    def set(self, key: Any, value: Any, token: int | None = None) -> None:
        """Cache ``value``, unless an invalidation came after ``token``."""
        if not self._enabled():
            return
        with self._lock:
            if token is not None and token != self._generation:
                return
            self._get_cache()[key] = value

    def pop(self, key: Any) -> None:
        with self._lock:
            self._generation += 1
            self._get_cache().pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._generation += 1
            self._cache = None  # rebuilt with the current settings on next use


_registry: list[ProcessCache] = []


def register(factory: Callable[[], Cache], enabled: Callable[[], bool] = lambda: True) -> ProcessCache:
    cache = ProcessCache(factory, enabled)
    _registry.append(cache)
    return cache


def clear_all() -> None:
    for cache in _registry:
        cache.clear()
