"""``asynch jobs requeue``: nudge a waiting job, never revive one that ended
(terminal states are absorbing: docs/architecture.md, invariant 5).  pending:
back in its tenant's queue if it fell out, and its model's doorbell rung
again (a lost one; a duplicate is a pull that finds nothing);
retry_wait: re-admitted through the gate now (as beat's retry pass does);
running: refused (a dead worker's lease expiry retries it); terminal: refused.
"""
from __future__ import annotations

from app.errors import Conflict
from app.jobs import dispatch
from app.jobs.service import get_job
from app.maintenance import passes as maintenance
from app.states import JobState
from app.tenancy.keys import OPERATOR


def requeue_job(job_id: str) -> dict:
    row = get_job(OPERATOR, job_id)
    state = JobState(row.state)
    if state == JobState.PENDING:
        # Its doorbell counted lost (the likely cause) and rung anew if its entry is there, then its entry put
        # back if it is not (NX), which rings then: one doorbell either way.
        dispatch.kick(row.model_name, broker_lost=True)
        dispatch.queue([row], mode="NX")
        return {"job_id": row.id, "action": "republished", "attempt": row.attempt}
    if state == JobState.RETRY_WAIT:
        rep = maintenance.retry_due(only=[row.id])
        if rep.processed != 1:
            raise Conflict(f"job not re-admitted ({rep.as_dict()}): its model's queue is full or it moved on")
        return {"job_id": row.id, "action": "readmitted", "attempt": row.attempt}
    if state == JobState.RUNNING:
        raise Conflict(f"cannot requeue job {job_id}: it is running (attempt {row.attempt}); "
                       "if its worker died, lease recovery retries it")
    raise Conflict(f"cannot requeue job {job_id}: it is {state.label}, a terminal state; submit a new job")
