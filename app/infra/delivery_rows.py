"""The outbox rows a terminal transition writes: event names and their bits (webhook_events and
a subscription's events hold an OR of them), and the INSERT ... SELECT statements app/transitions.py
runs in the SAME statement as the terminal UPDATE (CTEs over the moved row): the job's own webhook,
each of its tenant's subscriptions whose filter has the event, and on done its callback (seed 002).

Invariants: an outbox row exists for a terminal state iff the transition that reached it
committed; at most one per (job, kind, receiver) (unique; ON CONFLICT DO NOTHING), and a job
reaches one terminal state, so one event per receiver; a receiver whose filter lacks the state's
bit gets no row.  Which states are terminal is ``EVENT_OF_STATE``'s to say, nowhere else.
"""
from __future__ import annotations

from sqlalchemy import literal, select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from app.infra.tables import deliveries, webhook_subscriptions
from app.states import JobState as S

EVENTS = ("done", "failed", "timeout", "canceled")
EVENT_BITS = {"done": 1, "failed": 2, "timeout": 4, "canceled": 8}
EVENT_OF_STATE = {S.DONE: "done", S.FAILED: "failed", S.TIMEOUT: "timeout", S.CANCELED: "canceled",
                  S.EXPIRED: "failed"}  # expired: never run, an end like failed
JOB_OWN = 0  # subscription_id of the job's own webhook (and of a callback)
CALLBACK, WEBHOOK = "callback", "webhook"

_COLS = ["job_id", "tenant_id", "kind", "subscription_id", "event", "url", "status", "attempts", "next_attempt_at",
         "created_at", "updated_at"]


def bits_of(events) -> int:
    return sum(EVENT_BITS[e] for e in set(events))


def events_of(bits: int | None) -> list[str]:
    return [e for e in EVENTS if (bits or 0) & EVENT_BITS[e]]


def inserts(source, to_state: S) -> list:
    """The INSERT ... SELECT statements for the row(s) of ``source`` (the moved CTE) reaching ``to_state``."""
    event = EVENT_OF_STATE[S(to_state)]
    c, sub = source.c, webhook_subscriptions.c

    def row(kind: str, receiver, url):
        return [c.id, c.tenant_id, literal(kind), receiver, literal(event), url, literal("pending"), literal(0),
                c.updated_at, c.updated_at, c.updated_at]

    bit = EVENT_BITS[event]
    picks = [select(*row(WEBHOOK, literal(JOB_OWN), c.webhook_url)).where(
                 c.webhook_url.is_not(None), c.webhook_events.op("&")(bit) != 0),
             select(*row(WEBHOOK, sub.id, sub.url)).select_from(
                 source.join(webhook_subscriptions, sub.tenant_id == c.tenant_id)).where(sub.events.op("&")(bit) != 0)]
    if S(to_state) == S.DONE:  # the seed's callback; its full URL is frozen at the first attempt
        picks.append(select(*row(CALLBACK, literal(JOB_OWN), c.callback_url)).where(c.callback_url.is_not(None)))
    return [pg_insert(deliveries).from_select(_COLS, q).on_conflict_do_nothing(
        index_elements=["job_id", "kind", "subscription_id"]) for q in picks]
