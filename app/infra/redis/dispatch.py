"""Fair dispatch: which pending job a worker's free call slot takes next (the algorithm: docs/architecture.md "Fair
dispatch" and "A slot per call").

Invariants:
- Per model, each tenant's ready jobs wait in their own sorted set; the tenants with ready work and a free permit
  form a ring, lowest virtual *pass* first.  A dispatch charges the pass the job's estimated run seconds over the
  tenant's weight (1 with ``ASYNCH_DISPATCH_FAIRNESS=turns``), and the call's end corrects it to the seconds really
  run (Redis time); a tenant back from a pause starts at the current virtual time.  Below its guaranteed minimum
  (``set_shares``) a tenant goes first, free of charge; at its burst ceiling or its permit limit it is not
  dispatched (``blocked``).
- Jobs are pulled, never pushed: a step takes jobs only for its caller's free call slots (``pull`` for a doorbell,
  ``finish`` for the slots its calls just freed), each the one the ring picks at that moment, with the tenant's
  permit in the same step.  No job waits in a broker: a model with work and no worker pulling rings its doorbell
  (one ``asynch.pull`` message, at most one out per model, rung again if nothing pulled within its lease).
- Every decision is one Lua step over the model's keys (dispatch_*.lua, with their KEYS/ARGV); per-tenant keys are
  built from ARGV prefixes carrying the model's hash tag, so a step touches one slot (keys.py) and reads the model's
  copy of the tenant weights (``copy_weights``, on every change and every periodic kick).  Derived state:
  app/maintenance rebuilds it from the rows after a wipe.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from app.config import get_settings
from app.infra.redis import keys, scripts, upstream
from app.infra.redis.client import get_redis, read_under


@dataclass
class Step:
    """What a step answered: whether to ring the model's doorbell (``high``: at high priority), whether it queued a
    job of a tenant holding no permit (``express``: the workers' express slots may take it), the jobs it pulled
    for its caller, (tenant, job_id, attempt) each, and what else the script said before them (``head``)."""
    ring: bool = False
    high: bool = False
    express: bool = False
    pulled: list[tuple[str, str, int]] = field(default_factory=list)
    head: list = field(default_factory=list)


def _step(script, model: str, cap: int | None, *args, most: int = 0, lease: float = 0.0, gate: bool = False,
          client=None) -> list:
    """A dispatch_*.lua step's raw answer: the model's keys (``gate``: and its gate, run time), the common ARGV,
    ``args`` (``client``: a pipeline to queue it on); ``most`` jobs pulled for the caller, their permits lasting
    ``lease`` seconds (their calls' lease: the model's timeout and the grace)."""
    s = get_settings()
    k = [keys.dispatch_ring(model), keys.dispatch_blocked(model), keys.dispatch_pass(model),
         keys.dispatch_job_info(model), keys.dispatch_conf(model), keys.runtime_max_concurrency(model),
         keys.dispatch_weights(model), keys.dispatch_attempts(model), keys.dispatch_cost(model),
         keys.dispatch_charges(model), keys.dispatch_shares(model), keys.dispatch_scopes(model),
         keys.dispatch_job_scopes(model), keys.dispatch_delayed(model), keys.dispatch_congested(model),
         keys.dispatch_busy_budget(model)]
    return script(client=client, keys=k + ([keys.gate(model), keys.dispatch_run_time(model)] if gate else []), args=[
        keys.dispatch_ready(model, ""), keys.semaphore(model, ""), keys.dispatch_parked(model, ""),
        "" if cap is None else int(cap), f"{s.dispatch_bell_seconds:.3f}", f"{lease:.3f}", int(most),
        s.dispatch_fairness, upstream.params(), *args])


def _parsed(raw: list, head: int = 0) -> Step:
    """A finish_step answer (dispatch_lib.lua) after ``head`` values of the script's own."""
    ring, high, express, *rest = raw[head:]
    return Step(ring == "1", high == "1", express == "1", [(rest[i], rest[i + 1], int(rest[i + 2].rstrip("h")))
                                                           for i in range(0, len(rest), 3)], list(raw[:head]))


def enqueue(model: str, entries: Iterable[tuple[str, str, float, str | int, str]], *, cap: int | None = None,
            mode: str = "") -> Step:
    """Queue (tenant, job_id, order score, attempt: n, or "<n>h" for a job at the head, credential scope or '')
    entries; rings the doorbell if a free slot could take one."""
    flat = [x for t, job, score, attempt, scope in entries for x in (t, job, repr(float(score)), str(attempt), scope)]
    return _parsed(_step(scripts.get("dispatch_enqueue"), model, cap, mode, *flat))


def pull(model: str, most: int, lease: float, cap: int | None = None) -> Step:
    """A worker answers the model's doorbell with ``most`` free call slots: the jobs the ring picks now are its,
    their permits lasting ``lease``."""
    return _parsed(_step(scripts.get("dispatch_pull"), model, cap, most=most, lease=lease))


def pull_idle(model: str, lease: float, cap: int | None = None) -> Step:
    """A worker's express slot: one job of a tenant holding no permit on the model (the lowest pass among them),
    its permit lasting ``lease``; the doorbell's state untouched."""
    return _parsed(_step(scripts.get("dispatch_express"), model, cap, most=1, lease=lease))


def claimed(model: str, jobs: Iterable[tuple[str, str]], run_lease_seconds: float,
            cap: int | None = None) -> Step:
    """Jobs the worker-less runWork pass claimed from their rows, (tenant, job_id) each: their permits, in ONE step."""
    flat = [x for pair in jobs for x in pair]
    return _parsed(_step(scripts.get("dispatch_claimed"), model, cap, f"{run_lease_seconds:.3f}", *flat))


def finish(model: str, jobs: Iterable[tuple[str, str, str | None, float | None, tuple[float, int] | str | None]],
           cap: int | None = None, most: int = 0, lease: float = 0.0) -> tuple[list[bool], Step]:
    """Jobs that left pending/running and calls that ended, (tenant, job_id, wake-up, ran, keep) each, in ONE step:
    (for each, whether its gate slot was still held; the step: the jobs pulled for the caller's ``most`` freed
    slots, their permits lasting ``lease``, the ring).  Wake-up: None for none, "" for the job id alone, else the message (wakeups.py
    snapshot_message); ran: a done attempt's seconds, for the EWMA and upstream.py; keep: None to release its
    permits, (seconds, attempt): someone else ended it while that attempt's call may still run, so its permits
    stay, as "<job>#<attempt>", until the call ends (its worker's own finish of that id) and at most that long;
    "back": a pulled job its puller could not claim, back to its queue's head."""
    flat = [x for t, job, wake, ran, keep in jobs for x in (
        t, job, "-" if wake is None else wake, "" if ran is None else f"{ran:.6f}",
        "" if keep is None else keep if isinstance(keep, str) else f"{keep[0]:.3f} {keep[1]}")]
    raw = _step(scripts.get("dispatch_finish"), model, cap, keys.tenant_gate(model, ""), keys.terminal_channel(),
                f"{get_settings().estimate_alpha:.6f}", *flat, gate=True, most=most, lease=lease)
    n = int(raw[0])
    return [bool(x) for x in raw[1:1 + n]], _parsed(raw, 1 + n)


def returned(model: str, tenant: str, job_id: str, score: float, attempt: str, started: float,
             retry_after: float | None, delay: float, jitter: float, cap: int | None = None) -> Step:
    """A job whose upstream answered busy (a call ``started`` at unix s) is pending again: it waits ``delay``
    seconds, then returns to its tenant's queue at ``score`` with ``attempt`` ("<n>h"); its permits back, its
    charge settled, its scope's controller told (``retry_after``: capped seconds, None: none usable;
    ``jitter`` in [0, 1)).  The step's ``head``: [when the job may run again, when a pause this answer moved
    ends or 0]."""
    return _parsed(_step(scripts.get("dispatch_return"), model, cap, tenant, job_id, repr(float(score)), attempt,
                         f"{started:.3f}", f"{-1 if retry_after is None else retry_after:.3f}", f"{delay:.3f}",
                         f"{jitter:.6f}"), head=2)


def kick(model: str, *, cap: int | None = None, broker_lost: bool = False) -> tuple[Step, bool]:
    """Unblock the model's tenants and ring its doorbell if work waits; ``broker_lost``: its doorbell's message
    is gone.  Returns (the step, whether a doorbell is out after it)."""
    raw = _step(scripts.get("dispatch_kick"), model, cap, "1" if broker_lost else "")
    return _parsed(raw[:-1]), raw[-1] == "1"


def position(model: str, tenant: str, job_id: str, scores: list[float], cap: int | None = None,
             handed: list[str] = (), client=None) -> list:
    """Where jobs of ``tenant`` at ``scores`` stand (read only): [cap, running, the tenant's permits, tenants,
    EWMA seconds or '', samples, then (own ahead, all ahead) per score; -1 -1 for a queued ``job_id`` pulled;
    then per ``handed`` id 1 if the dispatcher holds it, else 0]."""
    return _step(scripts.get("dispatch_position"), model, cap, tenant, job_id, len(scores),
                 *[repr(float(x)) for x in scores], *handed, gate=True, client=client)


def positions(asks: list[tuple[str, str, list[float], int | None, list[str]]]) -> list[list]:
    """``position`` of jobs not queued yet for several (model, tenant, scores, cap, handed) asks: one EVALSHA, or
    for several one pipeline (redis-py checks SCRIPT EXISTS first: two round trips), as gate_admit_many."""
    pipe = get_redis().pipeline(transaction=False) if len(asks) > 1 else None
    out = [position(model, tenant, "", scores, cap, handed, client=pipe) for model, tenant, scores, cap, handed in asks]
    return pipe.execute() if pipe is not None else out


def restore_permits(model: str, held: list[tuple[str, str, float]]) -> None:
    """Running jobs' permits (tenant, job_id, lease expiry, unix s), rebuilt from the rows after a wipe."""
    pipe = get_redis().pipeline(transaction=False)
    for tenant, job_id, until in held:
        pipe.zadd(keys.semaphore(model, tenant), {job_id: until})
    pipe.execute()


def models() -> set[str]:
    """Models with dispatch state in Redis (for the periodic kick)."""
    return {m for kind in ("dq:ring", "dq:conf", "dq:blocked")
            for k in get_redis().scan_iter(match=keys.model_pattern(kind), count=500) if (m := keys.model_of(k, kind))}


def set_cap(model: str, max_concurrency: int, expected_seconds: float | None = None) -> None:
    """The model's max_concurrency, for steps whose caller does not know it (a cancel, a timeout).
    ``expected_seconds``: a tenant's charge per job before one of them finished."""
    conf = {"mc": int(max_concurrency), **({"es": float(expected_seconds)} if expected_seconds else {})}
    get_redis().hset(keys.dispatch_conf(model), mapping=conf)


def set_shares(model: str, shares: dict[str, tuple[int | None, int | None]]) -> None:
    """tenant -> (guaranteed minimum, burst ceiling) of concurrent jobs (None:
    none), replacing the model's whole map in one MULTI."""
    pipe = get_redis().pipeline(transaction=True)
    pipe.delete(keys.dispatch_shares(model))
    kept = {t: f"{'' if lo is None else lo} {'' if hi is None else hi}" for t, (lo, hi) in shares.items()
            if lo is not None or hi is not None}
    if kept:
        pipe.hset(keys.dispatch_shares(model), mapping=kept)
    pipe.execute()


def set_weight(tenant: str, weight: int, models_: Iterable[str] = ()) -> None:
    """The tenant's weight, in the global hash and the copy of every model with dispatch state (and ``models_``)."""
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
    """Make each model's copy of the weights (what its steps read) equal the global hash.  Each copy is replaced
    in one MULTI of its own slot; a step between two copies sees the old or the new weights whole."""
    names = sorted(set(model_names))
    if not names:
        return
    current = weights()
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
    return read_under(keys.dispatch_ready(model, ""), "zcard")


def bell(model: str) -> float | None:
    """When the model's doorbell was rung and not yet answered (None: no doorbell out)."""
    at = get_redis().hget(keys.dispatch_conf(model), "bell")
    return None if at is None else float(at)


def _waiting_step(model: str, cap: int | None, *args, client=None) -> list:
    """A dispatch_waiting.lua read (its KEYS/ARGV there)."""
    k = [keys.dispatch_conf(model), keys.runtime_max_concurrency(model), keys.dispatch_shares(model),
         keys.dispatch_scopes(model), keys.dispatch_delayed(model), keys.dispatch_job_scopes(model),
         keys.dispatch_attempts(model)]
    return scripts.get("dispatch_waiting")(client=client, keys=k, args=[
        keys.dispatch_ready(model, ""), keys.semaphore(model, ""), keys.dispatch_parked(model, ""),
        "" if cap is None else int(cap), *args])


def waiting(jobs: list[tuple[str, str, str]], caps: dict[str, int | None]) -> list[list]:
    """What holds each (model, tenant, job id) now (read only; dispatch_waiting.lua's answers), one round trip:
    one EVALSHA, or a pipeline for several."""
    pipe = get_redis().pipeline(transaction=False) if len(jobs) > 1 else None
    out = [_waiting_step(m, caps.get(m), "job", t, j, client=pipe) for m, t, j in jobs]
    return pipe.execute() if pipe is not None else out


def waiting_counts(model: str, cap: int | None = None) -> dict[str, int]:
    """The model's waiting jobs by reason (behind_own_jobs, tenant_limit, upstream_paused, no_worker)."""
    tenants = list(read_under(keys.dispatch_ready(model, ""), "zcard"))
    parked = list(read_under(keys.dispatch_parked(model, ""), "zcard"))
    raw = _waiting_step(model, cap, "counts", *tenants, "|", *parked)
    return dict(zip(("behind_own_jobs", "tenant_limit", "upstream_paused", "no_worker"), map(int, raw)))
