"""Commands that run the system's processes: the API, workers, beat, the
all-in-one dev stack, and the database migration."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import click

from app.cli.base import ROOT, upgrade_db
from app.config import env_names, get_settings, load_settings, set_settings
from app.secrets_policy import check_startup, masked

# --- database ------------------------------------------------------------------

@click.group(help="Database schema (Alembic).")
def db() -> None:
    pass


@db.command("upgrade", help="Apply every migration (alembic upgrade head).")
def db_upgrade() -> None:
    upgrade_db()
    click.echo("database at head")




# --- processes ----------------------------------------------------------------------

WORKER_CLASSES = ("gevent", "gthread")


@click.command(help="Run the API under gunicorn (gevent: long-polls park no thread).")
@click.option("--bind", default="0.0.0.0:8000")
@click.option("--workers", default=2, type=int)
@click.option("--worker-class", type=click.Choice(WORKER_CLASSES), default="gevent", show_default=True,
              help="gevent serves every request, long-polls included, on greenlets; gthread is the old "
                   "thread-per-request server (a long-poll holds a thread).")
@click.option("--worker-connections", type=int, default=None,
              help="Connections one worker process holds at once (waits included).  "
                   "Default: ASYNCH_WAITERS_MAX + 1000.")
@click.option("--threads", default=16, type=int, help="Threads per process (gthread only).")
def api(bind: str, workers: int, worker_class: str, worker_connections: int | None, threads: int) -> None:
    _refuse_insecure()
    # One Prometheus multiprocess directory per API server, set before
    # gunicorn (and so prometheus_client) starts; the hooks manage it.
    os.environ.update(metrics_group_env())
    os.execvp(sys.executable, api_argv(bind, workers, threads, worker_class, worker_connections))


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
    # No gunicorn access log: app/web/request_log.py already writes one JSON
    # line per request (with model, job and tenant), and the duplicate line
    # cost ~16% of an API process's CPU under load (bench/bench_waiters.py
    # profile).  GUNICORN_CMD_ARGS="--access-logfile -" brings it back.
    if worker_class == "gthread":
        argv += ["--threads", str(threads)]
    return argv + ["app.wsgi:app"]


def metrics_group_env() -> dict[str, str]:
    """PROMETHEUS_MULTIPROC_DIR for a process group (API server, worker node)
    about to be started: ASYNCH_METRICS_DIR or a fresh temporary directory."""
    from app.infra.metrics import group_env

    return group_env()


@click.command(help="Run a Celery worker for jobs (run_job and maintenance); callbacks have their own.")
@click.option("--concurrency", "-c", default=2, type=int)
@click.option("--queues", "-Q", default=None, help="Queues to consume (default: the job queue, ASYNCH_QUEUE_NAME).")
def worker(concurrency: int, queues: str | None) -> None:
    _refuse_insecure()
    # The node's pool processes write their metrics where its main process
    # (serving ASYNCH_WORKER_METRICS_PORT) reads them.
    os.environ.update(metrics_group_env())
    os.execvp(sys.executable, worker_argv(concurrency, queues))


def worker_argv(concurrency: int = 2, queues: str | None = None, node: str | None = None) -> list[str]:
    argv = [sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker", "--loglevel", "INFO",
            "-c", str(concurrency), "-Q", queues or get_settings().queue_name, "--without-gossip",
            "--without-mingle"]
    return argv + (["-n", node] if node else [])


def _refuse_insecure() -> None:
    """Outside dev mode a server does not start with weak secrets (app/secrets_policy.py check_startup)."""
    try:
        check_startup(get_settings())
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


@click.command("callback-worker", help="Run a Celery worker that delivers callbacks only "
               "(ASYNCH_CALLBACK_QUEUE_NAME): a slow receiver ties up these processes, never the job workers.")
@click.option("--concurrency", "-c", default=2, type=int)
def callback_worker(concurrency: int) -> None:
    _refuse_insecure()
    os.environ.update(metrics_group_env())  # its own metrics group, like any worker node
    os.execvp(sys.executable, callback_worker_argv(concurrency))


def callback_worker_argv(concurrency: int = 2) -> list[str]:
    # Its own node name: a job worker on the same host keeps celery@%h.
    return worker_argv(concurrency, get_settings().callback_queue_name, node="callbacks@%h")


def beat_argv(schedule_file: str = "celerybeat-schedule") -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "workers.celery_app", "beat", "--loglevel", "INFO",
            "-s", schedule_file, "-S", "workers.beat:LeaderScheduler"]


@click.command(help="Run Celery beat.  Several may run: one leads (Redis lock), the others stand by.")
def beat() -> None:
    _refuse_insecure()
    os.execvp(sys.executable, beat_argv())


@click.command(help="All in one: migrate, a demo echo model, an admin key, the API (gunicorn gevent, as "
               "`asynch api` serves it), a job worker, a callback worker and beat.")
@click.option("--port", default=8000, type=int)
@click.option("--model-port", default=8765, type=int)
def dev(port: int, model_port: int) -> None:
    from app.catalog import registry
    from app.catalog.schemas import ModelInput, ModelPatch
    from app.cli.demo_model import DemoModelServer
    from app.errors import Conflict
    from app.tenancy import keys as key_svc

    os.chdir(ROOT)
    # A local trial: every child runs in dev mode (weak secrets accepted, a derived secrets key).
    os.environ["ASYNCH_DEV_MODE"] = "1"
    set_settings(load_settings())
    upgrade_db()
    demo = DemoModelServer(port=model_port).start()
    try:
        registry.create_model(ModelInput(
            model_name="demo-echo", base_url=demo.url, route="/echo", http_method="POST", queue_limit=100,
            max_concurrency=4, timeout_seconds=30, expected_seconds=1, retry_times=2,
            form=[{"field": "prompt", "label": "Prompt", "type": "string", "required": True}],
            remark="echoes its payload back (asynch dev)"))
    except Conflict:
        registry.update_model("demo-echo", ModelPatch(base_url=demo.url, enabled=True))
    key, _ = key_svc.create_key("demo", "admin", "asynch dev")

    (ROOT / "data").mkdir(exist_ok=True)
    # Each worker node is its own metrics group; the callback node serves on the next port.
    callback_port = str(get_settings().worker_metrics_port + 1 if get_settings().worker_metrics_port else 0)
    base = f"http://127.0.0.1:{port}"
    # The API is the production serving path (gunicorn, gevent worker), one
    # process: every route behaves here as it does behind `asynch api`.
    # Each child leads its own process group, so a stop can reach its
    # workers/pool processes too; the terminal's Ctrl-C reaches only us, and
    # we stop them in order.
    api_proc = subprocess.Popen(api_argv(f"127.0.0.1:{port}", workers=1), env={**os.environ, **metrics_group_env()},
                                process_group=0)
    children = [api_proc,
                subprocess.Popen(worker_argv(2), env={**os.environ, **metrics_group_env()}, process_group=0),
                subprocess.Popen(callback_worker_argv(1), env={**os.environ, **metrics_group_env(),
                                                               "ASYNCH_WORKER_METRICS_PORT": callback_port},
                                 process_group=0),
                subprocess.Popen(beat_argv(str(ROOT / "data" / "celerybeat-schedule")), process_group=0)]

    def _stop(*_a):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    code = 0
    try:
        if not _wait_healthy(base, api_proc, timeout=60):
            click.echo("the API did not come up; stopping", err=True)
            code = 1
            return
        click.echo(f"""
