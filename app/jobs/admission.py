"""Group-committed admission: the submissions that arrive while a batch is
in flight share the next one -- one Redis round trip for every queue-estimate
step (one per model and tenant), one for every gate step, one multi-row INSERT, and
(through the hand-off, app/jobs/handoff.py) one dispatch step and one LPUSH; each request waits on
its own event for its own answer.  Done one at
a time, the client libraries' per-call overhead and three serialised round
trips dominate (bench/bench_admission.py).  Batching is natural, not timed:
the committer takes whatever is queued the moment it is free.

Invariants (docs/architecture.md, invariants 1, 3, 4 and "The admission path"):
- Gate before row: a row is inserted only after its gate step admitted it;
  a batch's gate steps run in arrival order in one Lua step (gate_admit.lua).
- Row before message: a job goes to the hand-off only after its INSERT returned.
- A 202 only for a committed row; a refused, conflicting or failed item gets its error.
- No leaked slot: every admitted item whose row was not inserted has its
  slots released before its answer.
- A refusal's Retry-After is the estimator's (when one of the slots that
  refused it should free), capped; it costs a Redis read only on refusal.
- Retention before the gate: a capped model (max_completed) evicts its
  expired and least recently read completed jobs first (seed 000), never
  failing a submission for it.
- Deadlines before the gate: each item's estimate counts its tenant's
  earlier items of the batch; one that cannot meet its deadline is refused
  (429 deadline_unmeetable) with no slot taken and no row written.
- Fork: the committer thread and its queue are per process (app/infra/process.py).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis
from app.errors import DomainError, QueueFull, TenantQueueFull, Unavailable
from app.infra import tracing
from app.infra.db import single_statement
from app.infra.process import PerProcess
from app.infra.redis import gate
from app.infra.tables import tasks
from app.jobs import dispatch, estimates, handoff, retention

log = logging.getLogger(__name__)

MAX_BATCH = 256  # submissions per batch: bounds one INSERT's size and a batch's latency


class IdempotencyConflict(Exception):
    """The row lost an Idempotency-Key race to another row (the caller replays)."""


@dataclass(eq=False)
class Submission:
    """One admitted-or-not job: what its gate step and its row need."""
    values: dict[str, Any]                # the asynch_task row
    queue_limit: int                      # the model's configured cap
    tenant_cap: int                       # the tenant's share of it
    retry_after: int                      # a 429's Retry-After when the estimator cannot say
    max_completed: int = 0                # the model's cap on kept done/claimed jobs (0: none)
    model_row: Any = None                 # its model (name, max_concurrency, expected_seconds): the estimate's
    want_estimate: bool = True            # the 202 shows it (a job with a deadline is estimated anyway)
    event: threading.Event = field(default_factory=threading.Event)
    row: Any = None
    error: BaseException | None = None
    estimate: Any = None                  # estimates.Estimate: where it stood in line (None: not asked, Redis away)

    job_id = property(lambda self: self.values["id"])
    model = property(lambda self: self.values["model_name"])
    tenant = property(lambda self: self.values["tenant_id"])

    @property
    def score(self) -> float:
        """Its place in its tenant's ready queue (app/jobs/dispatch.py entry)."""
        return dispatch.entry(self.values)[2]


