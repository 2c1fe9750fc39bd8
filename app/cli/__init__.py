"""The ``asynch`` command: run the pieces (processes.py) and operate them
(operate.py).  ``asynch --help`` lists everything; every command has --help."""
from __future__ import annotations

import click

from app.cli import client_cmds, devstack, devstate, operate, processes
from app.cli.base import ROOT, DomainGroup, alembic_config, upgrade_db
from app.cli.processes import beat_argv, callback_worker_argv, worker_argv


@click.group(cls=DomainGroup, help="model-asynch: asynchronous model-inference job middleware.  Inside a "
             "checkout whose `asynch dev` runs, commands use that stack (.asynch/dev.json) unless "
             "ASYNCH_DATABASE_URL is set.")
@click.pass_context
def main(ctx: click.Context) -> None:
    # Before any setting is read; `asynch dev` starts a stack of its own instead.
    if ctx.invoked_subcommand != "dev":
        devstate.load_dev_env()


for _cmd in (processes.db, processes.api, processes.worker, processes.callback_worker, processes.beat, devstack.dev,
             processes.env_cmd,
             operate.keys, operate.models, operate.jobs, operate.maintenance, operate.work, operate.tenants, operate.secrets,
             operate.callbacks,
             client_cmds.submit, client_cmds.wait, client_cmds.result, client_cmds.cancel):
    main.add_command(_cmd)

__all__ = ["ROOT", "alembic_config", "beat_argv", "callback_worker_argv", "main", "upgrade_db", "worker_argv"]
