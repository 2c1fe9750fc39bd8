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



def test_the_one_outbox_revision_moves_callbacks_in_and_back_out():
    """0021: the webhook tables become the outbox in place; each callback
    moves in with its log and its id (a new one where a webhook delivery
    holds it), and the downgrade moves it back out."""
    from argparse import Namespace

    import psycopg2
    from alembic import command
    from helpers import PG_ADMIN_DSN

    from app.cli import alembic_config

    name = "asynch_outbox_scratch"
    admin = psycopg2.connect(PG_ADMIN_DSN)
    admin.autocommit = True
    base = PG_ADMIN_DSN.rsplit("/", 1)[0]
    cfg = alembic_config()
    cfg.cmd_opts = Namespace(x=[f"url={base.replace('postgresql://', 'postgresql+psycopg2://')}/{name}"])
    try:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
            cur.execute(f'CREATE DATABASE "{name}"')
        command.upgrade(cfg, "0020_tenant_min_burst")
        db = psycopg2.connect(f"{base}/{name}")
        db.autocommit = True
        with db.cursor() as cur:
            for t in ("job_1", "job_2"):
                cur.execute("INSERT INTO asynch_task (id, tenant_id, model_name, request_payload, request_hash, state, "
                            "created_at, enqueue_at, updated_at) VALUES (%s, 'tenant-a', 'm', '{}', '', 2, now(), now(), "
                            "now())", (t,))
            cur.execute("INSERT INTO asynch_callback (id, job_id, tenant_id, url, status, attempts, next_attempt_at, "
                        "created_at, updated_at) VALUES (7, 'job_1', 'tenant-a', 'http://cb/x?task_id=job_1', "
                        "'delivered', 1, now(), now(), now())")
            cur.execute("INSERT INTO asynch_webhook_delivery (id, job_id, tenant_id, subscription_id, event, url, "
                        "status, attempts, next_attempt_at, created_at, updated_at) VALUES (7, 'job_2', 'tenant-a', "
                        "0, 'done', 'http://wh/', 'delivered', 1, now(), now(), now())")
            cur.execute("INSERT INTO asynch_callback_attempt (callback_id, attempt, started_at, duration_ms) "
                        "VALUES (7, 1, now(), 12)")
        command.upgrade(cfg, "head")
        with db.cursor() as cur:
            cur.execute("SELECT d.kind, d.id = 7, d.job_id, d.url, d.payload, count(a.id) FROM asynch_delivery d "
                        "LEFT JOIN asynch_delivery_attempt a ON a.delivery_id = d.id GROUP BY d.id ORDER BY d.kind")
            assert cur.fetchall() == [("callback", False, "job_1", "http://cb/x?task_id=job_1", "", 1),
                                      ("webhook", True, "job_2", "http://wh/", None, 0)]
        command.downgrade(cfg, "0020_tenant_min_burst")
        with db.cursor() as cur:
            cur.execute("SELECT c.job_id, c.url, count(a.id) FROM asynch_callback c "
                        "JOIN asynch_callback_attempt a ON a.callback_id = c.id GROUP BY c.id")
            assert cur.fetchall() == [("job_1", "http://cb/x?task_id=job_1", 1)]
            cur.execute("SELECT id, job_id FROM asynch_webhook_delivery")
            assert cur.fetchall() == [(7, "job_2")]
        db.close()
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.close()
