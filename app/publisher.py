"""Sends run_job messages by task name.  app/ never imports workers/: the API
only needs a producer, not the task code.  A message is a doorbell; the row
is the truth, so a lost message is repaired by recovery, not by the caller.

Priorities are semantic (``Priority``) and mapped per transport, because the
two brokers disagree on direction: kombu's Redis transport keeps one list
per priority step and BRPOPs them in ascending order, so 0 is served first
(kombu/transport/redis.py ``_brpop_start`` / ``_q_for_pri``), while RabbitMQ
(``x-max-priority``) serves the HIGHEST number first.
"""
from __future__ import annotations

import enum
import logging
import os
import threading
from urllib.parse import urlparse

from celery import Celery

from app.celery_config import MAX_PRIORITY, RUN_JOB_TASK, celery_settings
from app.config import get_settings

log = logging.getLogger(__name__)
_lock = threading.Lock()
_app: Celery | None = None
_pid: int | None = None


class Priority(enum.Enum):
    HIGH = "high"      # retries jumping the queue, maintenance tasks
    NORMAL = "normal"  # submissions, retries waiting at the tail


_AMQP_SCHEMES = {"amqp", "amqps", "pyamqp", "librabbitmq"}
# (HIGH, NORMAL) on each scale; NORMAL leaves room below and above it.
_AMQP = {Priority.HIGH: MAX_PRIORITY, Priority.NORMAL: MAX_PRIORITY // 2}
_KOMBU_VIRTUAL = {Priority.HIGH: 0, Priority.NORMAL: (MAX_PRIORITY + 1) // 2}


def broker_priority(priority: Priority, broker_url: str | None = None) -> int:
    """The number the configured broker needs for ``priority``."""
    url = broker_url if broker_url is not None else get_settings().effective_broker_url
    scheme = urlparse(url).scheme.split("+")[0].lower()
    table = _AMQP if scheme in _AMQP_SCHEMES else _KOMBU_VIRTUAL
    return table[priority]


def producer_app() -> Celery:
    global _app, _pid
    if _app is None or _pid != os.getpid():
        with _lock:
            if _app is None or _pid != os.getpid():
                app = Celery("asynch-producer", set_as_current=False)
                app.conf.update(celery_settings(get_settings()))
                _app, _pid = app, os.getpid()
    return _app


def reset_producer() -> None:
    global _app, _pid
    with _lock:
        _app, _pid = None, None


def publish_run_job(job_id: str, attempt: int, priority: Priority = Priority.NORMAL) -> bool:
    """Publish; False (logged) if the broker refused.  Never raises: the job
    is already committed and recovery re-publishes pending jobs."""
    try:
        producer_app().send_task(RUN_JOB_TASK, args=[job_id, attempt], queue=get_settings().queue_name,
                                 priority=broker_priority(priority))
        return True
    except Exception:
        log.exception("publish failed; recovery will re-publish", extra={"job_id": job_id})
        return False
