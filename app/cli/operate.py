"""Operator commands: API keys, model configurations, jobs, maintenance passes.

Commands only parse and render: the work is the service layer's, and a
domain error it raises becomes a clean one-line failure (``DomainGroup``).
"""
from __future__ import annotations

import json

import click

from app.catalog import registry, transfer
from app.catalog.schemas import ModelPatch
from app.cli import DomainGroup
from app.config import get_settings
from app.contract import dump, parse, parse_json
from app.jobs import service as job_service
from app.jobs.requests import JobListQuery
from app.jobs.schemas import JobDetail, JobStatus
from app.infra import secretbox
from app.maintenance import autotune, passes, periodic, requeue, secret_rotation
from app.tenancy import keys as key_service, limits
from app.tenancy.keys import OPERATOR
from app.tenancy.schemas import ApiKeyView, TenantLimitsInput
from app.delivery import outbox
from app.delivery.schemas import WebhookDelivery


def _echo(shape, indent: int | None = None) -> None:
    click.echo(json.dumps(dump(shape), indent=indent, ensure_ascii=False))


keys = DomainGroup("keys", help="API keys.")


@keys.command("create", help="Create a key and print it once; only its hash is stored.")
@click.option("--tenant", required=True, help="Tenant the key acts for.")
@click.option("--admin", is_flag=True, help="An admin key (models, keys, maintenance).")
@click.option("--name", default="", help="A label for the key.")
def keys_create(tenant: str, admin: bool, name: str) -> None:
    key, row = key_service.create_key(tenant, "admin" if admin else "user", name)
    click.echo(key)
    click.echo(f"# id={row.id} tenant={row.tenant_id} role={row.role} (shown once)", err=True)


@keys.command("list", help="List keys (never the secrets).")
@click.option("--tenant", default=None, help="Only this tenant's keys.")
def keys_list(tenant: str | None) -> None:
    for row in key_service.list_keys(tenant):
        _echo(ApiKeyView.from_row(row))


@keys.command("revoke", help="Revoke a key by id.")
@click.argument("key_id", type=int)
def keys_revoke(key_id: int) -> None:
    _echo(ApiKeyView.from_row(key_service.revoke_key(key_id)))


models = DomainGroup("models", help="Model configurations: list, JSON import/export, enable/disable.")


@models.command("list", help="Every model (disabled ones too), one JSON object a line: model_name, enabled, "
                             "base_url, max_concurrency, queue_limit (the configured values; GET /v1/models "
                             "has every field).")
def models_list() -> None:
    for row in registry.visible_models(OPERATOR):
        click.echo(json.dumps({k: getattr(row, k) for k in (
            "model_name", "enabled", "base_url", "max_concurrency", "queue_limit")}, ensure_ascii=False))


@models.command("export", help="Write models as a JSON list (head_msg left out unless --with-secrets).")
@click.argument("names", nargs=-1)
@click.option("--out", "-o", type=click.Path(dir_okay=False, writable=True), default="-",
              help="File to write (default: stdout).")
@click.option("--with-secrets", is_flag=True, help="Include head_msg (header values are secrets).")
def models_export(names: tuple[str, ...], out: str, with_secrets: bool) -> None:
    data = transfer.export_models(list(names) or None, with_secrets)
    with click.open_file(out, "w") as f:
        f.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    click.echo(f"# {len(data)} models exported", err=True)


@models.command("import", help="Create or update models from a JSON file; all or nothing.")
@click.argument("file", type=click.File("r"))
def models_import(file) -> None:
    try:
        data = parse_json(file.read())  # strict, as every body the API takes (no NaN, no 1e400)
    except ValueError as exc:
        raise click.ClickException(f"{file.name}: invalid JSON: {exc}")
    click.echo(json.dumps(transfer.import_models(data)))


def _set_enabled(enabled: bool):
    @click.argument("name")
    def run(name: str) -> None:
        row = registry.update_model(name, ModelPatch(enabled=enabled))
        click.echo(json.dumps({"model_name": row.model_name, "enabled": row.enabled}))
    return run


models.command("enable", help="Let a model take submissions again.")(_set_enabled(True))
models.command("disable", help="Refuse new submissions (404 \"model disabled\"); admitted jobs still run.")(
    _set_enabled(False))


jobs = DomainGroup("jobs", help="Inspect and steer jobs (as an operator: every tenant).")


