"""Fair dispatch: which pending job gets a run_job message next.

Per model, every tenant's ready jobs wait in their own sorted set (scored by
queue order); the tenants that have ready work and a free permit form a
ring scored by a virtual *pass* (stride scheduling: each dispatch advances
the tenant's pass by 1/weight, the lowest pass goes next, so a tenant with
weight 2 gets twice the turns of one with weight 1 when both have work, and
a tenant that comes back after a pause starts at the current virtual time,
not with credit saved up).  Dispatching a job takes its tenant's permit
(maxConcurrency) in the same step, so a message in the broker always has a
permit and a worker never polls for one; a tenant at its limit leaves the
ring (``blocked``) until one of its jobs finishes.  At most ``window``
messages per model wait in the broker unclaimed: fairness is decided here,
where it can be, and not in the broker's FIFO.

Every decision is one Lua step over the model's keys (dispatch_*.lua, their
KEYS/ARGV written there).  The scripts share the functions of
dispatch_lib.lua; per-tenant keys are built inside the script from the
prefixes in ARGV, which start with the model's hash tag like every key in
KEYS, so a step touches one hash slot (Redis Cluster; app/infra/redis/keys.py).
That is why a step reads the model's own copy of the tenant weights, not
the global hash: ``copy_weights`` refreshes the copies from it on every
change and every periodic kick.  Everything here is derived state: the rows
are the truth, and app/maintenance rebuilds these sets from them after a wipe.

Lost messages repair themselves: a dispatched job that no worker claims
within ``lease`` seconds goes back to the head of its tenant's queue with
its permit returned (a duplicate message is harmless: the claim CAS lets one
through).
"""
from __future__ import annotations

from typing import Iterable

from app.config import get_settings
from app.infra.redis import keys, scripts, upstream
from app.infra.redis.client import get_redis

def _keys(model: str) -> list[str]:
    return [keys.dispatch_ring(model), keys.dispatch_blocked(model), keys.dispatch_pass(model),
            keys.dispatch_inflight(model), keys.dispatch_inflight_info(model), keys.dispatch_conf(model),
            keys.runtime_max_concurrency(model), keys.dispatch_weights(model), keys.dispatch_attempts(model)]


def _args(model: str, cap: int | None, most: int | None) -> list:
    s = get_settings()
    return [keys.dispatch_ready(model, ""), keys.semaphore(model, ""), "" if cap is None else int(cap),
            s.dispatch_window, f"{s.dispatch_lease_seconds:.3f}", most if most is not None else s.dispatch_window]


