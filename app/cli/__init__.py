"""The ``asynch`` command: run the pieces (processes.py) and operate them
(operate.py).  ``asynch --help`` lists everything; every command has --help."""
from __future__ import annotations

import click

from app.cli import client_cmds, operate, processes
from app.cli.base import ROOT, DomainGroup, alembic_config, upgrade_db
from app.cli.processes import beat_argv, callback_worker_argv, worker_argv


@click.group(cls=DomainGroup, help="model-asynch: asynchronous model-inference job middleware.")
def main() -> None:
    pass


for _cmd in (processes.db, processes.api, processes.worker, processes.callback_worker, processes.beat, processes.dev, processes.env_cmd,
             operate.keys, operate.models, operate.jobs, operate.maintenance, operate.work, operate.tenants, operate.secrets,
             operate.callbacks,
             client_cmds.submit, client_cmds.wait):
    main.add_command(_cmd)

__all__ = ["ROOT", "alembic_config", "beat_argv", "callback_worker_argv", "main", "upgrade_db", "worker_argv"]
