"""Recovery: jobs whose queue entry was lost, a wiped Redis or broker, dead
workers' attempts, and jobs past their budget (docs/architecture.md,
"Recovery and wiped Redis"), and Redis made equal to the rows (invariants 1
and 4): the gates, and the dispatcher's blocked tenants and lost messages.

Every step is safe to run from several beats at once: rows are taken in
SKIP LOCKED batches, state changes are transition CASes, and queueing a job
is idempotent (NX: a job already queued, dispatched or running is left as
it is)."""
from __future__ import annotations

import json
import logging
import secrets
from datetime import datetime, timedelta

import redis
from sqlalchemy import and_, or_, select

from app import transitions
from app.clock import as_utc, now as clock_now
from app.config import get_settings
from app.infra import metrics
from app.infra.db import transaction
from app.infra.redis import dispatch as redis_dispatch, epoch, gate, keys, liveness
from app.infra.redis.client import get_redis
from app.infra.tables import models, tasks
from app.jobs import dispatch, effects
from app.jobs.execution import backoff_seconds
from app.maintenance.report import Report, batch_size, locked
from app.states import ACTIVE_STATES, SLOT_STATES, JobState, job_error
from app.tenancy import limits

log = logging.getLogger(__name__)


def _requeue_batch(where, limit: int, after: tuple | None) -> tuple[int, tuple | None]:
    """Queue one batch of pending jobs again (NX), in queue order after
    ``after`` = (enqueue_at, id).  Returns (rows seen, the last position)."""
    q = select(tasks.c.id, tasks.c.model_name, tasks.c.tenant_id, tasks.c.enqueue_at, tasks.c.attempt,
               tasks.c.promoted_at, tasks.c.priority, tasks.c.model_key).where(
        tasks.c.state == int(JobState.PENDING), *where)
    if after is not None:
        at, jid = after
        q = q.where(or_(tasks.c.enqueue_at > at, and_(tasks.c.enqueue_at == at, tasks.c.id > jid)))
    with transaction() as conn:
        rows = conn.execute(q.order_by(tasks.c.enqueue_at, tasks.c.id).limit(limit)).all()
    dispatch.queue(rows, mode="NX", caps=model_caps() if rows else {})
    return len(rows), ((rows[-1].enqueue_at, rows[-1].id) if rows else None)


def republish_stale_pending(older_than_seconds: float | None = None, limit: int | None = None) -> Report:
    """Pending jobs untouched for ASYNCH_REPUBLISH_AFTER_SECONDS, whose queue
    entry may be lost, queued again (NX: harmless for the others).  One batch
    per call from a cursor in Redis: a deep backlog costs the same per pass."""
    age = get_settings().republish_after_seconds if older_than_seconds is None else older_than_seconds
    cutoff = clock_now() - timedelta(seconds=age)
    r = get_redis()
    raw = r.get(keys.lost_job_cursor())
    after = None
    if raw:
        at, jid = json.loads(raw)
        after = (as_utc(datetime.fromisoformat(at)), jid)
    seen, last = _requeue_batch([tasks.c.updated_at < cutoff], batch_size(limit), after)
    if last is None or seen < batch_size(limit):
        r.delete(keys.lost_job_cursor())  # the end: the next pass starts over
    else:
        r.set(keys.lost_job_cursor(), json.dumps([as_utc(last[0]).isoformat(), last[1]]), ex=86400)
    return Report(processed=seen)


def requeue_all_pending(limit: int | None = None) -> Report:
    """Every pending job queued again (NX), in queue order (after a wipe)."""
    total, last = 0, None
    while True:
        seen, last = _requeue_batch([], batch_size(limit), last)
        total += seen
        if last is None:
            return Report(processed=total)


_SLOTS = [int(x) for x in SLOT_STATES]


