"""Engine and connection handling.

One engine per process (created lazily, re-created after fork so pooled
connections are never shared between a parent and its children).  Service
functions take a Connection; ``transaction()`` gives one inside BEGIN/COMMIT.
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Iterator

from sqlalchemy import event, create_engine
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from app.config import get_settings
from app.errors import Unavailable

_lock = threading.Lock()
_engine: Engine | None = None
_engine_pid: int | None = None


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        eng = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False}, hide_parameters=True)

        @event.listens_for(eng, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # pragma: no cover - dev mode only
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return eng
    return create_engine(
        url,
        pool_size=10,
        max_overflow=20,
        # No pre-ping: it costs a round trip per checkout.  A connection that
        # died with the server fails its first statement (a 503) and
        # SQLAlchemy then invalidates the whole pool.
        pool_recycle=1800,
        # A statement's parameters (payloads, modelKey) never appear in an
        # exception message, so a logged database error cannot leak them.
        hide_parameters=True,
    )


def get_engine() -> Engine:
    global _engine, _engine_pid
    pid = os.getpid()
    if _engine is None or _engine_pid != pid:
        with _lock:
            if _engine is None or _engine_pid != pid:
                if _engine is not None:
                    # Inherited across fork: drop the parent's sockets unclosed.
                    _engine.dispose(close=False)
                _engine = make_engine(get_settings().database_url)
                _engine_pid = pid
    return _engine


def reset_engine() -> None:
    global _engine, _engine_pid
    with _lock:
        if _engine is not None:
            _engine.dispose()
        _engine = None
        _engine_pid = None


def is_postgres(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql"


@contextmanager
def transaction() -> Iterator[Connection]:
    """BEGIN ... COMMIT on a pooled connection; a lost database is a 503."""
    try:
        with get_engine().begin() as conn:
            yield conn
    except OperationalError as exc:
        raise Unavailable("database unavailable") from exc
    except DBAPIError as exc:
        if exc.connection_invalidated:
            raise Unavailable("database unavailable") from exc
        raise
