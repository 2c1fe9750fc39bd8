"""Thin Celery tasks: take ids, call the service layer, nothing else.

Periodic tasks take the ``fence`` their beat stamped them with
(app/services/periodic.py); called without one they simply run."""
from __future__ import annotations

from app.celery_config import RUN_JOB_TASK
from app.errors import Unavailable
from app.services import autotune, execution, maintenance
from app.services.periodic import run_periodic
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


@celery.task(name="asynch.run_work", ignore_result=True)
def run_work(fence: dict | None = None) -> dict:
    return run_periodic("run_work", fence, maintenance.run_work)


@celery.task(name="asynch.recover", ignore_result=True)
def recover(fence: dict | None = None) -> dict:
    return run_periodic("recover", fence, maintenance.recover)


@celery.task(name="asynch.cleanup", ignore_result=True)
def cleanup(fence: dict | None = None) -> dict:
    return run_periodic("cleanup", fence, maintenance.cleanup)


@celery.task(name="asynch.autotune", ignore_result=True)
def autotune_models(fence: dict | None = None) -> dict:
    return run_periodic("autotune", fence, autotune.autotune)