@jobs.command("show", help="A job: its fields and timeline, as JSON.")
@click.argument("job_id")
def jobs_show(job_id: str) -> None:
    row = job_service.get_job(OPERATOR, job_id)
    _echo(JobDetail.from_row(row, {"poll_url": f"/v1/models/{row.model_name}/jobs/{row.id}",
                                   "result_url": f"/v1/models/{row.model_name}/jobs/{row.id}/result"},
                             admin=True), indent=2)


@jobs.command("list", help="Jobs newest first, one JSON object a line.")
@click.option("--model", default=None, help="Only this model's jobs.")
@click.option("--state", default=None, help="pending, running, done, failed, timeout, canceled or expired.")
@click.option("--tenant", default=None, help="Only this tenant's jobs.")
@click.option("--since", type=click.DateTime(), default=None, help="Created at or after (UTC).")
@click.option("--until", type=click.DateTime(), default=None, help="Created before (UTC).")
@click.option("--limit", type=int, default=50, show_default=True, help="At most this many jobs, newest first.")
def jobs_list(model, state, tenant, since, until, limit) -> None:
    query = parse(JobListQuery, {"state": state, "tenant": tenant, "limit": limit,
                                 "since": since.isoformat() if since else None,
                                 "until": until.isoformat() if until else None}, message="invalid query")
    rows, nxt = job_service.list_jobs(OPERATOR, query, model_name=model)
    for r in rows:
        click.echo(json.dumps({**dump(JobStatus.from_row(r)), "tenant": r.tenant_id}))
    if nxt:
        click.echo(f"# more: the page ends at {nxt}", err=True)


@jobs.command("cancel", help="Cancel a pending, running or retry-waiting job.")
@click.argument("job_id")
def jobs_cancel(job_id: str) -> None:
    _echo(JobStatus.from_row(job_service.cancel_job(OPERATOR, job_id)))


@jobs.command("requeue", help="Re-send a pending job's message or re-admit a retry_wait job now; "
                              "refuses running and terminal jobs.")
@click.argument("job_id")
def jobs_requeue(job_id: str) -> None:
    click.echo(json.dumps(requeue.requeue_job(job_id)))


maintenance = DomainGroup("maintenance", help="Run a maintenance pass now (what beat runs on its schedule).")


@maintenance.command("autotune", help="Fit runtime max_concurrency/queue_limit to recent P90 and throughput.")
@click.option("--window", type=click.IntRange(min=1), default=None,
              help="Seconds to look back (default ASYNCH_AUTOTUNE_WINDOW_SECONDS).")
@click.option("--dry-run", is_flag=True, help="Show the decision, write nothing.")
def m_autotune(window: int | None, dry_run: bool) -> None:
    click.echo(json.dumps(autotune.autotune(window, dry_run).as_dict()))


@maintenance.command("runs", help="Recent periodic runs (what beat got done, newest last).")
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True, help="How many runs to show.")
def m_runs(limit: int) -> None:
    for run in periodic.recent_runs(limit):
        click.echo(json.dumps(run))


work = DomainGroup("work", help="Run jobs without resident workers (a Kubernetes CronJob, the seed's "
                  "upper scheduler); resident Celery workers may run beside it.")


@work.command("run-once", help="The worker pass, then claim up to --max pending jobs and run them here "
                               "(seed: /task/runWork).")
@click.option("--max", "max_tasks", type=click.IntRange(0, 10000), default=None,
              help="Pending jobs to claim and run (default ASYNCH_RUN_WORK_MAX_TASKS).")
def work_run_once(max_tasks: int | None) -> None:
    click.echo(json.dumps(passes.run_work(max_tasks).as_dict()))


tenants = DomainGroup("tenants", help="Tenants' limits: dispatch weight, request rate, long-polls, queue caps.")


@tenants.command("limits", help="Show a tenant's limits (an error for a tenant with no API key and no limits: "
                                "a typo); with options, change them first, for any tenant (--queue-limit MODEL=N, "
                                "repeatable; N empty: back to the default).")
