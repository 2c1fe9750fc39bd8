"""Commands that run the system's processes: the API, workers, beat and the
database migration (the all-in-one dev stack: app/cli/devstack.py)."""
from __future__ import annotations

import os
import sys

import click

from app.cli import upgrade_db
from app.config import env_names, get_settings, removed_settings
from app.secret_settings import check_startup, masked

db = click.Group("db", help="Database schema (Alembic).")


@db.command("upgrade", help="Apply every migration (alembic upgrade head).")
def db_upgrade() -> None:
    upgrade_db()
    click.echo("database at head")


WORKER_CLASSES = ("gevent", "gthread")


@click.command(help="Run the API under gunicorn (gevent: long-polls park no thread).")
@click.option("--bind", default="0.0.0.0:8000", show_default=True,
              help="host:port (or fd://N, unix:PATH) gunicorn listens on.")
@click.option("--workers", default=2, type=int, show_default=True, help="API processes.")
@click.option("--worker-class", type=click.Choice(WORKER_CLASSES), default="gevent", show_default=True,
              help="gevent serves every request, long-polls included, on greenlets; gthread is the old "
                   "thread-per-request server (a long-poll holds a thread).")
@click.option("--worker-connections", type=int, default=None,
              help="Connections one worker process holds at once (waits included).  "
                   "Default: ASYNCH_WAITERS_MAX + 1000.")
@click.option("--threads", default=16, type=int, help="Threads per process (gthread only).")
def api(bind: str, workers: int, worker_class: str, worker_connections: int | None, threads: int) -> None:
    _exec(api_argv(bind, workers, threads, worker_class, worker_connections))


def _exec(argv: list[str], metrics: bool = True) -> None:
    """Become the server ``argv`` starts.  Outside dev mode a server does not
    start with weak secrets (app/secret_settings.py check_startup).  A server
    (API, worker node) gets its own Prometheus multiprocess directory, set
    before prometheus_client starts: a worker's pool processes write their
    metrics where its main process (ASYNCH_WORKER_METRICS_PORT) reads them."""
    try:
        check_startup(get_settings())
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    for note in removed_settings():
        click.echo(f"warning: {note}", err=True)
    if metrics:
        from app.infra.metrics import group_env

        os.environ.update(group_env())
    os.execvp(sys.executable, argv)


# Connections a worker accepts beyond ASYNCH_WAITERS_MAX waits: a process
# full of waiters must still take other tenants' submits and polls.
CONNECTIONS_BEYOND_WAITERS = 1000


def api_argv(bind: str = "0.0.0.0:8000", workers: int = 2, threads: int = 16, worker_class: str = "gevent",
             worker_connections: int | None = None) -> list[str]:
    if worker_class not in WORKER_CLASSES:
        raise ValueError(f"worker class must be one of {WORKER_CLASSES}, got {worker_class!r}")
    if worker_connections is None:
        worker_connections = get_settings().waiters_max + CONNECTIONS_BEYOND_WAITERS
    # The gevent configuration monkey-patches before anything else is imported
    # (app/web/gunicorn_gevent.py); both take their hooks from app/web/gunicorn_conf.py.
    conf = "app.web.gunicorn_gevent" if worker_class == "gevent" else "app.web.gunicorn_conf"
    argv = [sys.executable, "-m", "gunicorn", "--config", f"python:{conf}", "--bind", bind,
            "--workers", str(workers), "--worker-class", worker_class,
            "--worker-connections", str(worker_connections)]
    # No gunicorn access log: app/web/application.py already writes one JSON
    # line per request (with model, job and tenant), and the duplicate line
    # cost ~16% of an API process's CPU under load (bench/bench_waiters.py
    # profile).  GUNICORN_CMD_ARGS="--access-logfile -" brings it back.
    if worker_class == "gthread":
        argv += ["--threads", str(threads)]
    return argv + ["app.wsgi:app"]


_CONCURRENCY = click.option("--concurrency", "-c", default=2, type=int, show_default=True,
                            help="Pool processes: jobs (or deliveries) this node runs at once.")


@click.command(help="Run a Celery worker for jobs (run_job and maintenance); callbacks have their own.")
@_CONCURRENCY
@click.option("--queues", "-Q", default=None, help="Queues to consume (default: the job queue, ASYNCH_QUEUE_NAME).")
@click.option("--name", "-n", default=None, help="The node's name, NAME@HOST (%h: this host's name; NAME alone: "
              "NAME@this host) [default: celery@%h].  Two nodes on one host need two names (and two "
              "ASYNCH_WORKER_METRICS_PORTs): liveness is kept per name, so a dead node hidden behind a live one of "
              "its name is noticed only when its jobs' leases run out.")
def worker(concurrency: int, queues: str | None, name: str | None) -> None:
    _exec(worker_argv(concurrency, queues, node=name))


def worker_argv(concurrency: int = 2, queues: str | None = None, node: str | None = None) -> list[str]:
    argv = [sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker", "--loglevel", "INFO",
            "-c", str(concurrency), "-Q", queues or get_settings().queue_name, "--without-gossip",
            "--without-mingle"]
    return argv + (["-n", node] if node else [])


# Delivery processes mostly wait on receivers' sockets.  Four by default: the claim leaves one of a
# node's processes free of any one tenant (app/delivery/outbox.py ``tenant_cap``), so one tenant's
# stalled receivers hold at most 3 (ASYNCH_DELIVERY_TENANT_INFLIGHT's default) and another tenant's
# delivery finds a free process at once.
CALLBACK_PROCESSES = 4


@click.command("callback-worker", help="Run a Celery worker that delivers callbacks only "
               "(ASYNCH_CALLBACK_QUEUE_NAME): a slow receiver ties up these processes, never the job workers.")
@click.option("--concurrency", "-c", default=CALLBACK_PROCESSES, type=int, show_default=True,
              help="Pool processes: deliveries this node sends at once.  A tenant holds at most this - 1 of them.")
def callback_worker(concurrency: int) -> None:
    _exec(callback_worker_argv(concurrency))


def callback_worker_argv(concurrency: int = CALLBACK_PROCESSES) -> list[str]:
    # Its own node name: a job worker on the same host keeps celery@%h.
    return worker_argv(concurrency, get_settings().delivery_queue_name, node="callbacks@%h")


def beat_argv(schedule_file: str = "celerybeat-schedule") -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "workers.celery_app", "beat", "--loglevel", "INFO",
            "-s", schedule_file, "-S", "workers.beat:LeaderScheduler"]


@click.command(help="Run Celery beat.  Several may run: one leads (Redis lock), the others stand by.")
def beat() -> None:
    _exec(beat_argv(), metrics=False)


@click.command("env", help="List every ASYNCH_ environment variable and its current value (secrets, and the "
               "passwords inside URLs, as ***).")
def env_cmd() -> None:
    # Secrets show as ***, URLs without their password: the output gets pasted into tickets.
    s = get_settings()
    for name, var in env_names().items():
        click.echo(f"{var}={masked(name, getattr(s, name))}")
