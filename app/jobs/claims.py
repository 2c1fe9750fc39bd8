"""The seed-002 task face: batch status with claim (getTaskBatch).

Every done task a call names moves to claimed through
transitions.claim_results (one guarded UPDATE: each task is claimed, its
expire_at set, exactly once; ``claimed: true`` in the one answer that did
it).  Another tenant's ids are not found and never touched.  Every done or
claimed task named has its last_read_at set (max_completed evicts the least
recently read).
"""
from __future__ import annotations

from sqlalchemy import select

from app import transitions
from app.clock import now as clock_now
from app.infra.db import single_statement, transaction
from app.infra.tables import tasks
from app.jobs.seed_schemas import SeedTask
from app.states import RESULT_STATES
from app.tenancy.keys import Principal

# What task_view reads: a batch fetches only these, never the payloads.
VIEW_COLUMNS = tuple(tasks.c[n] for n in ("id", "state", "result_location", "result_content_type", "expire_at",
                                         "model_name", "biz_name", "retry_count", "created_at", "finished_at", "error"))


def get_task_batch(principal: Principal, task_ids: list[str]) -> list[SeedTask]:
    """``task_ids`` as declared by TaskIds (at most ASYNCH_BATCH_MAX_IDS);
    duplicates are answered once, in order."""
    ids = list(dict.fromkeys(task_ids))
    if not ids:
        return []
    tenant = None if principal.is_admin else principal.tenant_id
    with transaction() as conn:
        rows = {r.id: r for r in transitions.claim_results(conn, ids, tenant, returning=VIEW_COLUMNS)}
        claimed = set(rows)
        rest = [i for i in ids if i not in claimed]
        if rest:
            # Read after claiming: rows another call claimed meanwhile show as claimed.
            q = select(*VIEW_COLUMNS).where(tasks.c.id.in_(rest))
            if tenant is not None:
                q = q.where(tasks.c.tenant_id == tenant)
            rows.update((r.id, r) for r in conn.execute(q))
    again = [i for i in ids if i in rows and i not in claimed and rows[i].state in RESULT_STATES]
    if again:
        with single_statement() as conn:
            transitions.mark_read(conn, again, now=clock_now())
    return [SeedTask.from_row(rows[tid], tid in claimed) if tid in rows else SeedTask.not_found(tid) for tid in ids]
