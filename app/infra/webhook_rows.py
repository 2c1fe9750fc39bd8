"""The webhook deliveries a terminal transition writes (issue 16 item 5).

Event names and their bits (asynch_task.webhook_events and
asynch_webhook_subscription.events hold an OR of them), and the INSERT ...
SELECT statements app/transitions.py runs in the SAME statement as the
terminal UPDATE (data-modifying CTEs over the moved row).

Invariants: a delivery row exists for a terminal state iff the transition
that reached it committed (same statement); there is at most one per
(job, receiver) (unique job_id, subscription_id; ON CONFLICT DO NOTHING),
and a job reaches one terminal state, so one event per receiver; a state
whose bit the receiver's filter lacks gets no row at all.
"""
from __future__ import annotations

from sqlalchemy import and_, literal, select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from app.infra.tables import webhook_deliveries, webhook_subscriptions
from app.states import JobState as S

EVENTS = ("done", "failed", "timeout", "canceled")
EVENT_BITS = {"done": 1, "failed": 2, "timeout": 4, "canceled": 8}
ALL_EVENTS = 15
EVENT_OF_STATE = {S.DONE: "done", S.FAILED: "failed", S.TIMEOUT: "timeout", S.CANCELED: "canceled",
                  S.EXPIRED: "failed"}  # expired: never run, an end like failed
JOB_OWN = 0  # subscription_id of the job's own webhook

_COLS = ["job_id", "tenant_id", "subscription_id", "event", "url", "status", "attempts", "next_attempt_at",
         "created_at", "updated_at"]


def bits_of(events) -> int:
    out = 0
    for e in events:
        out |= EVENT_BITS[e]
    return out


def events_of(bits: int | None) -> list[str]:
    return [e for e in EVENTS if (bits or 0) & EVENT_BITS[e]]


def inserts(source, to_state: S) -> list:
    """The INSERT ... SELECT statements for the row(s) of ``source`` (the
    moved CTE): the job's own webhook,
    and each of its tenant's subscriptions, whose filter has the event."""
    event = EVENT_OF_STATE[S(to_state)]
    bit = EVENT_BITS[event]
    c = source.c
    sub = webhook_subscriptions.c
    own = select(c.id, c.tenant_id, literal(JOB_OWN), literal(event), c.webhook_url, literal("pending"),
                 literal(0), c.updated_at, c.updated_at, c.updated_at).where(
        c.webhook_url.is_not(None), c.webhook_events.op("&")(bit) != 0)
    subs = select(c.id, c.tenant_id, sub.id, literal(event), sub.url, literal("pending"), literal(0),
                  c.updated_at, c.updated_at, c.updated_at).select_from(
        source.join(webhook_subscriptions, sub.tenant_id == c.tenant_id)).where(and_(sub.events.op("&")(bit) != 0))
    return [pg_insert(webhook_deliveries).from_select(_COLS, q).on_conflict_do_nothing(
        index_elements=["job_id", "subscription_id"]) for q in (own, subs)]