class _Committer:
    """This process's admission queue and the one thread that commits it."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[Submission] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="asynch-admission", daemon=True).start()

    def _run(self) -> None:
        while True:
            batch = [self.queue.get()]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            admit_many(batch)


_committer: PerProcess[_Committer] = PerProcess(_Committer)

# A request waits at most this long for its batch: far above any batch's
# round trips; past it something is wedged, and a 503 is the honest answer.
WAIT_SECONDS = 30.0


def admit(sub: Submission) -> Any:
    """Queue ``sub`` for the next batch and wait for its answer: the committed
    row, or the error (QueueFull, TenantQueueFull, Unavailable, IdempotencyConflict, the database's)."""
    _committer.get().queue.put(sub)
    if not sub.event.wait(WAIT_SECONDS):
        # Not answered: it may still be committed later.  The row is the truth
        # and its job runs; the caller is told we do not know.
        raise Unavailable("admission did not answer in time")
    if sub.error is not None:
        raise sub.error
    return sub.row


def admit_many(subs: list[Submission]) -> None:
    """Commit ``subs`` as one batch in the caller's thread (a batch submit's
    own); each is answered (``row`` or ``error``) before this returns."""
    if not subs:
        return
    try:
        commit_batch(subs)
    except BaseException:  # never leave a request waiting
        log.exception("admission batch failed")
        for s in subs:
            if not s.event.is_set():
                _answer(s, error=s.error or Unavailable("admission failed"))


def _answer(sub: Submission, *, row: Any = None, error: BaseException | None = None) -> None:
    sub.row, sub.error = row, error
    sub.event.set()


def commit_batch(batch: list[Submission]) -> None:
    """Gate, INSERT and hand-off for ``batch`` (in arrival order), after each capped
    model's retention (bounded, best effort); every submission is answered before this returns."""
    retention.at_admission({s.model: s.max_completed for s in batch if s.max_completed > 0}.items())
    batch = _estimated(batch)
    if not batch:
        return
    t0 = time.time()
    try:
        decisions = gate.gate_admit_many([(s.model, s.tenant, s.job_id, s.queue_limit, s.tenant_cap) for s in batch])
    except redis.RedisError as exc:
        log.warning("admission gate unavailable: %s", exc)
        for s in batch:
            _answer(s, error=Unavailable("admission gate unavailable"))
        return
    admitted = [s for s, d in zip(batch, decisions) if d.admitted]
    t1 = time.time()
    _refuse_full([(s, d) for s, d in zip(batch, decisions) if not d.admitted])
    if not admitted:
        return
    try:
        rows = _insert([s.values for s in admitted])
    except Unavailable as exc:  # the database is away: nobody's row is in
        for s in admitted:
            _refuse(s, exc)
        return
    except Exception:
        # One row the database refused must not fail its neighbours (another
        # tenant's request, perhaps): each row alone, each with its own answer.
        rows = {}
        for s in admitted:
            try:
                rows.update(_insert([s.values]))
            except Exception as exc:
                if not isinstance(exc, Unavailable):  # not a domain error: the one handler answers 500
                    log.error("admission INSERT failed: %s", exc)
                _refuse(s, exc)
    for s in admitted:
        if not s.event.is_set() and s.job_id not in rows:  # its Idempotency-Key was taken by another row
            _refuse(s, IdempotencyConflict())
    committed = [s for s in admitted if not s.event.is_set()]
    if tracing.enabled():  # the gate step and the INSERT, a span of each job's trace
        t2, done = time.time(), [rows[s.job_id] for s in committed]
        tracing.record_many("asynch.admission", done, t0, t2, {"asynch.batch": len(batch),
                                                                "asynch.gate.seconds": t1 - t0,
                                                                "asynch.insert.seconds": t2 - t1})
    # After the commit: the batch's jobs join their tenants' queues as one
    # group (the hand-off never splits a group).
    handoff.send_many([(s.model, dispatch.entry(rows[s.job_id])) for s in committed])
    for s in committed:
        _answer(s, row=rows[s.job_id])


def _estimated(batch: list[Submission]) -> list[Submission]:
    """Estimate each (model, tenant) group, in arrival order (each item behind
    the group's earlier ones), all groups in one round trip; answer those that
    cannot meet their deadline; return the rest."""
    groups: dict[tuple[str, str], list[Submission]] = {}
    for s in batch:
        groups.setdefault((s.model, s.tenant), []).append(s)
    asked = [subs for subs in groups.values()
             if subs[0].model_row is not None and any(s.want_estimate or s.values.get("caller_deadline_at")
                                                       for s in subs)]
    found = estimates.for_new_many([(subs[0].model_row, subs[0].tenant, [s.score for s in subs]) for subs in asked])
    for subs, ests in zip(asked, found):
        for s, est in zip(subs, ests or [None] * len(subs)):
            s.estimate = est
            try:
                estimates.refuse_late(est, s.values.get("caller_deadline_at"))
            except DomainError as exc:
                _answer(s, error=exc)
    return [s for s in batch if not s.event.is_set()]


def _refuse_full(refused: list[tuple[Submission, Any]]) -> None:
    """Answer the items the gate refused (429) with the estimator's Retry-After: the time until one of
    the slots that refused it frees (app/jobs/estimates.py ``retry_after``).  Items estimated before
    the gate use that reading; the others' (model, tenant) groups are read in one round trip, only
    on this path; when Redis cannot say, the model's configured figure (``Submission.retry_after``)."""
    unread: dict[tuple[str, str], Submission] = {}
    for s, _d in refused:
        if s.estimate is None and s.model_row is not None:
            unread.setdefault((s.model, s.tenant), s)
    found = estimates.for_new_many([(s.model_row, s.tenant, [s.score]) for s in unread.values()]) if unread else []
    fresh = {key: (ests or [None])[0] for key, ests in zip(unread, found)}
    for s, d in refused:
        by_tenant = d.refused_by == "tenant"
        after = estimates.retry_after(s.estimate or fresh.get((s.model, s.tenant)), by_tenant, s.retry_after)
        _answer(s, error=TenantQueueFull(s.tenant, d.limit, after) if by_tenant else QueueFull(d.limit, after))


def _refuse(sub: Submission, error: BaseException) -> None:
    """An admitted item whose row is not in: its slots back, then its answer."""
    release_slot(sub.model, sub.tenant, sub.job_id)
    _answer(sub, error=error)


def release_slot(model: str, tenant: str, job_id: str) -> None:
    """Give back the gate slots of a job whose row was never committed (or
    never moved: a readmit that lost its CAS).  Best effort: reconcile repairs a miss."""
    try:
        gate.gate_release(model, tenant, job_id)
    except redis.RedisError:
        log.warning("slot release failed; reconcile will repair it", extra={"job_id": job_id})


_COLUMNS = ("id", "tenant_id", "creator", "model_name", "biz_name", "callback_url", "model_key", "request_payload",
            "request_hash", "passthrough_headers", "idempotency_key", "state", "attempt", "retry_count", "created_at",
            "enqueue_at", "updated_at", "deadline_at", "priority", "webhook_url", "webhook_events",
            "caller_deadline_at", "payload_file_id", "traceparent", "tracestate")
# Columns a submission may leave out (the table's server defaults).
_DEFAULTS = {"priority": 5, "webhook_url": None, "webhook_events": None, "caller_deadline_at": None,
             "payload_file_id": None, "traceparent": None, "tracestate": None}


def _insert(values: list[dict[str, Any]]) -> dict[str, Any]:
    """One multi-row INSERT ... RETURNING (its own transaction); the rows
    inserted, by id.  The VALUES are rendered by the driver (``mogrify``):
    compiling a Core insert of that many rows cost more than the round trip."""
    with single_statement() as conn:
        with conn.connection.dbapi_connection.cursor() as cur:
            rendered = b",".join(cur.mogrify(_ROW_TEMPLATE, tuple(v.get(c, _DEFAULTS.get(c)) for c in _COLUMNS))
                                 for v in values)
        # SQLAlchemy hands the driver an empty parameter mapping, so psycopg2
        # still reads "%" as a placeholder: a "%s" in a payload or a header
        # raised TypeError (a 500, found by schemathesis).  "%%" is one "%".
        sql = _INSERT_HEAD + rendered.decode().replace("%", "%%") + _INSERT_TAIL
        return {r.id: r for r in conn.exec_driver_sql(sql)}


_ROW_TEMPLATE = "(" + ", ".join(["%s"] * len(_COLUMNS)) + ")"
_INSERT_HEAD = f"INSERT INTO asynch_task ({', '.join(_COLUMNS)}) VALUES "
# The partial unique index's target (revision 0005): a row whose key is taken is skipped, not an error.
_INSERT_TAIL = (" ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"
                " RETURNING " + ", ".join(c.name for c in tasks.c))

