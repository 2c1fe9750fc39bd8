"""The one source of "now", so tests and maintenance can move time."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Callable

_now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)


def now() -> datetime:
    return _now()


def set_clock(fn: Callable[[], datetime] | None) -> None:
    """Install a clock (tests); None restores the wall clock."""
    global _now
    _now = fn or (lambda: datetime.now(timezone.utc))


def as_utc(dt: datetime | None) -> datetime | None:
    """A naive datetime (one built without tzinfo) is UTC: every stored time is."""
    return dt.replace(tzinfo=timezone.utc) if dt is not None and dt.tzinfo is None else dt
