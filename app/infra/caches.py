"""A small per-process cache with a time-to-live, for the hot admission
path (API keys, model configuration).  What a cached entry may hide is
bounded by its TTL: a revoked key or a changed model is seen by every API
process within that many seconds (at once by the process that changed it).
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

MISSING = object()
_registry: list["TTLCache"] = []


class TTLCache:
    def __init__(self, ttl: Callable[[], float], maxsize: int = 10_000) -> None:
        self._ttl = ttl
        self._maxsize = maxsize
        self._data: dict[Any, tuple[float, Any]] = {}
        self._lock = threading.Lock()
        _registry.append(self)

    def get(self, key: Any) -> Any:
        hit = self._data.get(key)
        if hit is None or hit[0] < time.monotonic():
            return MISSING
        return hit[1]

    def set(self, key: Any, value: Any) -> None:
        ttl = self._ttl()
        if ttl <= 0:
            return
        with self._lock:
            if len(self._data) >= self._maxsize:
                self._data.clear()  # crude but bounded; refills from the database
            self._data[key] = (time.monotonic() + ttl, value)

    def invalidate(self, key: Any = MISSING) -> None:
        with self._lock:
            if key is MISSING:
                self._data.clear()
            else:
                self._data.pop(key, None)


def clear_all() -> None:
    for c in _registry:
        c.invalidate()
