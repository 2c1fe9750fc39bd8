"""The after-commit effects of a job's transitions: the one module that runs
them (docs/architecture.md, "Effects follow from the transitions").  A
transition out of pending/running returns a ``transitions.Moved``; the
caller collects what it won, and the effects run once the transaction committed:

    with effects.collecting() as due, transaction() as conn:
        won = due.add(transitions.cancel(conn, job_id, tenant))

Invariants:
- Effects run only after the commit of the transaction that won the row
  (``collecting`` is entered before it, so its exit runs after the commit; an
  exception drops them), at most once, only for the winner (a lost CAS is None).
- Best effort: Redis or the broker being away never undoes the transition
  (reconcile, the listener's refetch and the delivery sweep repair a miss).
- Nothing else calls dispatch.finished or metrics.job_finished (tests/test_effects.py).
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator

from app.infra import metrics
from app.infra.celery_config import DELIVER_TASK
from app.infra.publisher import publish_task
from app.infra.wakeups import snapshot_message
from app.jobs import dispatch, estimates
from app.states import JobState
from app.transitions import Moved

log = logging.getLogger(__name__)


class Due(list):
    """The transitions a transaction won, (moved, cap, retry_after) each, whose effects are due after its commit."""

    def add(self, moved: Moved | None, cap: int | None = None, retry_after: float | None = None) -> Moved | None:
        """Note a transition's result (None: lost, nothing due); returns it.
        ``cap``: the model's max_concurrency if known; ``retry_after``: a busy upstream's."""
        if moved is not None:
            self.append((moved, cap, retry_after))
        return moved

    def add_all(self, moves: list[Moved], caps: dict[str, int]) -> list[Moved]:
        """A group transition's wins (transitions.complete_group), ``caps`` by model; returns them."""
        self.extend((m, caps.get(m.row.model_name), None) for m in moves)
        return moves


@contextmanager
def collecting() -> Iterator[Due]:
    """Collect won transitions; run their effects on a clean exit (enter
    it BEFORE the transaction, so the commit comes first)."""
    due = Due()
    yield due
    run_all(due)


def run(moved: Moved | None, cap: int | None = None, retry_after: float | None = None) -> None:
    """The effects of one committed transition (run_all of one)."""
    if moved is not None:
        run_all([(moved, cap, retry_after)])


def run_all(due: list[tuple[Moved, int | None, float | None]]) -> None:
    """The effects of committed transitions, those each ``Moved`` says are due: the releases of one model
    are ONE dispatch step (slots and permits back, wake-ups, run times, the next jobs).  A busy return keeps
    its slot: permit back, queued at its tenant's head, the model's limit lowered (paused for ``retry_after``)."""
    releases: dict[tuple[str, int | None], list] = {}
    for moved, cap, _ in due:
        row = moved.row
        if moved.terminal:
            metrics.job_finished(row)
        if moved.release:
            releases.setdefault((row.model_name, cap), []).append((
                row.tenant_id, row.id, snapshot_message(row) if moved.terminal else None,
                estimates.ran_seconds(row) if moved.state == JobState.DONE else None))
    for (model, cap), jobs in releases.items():
        dispatch.finished(model, jobs, cap=cap)
    for moved, cap, retry_after in due:
        for _ in range(moved.deliveries):  # a pump token per outbox row (a miss is the sweep's)
            publish_task(DELIVER_TASK, [])
        if moved.requeue:
            row = moved.row
            dispatch.returned(row.model_name, row.tenant_id, row.id,
                              dispatch.order_score(row.created_at, row.priority), row.attempt,
                              row.started_at.timestamp() if row.started_at else 0.0, retry_after, cap=cap)


def release_stale_dispatch(model: str, tenant: str, job_id: str) -> None:
    """A dispatch of a job that already ended (its queue entry came back after a
    slow or lost message): its permit and in-flight entry go back now (idempotent removals)."""
    dispatch.finished(model, [(tenant, job_id, None, None)])
