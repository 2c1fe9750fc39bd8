"""gunicorn hooks of `asynch api` (``-c python:app.observe.gunicorn_conf``):
the API server's Prometheus multiprocess directory.  The master empties it
before forking (``on_starting``), marks each exited worker dead, and removes
a temporary one on exit.  Without the directory `asynch api` sets, one scrape
would see one worker only, so the server refuses to start.
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
