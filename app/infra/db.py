"""Engine and connection handling.

PostgreSQL is the one SQL dialect; no ASYNCH_DATABASE_URL (the default) is NotConfigured, never
a file created somewhere.  One engine per process, created lazily (app/infra/process.py drops it
in a forked child: pooled connections are never shared with children).  Service functions open
their own unit of work: ``transaction()`` (BEGIN/COMMIT) or ``single_statement()``.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from sqlalchemy import create_engine
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from app.config import get_settings
from app.errors import NO_DATABASE, NotConfigured, Unavailable
from app.infra.process import PerProcess


def make_engine(url: str, autocommit: bool = False, pool_size: int = 16) -> Engine:
    if not url:
        raise NotConfigured(NO_DATABASE)
    if not url.startswith("postgresql"):
        raise NotConfigured(f"ASYNCH_DATABASE_URL must be a PostgreSQL URL (postgresql+psycopg2://...), got "
                            f"{url.split(':', 1)[0]}://...")
    return create_engine(
        url,
        pool_size=max(1, pool_size),
        max_overflow=max(1, pool_size),
        # No pre-ping (a round trip per checkout): a connection that died with the server fails its
        # first statement (a 503) and SQLAlchemy then invalidates the whole pool.
        pool_recycle=1800,
        # A statement's parameters (payloads, modelKey) never appear in an
        # exception message, so a logged database error cannot leak them.
        hide_parameters=True,
        # Set once at connect: switching a pooled connection per checkout
        # would cost a "SET default_transaction_isolation" round trip.
        **({"isolation_level": "AUTOCOMMIT"} if autocommit else {}),
    )


# One pool for transactions, one always in autocommit mode (single_statement()).  A forked child
# drops the parent's pools without closing their sockets (the parent uses them) and opens its own.
_engines = {flag: PerProcess(lambda flag=flag: make_engine(get_settings().database_url, flag,
                                                           get_settings().db_pool_size),
                             on_fork=lambda e: e.dispose(close=False), on_reset=lambda e: e.dispose())
            for flag in (False, True)}


def get_engine(autocommit: bool = False) -> Engine:
    return _engines[autocommit].get()


def reset_engine() -> None:
    for item in _engines.values():
        item.reset()


# A server that cannot write now: a read-only session (a standby, or default_transaction_read_only
# during maintenance).  A full disk (class 53) is an OperationalError already.
_CANNOT_WRITE = {"25006"}  # read_only_sql_transaction


@contextmanager
def _lost_database_is_unavailable() -> Iterator[None]:
    try:
        yield
    except DBAPIError as exc:  # OperationalError is one
        if (isinstance(exc, OperationalError) or exc.connection_invalidated
                or getattr(exc.orig, "pgcode", None) in _CANNOT_WRITE):
            raise Unavailable("database unavailable") from exc
        raise


@contextmanager
def transaction() -> Iterator[Connection]:
    """BEGIN ... COMMIT on a pooled connection; a lost database is a 503."""
    with _lost_database_is_unavailable(), get_engine().begin() as conn:
        yield conn


@contextmanager
def single_statement() -> Iterator[Connection]:
    """A pooled connection in autocommit mode, for ONE statement that is its own transaction (the admission
    INSERT ... RETURNING): one round trip instead of BEGIN, statement, COMMIT.  Never run two dependent
    statements in it; use transaction()."""
    with _lost_database_is_unavailable(), get_engine(autocommit=True).connect() as conn:
        yield conn


# A write that is ONE statement (a transition with its side write in one CTE,
# app/transitions.py ``alongside``) is the same thing under its own name.
atomic_statement = single_statement