def reconcile_gates() -> Report:
    """Every gate's slot set (the model's and each tenant's) made equal to the
    pending/running rows; slots younger than ASYNCH_RECONCILE_GRACE_SECONDS
    are spared (their row may commit), an id added that left meanwhile is
    given straight back."""
    s = get_settings()
    rep = Report(details={"added": 0, "removed": 0, "models": 0})
    with transaction() as conn:
        names = {r.model_name for r in conn.execute(select(models.c.model_name))}
    names |= set(gate.gate_models())
    for name in sorted(names):
        with transaction() as conn:
            rows = conn.execute(select(tasks.c.id, tasks.c.tenant_id).where(
                tasks.c.model_name == name, tasks.c.state.in_(_SLOTS))).all()
        by_tenant: dict[str, list[str]] = {}
        for r in rows:
            by_tenant.setdefault(r.tenant_id, []).append(r.id)
        added, removed = gate.gate_reconcile(name, [r.id for r in rows], s.reconcile_grace_seconds)
        tenant_keys = gate.tenant_gates(name)
        for tenant in sorted(set(tenant_keys) | set(by_tenant)):
            t_added, _ = gate.gate_reconcile(name, by_tenant.get(tenant, []), s.reconcile_grace_seconds,
                                             key=tenant_keys.get(tenant) or keys.tenant_gate(name, tenant))
            added += t_added
        gate.note_holders(name, by_tenant)
        if added:
            with transaction() as conn:
                still = {r.id for r in conn.execute(select(tasks.c.id).where(
                    tasks.c.id.in_(set(added)), tasks.c.state.in_(_SLOTS)))}
            tenant_of = {r.id: r.tenant_id for r in rows}
            for jid in set(added) - still:
                gate.gate_release(name, tenant_of.get(jid, ""), jid)
        rep.details["added"] += len(set(added))
        rep.details["removed"] += len(removed)
        rep.details["models"] += 1
        rep.processed += len(set(added)) + len(removed)
    return rep


def model_caps() -> dict[str, int]:
    with transaction() as conn:
        return {r.model_name: r.max_concurrency for r in conn.execute(
            select(models.c.model_name, models.c.max_concurrency))}


def kick_dispatch(broker_lost: bool = False) -> Report:
    """Every model's dispatcher: tenants at their limit tried again, delayed jobs whose time came queued, a
    doorbell rung where work waits (``broker_lost``: the broker lost the doorbells out: rung anew)."""
    return Report(processed=dispatch.kick_all(model_caps(), broker_lost=broker_lost))


def _restore_permits() -> int:
    """Running jobs hold their tenant's permit until their lease ends."""
    with transaction() as conn:
        rows = conn.execute(select(tasks.c.id, tasks.c.model_name, tasks.c.tenant_id, tasks.c.lease_expires_at)
                            .where(tasks.c.state == int(JobState.RUNNING))).all()
    by_model: dict[str, list[tuple[str, str, float]]] = {}
    fallback = clock_now() + timedelta(seconds=get_settings().lease_grace_seconds)
    for r in rows:
        until = as_utc(r.lease_expires_at) or fallback
        by_model.setdefault(r.model_name, []).append((r.tenant_id, r.id, until.timestamp()))
    for model, held in by_model.items():
        redis_dispatch.restore_permits(model, held)
    return len(rows)


def _any_active_job() -> bool:
    with transaction() as conn:
        return conn.execute(select(tasks.c.id).where(tasks.c.state.in_([int(x) for x in ACTIVE_STATES]))
                            .limit(1)).first() is not None


def repair_after_wipe() -> Report:
    """A Redis (the gates' or the broker's) without our epoch mark lost its
    data.  The gates': gates, queues, permits and weights are rebuilt from the
    rows and every pending job is queued again.  The broker's: every model's
    doorbell is rung anew.  A first start looks the same (one
    rebuild), and is logged as one (INFO, not the WARNING) when no job is
    active: nothing was lost."""
    token = secrets.token_hex(8)
    wiped = epoch.claim_epochs(token)
    if not wiped:
        return Report(details={"wiped": []})
    if _any_active_job():
        log.warning("redis data lost (%s): rebuilding gates and queues from the rows", ", ".join(wiped))
    else:
        # A fresh Redis (a first start) looks like a wiped one; with no job
        # pending, running or waiting to retry, nothing was lost: no WARNING.
        log.info("first start of redis (%s): no active job to repair; gates and queues built from the rows",
                 ", ".join(wiped))
    details: dict = {"wiped": wiped}
    try:
        # "redis", or "redis:<tag>" for one master of a Redis Cluster: any
        # lost part of the derived state means rebuilding all of it.
        if any(name.split(":")[0] == "redis" for name in wiped):
            details["reconcile"] = reconcile_gates().as_dict()
            details["permits"] = _restore_permits()
            details["weights"] = limits.sync_weights()
            details["shares"] = limits.sync_shares()
            details["requeued"] = requeue_all_pending().processed
        details["dispatched"] = kick_dispatch(broker_lost="broker" in wiped).processed
    except BaseException:
        # Let the next pass see the wipe again.
        epoch.drop_epochs(token, wiped)
        raise
    return Report(processed=details.get("requeued", 0) + details["dispatched"], details=details)


