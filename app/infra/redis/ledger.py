"""The ledger's self-check (app/maintenance/verify.py), as Redis sees it: reads of the derived state the check
compares with the rows, and the last run's violation counts (``asynch_ledger_violations``, rendered by
app/observe/cluster.py at scrape time, never from a process's memory).

Invariants: every function here only reads, except ``record`` (one hash, replaced whole in one MULTI); a model's
reads are one pipeline over its own keys (one hash slot, keys.py)."""
from __future__ import annotations

import time

from app.infra.redis import keys
from app.infra.redis.client import get_redis


def model_state(model: str) -> tuple[dict[str, float], dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """(the model's gate: job -> admission time, each tenant's gate, each permit set's live permits: job -> expiry),
    the permit sets by their suffix (a tenant, or a credential scope ``~k:<hash>``)."""
    r = get_redis()
    tg_prefix, sem_prefix = keys.tenant_gate(model, ""), keys.semaphore(model, "")
    tgates = list(r.scan_iter(match=tg_prefix + "*", count=500))
    sems = list(r.scan_iter(match=sem_prefix + "*", count=500))
    pipe = r.pipeline(transaction=False)
    pipe.zrange(keys.gate(model), 0, -1, withscores=True)
    for k in tgates:
        pipe.zrange(k, 0, -1, withscores=True)
    now = time.time()
    for k in sems:
        pipe.zrangebyscore(k, now, "+inf", withscores=True)
    res = pipe.execute()
    gate = dict(res[0])
    tenant_gates = {k[len(tg_prefix):]: dict(v) for k, v in zip(tgates, res[1:1 + len(tgates)])}
    permits = {k[len(sem_prefix):]: dict(v) for k, v in zip(sems, res[1 + len(tgates):])}
    return gate, tenant_gates, permits


def held_by_dispatcher(model: str, job_ids: list[str]) -> list[bool]:
    """For each job, whether the model's dispatcher holds it (queued, pulled, set aside: its attempt is noted
    from the enqueue to the finish step, dispatch_lib.lua KEYS[8])."""
    if not job_ids:
        return []
    return [bool(x) for x in get_redis().hmget(keys.dispatch_attempts(model), job_ids)]


def record(counts: dict[str, int]) -> None:
    """The last run's violations per check (and when it ran)."""
    pipe = get_redis().pipeline(transaction=True)
    pipe.delete(keys.ledger_violations())
    pipe.hset(keys.ledger_violations(), mapping={**{c: int(n) for c, n in counts.items()}, "_at": f"{time.time():.3f}"})
    pipe.execute()


def last_counts() -> tuple[dict[str, int], float | None]:
    """(check -> violations, when) of the last recorded run; ({}, None) when none ran."""
    raw = get_redis().hgetall(keys.ledger_violations())
    at = raw.pop("_at", None)
    return {c: int(n) for c, n in raw.items()}, (float(at) if at else None)
