"""Per-process state, and the one place that makes it fork-safe.

Gunicorn and Celery's prefork pool fork: a child must never use its
parent's sockets (a pooled database connection, a Redis client, the
broker's connection) or wait on its parent's threads (the outbox sender,
the wake-up listener).  Everything of that kind is a ``PerProcess`` value,
built on first use; ``os.register_at_fork`` clears every one of them in a
forked child (calling its ``on_fork`` hook first, e.g. to drop an engine's
inherited connections without closing the parent's sockets), so the child
builds its own on first use.
"""
from __future__ import annotations

import os
import threading
import weakref
from typing import Callable, Generic, TypeVar

T = TypeVar("T")

_all: "weakref.WeakSet[PerProcess]" = weakref.WeakSet()


class PerProcess(Generic[T]):
    def __init__(self, factory: Callable[[], T], on_fork: Callable[[T], None] | None = None,
                 on_reset: Callable[[T], None] | None = None) -> None:
        self._factory = factory
        self._on_fork = on_fork
        self._on_reset = on_reset
        self._lock = threading.Lock()
        self._value: T | None = None
        _all.add(self)

    def get(self) -> T:
        value = self._value
        if value is None:
            with self._lock:
                if self._value is None:
                    self._value = self._factory()
                value = self._value
        return value

    def peek(self) -> T | None:
        """The value if this process has built it, else None."""
        return self._value

    def reset(self) -> None:
        """Drop the value (tests, settings changes); the next get() builds a new one."""
        with self._lock:
            value, self._value = self._value, None
        if value is not None and self._on_reset is not None:
            self._on_reset(value)

    def _forked(self) -> None:
        # The parent's lock may have been held by a thread that does not exist here.
        self._lock = threading.Lock()
        value, self._value = self._value, None
        if value is not None and self._on_fork is not None:
            try:
                self._on_fork(value)
            except Exception:  # a broken inherited value must not kill the child
                pass


def _after_fork_in_child() -> None:
    for item in list(_all):
        item._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)
