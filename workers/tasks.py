"""Thin Celery tasks: take ids, call the service layer, nothing else."""
from __future__ import annotations

from app.celery_config import DELIVER_CALLBACK_TASK, DELIVER_DUE_CALLBACKS_TASK, RUN_JOB_TASK
from app.services import callbacks, concurrency, execution, maintenance
from workers.celery_app import celery


# max_retries=None: waiting for a permit (or a callback's next try) is not
# bounded by Celery's retry count; the job's budget and the callback's
# max attempts bound it.
@celery.task(name=RUN_JOB_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True,
             max_retries=None)
def run_job(self, job_id: str, attempt: int) -> str:
    out = execution.run_attempt(job_id, attempt, chain_token=self.request.id)
    if out == "no_permit":
        # Not an attempt: come back later instead of holding this process.
        raise self.retry(countdown=concurrency.retry_countdown())
    return out


@celery.task(name="asynch.retry_due", ignore_result=True)
def retry_due() -> dict:
    return maintenance.retry_due().as_dict()


@celery.task(name="asynch.recover", ignore_result=True)
def recover() -> dict:
    return maintenance.recover().as_dict()


@celery.task(name=DELIVER_CALLBACK_TASK, bind=True, acks_late=True, ignore_result=True, max_retries=None)
def deliver_callback(self, callback_id: int) -> str:
    out = callbacks.deliver(callback_id)
    if out.status == "retry":
        raise self.retry(countdown=out.retry_in)
    return out.status


@celery.task(name=DELIVER_DUE_CALLBACKS_TASK, ignore_result=True)
def deliver_due_callbacks() -> dict:
    return callbacks.deliver_due_callbacks()
