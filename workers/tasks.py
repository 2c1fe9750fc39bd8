"""Thin Celery tasks: take ids, call the service layer, nothing else."""
from __future__ import annotations

from app.celery_config import RUN_JOB_TASK
from app.errors import Unavailable
from app.services import execution, maintenance
from workers.celery_app import celery


@celery.task(bind=True, name=RUN_JOB_TASK, acks_late=True, reject_on_worker_lost=True, ignore_result=True,
             max_retries=None)
def run_job(self, job_id: str, attempt: int) -> str:
    try:
        return execution.run_attempt(job_id, attempt)
    except Unavailable as exc:
        # The database is away: ring the doorbell again shortly rather than
        # leave the job to the stale-pending sweep.
        raise self.retry(exc=exc, countdown=2)


@celery.task(name="asynch.retry_due", ignore_result=True)
def retry_due() -> dict:
    return maintenance.retry_due().as_dict()


@celery.task(name="asynch.recover", ignore_result=True)
def recover() -> dict:
    return maintenance.recover().as_dict()
