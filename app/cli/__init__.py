"""The ``asynch`` command: run the pieces, manage keys, migrate, maintain."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click

from app.config import env_names, get_settings

ROOT = Path(__file__).resolve().parents[2]


def alembic_config():
    from alembic.config import Config

    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "alembic"))
    cfg.attributes["configure_logging"] = False
    return cfg


def upgrade_db() -> None:
    from alembic import command

    command.upgrade(alembic_config(), "head")


@click.group(help="model-asynch: asynchronous model-inference job middleware.")
def main() -> None:
    pass


# --- database ------------------------------------------------------------------

@main.group(help="Database schema (Alembic).")
def db() -> None:
    pass


@db.command("upgrade", help="Apply every migration (alembic upgrade head).")
def db_upgrade() -> None:
    upgrade_db()
    click.echo("database at head")


# --- keys ------------------------------------------------------------------------

@main.group(help="API keys.")
def keys() -> None:
    pass


@keys.command("create", help="Create a key and print it once; only its hash is stored.")
@click.option("--tenant", required=True, help="Tenant the key acts for.")
@click.option("--admin", is_flag=True, help="An admin key (models, keys, maintenance).")
@click.option("--name", default="", help="A label for the key.")
def keys_create(tenant: str, admin: bool, name: str) -> None:
    from app.infra.db import transaction
    from app.errors import DomainError
    from app.tenancy import keys as svc

    try:
        with transaction() as conn:
            key, view = svc.create_key(conn, tenant, "admin" if admin else "user", name)
    except DomainError as exc:
        raise click.ClickException(f"{exc.message}: {json.dumps(exc.extra)}")
    click.echo(key)
    click.echo(f"# id={view['id']} tenant={view['tenant']} role={view['role']} (shown once)", err=True)


@keys.command("list", help="List keys (never the secrets).")
@click.option("--tenant", default=None)
def keys_list(tenant: str | None) -> None:
    from app.infra.db import transaction
    from app.tenancy import keys as svc

    with transaction() as conn:
        for k in svc.list_keys(conn, tenant):
            click.echo(json.dumps(k))


@keys.command("revoke", help="Revoke a key by id.")
@click.argument("key_id", type=int)
def keys_revoke(key_id: int) -> None:
    from app.infra.db import transaction
    from app.errors import DomainError
    from app.tenancy import keys as svc

    try:
        with transaction() as conn:
            click.echo(json.dumps(svc.revoke_key(conn, key_id)))
    except DomainError as exc:
        raise click.ClickException(exc.message)


# --- models ------------------------------------------------------------------------

@main.group(help="Model configurations: JSON import/export, enable/disable.")
def models() -> None:
    pass


def _fail(exc) -> click.ClickException:
    errors = getattr(exc, "errors", None)
    return click.ClickException(exc.message + ("\n" + json.dumps(errors, indent=2) if errors else ""))


@models.command("export", help="Write models as a JSON list (head_msg left out unless --with-secrets).")
@click.argument("names", nargs=-1)
@click.option("--out", "-o", type=click.Path(dir_okay=False, writable=True), default="-",
              help="File to write (default: stdout).")
@click.option("--with-secrets", is_flag=True, help="Include head_msg (header values are secrets).")
def models_export(names: tuple[str, ...], out: str, with_secrets: bool) -> None:
    from app.infra.db import transaction
    from app.catalog.transfer import export_models

    with transaction() as conn:
        data = export_models(conn, list(names) or None, with_secrets)
    with click.open_file(out, "w") as f:
        f.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    click.echo(f"# {len(data)} models exported", err=True)


@models.command("import", help="Create or update models from a JSON file; all or nothing.")
@click.argument("file", type=click.File("r"))
def models_import(file) -> None:
    from app.infra.db import transaction
    from app.errors import DomainError
    from app.catalog.transfer import import_models

    try:
        data = json.load(file)
    except ValueError as exc:
        raise click.ClickException(f"{file.name}: invalid JSON: {exc}")
    try:
        with transaction() as conn:
            click.echo(json.dumps(import_models(conn, data)))
    except DomainError as exc:
        raise _fail(exc)


def _set_enabled(name: str, enabled: bool) -> None:
    from app.infra.db import transaction
    from app.errors import DomainError
    from app.catalog import registry as model_registry

    try:
        with transaction() as conn:
            m = model_registry.update_model(conn, name, {"enabled": enabled})
    except DomainError as exc:
        raise _fail(exc)
    click.echo(json.dumps({"model_name": m["model_name"], "enabled": m["enabled"]}))


@models.command("enable", help="Let a model take submissions again.")
@click.argument("name")
def models_enable(name: str) -> None:
    _set_enabled(name, True)


@models.command("disable", help="Refuse new submissions (404); admitted jobs still run.")
@click.argument("name")
def models_disable(name: str) -> None:
    _set_enabled(name, False)


# --- jobs ----------------------------------------------------------------------------

@main.group(help="Inspect and steer jobs (as an operator: every tenant).")
def jobs() -> None:
    pass


@jobs.command("show", help="A job: its fields and timeline, as JSON.")
@click.argument("job_id")
def jobs_show(job_id: str) -> None:
    from app.errors import DomainError
    from app.jobs.service import get_job
    from app.observe.live import job_detail
    from app.maintenance.requeue import OPERATOR

    try:
        click.echo(json.dumps(job_detail(get_job(OPERATOR, job_id)), indent=2, ensure_ascii=False))
    except DomainError as exc:
        raise _fail(exc)


@jobs.command("list", help="Jobs newest first, one JSON object a line.")
@click.option("--model", default=None)
@click.option("--state", default=None, help="pending, running, done, failed, timeout or canceled.")
@click.option("--tenant", default=None)
@click.option("--since", type=click.DateTime(), default=None, help="Created at or after (UTC).")
@click.option("--until", type=click.DateTime(), default=None, help="Created before (UTC).")
@click.option("--limit", type=int, default=50)
def jobs_list(model, state, tenant, since, until, limit) -> None:
    from datetime import timezone

    from app.errors import DomainError
    from app.jobs.service import list_jobs, status_view
    from app.maintenance.requeue import OPERATOR

    utc = lambda t: t.replace(tzinfo=timezone.utc) if t else None  # noqa: E731
    try:
        rows, nxt = list_jobs(OPERATOR, model_name=model, state=state, tenant=tenant, limit=limit,
                              since=utc(since), until=utc(until))
    except DomainError as exc:
        raise _fail(exc)
    for r in rows:
        click.echo(json.dumps({**status_view(r), "tenant": r.tenant_id}))
    if nxt:
        click.echo(f"# more: the page ends at {nxt}", err=True)


@jobs.command("cancel", help="Cancel a pending, running or retry-waiting job.")
@click.argument("job_id")
def jobs_cancel(job_id: str) -> None:
    from app.errors import DomainError
    from app.jobs.service import cancel_job, status_view
    from app.maintenance.requeue import OPERATOR

    try:
        click.echo(json.dumps(status_view(cancel_job(OPERATOR, job_id))))
    except DomainError as exc:
        raise _fail(exc)


@jobs.command("requeue", help="Re-send a pending job's message or re-admit a retry_wait job now; "
                              "refuses running and terminal jobs.")
@click.argument("job_id")
def jobs_requeue(job_id: str) -> None:
    from app.errors import DomainError
    from app.maintenance.requeue import requeue_job

    try:
        click.echo(json.dumps(requeue_job(job_id)))
    except DomainError as exc:
        raise _fail(exc)


# --- maintenance ------------------------------------------------------------------

@main.group(help="Run a maintenance pass now (what beat runs on its schedule).")
def maintenance() -> None:
    pass


@maintenance.command("reconcile", help="Make the Redis gates equal the database.")
def m_reconcile() -> None:
    from app.maintenance import passes as m

    click.echo(json.dumps(m.reconcile_gates().as_dict()))


@maintenance.command("recover", help="Expired leases, overdue jobs, lost messages, gates.")
def m_recover() -> None:
    from app.maintenance import passes as m

    click.echo(json.dumps(m.recover().as_dict()))


@maintenance.command("retry", help="The worker pass: due retries re-admitted, long-waiting retries "
                                    "promoted, lost messages re-sent (seed: /task/runWork).")
def m_retry() -> None:
    from app.maintenance import passes as m

    click.echo(json.dumps(m.run_work().as_dict()))


@maintenance.command("cleanup", help="Delete expired claimed jobs and old terminal jobs with their "
                                     "results; time out overdue jobs.")
def m_cleanup() -> None:
    from app.maintenance import passes as m

    click.echo(json.dumps(m.cleanup().as_dict()))


@maintenance.command("autotune", help="Fit runtime max_concurrency/queue_limit to recent P90 and throughput.")
@click.option("--window", type=click.IntRange(min=1), default=None,
              help="Seconds to look back (default ASYNCH_AUTOTUNE_WINDOW_SECONDS).")
@click.option("--dry-run", is_flag=True, help="Show the decision, write nothing.")
def m_autotune(window: int | None, dry_run: bool) -> None:
    from app.maintenance import autotune

    click.echo(json.dumps(autotune.autotune(window, dry_run).as_dict()))


@maintenance.command("runs", help="Recent periodic runs (what beat got done, newest last).")
@click.option("--limit", type=click.IntRange(1, 1000), default=20)
def m_runs(limit: int) -> None:
    from app.maintenance import periodic

    for run in periodic.recent_runs(limit):
        click.echo(json.dumps(run))


# --- processes ----------------------------------------------------------------------

@main.command(help="Run the API under gunicorn.")
@click.option("--bind", default="0.0.0.0:8000")
@click.option("--workers", default=2, type=int)
@click.option("--threads", default=16, type=int, help="Threads per process (long-polls hold one).")
def api(bind: str, workers: int, threads: int) -> None:
    os.execvp(sys.executable, [sys.executable, "-m", "gunicorn", "--bind", bind, "--workers", str(workers),
                               "--threads", str(threads), "--worker-class", "gthread",
                               "--access-logfile", "-", "app.wsgi:app"])


@main.command(help="Run a Celery worker.")
@click.option("--concurrency", "-c", default=2, type=int)
@click.option("--queues", "-Q", default=None, help="Queues to consume (default: the configured one).")
def worker(concurrency: int, queues: str | None) -> None:
    os.execvp(sys.executable, worker_argv(concurrency, queues))


def worker_argv(concurrency: int = 2, queues: str | None = None) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker", "--loglevel", "INFO",
            "-c", str(concurrency), "-Q", queues or get_settings().queue_name, "--without-gossip",
            "--without-mingle"]


def beat_argv(schedule_file: str = "celerybeat-schedule") -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "workers.celery_app", "beat", "--loglevel", "INFO",
            "-s", schedule_file, "-S", "workers.beat:LeaderScheduler"]


@main.command(help="Run Celery beat.  Several may run: one leads (Redis lock), the others stand by.")
def beat() -> None:
    os.execvp(sys.executable, beat_argv())


@main.command(help="All in one: migrate, a demo echo model, an admin key, the API, a worker and beat.")
@click.option("--port", default=8000, type=int)
@click.option("--model-port", default=8765, type=int)
def dev(port: int, model_port: int) -> None:
    from werkzeug.serving import make_server

    from app import create_app
    from app.infra.db import transaction
    from app.cli.demo_model import DemoModelServer
    from app.errors import Conflict
    from app.tenancy import keys as key_svc
    from app.catalog import registry as model_registry

    os.chdir(ROOT)
    upgrade_db()
    demo = DemoModelServer(port=model_port).start()
    with transaction() as conn:
        try:
            model_registry.create_model(conn, {
                "model_name": "demo-echo", "base_url": demo.url, "route": "/echo",
                "http_method": "POST", "queue_limit": 100, "max_concurrency": 4,
                "timeout_seconds": 30, "expected_seconds": 1, "retry_times": 2,
                "form": [{"field": "prompt", "label": "Prompt", "type": "string", "required": True}],
                "remark": "echoes its payload back (asynch dev)",
            })
        except Conflict:
            model_registry.update_model(conn, "demo-echo", {"base_url": demo.url, "enabled": True})
        key, _ = key_svc.create_key(conn, "demo", "admin", "asynch dev")

    (ROOT / "data").mkdir(exist_ok=True)
    children = [subprocess.Popen(worker_argv(2)),
                subprocess.Popen(beat_argv(str(ROOT / "data" / "celerybeat-schedule")))]

    server = make_server("127.0.0.1", port, create_app(), threaded=True)
    base = f"http://127.0.0.1:{port}"
    click.echo(f"""
