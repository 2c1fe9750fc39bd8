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
    """The transitions a transaction won, (moved, cap, busy) each, whose effects are due after its commit; and the
    calls that ended without a transition of their own (``call_ended``)."""

    def __init__(self) -> None:
        super().__init__()
        self.ended: list[tuple[str, str, str, str | None]] = []
        self.pulled: dict[str, list[dispatch.Pulled]] = {}

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

    def call_ended(self, model: str, tenant: str, job_id: str, attempt: int | None = None) -> None:
        """A call ended whose job was not its worker's to end any more (canceled, timed out, recovered: its
        ``attempt``, whose permits the ending kept as "<job>#<attempt>"), or a pulled job never claimed (no
        attempt): its permits go back and its charge settles, at the call's real end (idempotent)."""
        self.ended.append((model, tenant, job_id if attempt is None else f"{job_id}#{attempt}", None))

    def give_back(self, model: str, tenant: str, job_id: str) -> None:
        """A pulled job its puller could not claim (the database away): back to the head of its queue, its
        permits and charge given back."""
        self.ended.append((model, tenant, job_id, "back"))


@contextmanager
def collecting(refill: dict[str, tuple[int, float]] | None = None) -> Iterator[Due]:
    """Collect won transitions; run their effects on a clean exit (enter it BEFORE the transaction, so the commit
    comes first).  ``refill``: model -> (the caller's call slots these ends freed, each taking the job the fair
    dispatcher picks then; their permits' lease) (a worker's writer); what they took is ``due.pulled`` after."""
    due = Due()
    yield due
    due.pulled = run_all(due, ended=due.ended, refill=refill)


def run(moved: Moved | None, cap: int | None = None, busy: dispatch.Busy | None = None) -> None:
    """The effects of one committed transition (run_all of one)."""
    if moved is not None:
        run_all([(moved, cap, busy)])


def run_all(due: list[tuple[Moved, int | None, dispatch.Busy | None]], *,
            ended: list[tuple[str, str, str, str | None]] = (),
            refill: dict[str, tuple[int, float]] | None = None) -> dict[str, list[dispatch.Pulled]]:
    """The effects of committed transitions, those each ``Moved`` says are due, and of calls that ``ended``
    (model, tenant, job or "<job>#<attempt>", keep: None or "back", ``Due.give_back``): a busy answer's job keeps its slot, its permit goes back and it
    waits out its backoff (``returned``: its scope's controller told); then the releases and call ends of one
    model are ONE dispatch step (slots and permits back, wake-ups, run times), which also takes, for the
    ``refill`` slots the caller freed, the jobs the ring picks now (returned, by model); a call someone else
    ended is told to stop; a move into pending is queued (``queue``: one step per model)."""
    for moved, cap, busy in due:
        if moved.requeue and busy is not None:
            dispatch.returned(moved.row, busy, cap=cap)
    releases: dict[str, list] = {}
    caps: dict[str, int] = {}
    for moved, cap, _busy in due:
        row = moved.row
        if cap is not None:
            caps[row.model_name] = cap
        if moved.terminal:
            metrics.job_finished(row)
        if moved.release:
            releases.setdefault(row.model_name, []).append((
                row.tenant_id, row.id, snapshot_message(row) if moved.terminal else None,
                estimates.ran_seconds(row) if moved.state == JobState.DONE else None,
                (STOPPING_PERMIT_SECONDS, row.attempt) if moved.stops_call else None))
    for model, tenant, job, keep in ended:
        releases.setdefault(model, []).append((tenant, job, None, None, keep))
    pulled = {}
    for model in sorted(set(releases) | {m for m, (n, _lease) in (refill or {}).items() if n > 0}):
        most, lease = (refill or {}).get(model, (0, 0.0))
        pulled[model] = dispatch.finished(model, releases.get(model, []), cap=caps.get(model), most=most,
                                          lease=lease)
    for moved, _cap, _busy in due:
        if moved.stops_call:  # its worker closes the call's connection (app/jobs/calls.py)
            publish_stop(moved.row.id, moved.row.attempt)
    queued = []
    for moved, _cap, busy in due:
        for _ in range(moved.deliveries):  # a pump token per outbox row (a miss is the sweep's)
            publish_task(DELIVER_TASK, [])
        if moved.requeue and busy is None:
            queued.append(moved.row)
    dispatch.queue(queued, caps=caps)
    return pulled


def call_ended(model: str, tenant: str, job_id: str, attempt: int | None = None) -> None:
    """``Due.call_ended`` of one call, now."""
    due = Due()
    due.call_ended(model, tenant, job_id, attempt)
    run_all([], ended=due.ended)
