"""Fair dispatch: which pending job gets a run_job message next.

Per model, every tenant's ready jobs wait in their own sorted set (scored by
queue order); the tenants that have ready work and a free permit form a
ring scored by a virtual *pass*, and the lowest pass goes next.  The ring
shares model time, not turns (deficit round robin by cost): a dispatch
advances the tenant's pass by its estimated run seconds (the EWMA of its
attempts on this model, else the model's expected_seconds, else 1) over its
weight, and when the attempt ends the charge is corrected to the seconds it
really ran (claim to finish, Redis time), so a tenant of 2 s jobs gets as
much model time as one of 0.1 s jobs, not 20x.  ``ASYNCH_DISPATCH_FAIRNESS=
turns`` charges 1 per job (the old stride scheduling, a benchmark baseline).
A tenant that comes back after a pause starts at the current virtual time,
not with credit saved up.  Per (tenant, model) a guaranteed minimum and a
burst ceiling of concurrent jobs (``set_shares``): a tenant with work below
its minimum goes first, free of charge, its message at high priority in the
broker; a tenant at its ceiling (never above max_concurrency) is not
dispatched.  Dispatching a job takes its tenant's permit in the same step,
so a message in the broker always has a permit and a worker never polls for
one; a tenant at its limit leaves the ring (``blocked``) until one of its
jobs finishes.  At most ``window`` messages per model wait in the broker
unclaimed: fairness is decided here, where it can be, and not in the
broker's FIFO.

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
its permit and its charge returned (a duplicate message is harmless: the
claim CAS lets one through).
"""
from __future__ import annotations

from typing import Iterable

from app.config import get_settings
from app.infra.redis import keys, scripts, upstream
from app.infra.redis.client import get_redis

def _keys(model: str) -> list[str]:
    return [keys.dispatch_ring(model), keys.dispatch_blocked(model), keys.dispatch_pass(model),
            keys.dispatch_inflight(model), keys.dispatch_inflight_info(model), keys.dispatch_conf(model),
            keys.runtime_max_concurrency(model), keys.dispatch_weights(model), keys.dispatch_attempts(model),
            keys.dispatch_cost(model), keys.dispatch_charges(model), keys.dispatch_shares(model)]


def _args(model: str, cap: int | None, most: int | None) -> list:
    s = get_settings()
    return [keys.dispatch_ready(model, ""), keys.semaphore(model, ""), "" if cap is None else int(cap),
            s.dispatch_window, f"{s.dispatch_lease_seconds:.3f}", most if most is not None else s.dispatch_window,
            s.dispatch_fairness]


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
           cap: int | None = None, ran: float | None = None) -> tuple[bool, list[tuple[str, str, str]]]:
    """(whether the gate slot was still held, the jobs dispatched).
    ``message``: what the wake-up carries (app/infra/wakeups.py
    snapshot_message); empty, the job id.  ``ran``: a done attempt's run
    time (seconds), into the model's EWMA and the upstream controller's
    sample (upstream.py) in the same step."""
    released, *rest = scripts.get("dispatch_finish")(
        keys=[*_keys(model), keys.gate(model), keys.dispatch_run_time(model)], args=[
            *_args(model, cap, None), tenant, job_id, keys.tenant_gate(model, ""),
            keys.terminal_channel() if wake else "", message if wake else "",
            "" if ran is None else f"{ran:.6f}", f"{get_settings().estimate_alpha:.6f}", upstream.finish_arg()])
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


def position(model: str, tenant: str, job_id: str, scores: list[float], cap: int | None = None) -> list:
    """Where jobs of ``tenant`` at ``scores`` stand (dispatch_position.lua,
    read only): [cap, running, the tenant's permits, tenants, EWMA seconds
    or '', samples, then (own ahead, all ahead) per score; -1 -1 for a
    queued ``job_id`` already dispatched]."""
    return scripts.get("dispatch_position")(
        keys=[*_keys(model), keys.gate(model), keys.dispatch_run_time(model)],
        args=[*_args(model, cap, None), tenant, job_id, *[repr(float(x)) for x in scores]])



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


def set_cap(model: str, max_concurrency: int, expected_seconds: float | None = None) -> None:
    """The model's max_concurrency, for dispatch steps whose caller does not
    know it (a cancel, a timeout); the periodic kick dispatches what a raised
    limit now allows.  ``expected_seconds``: the charge of a tenant's jobs
    before one of them finished."""
    conf = {"mc": int(max_concurrency), **({"es": float(expected_seconds)} if expected_seconds else {})}
    get_redis().hset(keys.dispatch_conf(model), mapping=conf)


def set_shares(model: str, shares: dict[str, tuple[int | None, int | None]]) -> None:
    """tenant -> (guaranteed minimum, burst ceiling) of concurrent jobs on
    ``model`` (None: none); a tenant with neither is dropped.  Replaces the
    model's whole map in one MULTI of its slot."""
    pipe = get_redis().pipeline(transaction=True)
    pipe.delete(keys.dispatch_shares(model))
    kept = {t: f"{'' if lo is None else lo} {'' if hi is None else hi}" for t, (lo, hi) in shares.items()
            if lo is not None or hi is not None}
    if kept:
        pipe.hset(keys.dispatch_shares(model), mapping=kept)
    pipe.execute()


def ring(model: str) -> list[tuple[str, float]]:
    """The ring in dispatch order, (tenant, pass) lowest pass first (a tenant
    below its guaranteed minimum goes before it; blocked tenants are not in it)."""
    return [(t, float(p)) for t, p in get_redis().zrange(keys.dispatch_ring(model), 0, -1, withscores=True)]


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
              keys.dispatch_inflight(model), keys.dispatch_inflight_info(model), keys.dispatch_attempts(model),
              keys.dispatch_charges(model)]
    for prefix in (keys.dispatch_ready(model, ""), keys.semaphore(model, "")):
        doomed += list(r.scan_iter(match=prefix + "*", count=500))
    if doomed:
        r.delete(*doomed)
