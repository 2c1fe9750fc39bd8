"""The Celery application workers and beat run (``celery -A workers.celery_app``)."""
from __future__ import annotations

import logging

from celery import Celery
from celery.signals import worker_process_init

from app.celery_config import celery_settings
from app.config import get_settings
from app.logging_setup import configure_logging
from workers.heartbeat import install as install_heartbeat

configure_logging(get_settings().log_level)

celery = Celery("asynch")
celery.conf.update(celery_settings(get_settings()))
celery.conf.beat_schedule = __import__("beat_schedule").build_schedule(get_settings())
celery.conf.imports = ("workers.tasks",)
app = celery
install_heartbeat(celery)


@worker_process_init.connect
def _fresh_connections(**_kw):
    # A forked pool process must not reuse the parent's sockets.
    from app.db import reset_engine
    from app.redis_scripts import reset_redis

    reset_engine()
    reset_redis()
    logging.getLogger(__name__).debug("pool process initialised")
