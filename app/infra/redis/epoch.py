"""Wipe detection: every Redis we depend on (the gate's, and the broker's
when it is a Redis database of its own) carries an epoch mark.  A store
where ``SET NX`` of the mark succeeds has lost everything (or this is the
first start), so recovery rebuilds what it held from the rows."""
from __future__ import annotations

from typing import Iterable

import redis

from app.infra.redis import keys
from app.infra.redis.client import broker_redis, get_redis, script

# Delete a key only if it still holds our value (epoch rollback).
# KEYS[1] key  ARGV[1] expected value.  Returns 1 if deleted.
COMPARE_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def _stores() -> list[tuple[str, redis.Redis]]:
    stores = [("redis", get_redis())]
    b = broker_redis()
    if b is not None:
        stores.append(("broker", b))
    return stores


def claim_epochs(token: str) -> list[str]:
    """Mark every Redis we depend on with ``token`` where no mark is present.
    Returns the names of the stores that had none: they were wiped (or this
    is the first start), so whatever they held derived state for is gone."""
    return [name for name, client in _stores() if client.set(keys.epoch(), token, nx=True)]


def drop_epochs(token: str, names: Iterable[str]) -> None:
    """Undo claim_epochs (the repair failed): the next pass sees the wipe again."""
    for name, client in _stores():
        if name in names:
            script(COMPARE_DELETE, client)(keys=[keys.epoch()], args=[token])
