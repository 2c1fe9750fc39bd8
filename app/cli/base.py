"""What every ``asynch`` command shares: where the checkout is (alembic.ini
sits next to app/), the migration, and the group class that turns a domain
error into a clean failure with a non-zero exit."""
from __future__ import annotations

import json
from pathlib import Path

import click

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


class DomainGroup(click.Group):
    """A command group whose commands may raise DomainError: it is shown as
    ``Error: <message>`` (with the invalid fields, if any) and exit status 1,
    the same text the HTTP API answers with."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except DomainError as exc:
            errors = getattr(exc, "errors", None)
            raise click.ClickException(exc.message + ("\n" + json.dumps(errors, indent=2) if errors else ""))
