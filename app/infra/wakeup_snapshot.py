"""What a wake-up hands a waiter (docs/architecture.md invariant 7): the
terminal-row snapshot it carries, written by the transition's winner after
its commit and read by every API process's listener (app/infra/wakeups.py),
or the row the hub's fetcher reads when a message carries none.

Invariants:
- A snapshot holds only what a poll body and a job event show: never the
  payload, the modelKey, the callback URL or a secret.
- Only a terminal state is taken as a snapshot (terminal is absorbing, so
  the snapshot is final); anything else, a bare job id or junk, parses as
  None and the listener falls back to reading the row.
- The fetcher reads on a connection of its own (``fetch_engine``, one per
  process), never from the request pool.
"""
from __future__ import annotations

import json
from datetime import datetime

from app.config import get_settings
from app.infra.process import PerProcess
from app.states import is_terminal

# The columns a wake-up snapshot carries: what a poll body and a job event
# show, nothing else (no payload, no modelKey, no callback URL).
SNAPSHOT_FIELDS = ("id", "model_name", "tenant_id", "state", "attempt", "retry_count", "error", "result_size",
                   "result_content_type", "priority")
SNAPSHOT_TIMES = ("created_at", "started_at", "finished_at", "updated_at")


def snapshot_message(row) -> str:
    """The wake-up message for a row that just became terminal (after its
    commit): a JSON object of SNAPSHOT_FIELDS and SNAPSHOT_TIMES."""
    out = {f: getattr(row, f, None) for f in SNAPSHOT_FIELDS}
    for f in SNAPSHOT_TIMES:
        t = getattr(row, f, None)
        out[f] = t.isoformat() if t is not None else None
    return json.dumps(out, separators=(",", ":"))


class Snapshot:
    """A terminal row as a wake-up carried it: the attributes of a row for
    the fields it has.  ``v1_body`` memoises the rendered poll body, so
    every waiter of the job sends the same bytes."""

    __slots__ = (*SNAPSHOT_FIELDS, *SNAPSHOT_TIMES, "v1_body")

    def __init__(self, data: dict) -> None:
        for f in SNAPSHOT_FIELDS:
            setattr(self, f, data.get(f))
        for f in SNAPSHOT_TIMES:
            t = data.get(f)
            setattr(self, f, datetime.fromisoformat(t) if t else None)
        self.v1_body = None


def parse_snapshot(data: str) -> Snapshot | None:
    """The snapshot in a wake-up message, or None (a bare job id, or junk)."""
    if not data.startswith("{"):
        return None
    try:
        snap = Snapshot(json.loads(data))
    except (ValueError, TypeError, AttributeError):
        return None
    return snap if isinstance(snap.id, str) and is_terminal(snap.state) else None


def _make_fetch_engine():
    from app.infra.db import make_engine

    return make_engine(get_settings().database_url, autocommit=True, pool_size=1)


# The fetcher's own connection: wake-ups never queue for a database
# connection behind the requests of the process (a burst of new waits each
# reading its job, submits).  One more connection per API process.
fetch_engine = PerProcess(_make_fetch_engine, on_fork=lambda e: e.dispose(close=False), on_reset=lambda e: e.dispose())


def read_rows(ids: list[str], batch: int) -> dict[str, object]:
    """The rows of ``ids`` by id, ``batch`` ids per SELECT, on the fetcher's connection."""
    from sqlalchemy import select

    from app.infra.tables import tasks

    out = {}
    with fetch_engine.get().connect() as conn:
        for i in range(0, len(ids), batch):
            chunk = ids[i:i + batch]
            out.update((r.id, r) for r in conn.execute(select(tasks).where(tasks.c.id.in_(chunk))))
    return out
