"""Thin Celery tasks: take ids, call the service layer, nothing else.

Periodic tasks take the ``fence`` their beat stamped them with
(app/maintenance/periodic.py); called without one they simply run."""
from __future__ import annotations

from app.delivery import outbox
from app.errors import Unavailable
from app.infra.celery_config import DELIVER_DUE_TASK, DELIVER_TASK, KICK_MODEL_TASK, RUN_JOB_TASK, RUN_JOBS_TASK
from app.infra import metrics
from app.jobs import dispatch, execution
from app.maintenance import autotune, passes as maintenance
from app.maintenance.periodic import run_periodic
from workers import heartbeat
from workers.celery_app import celery


# max_retries=None: waiting for the database to come back is not bounded by
# Celery's retry count; the job's budget bounds it.  A message only exists once its jobs were
# dispatched with their tenants' permits (app/jobs/dispatch.py): no polling here.
@celery.task(name=RUN_JOBS_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True,
             max_retries=None)
def run_jobs(self, jobs: list) -> list[str]:
    """A group of one model's jobs, [[job_id, attempt], ...]: claimed together, called at once."""
    return _run(self, jobs)


@celery.task(name=RUN_JOB_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True,
             max_retries=None)
def run_job(self, job_id: str, attempt: int = -1) -> list[str]:
    """One job's message from a release before run_jobs (a group of one)."""
    return _run(self, [[job_id, attempt]])


def _run(self, jobs: list) -> list[str]:
    try:
        out = execution.run_group([(job_id, attempt) for job_id, attempt in jobs],
                                  worker=heartbeat.identity(self.request.hostname))
    except Unavailable as exc:
        # The database is away: ring the doorbell again shortly rather than
        # leave the jobs to the maintenance pass (a job claimed meanwhile is stale then).
        raise self.retry(exc=exc, countdown=2)
    for outcome in out:
        metrics.run_job_message(outcome)
    return out


@celery.task(name=KICK_MODEL_TASK, ignore_result=True)
def kick_model(model: str) -> int:
    """A model's Retry-After pause ended: dispatch what it allows now."""
    return dispatch.kick(model)


# The outbox (app/delivery/outbox.py) runs on the delivery queue
# (celery_config.queue_for / task_routes), consumed only by `asynch
# callback-worker`: a stalling receiver never holds a job worker.  A token
# names no row (None) or, for tests and old doorbells, one.
@celery.task(name=DELIVER_TASK, acks_late=True, ignore_result=True)
def deliver(delivery_id: int | None = None) -> str:
    return outbox.pump(delivery_id)


def _periodic(task_name: str, run_name: str, run):
    @celery.task(name=task_name, ignore_result=True)
    def periodic(fence: dict | None = None) -> dict:
        return run_periodic(run_name, fence, run)
    return periodic


run_work = _periodic("asynch.run_work", "run_work", maintenance.run_work)
recover = _periodic("asynch.recover", "recover", maintenance.recover)
cleanup = _periodic("asynch.cleanup", "cleanup", maintenance.cleanup)
autotune_models = _periodic("asynch.autotune", "autotune", autotune.autotune)
deliver_due = _periodic(DELIVER_DUE_TASK, "deliver", outbox.deliver_due)
