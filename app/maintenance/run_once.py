"""runWork without resident workers (seed 002 ``POST /task/runWork``, also
``asynch work run-once``, e.g. from a CronJob): claim up to N pending jobs
and run them here with a Celery worker's code (execution.run_claimed).

Invariants:
- a job is taken by transitions.claim on rows locked FOR UPDATE SKIP LOCKED:
  concurrent passes take disjoint rows, and a worker's run_job message for
  the same attempt is refused by its claim CAS, so each attempt runs once;
- a tenant's max_concurrency (or autotune's lower override) counts the rows
  running for the model and tenant, whoever runs them: never started past;
- a claimed job takes its permit as a worker's claim does (dispatch.claimed)
  and leaves its ready queue; its lease is the model's timeout +
  ASYNCH_LEASE_GRACE_SECONDS, and a pass that dies mid-run is recovered like
  a dead worker (worker NULL: lease-based).
"""
from __future__ import annotations

from datetime import timedelta

import redis
from sqlalchemy import func, or_, select

from app import transitions
from app.clock import now as clock_now
from app.config import get_settings
from app.infra.db import transaction
from app.infra.redis.runtime import runtime_limits_raw
from app.infra.tables import models, tasks
from app.jobs import dispatch, execution
from app.maintenance.autotune import effective
from app.maintenance.report import Report, locked
from app.states import JobState


def run_once(max_tasks: int | None = None) -> Report:
    """Claim up to ``max_tasks`` (None: ASYNCH_RUN_WORK_MAX_TASKS) pending
    jobs, oldest queue time first, and run each attempt here.  Reports how
    many it claimed, each outcome's count, and the job ids."""
    settings = get_settings()
    n = settings.run_work_max_tasks if max_tasks is None else max_tasks
    out = Report(details={"claimed": 0, "outcomes": {}, "jobs": []})
    if n <= 0:
        return out
    taken: list[tuple] = []
    with transaction() as conn:
        # A few more candidates than wanted: some may be at their tenant's cap.
        q = locked(conn, select(tasks.c.id, tasks.c.attempt, tasks.c.model_name, tasks.c.tenant_id)
                   .where(tasks.c.state == int(JobState.PENDING),  # past their deadline: the expiry pass's
                          or_(tasks.c.caller_deadline_at.is_(None), tasks.c.caller_deadline_at >= clock_now()))
                   .order_by(tasks.c.enqueue_at, tasks.c.id).limit(n * 4))
        candidates = conn.execute(q).all()
        if not candidates:
            return out
        names = sorted({c.model_name for c in candidates})
        conf = {m.model_name: m for m in conn.execute(select(models).where(models.c.model_name.in_(names)))}
        running = {(r.model_name, r.tenant_id): r.n for r in conn.execute(
            select(tasks.c.model_name, tasks.c.tenant_id, func.count().label("n"))
            .where(tasks.c.state == int(JobState.RUNNING), tasks.c.model_name.in_(names))
            .group_by(tasks.c.model_name, tasks.c.tenant_id))}
        now = clock_now()
        caps: dict[str, int] = {}
        for c in candidates:
            if len(taken) >= n:
                break
            model = conf.get(c.model_name)
            cap = caps.setdefault(c.model_name, _cap(c.model_name, model))
            if running.get((c.model_name, c.tenant_id), 0) >= cap:
                continue
            lease = (model.timeout_seconds if model is not None else 60) + settings.lease_grace_seconds
            row = transitions.claim(conn, c.id, c.attempt, now + timedelta(seconds=lease), None)
            if row is not None:
                running[(c.model_name, c.tenant_id)] = running.get((c.model_name, c.tenant_id), 0) + 1
                taken.append((row, model, lease, cap))
    for row, model, lease, cap in taken:
        dispatch.claimed(row.model_name, row.tenant_id, row.id, lease, cap=cap)
        outcome = execution.run_claimed(row, model, row.attempt)
        out.details["outcomes"][outcome] = out.details["outcomes"].get(outcome, 0) + 1
        out.details["jobs"].append(row.id)
    out.processed = out.details["claimed"] = len(taken)
    return out


def _cap(model_name: str, model) -> int:
    """The model's max_concurrency, or autotune's runtime override when lower
    (as the dispatcher takes it); Redis away: the configured cap."""
    cap = model.max_concurrency if model is not None else 1
    try:
        return effective(runtime_limits_raw(model_name)[0], cap)
    except redis.RedisError:
        return cap
