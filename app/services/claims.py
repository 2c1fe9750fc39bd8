"""The seed-002 task face: batch status with claim (getTaskBatch) and the
single-task view (getTaskResult).

getTaskBatch moves every done task it names to claimed with
expire_at = now + the model's auto_clean_seconds, through
transitions.claim_results: one guarded UPDATE per model, so among any number
of concurrent calls each task is claimed, and its expire_at set, exactly once
(``claimed: true`` in the one answer that did it).  Another tenant's ids are
reported as not found and never touched.
"""
from __future__ import annotations

from collections import defaultdict

from sqlalchemy import select

from app import transitions
from app.clock import as_utc
from app.config import get_settings
from app.db import transaction
from app.errors import ValidationFailed
from app.models import models, tasks
from app.services.keys import Principal
from app.states import JobState, seed_code

_RESULT_STATES = (JobState.DONE, JobState.CLAIMED)
_ERROR_STATES = (JobState.FAILED, JobState.TIMEOUT, JobState.CANCELED, JobState.RETRY_WAIT)


def _iso(dt) -> str | None:
    dt = as_utc(dt)
    return dt.isoformat().replace("+00:00", "Z") if dt else None


def task_view(row, claimed: bool | None = None) -> dict:
    """A task as the seed-002 routes show it (state: the seed's 0-4 code)."""
    st = JobState(row.state)
    body = {"task_id": row.id, "state": seed_code(st),
            "oss_file": row.result_location if st in _RESULT_STATES else None,
            "file_type": row.result_content_type if st in _RESULT_STATES else None,
            "expire_at": _iso(row.expire_at) if st == JobState.CLAIMED else None,
            "model_name": row.model_name, "biz_name": row.biz_name, "retry_count": row.retry_count,
            "created_at": _iso(row.created_at), "finished_at": _iso(row.finished_at)}
    if row.error and st in _ERROR_STATES:
        body["error"] = row.error
    if claimed is not None:
        body["claimed"] = claimed
    return body


def _ids(task_ids) -> list[str]:
    cap = get_settings().batch_max_ids
    if not isinstance(task_ids, list):
        raise ValidationFailed("invalid task ids", [{"pointer": "/task_ids", "message": "must be an array of task ids"}])
    if len(task_ids) > cap:
        raise ValidationFailed("invalid task ids", [{"pointer": "/task_ids", "message": f"must name at most {cap} ids"}])
    errs = [{"pointer": f"/task_ids/{i}", "message": "must be a task id string"}
            for i, t in enumerate(task_ids) if not isinstance(t, str) or not 0 < len(t) <= 40]
    if errs:
        raise ValidationFailed("invalid task ids", errs)
    return list(dict.fromkeys(task_ids))  # de-duplicated, order kept


def get_task_batch(principal: Principal, task_ids) -> list[dict]:
    ids = _ids(task_ids)
    if not ids:
        return []
    claimed: set[str] = set()
    with transaction() as conn:
        q = select(tasks.c.id, tasks.c.model_name, tasks.c.state).where(tasks.c.id.in_(ids))
        if not principal.is_admin:
            q = q.where(tasks.c.tenant_id == principal.tenant_id)
        visible = conn.execute(q).all()
        done: dict[str, list[str]] = defaultdict(list)
        for r in visible:
            if r.state == JobState.DONE:
                done[r.model_name].append(r.id)
        if done:
            keep = dict(conn.execute(select(models.c.model_name, models.c.auto_clean_seconds)
                                     .where(models.c.model_name.in_(list(done)))).all())
            for model, jids in done.items():
                claimed.update(r.id for r in transitions.claim_results(conn, jids, keep.get(model, 3600)))
        # Read after claiming: rows another call claimed meanwhile show as claimed.
        rows = {r.id: r for r in conn.execute(select(tasks).where(tasks.c.id.in_([v.id for v in visible])))}
    out = []
    for tid in ids:
        row = rows.get(tid)
        if row is None:
            out.append({"task_id": tid, "state": None, "oss_file": None, "error": "task not found", "claimed": False})
        else:
            out.append(task_view(row, claimed=tid in claimed))
    return out
