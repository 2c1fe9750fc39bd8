"""The ``asynch`` command: run the pieces (processes.py), operate them
(operate.py), the dev stack (devstack.py) and the API's client
(client_cmds.py).  ``asynch --help`` lists everything; every command has
--help.  Here too what every command shares: where the checkout is
(alembic.ini sits next to app/), the migration, and the group class that
turns a domain error into a clean failure with a non-zero exit.

Invariant: a command's module is imported only when that command runs (or a
listing needs it): ``asynch wait`` loads the HTTP client, not the server."""
from __future__ import annotations

import importlib
from pathlib import Path

import click

from app.cli import devstate
from app.errors import DomainError

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


def one_line(message: str, errors: list[dict] | None = None) -> str:
    """A domain error as one line: its message, then each invalid field as
    ``; <pointer>: <message>`` (as the client commands print an HTTP 422)."""
    return message + "".join(f"; {e.get('pointer', '')}: {e.get('message', '')}" for e in errors or ())


class DomainGroup(click.Group):
    """A command group whose commands may raise DomainError: it is shown as
    one line, ``Error: <message>`` (with the invalid fields, if any), and exit
    status 1, the same text the HTTP API answers with."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except DomainError as exc:
            raise click.ClickException(one_line(exc.message, getattr(exc, "errors", None))) from None


# module -> its commands ("name=attribute" where they differ)
_MODULES = {"processes": "db api worker callback-worker=callback_worker beat env=env_cmd", "devstack": "dev",
            "operate": "keys models jobs maintenance work tenants secrets callbacks verify",
            "client_cmds": "submit wait stream result cancel", "batch_cmds": "files batches"}
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
             "its database unless ASYNCH_DATABASE_URL is set, the client commands (submit, wait, stream, result, "
             "cancel) its API URL and admin key unless --url/ASYNCH_URL or --key/ASYNCH_API_KEY say otherwise.")
@click.version_option(package_name="model-asynch", prog_name="asynch", message="%(prog)s %(version)s",
                      help="Print the version (of the installed model-asynch package) and exit.")
@click.pass_context
def main(ctx: click.Context) -> None:
    # Before any setting is read; `asynch dev` starts a stack of its own instead.
    if ctx.invoked_subcommand != "dev":
        devstate.load_dev_env()

