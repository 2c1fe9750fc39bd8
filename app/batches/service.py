"""Batches as callers see them: create, retrieve, list, cancel; each a tenant's own (another tenant's id is 404).

Invariants: create judges and writes (app/batches/create.py) and then runs the batch's first pass at once
(admission starts without waiting for beat; a failure there is left to beat); cancel marks the batch
cancelling (a guarded UPDATE) and runs its pass, which stops its jobs.  Reads never write."""
from __future__ import annotations

import logging

from sqlalchemy import and_, or_, select

from app.batches import create as creating, progress
from app.batches.schemas import BatchCreate, BatchErrors, BatchError, BatchObject, RequestCounts
from app.errors import NotFound
from app.infra.db import single_statement
from app.infra.tables import batches

log = logging.getLogger(__name__)


def create(tenant: str, body: BatchCreate):
    row = creating.create(tenant, body)
    if row.status == "in_progress":
        _pass(row.id)
    return get(tenant, row.id)


def _pass(batch_id: str) -> None:
    try:
        progress.advance(batch_id)
    except Exception:  # beat's next pass does it
        log.exception("batch pass failed", extra={"batch_id": batch_id})


def get(tenant: str, batch_id: str):
    with single_statement() as conn:
        row = conn.execute(select(batches).where(batches.c.id == batch_id, batches.c.tenant_id == tenant)).first()
    if row is None:
        raise NotFound(f"no such batch: {batch_id}")
    return row


def list_batches(tenant: str, after: str | None, limit: int):
    q = select(batches).where(batches.c.tenant_id == tenant)
    with single_statement() as conn:
        if after:
            ref = conn.execute(select(batches.c.created_at, batches.c.id).where(
                batches.c.id == after, batches.c.tenant_id == tenant)).first()
            if ref is None:
                raise NotFound(f"no such batch: {after}")
            q = q.where(or_(batches.c.created_at < ref.created_at,
                            and_(batches.c.created_at == ref.created_at, batches.c.id < ref.id)))
        rows = conn.execute(q.order_by(batches.c.created_at.desc(), batches.c.id.desc()).limit(limit + 1)).all()
    return rows[:limit], len(rows) > limit


def cancel(tenant: str, batch_id: str):
    get(tenant, batch_id)
    progress.cancel(batch_id)
    _pass(batch_id)
    return get(tenant, batch_id)


def view(row) -> BatchObject:
    ts = lambda d: None if d is None else int(d.timestamp())  # noqa: E731
    errors = None
    if row.errors:
        errors = BatchErrors.model_construct(object="list", data=[BatchError.model_construct(**e) for e in row.errors])
    times = {k: ts(getattr(row, k)) for k in ("created_at", "in_progress_at", "expires_at", "finalizing_at",
                                              "completed_at", "failed_at", "expired_at", "cancelling_at",
                                              "cancelled_at")}
    return BatchObject.model_construct(
        id=row.id, object="batch", endpoint=row.endpoint, errors=errors, input_file_id=row.input_file_id,
        completion_window=row.completion_window, status=row.status, output_file_id=row.output_file_id,
        error_file_id=row.error_file_id, request_counts=RequestCounts.model_construct(
            total=row.total, completed=row.completed, failed=row.failed), metadata=row.metadata, **times)
