"""The ``asynch`` command: run the pieces (processes.py), operate them
(operate.py), the dev stack (devstack.py) and the API's client
(client_cmds.py).  ``asynch --help`` lists everything; every command has
--help.

Invariant: a command's module is imported only when that command runs (or a
listing needs it): ``asynch wait`` loads the HTTP client, not the server."""
from __future__ import annotations

import importlib

import click

from app.cli import devstate
from app.cli.base import ROOT, DomainGroup, alembic_config, upgrade_db

# module -> its commands ("name=attribute" where they differ)
_MODULES = {"processes": "db api worker callback-worker=callback_worker beat env=env_cmd", "devstack": "dev",
            "operate": "keys models jobs maintenance work tenants secrets callbacks",
            "client_cmds": "submit wait result cancel"}
COMMANDS = {n.split("=")[0]: f"{m}:{n.split('=')[-1].replace('-', '_')}" for m, names in _MODULES.items()
            for n in names.split()}


class LazyGroup(DomainGroup):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr = COMMANDS[name].split(":")
        return getattr(importlib.import_module(f"app.cli.{module}"), attr)


@click.group(cls=LazyGroup, help="model-asynch: asynchronous model-inference job middleware.  Inside a "
             "checkout whose `asynch dev` runs, commands use that stack (.asynch/dev.json): the server commands "
             "its database unless ASYNCH_DATABASE_URL is set, the client commands (submit, wait, result, "
             "cancel) its API URL and admin key unless --url/ASYNCH_URL or --key/ASYNCH_API_KEY say otherwise.")
@click.pass_context
def main(ctx: click.Context) -> None:
    # Before any setting is read; `asynch dev` starts a stack of its own instead.
    if ctx.invoked_subcommand != "dev":
        devstate.load_dev_env()


__all__ = ["ROOT", "alembic_config", "main", "upgrade_db"]