def recover_expired_leases(limit: int | None = None) -> Report:
    """A running job whose lease ran out lost its worker: that attempt failed."""
    now = clock_now()
    return _fail_attempts(_running(tasks.c.lease_expires_at < now), limit,
                          job_error("worker_lost", "worker lost (lease expired)"),
                          lambda r: now + timedelta(seconds=backoff_seconds(r.attempt - r.busy_count)),
                          lease_expired_before=lambda r: now)[0]


def recover_dead_workers(limit: int | None = None) -> Report:
    """A running attempt whose node stopped heartbeating (its liveness hash
    expired) failed now, not when its lease runs out.  Only the node named by
    the claim counts, if it still holds the attempt; a paused node's late
    writes are refused by the attempt guard.  A retry is due at once."""
    if not get_settings().recover_by_heartbeat:
        return Report(details={"skipped": "ASYNCH_RECOVER_BY_HEARTBEAT is off"})
    ttl = metrics.worker_ttl()
    try:
        live = {f"{node}#{fields.get('instance', '')}" for node, fields in liveness.workers_read().items()}
        if not liveness.liveness_settled(ttl):
            return Report(details={"skipped": "liveness not established yet (first start or a wiped Redis)"})
    except redis.RedisError as exc:
        return Report(details={"skipped": f"redis: {exc}"})
    now = clock_now()
    # Claimed at least a TTL ago: its node has had time to be seen.
    q = _running(tasks.c.worker.is_not(None), tasks.c.started_at < now - timedelta(seconds=ttl))
    if live:
        q = q.where(tasks.c.worker.not_in(sorted(live)))
    # Due at once, no backoff: a node that died is not the model
    # failing, so run_work's retry step (next in the same sweep) puts it
    # back in its queue.  The attempt still counts.
    rep, won = _fail_attempts(q, limit, job_error("worker_lost", "worker lost (stopped heartbeating)"),
                              lambda r: now, worker_gone=lambda r: r.worker)
    rep.details["nodes"] = sorted({r.worker for r, _moved in won})
    if won:
        log.warning("recovered %d attempt(s) of worker node(s) without a heartbeat: %s", len(won),
                    ", ".join(rep.details["nodes"]))
    return rep


def _running(*where):
    """Running attempts with what failing them needs (the model's retry_times)."""
    return select(tasks.c.id, tasks.c.attempt, tasks.c.busy_count, tasks.c.worker, models.c.retry_times).join(
        models, models.c.model_name == tasks.c.model_name, isouter=True).where(
        tasks.c.state == int(JobState.RUNNING), *where)


def _fail_attempts(q, limit: int | None, error: str, retry_at_of, **guard_of) -> tuple[Report, list]:
    """Fail the running attempts of one SKIP LOCKED batch of ``q``: retry_wait at ``retry_at_of(row)``
    if the model allows another attempt, else failed; ``guard_of``: the
    transition's guard arguments as functions of the row.  Won moves' effects
    run after the commit.  Returns the report and (row, move)s won."""
    rep = Report(details={"retry_wait": 0, "failed": 0})
    won = []
    with effects.collecting() as due, transaction() as conn:
        for r in conn.execute(locked(q.limit(batch_size(limit)))).all():
            retry = r.attempt - r.busy_count <= (r.retry_times or 0)  # busy answers spent none
            moved = due.add(transitions.fail_attempt(conn, r.id, r.attempt, error,
                                                     retry_at=retry_at_of(r) if retry else None,
                                                     **{k: f(r) for k, f in guard_of.items()}))
            if moved is not None:
                won.append((r, moved))
                rep.details["retry_wait" if moved.state == JobState.RETRY_WAIT else "failed"] += 1
    rep.processed = len(won)
    return rep, won


def time_out_overdue(limit: int | None = None) -> Report:
    """pending/running/retry_wait past the job's budget become timeout (a
    retry_wait job holds no slot: its release is a no-op)."""
    return _end_overdue([*SLOT_STATES, JobState.RETRY_WAIT], tasks.c.deadline_at, transitions.time_out, limit)


def expire_past_deadline(limit: int | None = None) -> Report:
    """Pending jobs past their caller's deadline (X-Deadline) expire without a
    model call, also those no worker reaches (the claim refuses them too)."""
    return _end_overdue([JobState.PENDING], tasks.c.caller_deadline_at, transitions.expire, limit)


def _end_overdue(states, column, transition, limit: int | None) -> Report:
    now = clock_now()
    with effects.collecting() as due, transaction() as conn:
        rows = conn.execute(locked(select(tasks.c.id).where(
            tasks.c.state.in_([int(x) for x in states]), column.is_not(None), column < now,
        ).limit(batch_size(limit)))).all()
        for r in rows:
            due.add(transition(conn, r.id, now=now))
    return Report(processed=len(due))
