"""The Celery application workers and beat run (``celery -A workers.celery_app``)."""
from __future__ import annotations

import logging
import multiprocessing

from celery import Celery
from celery.signals import (task_postrun, task_prerun, worker_init, worker_process_init, worker_process_shutdown,
                            worker_shutdown, worker_shutting_down)

from app.config import get_settings
from app.infra import metrics, metrics_server, tracing
from app.infra.celery_config import celery_settings
from app.infra.logs import bind, configure_logging, quiet_routine_tasks, reset
from workers.heartbeat import ConsumingHeartbeat

configure_logging(get_settings().log_level)

celery = Celery("asynch")
celery.conf.update(celery_settings(get_settings()))
celery.conf.beat_schedule = __import__("beat_schedule").build_schedule(get_settings())
# The scheduled passes' "received" and "succeeded" lines at DEBUG (a pass that did something logs one
# INFO line of its own): at INFO they were ~150 lines a minute.
quiet_routine_tasks({entry["task"] for entry in celery.conf.beat_schedule.values()})
# Only the beat holding the Redis lock sends (workers/beat.py).
celery.conf.beat_scheduler = "workers.beat:LeaderScheduler"
celery.conf.imports = ("workers.tasks",)
celery.steps["consumer"].add(ConsumingHeartbeat)


# Set by the main process when the node begins to stop, read by its pool processes (forked after this, they share
# it): a doorbell's task holding its process while every call slot is taken lets go then (app/jobs/slots.py).
_SHUTTING_DOWN = multiprocessing.RawValue("b", 0)


def shutting_down() -> bool:
    return bool(_SHUTTING_DOWN.value)


@worker_shutting_down.connect
def _node_stopping(**_kw):
    _SHUTTING_DOWN.value = 1


@worker_process_init.connect
def _fresh_connections(**_kw):
    # A forked pool process must not reuse the parent's sockets.
    from app.infra.db import reset_engine
    from app.infra.redis.client import reset_redis

    reset_engine()
    reset_redis()
    metrics_server.forget_inherited_server()
    logging.getLogger(__name__).debug("pool process initialised")


_log_tokens: dict = {}


@task_prerun.connect
def _bind_job(task_id=None, args=None, **_kw):
    # Everything logged while a run_jobs message of one job runs carries its job_id (a larger group's
    # lines carry each job's own: app/jobs/execution.py logs with its context).
    first = args[0] if args else None
    if isinstance(first, list) and len(first) == 1 and isinstance(first[0], list):
        first = first[0][0]
    job_id = first if isinstance(first, str) and first.startswith("job_") else None
    _log_tokens[task_id] = bind(job_id=job_id)


@task_postrun.connect
def _unbind_job(task_id=None, **_kw):
    if (token := _log_tokens.pop(task_id, None)) is not None:
        reset(token)


# --- the node's metrics (app/infra/metrics.py, served by app/infra/metrics_server.py) ---
# worker_init and worker_shutdown fire in the main process only, before the
# pool forks and after it is gone; worker_process_shutdown in each pool child.

@worker_init.connect
def _trace_service(**_kw):
    # Its spans' service.name unless OTEL_SERVICE_NAME says otherwise; set when a worker starts (its pool
    # processes inherit it), not when this module is imported: an API process that imports the task
    # names must keep its own.
    tracing.service_name = "model-asynch-worker"


@worker_init.connect
def _delivery_pool(sender=None, **_kw):
    # The claim leaves one of this node's processes free of any one tenant (app/delivery/outbox.py).
    from app.delivery import outbox

    outbox.set_pool_processes(getattr(sender, "concurrency", None))


@worker_init.connect
def _node_metrics(**_kw):
    port = get_settings().worker_metrics_port
    if metrics.prepare_group_dir() is None:
        # Pool processes would count in their own memory, out of reach of
        # the main process: serving its numbers alone would mislead.
        if port:
            logging.getLogger(__name__).warning(
                "worker metrics not served: no PROMETHEUS_MULTIPROC_DIR (start workers with `asynch worker`)")
        return
    metrics_server.serve_node(port)


@worker_process_shutdown.connect
def _pool_process_gone(pid=None, **_kw):
    # The calls in flight end and are written before the process goes (each bounded by its deadline).
    from app.jobs import slots

    slots.drain()
    tracing.flush()  # its last spans out before it goes
    metrics.process_dead(pid)


@worker_shutdown.connect
def _node_metrics_gone(**_kw):
    metrics.cleanup_group_dir()
