"""What every maintenance pass shares: its report, running parts in order,
and taking rows in SKIP LOCKED batches."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Sequence

import redis

from app.config import get_settings
from app.infra.tables import tasks

log = logging.getLogger(__name__)


def batch_size(limit: int | None) -> int:
    return limit if limit is not None else get_settings().maintenance_batch


def locked(q):
    """SELECT ... FOR UPDATE OF asynch_task SKIP LOCKED: concurrent passes
    take disjoint rows."""
    return q.with_for_update(skip_locked=True, of=tasks)


@dataclass
class Report:
    processed: int = 0
    details: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"processed": self.processed, **self.details}


def compose(parts: Sequence[tuple[str, Callable[[], Report]]]) -> Report:
    """Run passes in order; a Redis outage fails only the passes that need
    Redis (leases, timeouts and cleanup are database-only)."""
    out = Report()
    for name, fn in parts:
        try:
            r = fn()
        except redis.RedisError as exc:
            log.warning("maintenance pass %s: redis unavailable: %s", name, exc)
            out.details[name] = {"error": f"redis unavailable: {exc}"}
            continue
        out.details[name] = r.as_dict()
        out.processed += r.processed
    return out
