"""The seed-002 task face: batch status with claim (getTaskBatch) and the
single-task view (getTaskResult).

getTaskBatch moves every done task it names to claimed with
expire_at = now + the model's auto_clean_seconds, through
transitions.claim_results: one guarded UPDATE, so among any number
of concurrent calls each task is claimed, and its expire_at set, exactly once
(``claimed: true`` in the one answer that did it).  Another tenant's ids are
reported as not found and never touched.
"""
from __future__ import annotations

from sqlalchemy import select

from app import transitions
from app.config import get_settings
from app.infra.db import transaction
from app.errors import ValidationFailed
from app.infra.tables import tasks
from app.tenancy.keys import Principal
from app.states import JobState, seed_code

_RESULT_STATES = (JobState.DONE, JobState.CLAIMED)
_ERROR_STATES = (JobState.FAILED, JobState.TIMEOUT, JobState.CANCELED, JobState.RETRY_WAIT)


def _iso(dt) -> str | None:
    """UTC ISO-8601 with a Z (a batch formats thousands: no helper calls)."""
    if dt is None:
        return None
    text = dt.isoformat()
    if dt.tzinfo is None:  # SQLite hands times back naive; every stored time is UTC
        return text + "Z"
    return text[:-6] + "Z" if text.endswith("+00:00") else text


# What task_view reads: a batch fetches only these, never the payloads.
VIEW_COLUMNS = tuple(tasks.c[n] for n in (
    "id", "state", "result_location", "result_content_type", "expire_at", "model_name", "biz_name",
    "retry_count", "created_at", "finished_at", "error"))

# state -> (the seed's code, shows the result, shows the error, is claimed)
_BY_STATE = {int(s): (seed_code(s), s in _RESULT_STATES, s in _ERROR_STATES, s == JobState.CLAIMED)
             for s in JobState}


def task_view(row, claimed: bool | None = None) -> dict:
    """A task as the seed-002 routes show it (state: the seed's 0-4 code)."""
    return _view(tuple(getattr(row, c.name) for c in VIEW_COLUMNS), claimed)


def _view(values: tuple, claimed: bool | None) -> dict:
    # Unpacked by position (VIEW_COLUMNS' order): a batch builds a thousand of these.
    task_id, state, location, content_type, expire_at, model, biz, retries, created, finished, err = values
    code, result, error, is_claimed = _BY_STATE[state]
    body = {"task_id": task_id, "state": code,
            "oss_file": location if result else None,
            "file_type": content_type if result else None,
            "expire_at": _iso(expire_at) if is_claimed else None,
            "model_name": model, "biz_name": biz, "retry_count": retries,
            "created_at": _iso(created), "finished_at": _iso(finished)}
    if error and err:
        body["error"] = err
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
    out = []
    for tid in ids:
        row = rows.get(tid)
        if row is None:
            out.append({"task_id": tid, "state": None, "oss_file": None, "error": "task not found", "claimed": False})
        else:
            out.append(_view(row, tid in claimed))  # rows of VIEW_COLUMNS, in that order
    return out
