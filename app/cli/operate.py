"""Operator commands: API keys, model configurations, jobs, maintenance passes.

Commands only parse and render: the work is the service layer's, and a
domain error it raises becomes a clean one-line failure (``DomainGroup``).
"""
from __future__ import annotations

import json

import click

from app.cli.base import DomainGroup


# --- keys ------------------------------------------------------------------------

@click.group(cls=DomainGroup, help="API keys.")
def keys() -> None:
    pass


@keys.command("create", help="Create a key and print it once; only its hash is stored.")
@click.option("--tenant", required=True, help="Tenant the key acts for.")
@click.option("--admin", is_flag=True, help="An admin key (models, keys, maintenance).")
@click.option("--name", default="", help="A label for the key.")
def keys_create(tenant: str, admin: bool, name: str) -> None:
    from app.infra.db import transaction
    from app.tenancy import keys as svc

    with transaction() as conn:
        key, view = svc.create_key(conn, tenant, "admin" if admin else "user", name)
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
    from app.tenancy import keys as svc

    with transaction() as conn:
        click.echo(json.dumps(svc.revoke_key(conn, key_id)))


# --- models ------------------------------------------------------------------------

@click.group(cls=DomainGroup, help="Model configurations: JSON import/export, enable/disable.")
def models() -> None:
    pass


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
    from app.catalog.transfer import import_models

    try:
        data = json.load(file)
    except ValueError as exc:
        raise click.ClickException(f"{file.name}: invalid JSON: {exc}")
    with transaction() as conn:
        click.echo(json.dumps(import_models(conn, data)))


def _set_enabled(name: str, enabled: bool) -> None:
    from app.infra.db import transaction
    from app.catalog import registry as model_registry

    with transaction() as conn:
        m = model_registry.update_model(conn, name, {"enabled": enabled})
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

@click.group(cls=DomainGroup, help="Inspect and steer jobs (as an operator: every tenant).")
def jobs() -> None:
    pass


@jobs.command("show", help="A job: its fields and timeline, as JSON.")
@click.argument("job_id")
def jobs_show(job_id: str) -> None:
    from app.jobs.service import get_job
    from app.observe.live import job_detail
    from app.maintenance.requeue import OPERATOR

    click.echo(json.dumps(job_detail(get_job(OPERATOR, job_id)), indent=2, ensure_ascii=False))


@jobs.command("list", help="Jobs newest first, one JSON object a line.")
@click.option("--model", default=None)
@click.option("--state", default=None, help="pending, running, done, failed, timeout or canceled.")
@click.option("--tenant", default=None)
@click.option("--since", type=click.DateTime(), default=None, help="Created at or after (UTC).")
@click.option("--until", type=click.DateTime(), default=None, help="Created before (UTC).")
@click.option("--limit", type=int, default=50)
def jobs_list(model, state, tenant, since, until, limit) -> None:
    from datetime import timezone

    from app.jobs.service import list_jobs, status_view
    from app.maintenance.requeue import OPERATOR

    utc = lambda t: t.replace(tzinfo=timezone.utc) if t else None  # noqa: E731
    rows, nxt = list_jobs(OPERATOR, model_name=model, state=state, tenant=tenant, limit=limit,
                          since=utc(since), until=utc(until))
    for r in rows:
        click.echo(json.dumps({**status_view(r), "tenant": r.tenant_id}))
    if nxt:
        click.echo(f"# more: the page ends at {nxt}", err=True)


@jobs.command("cancel", help="Cancel a pending, running or retry-waiting job.")
@click.argument("job_id")
def jobs_cancel(job_id: str) -> None:
    from app.jobs.service import cancel_job, status_view
    from app.maintenance.requeue import OPERATOR

    click.echo(json.dumps(status_view(cancel_job(OPERATOR, job_id))))


@jobs.command("requeue", help="Re-send a pending job's message or re-admit a retry_wait job now; "
                              "refuses running and terminal jobs.")
@click.argument("job_id")
def jobs_requeue(job_id: str) -> None:
    from app.maintenance.requeue import requeue_job

    click.echo(json.dumps(requeue_job(job_id)))


# --- maintenance ------------------------------------------------------------------

@click.group(cls=DomainGroup, help="Run a maintenance pass now (what beat runs on its schedule).")
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


