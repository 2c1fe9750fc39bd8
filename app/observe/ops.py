"""What the console's operator pages read: a job's attempt log, the workers,
the maintenance state (beat leader, latest periodic runs, gates against the
rows) and a tenant's queue share in use.

Invariants:
- Reads only, at request time, from the rows and the Redis keys holding the
  live state, never process memory: any API process answers the same.
- A tenant's pending and running are its gate set's (app/observe/live.py
  says what they mean); the maintenance state counts the slot-holding rows
  themselves, one index range per model, since comparing the gates with
  them is what it is for.
- Tenant-scoped: a job's attempts only of a job the principal may see; a
  tenant's state only for its own keys or an admin; workers and maintenance
  are admin routes (app/web/v1_admin.py).
"""
from __future__ import annotations

import json
import time

from sqlalchemy import select, union

from app.clock import as_utc, now as clock_now
from app.contract import iso_z
from app.infra.db import transaction
from app.infra.metrics import worker_ttl
from app.infra.redis import gate, leader, liveness
from app.infra.tables import api_keys, models, task_attempts, tasks, tenant_limits
from app.jobs import service as jobs
from app.observe.live import active_counts, row_counts
from app.states import SLOT_STATES, JobState
from app.tenancy import limits
from app.tenancy.keys import Principal


def job_with_attempts(principal: Principal, job_id: str):
    """The job row (404 unless the principal may see it) and its ended attempts, oldest first."""
    with transaction() as conn:
        row = jobs.load_job(conn, principal, job_id)
        attempts = conn.execute(select(task_attempts).where(task_attempts.c.job_id == job_id)
                                .order_by(task_attempts.c.attempt, task_attempts.c.id)).all()
    return row, attempts


def _age(stamp: str | None, now: float) -> float | None:
    try:
        return round(max(0.0, now - float(stamp)), 3) if stamp else None
    except ValueError:
        return None


def workers() -> dict:
    """Every node with a liveness hash or named by a running job (hash gone:
    dead), each with the jobs it runs."""
    live = liveness.workers_read()
    now = time.time()
    with transaction() as conn:
        running = conn.execute(select(tasks.c.id, tasks.c.model_name, tasks.c.tenant_id, tasks.c.attempt,
                                      tasks.c.started_at, tasks.c.worker)
                               .where(tasks.c.state == int(JobState.RUNNING)).order_by(tasks.c.started_at)).all()
    # A running row names "<node>#<instance>" (the process's start, app/maintenance/recovery.py).
    # Its job is that node's unless the node's hash names another instance: then the node
    # restarted and the job is the old instance's, listed on its own (dead).
    by_node: dict[str, list[dict]] = {}
    for r in running:
        worker = r.worker or ""
        node, inst = worker.rsplit("#", 1) if "#" in worker else (worker, "")
        known = live.get(node, {}).get("instance")
        where = node if node in live and (not known or not inst or known == inst) else worker
        by_node.setdefault(where, []).append(
            {"job_id": r.id, "model": r.model_name, "tenant": r.tenant_id, "attempt": r.attempt,
             "started_at": iso_z(as_utc(r.started_at))})
    out = []
    for node in sorted(set(live) | {n for n in by_node if n}):
        h = live.get(node, {})
        # Alive as recovery sees it: the hash is there (each heartbeat or consumed message renews it for ttl).
        out.append({"node": node, "alive": bool(h), "heartbeat_age_seconds": _age(h.get("heartbeat"), now),
                    "consumed_age_seconds": _age(h.get("consumed"), now),
                    "queues": [q for q in h.get("queues", "").split(",") if q], "instance": h.get("instance") or None,
                    "running": by_node.get(node, [])})
    return {"ttl_seconds": worker_ttl(), "workers": out, "unassigned_running": len(by_node.get("", []))}


def maintenance_state(runs: int = 200) -> dict:
    """The beat leader, the latest run of each periodic task, and every
    gate's slots against its pending/running rows (what reconcile repairs)."""
    cur = leader.leader_current()
    # The last entry of each task wins (the history is oldest first, as periodic.recent_runs reads it).
    latest = {e["task"]: e for e in map(json.loads, leader.beat_history(runs))}
    with transaction() as conn:
        names = [r.model_name for r in conn.execute(select(models.c.model_name).order_by(models.c.model_name))]
        gate_names = sorted(set(names) | set(gate.gate_models()))
        # The rows themselves (this view checks the gates against them): one index range per model and state.
        counted = row_counts(conn, gate_names, dict.fromkeys(sorted(SLOT_STATES)))
    rows = {m: sum(counted[(m, s.label)] for s in SLOT_STATES) for m in gate_names}
    snap = gate.gate_snapshot(gate_names)
    gates = [{"model": m, "slots": snap[m][0], "active_rows": int(rows.get(m, 0)),
              "drift": snap[m][0] - int(rows.get(m, 0)), "configured": m in names} for m in gate_names]
    return {"leader": {"owner": cur[1], "token": cur[0], "ttl_ms": leader.leader_ttl_ms()} if cur else None,
            "latest": sorted(latest.values(), key=lambda e: e["task"]),
            "gates": gates, "checked_at": iso_z(clock_now())}


def tenants(principal: Principal) -> list[str]:
    if not principal.is_admin:
        return [principal.tenant_id]
    with transaction() as conn:
        q = union(select(api_keys.c.tenant_id), select(tenant_limits.c.tenant_id))
        return sorted(r[0] for r in conn.execute(q))


def tenant_state(principal: Principal, tenant: str) -> dict:
    """The tenant's share of each enabled model's queue in use (its gate
    set's size against its cap) and its jobs by state there."""
    limits.read(principal, tenant)  # 422 for a bad id, 403 for another tenant's key
    with transaction() as conn:
        model_rows = conn.execute(select(models).where(models.c.enabled.is_(True)).order_by(models.c.model_name)).all()
        by = active_counts(conn, [m.model_name for m in model_rows], tenant)
    return {"tenant": tenant, "models": [
        {"model": m.model_name, "in_use": by[(m.model_name, "pending")] + by[(m.model_name, "running")],
         "cap": limits.tenant_queue_cap(tenant, m), "queue_limit": m.queue_limit,
         **{s: by.get((m.model_name, s), 0) for s in ("pending", "running", "retry_wait")}} for m in model_rows]}
