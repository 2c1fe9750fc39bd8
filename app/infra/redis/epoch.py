"""Wipe detection: every Redis we depend on (the gate's, and the broker's when it is a database of its own)
carries an epoch mark.  Where ``SET NX`` of the mark succeeds the store lost everything (or first start, or a
layout change: the mark's name carries its version), so recovery rebuilds it from the rows.  Under Redis
Cluster a master can lose its data alone, so each master has its own mark, hash-tagged into a slot it serves
(a resharding that moves that slot costs one rebuild).
"""
from __future__ import annotations

from typing import Iterable

import redis

from app.infra.redis import keys, scripts
from app.infra.redis.client import broker_redis, get_redis, is_cluster


def _stores() -> list[tuple[str, redis.Redis, str]]:
    """(name, client, epoch key) of every mark we keep."""
    r = get_redis()
    stores = [(f"redis:{tag}" if tag else "redis", r, keys.epoch(tag)) for tag in _node_tags(r)]
    if (b := broker_redis()) is not None:
        stores.append(("broker", b, keys.epoch()))
    return stores


def _node_tags(r) -> list[str]:
    """One hash tag per cluster master ("n<i>", the first in a slot it serves); [""] for a single Redis."""
    if not is_cluster(r):
        return [""]
    found = (next((f"n{i}" for i in range(100_000) if r.get_node_from_key(keys.epoch(f"n{i}")) == node), None)
             for node in r.get_primaries())
    return [tag for tag in found if tag]


def claim_epochs(token: str) -> list[str]:
    """Mark every Redis we depend on with ``token`` where no mark is present;
    returns the names of those that had none (wiped, or the first start)."""
    return [name for name, client, key in _stores() if client.set(key, token, nx=True)]


def drop_epochs(token: str, names: Iterable[str]) -> None:
    """Undo claim_epochs (the repair failed): the next pass sees the wipe again."""
    for name, client, key in _stores():
        if name in names:
            scripts.get("epoch_compare_delete", client)(keys=[key], args=[token])
