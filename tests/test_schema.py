"""app/infra/tables.py describes the schema Alembic builds, index for index.

Queries are written against app/infra/tables.py, but the schema comes from the
migrations alone, so the two must not drift: this builds models.py's tables
in a scratch schema and compares every index definition (columns, order,
uniqueness, partial predicate) with what `alembic upgrade head` made.
Alembic's own autogenerate comparison ignores index predicates, which is
exactly what revision 0004 is about.
"""
from __future__ import annotations

from sqlalchemy import text

from app.infra.db import get_engine
from app.infra.tables import metadata

MIRROR = "models_py_mirror"


def _indexes(conn, schema: str) -> dict[str, str]:
    rows = conn.execute(text("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = :s "
                             "AND tablename <> 'alembic_version'"), {"s": schema})
    return {name: definition.replace(f" ON {schema}.", " ON ") for name, definition in rows}


def test_models_py_has_exactly_the_indexes_the_migrations_create():
    with get_engine().connect() as conn:
        with conn.begin():
            conn.execute(text(f"DROP SCHEMA IF EXISTS {MIRROR} CASCADE"))
            conn.execute(text(f"CREATE SCHEMA {MIRROR}"))
            conn.execute(text(f"SET LOCAL search_path TO {MIRROR}"))
            metadata.create_all(conn)
            mirror = _indexes(conn, MIRROR)
            real = _indexes(conn, "public")
            conn.execute(text(f"DROP SCHEMA {MIRROR} CASCADE"))
    assert "ix_asynch_task_retry_due" in real and "WHERE (state = 7)" in real["ix_asynch_task_retry_due"]
    assert set(mirror) == set(real), (set(mirror) ^ set(real))
    assert {k: v for k, v in mirror.items() if real[k] != v} == {}


def _round_trip(url: str) -> None:
    from argparse import Namespace

    from alembic import command
    from app.cli import alembic_config

    cfg = alembic_config()
    cfg.cmd_opts = Namespace(x=[f"url={url}"])
    command.upgrade(cfg, "head")
    command.downgrade(cfg, "0003")
    command.upgrade(cfg, "head")


def test_partial_index_revision_goes_down_and_up_on_postgresql():
    import psycopg2
    from helpers import PG_ADMIN_DSN

    name = "asynch_migration_scratch"
    admin = psycopg2.connect(PG_ADMIN_DSN)
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
            cur.execute(f'CREATE DATABASE "{name}"')
        url = PG_ADMIN_DSN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg2://") + f"/{name}"
        _round_trip(url)
        check = psycopg2.connect(PG_ADMIN_DSN.rsplit("/", 1)[0] + f"/{name}")
        with check.cursor() as cur:
            cur.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'asynch_task'")
            names = {r[0] for r in cur.fetchall()}
        check.close()
        assert "ix_asynch_task_claimed_expire" in names and "ix_asynch_task_state_expire" not in names
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.close()

