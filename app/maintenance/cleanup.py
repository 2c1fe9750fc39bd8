"""Cleanup, the periodic pass at the end of a job's life: what retention
(app/jobs/retention.py, its invariants) deletes, for every model -- submits
to a capped model evict first, this is the backstop -- then jobs past their
budget (pending, running, retry_wait) time out."""
from __future__ import annotations

from sqlalchemy import select

from app.clock import now as clock_now
from app.infra.db import transaction
from app.infra.tables import models
from app.jobs import retention
from app.maintenance.recovery import time_out_overdue
from app.maintenance.report import Report, batch_size


def cleanup(limit: int | None = None) -> Report:
    """Hard-delete what served its time, with its stored result, then each
    capped model's least recently read beyond max_completed; then time out
    the jobs past their budget."""
    n = batch_size(limit)
    rep = Report(details={"claimed": 0, "failed": 0, "done": 0, "objects": 0, "object_errors": 0, "evicted": 0})

    def drain(name: str, step) -> None:
        while True:
            seen, deleted, objects, errors = step()
            rep.details[name] += deleted
            rep.details["objects"] += objects
            rep.details["object_errors"] += errors
            # A short batch is the end; a batch that deleted nothing only has
            # rows whose objects failed to delete: leave them for next time.
            if seen < n or deleted == 0:
                break

    for name, states, col, before in retention.expiry_kinds(clock_now()):
        drain(name, lambda: retention.purge_batch(states, col, before, n))  # noqa: B023 (called at once)
    with transaction() as conn:
        capped = conn.execute(select(models.c.model_name, models.c.max_completed)
                              .where(models.c.max_completed > 0)).all()
    for model_name, cap in capped:
        drain("evicted", lambda: retention.evict_over_cap(model_name, cap, n))  # noqa: B023
    rep.details["timeouts"] = time_out_overdue(limit).processed
    rep.processed = sum(rep.details[k] for k in ("claimed", "failed", "done", "evicted", "timeouts"))
    return rep
