"""gunicorn configuration `asynch api` runs with: ``-c python:app.web.gunicorn_conf``
(gthread) or ``-c python:app.web.gunicorn_gevent`` (gevent, the default,
which patches first and then takes every hook from here).

Invariants:
- The master empties the API server's Prometheus multiprocess directory
  before forking, marks each exited worker dead, and removes a temporary one
  on exit.  Without the directory `asynch api` sets, one scrape would see one
  worker only, so the server refuses to start.
- The master raises RLIMIT_NOFILE before it forks (workers inherit it):
  every connection a worker holds (a long-poll too) is a descriptor.
- A stopping worker drains its long-polls (hub.drain): they answer at once
  with the state they have, so SIGTERM is not held up by minutes of budget.
"""
from __future__ import annotations

import signal
import threading

from app.config import get_settings
from app.infra import metrics, serving
from app.infra.wakeups import hub

# Descriptors a worker needs besides its client connections: database and
# Redis pools, the listener, log and metrics files.
SPARE_DESCRIPTORS = 1024


def on_starting(server) -> None:
    if metrics.prepare_group_dir() is None:
        raise RuntimeError("PROMETHEUS_MULTIPROC_DIR is not set: start the API with `asynch api`")
    serving.raise_nofile(server.cfg.worker_connections + SPARE_DESCRIPTORS)


def child_exit(server, worker) -> None:
    metrics.process_dead(worker.pid)


def on_exit(server) -> None:
    metrics.cleanup_group_dir()


def post_worker_init(worker) -> None:
    serving.make_green()  # psycopg2 yields to the hub (no-op outside gevent)
    serving.tune_gc()
    stop = worker.handle_exit

    def handle_exit(sig, frame) -> None:
        stop(sig, frame)
        # From a signal handler: hand the drain to a greenlet / thread of its own.
        if serving.is_green():
            import gevent

            gevent.spawn(hub.drain)
        else:
            threading.Thread(target=hub.drain, name="asynch-drain", daemon=True).start()

    worker.handle_exit = handle_exit
    signal.signal(signal.SIGTERM, handle_exit)  # the worker installed the unwrapped one already
    signal.siginterrupt(signal.SIGTERM, False)
    if not (serving.is_green() and get_settings().wait_parking):
        return
    # Parked waits (app/infra/parking.py): the middleware keeps a parked request's
    # socket; the worker writes nothing and closes only its own descriptor
    # (StopIteration ends gunicorn's keep-alive loop at once); every parked wait is
    # answered before the worker exits (a graceful stop waits only for request
    # greenlets, which parked waits no longer have).
    from gunicorn import SERVER

    from app.infra import parking

    worker.wsgi = parking.ParkingMiddleware(worker.wsgi, server=SERVER)
    handled = worker.is_already_handled

    def is_already_handled(respiter) -> bool:
        if respiter is parking.PARKED:
            raise StopIteration()
        return handled(respiter)

    worker.is_already_handled = is_already_handled
    run = worker.run

    def run_then_answer_parked() -> None:
        try:
            run()
        finally:
            hub.drain()
            parking.drain()

    worker.run = run_then_answer_parked

