"""gunicorn server hooks `asynch api` runs with (``-c python:app.observe.gunicorn_conf``):
the lifecycle of the API server's Prometheus multiprocess directory.

Invariants: the master takes and empties the directory before it forks any
worker (``on_starting``), marks each exited worker dead (``child_exit``), and
removes a temporary directory when it exits (``on_exit``).  The directory
itself comes from the environment `asynch api` set before exec'ing gunicorn
(app.infra.metrics.group_env); without it the workers keep metrics in memory
and one scrape would see one worker only, so the server refuses to start.
"""
from __future__ import annotations

from app.infra import metrics


def on_starting(server) -> None:
    if metrics.prepare_group_dir() is None:
        raise RuntimeError("PROMETHEUS_MULTIPROC_DIR is not set: start the API with `asynch api`")


def child_exit(server, worker) -> None:
    metrics.process_dead(worker.pid)


def on_exit(server) -> None:
    metrics.cleanup_group_dir()
