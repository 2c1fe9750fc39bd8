"""Reading JSON numbers: JSON has one number type, so 2.0 is the integer 2
(as JSON Schema says); booleans are never numbers."""
from __future__ import annotations

from typing import Any


def as_int(v: Any) -> int | None:
    """The integer ``v`` stands for, or None (not a number, a bool, a fraction)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None