model-asynch dev is up: API {base}, demo model {demo.url}, {len(children) - 1} helper processes.
Admin key (tenant "demo"): {key}
Console: {base}/console (log in with the key)   Metrics: {base}/metrics, {base}/metrics/cluster
OpenAPI: {base}/openapi.json

Submit a job, then wait for it and read its result:
  curl -s -X POST {base}/v1/models/demo-echo/jobs -H 'Authorization: Bearer {key}' \\
       -H 'Content-Type: application/json' -d '{{"prompt": "hello"}}'
  curl -s '{base}/v1/models/demo-echo/jobs/<job_id>/wait?timeout=5000' -H 'Authorization: Bearer {key}'
  curl -s {base}/v1/models/demo-echo/jobs/<job_id>/result -H 'Authorization: Bearer {key}'
Ctrl-C stops everything.
""", err=True)
        while True:
            dead = [c for c in children if c.poll() is not None]
            if dead:
                click.echo(f"a dev process exited ({' '.join(dead[0].args[:4])} ...: {dead[0].returncode}); "
                           "stopping", err=True)
                code = 1
                return
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop at a time
        for c in children:
            if c.poll() is None:
                c.terminate()
        deadline = time.time() + 15
        for c in children:
            try:
                c.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass  # a worker still finishing a model call: killed below
        for c in children:
            # Whatever is left of its group (a pool process mid-call, a
            # process that ignored SIGTERM) goes now.
            try:
                os.killpg(c.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            c.wait()
        demo.stop()
        if code:
            sys.exit(code)


def _wait_healthy(base: str, proc: subprocess.Popen, timeout: float) -> bool:
    import urllib.request

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=2) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


@click.command("env", help="List every ASYNCH_ environment variable and its current value (secrets, and the "
               "passwords inside URLs, as ***).")
def env_cmd() -> None:
    # Secrets show as ***, URLs without their password: the output gets pasted into tickets.
    s = get_settings()
    for name, var in env_names().items():
        click.echo(f"{var}={masked(name, getattr(s, name))}")