def _triples(flat: list) -> list[tuple[str, str, str]]:
    """(tenant, job_id, attempt: "<n>" or "<n>h" for a head retry) of each job dispatched."""
    return [(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]


def enqueue(model: str, entries: Iterable[tuple[str, str, float, str | int]], *, cap: int | None = None,
            mode: str = "", most: int | None = None) -> list[tuple[str, str, str]]:
    """Queue (tenant, job_id, order score, attempt) entries and dispatch
    (attempt: n, or "<n>h" for a retry at the head); returns the (tenant,
    job_id, attempt) of each job dispatched."""
    flat = [x for t, job, score, attempt in entries for x in (t, job, repr(float(score)), str(attempt))]
    return _triples(scripts.get("dispatch_enqueue")(keys=_keys(model), args=[*_args(model, cap, most), mode, *flat]))


def claimed(model: str, tenant: str, job_id: str, run_lease_seconds: float,
            cap: int | None = None) -> list[tuple[str, str, str]]:
    return _triples(scripts.get("dispatch_claimed")(keys=_keys(model), args=[*_args(model, cap, None), tenant, job_id,
                                                            f"{run_lease_seconds:.3f}"]))


def finish(model: str, tenant: str, job_id: str, *, wake: bool, message: str = "",
           cap: int | None = None, run_seconds: float | None = None) -> tuple[bool, list[tuple[str, str, str]]]:
    """(whether the gate slot was still held, the jobs dispatched).
    ``message``: what the wake-up carries (app/infra/wakeups.py
    snapshot_message); empty, the job id.  ``run_seconds``: a done job's
    run time, the upstream controller's sample (upstream.py)."""
    released, *rest = scripts.get("dispatch_finish")(keys=[*_keys(model), keys.gate(model)], args=[
        *_args(model, cap, None), tenant, job_id, keys.tenant_gate(model, ""),
        keys.terminal_channel() if wake else "", message if wake else "", *upstream.sample(run_seconds)])
    return bool(released), _triples(rest)


def returned(model: str, tenant: str, job_id: str, score: float, attempt: str, started: float,
             retry_after: float | None, cap: int | None = None) -> tuple[float, list[tuple[str, str, str]]]:
    """A job whose upstream answered busy is pending again (dispatch_return.lua):
    the controller's decrease and pause, its permit back, queued at ``score``
    with ``attempt`` ("<n>h"), dispatch.  ``started``: when the busy call
    began (unix s).  Returns (the pause's end if this answer moved it, else
    0; the jobs dispatched)."""
    till, *rest = scripts.get("dispatch_return")(keys=_keys(model), args=[
        *_args(model, cap, None), tenant, job_id, repr(float(score)), attempt, f"{started:.3f}",
        f"{retry_after or 0:.3f}", upstream.params()])
    return float(till), _triples(rest)


def kick(model: str, *, cap: int | None = None, requeue_inflight: bool = False) -> list[tuple[str, str, str]]:
    return _triples(scripts.get("dispatch_kick")(keys=_keys(model),
                                                 args=[*_args(model, cap, None), "1" if requeue_inflight else ""]))


def restore_permits(model: str, held: list[tuple[str, str, float]]) -> None:
    """(tenant, job_id, lease expiry as unix time) of running jobs: their
    permits, rebuilt from the rows after a wipe."""
    pipe = get_redis().pipeline(transaction=False)
    for tenant, job_id, until in held:
        pipe.zadd(keys.semaphore(model, tenant), {job_id: until})
    pipe.execute()


def models() -> set[str]:
    """Models with dispatch state in Redis (for the periodic kick)."""
    found = set()
    for kind in ("dq:ring", "dq:inflight", "dq:blocked"):
        for k in get_redis().scan_iter(match=keys.model_pattern(kind), count=500):
            name = keys.model_of(k, kind)
            if name:
                found.add(name)
    return found


def set_cap(model: str, max_concurrency: int) -> None:
    """The model's max_concurrency, for dispatch steps whose caller does not
    know it (a cancel, a timeout); the periodic kick dispatches what a raised
    limit now allows."""
    get_redis().hset(keys.dispatch_conf(model), "mc", int(max_concurrency))


def set_weight(tenant: str, weight: int, models_: Iterable[str] = ()) -> None:
    """The tenant's weight, in the global hash and in the copy of every
    model with dispatch state (and of ``models_``): at once where it matters."""
    get_redis().hset(keys.tenant_weights(), tenant, int(weight))
    copy_weights(set(models_) | models())


def replace_weights(weights: dict[str, int], models_: Iterable[str] = ()) -> None:
    pipe = get_redis().pipeline(transaction=True)
    pipe.delete(keys.tenant_weights())
    if weights:
        pipe.hset(keys.tenant_weights(), mapping={t: int(w) for t, w in weights.items()})
    pipe.execute()
    copy_weights(set(models_) | models())


def copy_weights(model_names: Iterable[str]) -> None:
    """Make each model's copy of the weights (what its dispatch steps read)
    equal the global hash.  Each copy is replaced in one MULTI of its own
    slot; a step between two copies sees the old or the new weights whole."""
    names = sorted(set(model_names))
    if not names:
        return
    current = {t: int(w) for t, w in get_redis().hgetall(keys.tenant_weights()).items()}
    pipe = get_redis().pipeline(transaction=False)
    for m in names:
        pipe.delete(keys.dispatch_weights(m))
        if current:
            pipe.hset(keys.dispatch_weights(m), mapping=current)
    pipe.execute()


def weights() -> dict[str, int]:
    return {t: int(w) for t, w in get_redis().hgetall(keys.tenant_weights()).items()}


def ready_counts(model: str) -> dict[str, int]:
    """tenant -> jobs waiting in its ready queue (metrics, tests)."""
    prefix = keys.dispatch_ready(model, "")
    found = list(get_redis().scan_iter(match=prefix + "*", count=500))
    pipe = get_redis().pipeline(transaction=False)
    for k in found:
        pipe.zcard(k)
    return {k[len(prefix):]: int(n) for k, n in zip(found, pipe.execute()) if n}


def inflight(model: str) -> list[str]:
    return list(get_redis().zrange(keys.dispatch_inflight(model), 0, -1))


def permits(model: str, tenant: str) -> list[str]:
    return list(get_redis().zrange(keys.semaphore(model, tenant), 0, -1))


def clear_model(model: str) -> None:
    """Drop a model's whole dispatch state (the rebuild after a wipe starts here)."""
    r = get_redis()
    doomed = [keys.dispatch_ring(model), keys.dispatch_blocked(model), keys.dispatch_pass(model),
              keys.dispatch_inflight(model), keys.dispatch_inflight_info(model), keys.dispatch_attempts(model)]
    for prefix in (keys.dispatch_ready(model, ""), keys.semaphore(model, "")):
        doomed += list(r.scan_iter(match=prefix + "*", count=500))
    if doomed:
        r.delete(*doomed)
