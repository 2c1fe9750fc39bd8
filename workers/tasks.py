"""Thin Celery tasks: take ids, call the service layer, nothing else.

Periodic tasks take the ``fence`` their beat stamped them with
(app/maintenance/periodic.py); called without one they simply run."""
from __future__ import annotations

from app.batches import progress as batch_progress
from app.delivery import outbox
from app.infra.celery_config import (DELIVER_DUE_TASK, DELIVER_TASK, KICK_MODEL_TASK, PULL_TASK, RUN_JOB_TASK,
                                     RUN_JOBS_TASK)
from app.jobs import dispatch, execution, slots
from app.maintenance import autotune, passes as maintenance, verify
from app.maintenance.periodic import run_periodic
from workers import heartbeat
from workers.celery_app import celery, shutting_down


# A doorbell: acked late, so a process holding one (every slot taken) counts against its node's prefetch and
# the node takes no more than it can answer; a duplicate (a redelivery) is a pull that finds nothing.
@celery.task(name=PULL_TASK, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def pull(model: str) -> int:
    """A model's doorbell: this process's free call slots pull its jobs (app/jobs/slots.py)."""
    return slots.get().answer_bell(model, heartbeat.identity(pull.request.hostname), shutting_down)


@celery.task(name=RUN_JOBS_TASK, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_jobs(jobs: list) -> int:
    """A release before doorbells published its jobs, [[job_id, attempt], ...]: answered as their model's
    doorbell (the jobs are in their queues again since the upgrade's rebuild: keys.LAYOUT)."""
    return sum(slots.get().answer_bell(m, heartbeat.identity(run_jobs.request.hostname), shutting_down)
               for m in execution.models_of([j for j, _a in jobs]))


@celery.task(name=RUN_JOB_TASK, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_job(job_id: str, attempt: int = -1) -> int:
    """One job's message from a release before run_jobs: as ``run_jobs``."""
    return sum(slots.get().answer_bell(m, heartbeat.identity(run_job.request.hostname), shutting_down)
               for m in execution.models_of([job_id]))


@celery.task(name=KICK_MODEL_TASK, ignore_result=True)
def kick_model(model: str) -> None:
    """A model's Retry-After pause ended: dispatch what it allows now."""
    dispatch.kick(model)


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
batches = _periodic("asynch.batches", "batches", batch_progress.advance_all)
verify_ledger = _periodic("asynch.verify", "verify", verify.run_sampled)
