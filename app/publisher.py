"""Sends run_job (and other) messages by task name.  app/ never imports workers/: the API
only needs a producer, not the task code.  A message is a doorbell; the row
is the truth, so a lost message is repaired by recovery, not by the caller."""
from __future__ import annotations

import logging
import os
import threading

from celery import Celery

from app.celery_config import RUN_JOB_TASK, celery_settings
from app.config import get_settings

log = logging.getLogger(__name__)
_lock = threading.Lock()
_app: Celery | None = None
_pid: int | None = None


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


def publish_run_job(job_id: str, attempt: int, priority: int | None = None) -> bool:
    """Publish; False (logged) if the broker refused.  Never raises: the job
    is already committed and recovery re-publishes pending jobs."""
    try:
        kw = {"priority": priority} if priority is not None else {}
        producer_app().send_task(RUN_JOB_TASK, args=[job_id, attempt],
                                 queue=get_settings().queue_name, **kw)
        return True
    except Exception:
        log.exception("publish failed; recovery will re-publish", extra={"job_id": job_id})
        return False


def publish_task(name: str, args: list) -> bool:
    """Publish any task by name; False (logged) if the broker refused.  For
    work whose durable record is a row that a sweep re-publishes."""
    try:
        producer_app().send_task(name, args=args, queue=get_settings().queue_name)
        return True
    except Exception:
        log.exception("publish of %s failed; the sweep will re-publish", name)
        return False
