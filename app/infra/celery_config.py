"""Celery settings shared by the publisher (API side) and the workers: one broker, queues, options.

Two queues: the job queue (doorbells and maintenance; `asynch worker`) and the delivery queue (the
outbox; `asynch callback-worker`): a stalling receiver ties up delivery processes only.
``queue_for`` is the one routing rule; task_routes says the same to Celery (retries, beat)."""
from __future__ import annotations

from kombu import Queue

from app.config import Settings

# A model's doorbell, [model]: a worker with free call slots pulls the jobs the fair dispatcher picks (app/jobs/slots.py).
PULL_TASK = "asynch.pull"
# Messages of releases before doorbells ([[job_id, attempt], ...] and one job's): still answered, as doorbells of
# their jobs' model, so none in a broker at an upgrade is lost.
RUN_JOBS_TASK = "asynch.run_jobs"
RUN_JOB_TASK = "asynch.run_job"
# The outbox (app/delivery/outbox.py): a pump token (delivers due rows, fairest first), the sweep.
DELIVER_TASK = "asynch.deliver"
DELIVER_DUE_TASK = "asynch.deliver_due"
# Dispatch one model again when its upstream's Retry-After pause ends (app/jobs/dispatch.py).
KICK_MODEL_TASK = "asynch.kick_model"
MAX_PRIORITY = 9
DELIVERY_TASKS = frozenset({DELIVER_TASK, DELIVER_DUE_TASK})


def queue_for(task: str, s: Settings) -> str:
    return s.delivery_queue_name if task in DELIVERY_TASKS else s.queue_name


def celery_settings(s: Settings) -> dict:
    return {
        "broker_url": s.effective_broker_url,
        "broker_connection_retry_on_startup": True,
        # Redis: a message not acked within this many seconds goes to another worker (> the longest call).
        "broker_transport_options": {"visibility_timeout": s.broker_visibility_timeout, "sep": ":",
                                     "priority_steps": list(range(MAX_PRIORITY + 1)),
                                     "queue_order_strategy": "priority"},
        "task_default_queue": s.queue_name,
        "task_queues": [Queue(q, routing_key=q, queue_arguments={"x-max-priority": MAX_PRIORITY})
                        for q in (s.queue_name, s.delivery_queue_name)],
        "task_routes": {t: {"queue": s.delivery_queue_name, "routing_key": s.delivery_queue_name}
                        for t in sorted(DELIVERY_TASKS)},
        "task_queue_max_priority": MAX_PRIORITY,
        # Invariant 6: at-least-once delivery, one message in hand at a time.
        "task_acks_late": True, "task_reject_on_worker_lost": True, "worker_prefetch_multiplier": 1,
        "task_ignore_result": True, "result_backend": None,
        "task_serializer": "json", "accept_content": ["json"],
        "task_publish_retry": True,
        "task_publish_retry_policy": {"max_retries": 2, "interval_start": 0,
                                      "interval_step": 0.2, "interval_max": 0.5},
        "worker_hijack_root_logger": False, "enable_utc": True,
    }