@click.argument("tenant")
@click.option("--weight", type=int, default=None, help="Share of dispatch when tenants compete (default 1).")
@click.option("--rate", type=float, default=None, help="Requests per second per API key.")
@click.option("--burst", type=int, default=None, help="Token bucket size.")
@click.option("--max-waiters", type=int, default=None, help="Concurrent long-polls per API process.")
@click.option("--queue-limit", "queue_limits", multiple=True, help="MODEL=N: this tenant's cap on a model's queue.")
def tenants_limits(tenant, weight, rate, burst, max_waiters, queue_limits) -> None:
    change = {k: v for k, v in (("weight", weight), ("rate_per_second", rate), ("burst", burst),
                                ("max_waiters", max_waiters)) if v is not None}
    if queue_limits:
        caps = {}
        for item in queue_limits:
            model, sep, n = item.partition("=")
            if not sep:
                raise click.BadParameter(f"{item!r} is not MODEL=N", param_hint="--queue-limit")
            caps[model] = int(n) if n.strip() else None
        change["queue_limits"] = caps
    _echo(limits.update(tenant, parse(TenantLimitsInput, change, message="invalid tenant limits")) if change
          else limits.read(OPERATOR, tenant, must_exist=True), indent=2)


callbacks = DomainGroup("callbacks", help="Callback and webhook deliveries.")


@callbacks.command("replay", help="Re-send a failed webhook delivery (its id: GET /v1/jobs/{id}/webhooks): "
                                  "the same webhook-id and body, a fresh attempt budget.")
@click.argument("delivery_id", type=click.IntRange(min=0))
def callbacks_replay(delivery_id: int) -> None:
    _echo(WebhookDelivery.of(outbox.replay(OPERATOR, delivery_id)))


secrets = DomainGroup("secrets", help="Secrets at rest (head_msg values, callback secrets): key rotation.")


@secrets.command("new-key", help="Print a new key for ASYNCH_SECRETS_KEYS (put it first to rotate).")
def secrets_new_key() -> None:
    click.echo(secretbox.new_key())


@secrets.command("derived-key", help="Print the key derived from ASYNCH_KEY_PEPPER, which encrypted the values "
                 "of a deployment that ran without ASYNCH_SECRETS_KEYS: list it after a new key, then rotate.")
def secrets_derived_key() -> None:
    click.echo(secretbox.derived_key(get_settings().key_pepper))


def _prints(fn):
    """A command printing what ``fn()`` returns (a pass's report, or a dict) as one JSON line."""
    def run() -> None:
        out = fn()
        click.echo(json.dumps(out.as_dict() if hasattr(out, "as_dict") else out))
    return run


for _group, _name, _fn, _help in (
        (maintenance, "reconcile", passes.reconcile_gates, "Make the Redis gates equal the database."),
        (maintenance, "recover", passes.recover, "Expired leases, overdue jobs, lost messages, gates."),
        (maintenance, "retry", passes.run_work, "The worker pass: due retries re-admitted, long-waiting retries "
         "promoted, lost messages re-sent (seed: /task/runWork)."),
        (maintenance, "cleanup", passes.cleanup, "Delete expired claimed jobs and old terminal jobs with their "
         "results; time out overdue jobs."),
        (work, "clean-once", passes.clean_work, "The cleaner pass: expired and old jobs, due retries, expired "
         "leases, timeouts (seed: /task/cleanWork)."),
        (secrets, "rotate", secret_rotation.rotate_secrets, "Re-encrypt every stored secret with the first "
         "ASYNCH_SECRETS_KEYS key; afterwards the other keys can be dropped.")):
    _group.command(_name, help=_help)(_prints(_fn))


@click.command("verify", help="Check the ledger of the running deployment: every broken guarantee (an admitted job "
                              "nothing will move, a job terminal twice, a done job's missing result object, a wanted "
                              "delivery neither delivered nor dead, gate slots or permits that disagree with the rows, "
                              "a job pending past its deadline), one line each: check, job id, what is wrong.  Exit "
                              "status 1 when any is found, 0 when clean.")
@click.option("--sample", type=int, default=None, help="At most this many rows per check (default: all).")
@click.option("--grace", type=float, default=None,
              help="Spare anything younger than this many seconds (default ASYNCH_VERIFY_GRACE_SECONDS).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line instead.")
@click.option("--record", is_flag=True, help="Also set the asynch_ledger_violations gauge from this run.")
def verify(sample: int | None, grace: float | None, as_json: bool, record: bool) -> None:
    from app.infra.redis import ledger
    from app.maintenance import verify as ledger_check

    rep = ledger_check.verify(sample=sample, grace_seconds=grace)
    for v in rep.violations:
        click.echo(json.dumps(v.as_dict(), ensure_ascii=False) if as_json else f"{v.check}\t{v.job_id}\t{v.detail}")
    if record:
        ledger.record(rep.counts())
    counts = rep.counts()
    click.echo("# " + (", ".join(f"{c}={n}" for c, n in counts.items() if n) or "clean: no violation"), err=True)
    if rep.violations:
        raise SystemExit(1)
