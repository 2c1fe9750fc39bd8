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
from app.infra.redis.events import publish_stop
from app.infra.wakeups import snapshot_message
from app.jobs import dispatch, estimates
from app.states import JobState
from app.transitions import Moved

log = logging.getLogger(__name__)

# A job ended by someone else (a cancel, a timeout, recovery) keeps its call's permits until the worker reports
# the call's end, within about a second (app/jobs/calls.py); past this, a worker that never reports (dead) loses them.
STOPPING_PERMIT_SECONDS = 10.0


class Due(list):
    """The transitions a transaction won, (moved, cap, busy) each, whose effects are due after its commit."""

    def add(self, moved: Moved | None, cap: int | None = None, busy: dispatch.Busy | None = None) -> Moved | None:
        """Note a transition's result (None: lost, nothing due); returns it.
        ``cap``: the model's max_concurrency if known; ``busy``: the busy answer a return to the queue follows."""
        if moved is not None:
            self.append((moved, cap, busy))
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


def run(moved: Moved | None, cap: int | None = None, busy: dispatch.Busy | None = None) -> None:
    """The effects of one committed transition (run_all of one)."""
    if moved is not None:
        run_all([(moved, cap, busy)])


def run_all(due: list[tuple[Moved, int | None, dispatch.Busy | None]]) -> None:
    """The effects of committed transitions, those each ``Moved`` says are due: the releases of one model
    are ONE dispatch step (slots and permits back, wake-ups, run times, the next jobs).  A move into pending
    is queued (app/jobs/dispatch.py ``queue``: one step per model); a busy answer's job keeps its slot, its
    permit goes back and it waits out its backoff first (``returned``: its scope's controller told)."""
    releases: dict[tuple[str, int | None], list] = {}
    for moved, cap, _busy in due:
        row = moved.row
        if moved.terminal:
            metrics.job_finished(row)
        if moved.release:
            releases.setdefault((row.model_name, cap), []).append((
                row.tenant_id, row.id, snapshot_message(row) if moved.terminal else None,
                estimates.ran_seconds(row) if moved.state == JobState.DONE else None,
                (STOPPING_PERMIT_SECONDS, row.attempt) if moved.stops_call else None))
    for (model, cap), jobs in releases.items():
        dispatch.finished(model, jobs, cap=cap)
    for moved, _cap, _busy in due:
        if moved.stops_call:  # its worker closes the call's connection (app/jobs/calls.py)
            publish_stop(moved.row.id, moved.row.attempt)
    queued, caps = [], {}
    for moved, cap, busy in due:
        for _ in range(moved.deliveries):  # a pump token per outbox row (a miss is the sweep's)
            publish_task(DELIVER_TASK, [])
        if moved.requeue and busy is not None:
            dispatch.returned(moved.row, busy, cap=cap)
        elif moved.requeue:
            queued.append(moved.row)
            if cap is not None:
                caps[moved.row.model_name] = cap
    dispatch.queue(queued, caps=caps)


def call_ended(model: str, tenant: str, job_id: str, attempt: int | None = None) -> None:
    """A call ended whose job was not this worker's to end any more (canceled, timed out, recovered: its
    ``attempt``, whose permits the ending kept as "<job>#<attempt>"), or a dispatch of a job that had already
    ended (no attempt): its permits go back and its charge settles now, at the call's real end (idempotent)."""
    dispatch.finished(model, [(tenant, job_id if attempt is None else f"{job_id}#{attempt}", None, None, None)])
