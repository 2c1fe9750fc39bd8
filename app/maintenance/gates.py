"""Redis made equal to the rows (docs/architecture.md, invariants 1 and 4):
the gates, and the dispatcher's blocked tenants and lost messages."""
from __future__ import annotations

from sqlalchemy import select

from app.config import get_settings
from app.infra.db import transaction
from app.infra.redis import gate, keys
from app.infra.tables import models, tasks
from app.jobs import dispatch
from app.maintenance.report import Report
from app.states import SLOT_STATES

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


def kick_dispatch(requeue_inflight: bool = False) -> Report:
    """Every model's dispatcher: tenants at their limit tried again, dispatched
    jobs nobody claimed in time back to their queue."""
    return Report(processed=dispatch.kick_all(model_caps(), requeue_inflight=requeue_inflight))
