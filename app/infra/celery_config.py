"""Celery settings shared by the publisher (API side) and the workers, so
both agree on the broker, the queue and its options."""
from __future__ import annotations

from kombu import Queue

from app.config import Settings

RUN_JOB_TASK = "asynch.run_job"
DELIVER_CALLBACK_TASK = "asynch.deliver_callback"
DELIVER_DUE_CALLBACKS_TASK = "asynch.deliver_due_callbacks"
MAX_PRIORITY = 9


def celery_settings(s: Settings) -> dict:
    return {
        "broker_url": s.effective_broker_url,
        "broker_connection_retry_on_startup": True,
        # Redis: a message not acked within this many seconds is handed to
        # another worker.  It must exceed the longest model call.
        "broker_transport_options": {
            "visibility_timeout": s.broker_visibility_timeout,
            "priority_steps": list(range(MAX_PRIORITY + 1)),
            "sep": ":",
            "queue_order_strategy": "priority",
        },
        "task_default_queue": s.queue_name,
        "task_queues": [Queue(s.queue_name, routing_key=s.queue_name,
                              queue_arguments={"x-max-priority": MAX_PRIORITY})],
        "task_queue_max_priority": MAX_PRIORITY,
        # Invariant 6: at-least-once delivery, one message in hand at a time.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_ignore_result": True,
        "result_backend": None,
        "task_serializer": "json",
        "accept_content": ["json"],
        "task_publish_retry": True,
        "task_publish_retry_policy": {"max_retries": 2, "interval_start": 0,
                                      "interval_step": 0.2, "interval_max": 0.5},
        "worker_hijack_root_logger": False,
        "enable_utc": True,
    }