model-asynch dev is up: API {base}, demo model {demo.url}, {len(children)} helper processes.
Admin key (tenant "demo"): {key}
Console: {base}/console (log in with the key)   Metrics: {base}/metrics   OpenAPI: {base}/openapi.json

Submit a job, then wait for it and read its result:
  curl -s -X POST {base}/v1/models/demo-echo/jobs -H 'Authorization: Bearer {key}' \\
       -H 'Content-Type: application/json' -d '{{"prompt": "hello"}}'
  curl -s '{base}/v1/models/demo-echo/jobs/<job_id>/wait?timeout=5000' -H 'Authorization: Bearer {key}'
  curl -s {base}/v1/models/demo-echo/jobs/<job_id>/result -H 'Authorization: Bearer {key}'
Ctrl-C stops everything.
""", err=True)

    def _stop(*_a):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        for c in children:
            c.terminate()
        deadline = time.time() + 10
        for c in children:
            try:
                c.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                c.kill()
        demo.stop()


@main.command("env", help="List every ASYNCH_ environment variable and its current value.")
def env_cmd() -> None:
    s = get_settings()
    for name, var in env_names().items():
        v = getattr(s, name)
        if name in ("bootstrap_admin_key", "key_pepper", "s3_secret_key", "oss_authorization", "metrics_token") and v:
            v = "***"
        click.echo(f"{var}={v}")


if __name__ == "__main__":
    main()
