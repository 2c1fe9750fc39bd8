"""Per-process state, and the one place that makes it fork-safe.

Gunicorn and Celery's prefork pool fork: a child must never use its parent's sockets (pooled
database connections, Redis clients, the broker's connection) or wait on its parent's threads
(the outbox sender, the wake-up listener).  Everything of that kind is a ``PerProcess`` value,
built on first use; a forked child drops every one (after its ``on_fork`` hook, e.g. to drop an
engine's inherited connections without closing the parent's sockets) and builds its own.
"""
from __future__ import annotations

import os
from contextlib import suppress
import threading
import weakref
from typing import Callable, Generic, TypeVar

T = TypeVar("T")

_all: "weakref.WeakSet[PerProcess]" = weakref.WeakSet()


class PerProcess(Generic[T]):
    def __init__(self, factory: Callable[[], T], on_fork: Callable[[T], None] | None = None,
                 on_reset: Callable[[T], None] | None = None) -> None:
        self._factory, self._on_fork, self._on_reset = factory, on_fork, on_reset
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
            with suppress(Exception):  # a broken inherited value must not kill the child
                self._on_fork(value)


def _after_fork_in_child() -> None:
    for item in list(_all):
        item._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)
