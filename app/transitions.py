"""Every change of a job's state, each one conditional UPDATE ... RETURNING.

The row is the truth (docs/architecture.md, invariant 2): a transition names
the states it may start from and, where a worker's attempt is involved, the
attempt it expects; whoever gets the row back owns the transition and its
side effects, everyone else gets ``None``.  Nothing here reads a row and
writes it back.  A move out of pending/running returns a ``Moved`` (the row
and the after-commit effects it implies), which callers hand to
app/jobs/effects.py, the one module that runs them.

A move into a terminal state writes its outbox rows (webhooks; on done the
callback) in the same statement (app/infra/delivery_rows.py), and an attempt
that ends appends its row to asynch_task_attempt in it too: only the winner
writes them, exactly once.  A transition the state machine does not allow
raises IllegalTransition before touching the database (a bug, not a race).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Iterable, Sequence

from sqlalchemy import (BigInteger, DateTime, Integer, LargeBinary, String, Text, bindparam, cast, delete, func, insert,
                        literal, literal_column, or_, select, update)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Connection, Row
from sqlalchemy.sql.elements import ClauseElement

from app.clock import now as clock_now
from app.errors import IllegalTransition
from app.infra import delivery_rows
from app.infra.tables import deliveries, models, task_attempts, tasks
from app.states import RESULT_STATES, TERMINAL_STATES, job_error
from app.states import JobState as S

# The retention of a claimed result whose model row is gone (the column's default).
DEFAULT_KEEP_SECONDS = 3600

# The state machine (docs/architecture.md, "Job states"), and nothing else.  running -> pending: a busy upstream
# (no retry spent); retry_wait -> timeout: it still has a budget; pending/retry_wait -> failed: an admin's fail (seed
# 000: any non-terminal state can be ended); pending -> expired: its caller's deadline passed before it started.
ALLOWED: frozenset[tuple[S, S]] = frozenset((a, b) for a, targets in {
    S.PENDING: (S.RUNNING, S.CANCELED, S.TIMEOUT, S.FAILED, S.EXPIRED),
    S.RUNNING: (S.DONE, S.FAILED, S.TIMEOUT, S.RETRY_WAIT, S.PENDING, S.CANCELED),
    S.RETRY_WAIT: (S.PENDING, S.CANCELED, S.TIMEOUT, S.FAILED),
    S.DONE: (S.CLAIMED,),
}.items() for b in targets)


@dataclass(frozen=True)
class Moved:
    """A transition this caller won: ``row`` as it now is, and which after-commit effects are due."""
    row: Row
    release: bool      # the job left pending/running: its gate slots and permit go back
    terminal: bool     # it ended: waiters wake with its snapshot, the finish is counted
    deliveries: int    # outbox rows the same statement wrote (their doorbell rings)
    requeue: bool = False  # back to pending (a retry re-admitted, a busy answer): queued by the effects
    stops_call: bool = False  # it ended an attempt whose call may still run elsewhere: that call is stopped

    @property
    def state(self) -> S:
        return S(self.row.state)


def _moved(row: Row | None, *, stops_call: bool = False) -> Moved | None:
    """What a won move out of pending/running implies; None stays None.  ``stops_call``: the caller is not the
    attempt's own worker (a cancel, a timeout, recovery): a call still running for it is stopped (the
    statement's ``call_open`` says whether one was running)."""
    if row is None:
        return None
    return Moved(row=row, release=True, terminal=S(row.state) in TERMINAL_STATES,
                 deliveries=int(getattr(row, "deliveries_queued", 0) or 0),
                 stops_call=stops_call and bool(getattr(row, "call_open", 1)))


def check_allowed(from_states: Iterable[S], to_state: S) -> None:
    for s in from_states:
        if (S(s), S(to_state)) not in ALLOWED:
            raise IllegalTransition(f"transition {S(s).label} -> {S(to_state).label} is not allowed")


def _cas(conn: Connection, job_id: str, from_states: Sequence[S], to_state: S, *, attempt: int | None = None,
         where: Sequence = (), values: dict | None = None, alongside: tuple | None = None,
         log_attempt: bool | str = False) -> Row | None:
    """The one writer of ``state``.  ``log_attempt``: the running attempt ends
    here, logged by the same statement (``"open"``: only if one is running and
    not logged yet).  ``alongside``: (statement, params) of another write that
    must commit with this one (a model call's usage count), in ONE statement,
    whether or not the guard matches: it records what happened, not who owns the row."""
    check_allowed(from_states, to_state)
    vals = {"state": int(to_state), "updated_at": clock_now()}
    if S(to_state) in TERMINAL_STATES:
        # The OSS pass-through credentials are only needed for an upload, the
        # job's modelKey header values only for a model call: neither stays at rest.
        vals.update(passthrough_headers=None, model_key=None)
    vals.update(values or {})
    states = tuple(int(s) for s in from_states)
    # A value that is SQL (a column of the row itself) is part of the statement, not a parameter.
    exprs = {k: str(v) for k, v in vals.items() if isinstance(v, ClauseElement)}
    # A terminal state writes its outbox rows with the transition itself
    # (app/infra/delivery_rows.py): never lost, never twice.
    hooks = S(to_state) if S(to_state) in delivery_rows.EVENT_OF_STATE else None
    side, side_params = alongside or (None, {})
    # Hot paths: one statement per shape, built once, values as parameters.  Maintenance guards
    # (``where``) carry their own literals: built per call (rare).
    key = None if where else (states, attempt is not None, tuple(sorted(vals)), tuple(sorted(exprs.items())), id(side),
                              log_attempt, hooks)
    stmt = _STATEMENTS.get(key)
    if stmt is None:
        # UPDATE asynch_task WHERE id = :_id AND state IN (...) [AND attempt = :_attempt]
        stmt = update(tasks).where(tasks.c.id == bindparam("_id"))
        stmt = stmt.where(tasks.c.state == states[0]) if len(states) == 1 else stmt.where(tasks.c.state.in_(states))
        if attempt is not None:
            stmt = stmt.where(tasks.c.attempt == bindparam("_attempt"))
        stmt = stmt.where(*where).values({k: vals[k] if k in exprs else bindparam(f"v_{k}") for k in vals}
                                         ).returning(*tasks.c)
        if side is not None or log_attempt or hooks is not None:
            stmt = _combined(stmt, side, log_attempt, hooks)
        if key is not None:
            _STATEMENTS[key] = stmt
    params = {f"v_{k}": v for k, v in vals.items() if k not in exprs} | {"_id": job_id, "_attempt": attempt}
    return conn.execute(stmt, params | side_params).first()


_ATTEMPT_COLS = ("job_id", "attempt", "worker", "started_at", "ended_at", "outcome", "error", "error_detail")
_STATEMENTS: dict[tuple, object] = {}


def _combined(stmt, side, log_attempt: bool | str, hooks: S | None):
    """WITH moved AS (<the CAS> RETURNING *) [, side AS (<side>)] [, logged AS
    (INSERT INTO asynch_task_attempt ... FROM moved)] [, hook0.. AS (INSERT the
    outbox rows FROM moved)] SELECT moved.*[, <rows inserted> AS deliveries_queued]
    FROM moved.  PostgreSQL runs every data-modifying CTE exactly once: the log
    and the deliveries commit with the transition or not at all."""
    moved = stmt.cte("moved")
    cols = [moved]
    ctes = []
    if side is not None:
        ctes.append(side.returning(literal_column("1")).cte("side"))
    if log_attempt:
        c = moved.c
        rows = select(c.id, c.attempt, c.worker, c.started_at, c.updated_at, c.state, c.error, c.error_detail)
        if log_attempt == "open":  # the statement's snapshot: earlier attempts' rows are committed
            logged = select(task_attempts.c.id).where(task_attempts.c.job_id == c.id,
                                                      task_attempts.c.attempt == c.attempt)
            rows = rows.where(c.attempt > 0, ~logged.exists())
        log = insert(task_attempts).from_select(list(_ATTEMPT_COLS), rows)
        logged = log.returning(literal_column("1")).cte("logged")
        ctes.append(logged)
        if log_attempt == "open":  # whether an attempt was running: its call is to be stopped
            cols.append(select(func.count()).select_from(logged).scalar_subquery().label("call_open"))
    if hooks is not None:
        made = [ins.returning(deliveries.c.id).cte(f"hook{i}")
                for i, ins in enumerate(delivery_rows.inserts(moved, hooks))]
        ctes.extend(made)
        counted = [select(func.count()).select_from(h).scalar_subquery() for h in made]
        cols.append(sum(counted[1:], counted[0]).label("deliveries_queued"))
    return select(*cols).add_cte(*ctes)


def _group(*cols) -> object:
    """``unnest(CAST(:g_<name> AS <type>[]), ...) AS g(<name>, ...)``: one row per job of a group, each
    column one array parameter (one statement shape whatever the group's size)."""
    return func.unnest(*[cast(bindparam(f"g_{n}"), ARRAY(t)) for n, t in cols]).table_valued(
        *[n for n, _ in cols]).render_derived(name="g")


_CLAIMS = _group(("id", String), ("attempt", Integer))
_CLAIM = (update(tasks).where(tasks.c.id == _CLAIMS.c.id, tasks.c.attempt == _CLAIMS.c.attempt,
                              tasks.c.state == int(S.PENDING))
          .values(state=int(S.RUNNING), attempt=tasks.c.attempt + 1, started_at=bindparam("v_now"),
                  updated_at=bindparam("v_now"), lease_expires_at=bindparam("v_lease"), worker=bindparam("v_worker"))
          .returning(*tasks.c))
# The same, but not for a job whose caller's deadline passed while it waited (it is to expire, never to run).
_CLAIM_IN_TIME = _CLAIM.where(or_(tasks.c.caller_deadline_at.is_(None), tasks.c.caller_deadline_at >= bindparam("v_now")))


def claim_group(conn: Connection, jobs: Sequence[tuple[str, int]], lease_until: datetime,
                worker: str | None = None, *, before_caller_deadline: bool = False) -> list[Row]:
    """pending -> running for each (job_id, the attempt it was pulled or published at) of a worker's group, in
    ONE statement (one commit: every claim is durable before any of its calls).  Returns the rows it moved;
    a job no longer pending at that attempt is left out (it must not run), and with ``before_caller_deadline``
    one past its caller's deadline too.  ``worker``: the node."""
    check_allowed([S.PENDING], S.RUNNING)
    jobs = dict(jobs)  # a job named twice is claimed once
    if not jobs:
        return []
    return list(conn.execute(_CLAIM_IN_TIME if before_caller_deadline else _CLAIM, {
        "g_id": list(jobs), "g_attempt": list(jobs.values()), "v_now": clock_now(), "v_lease": lease_until,
        "v_worker": worker}).all())


def claim(conn: Connection, job_id: str, attempt: int, lease_until: datetime, worker: str | None = None) -> Row | None:
    """A group of one (claim_group)."""
    return next(iter(claim_group(conn, [(job_id, attempt)], lease_until, worker)), None)


# A worker's claim of pulled jobs, with their model's row read in the same statement (a model deleted or changed a
# moment ago is seen so, and the lease follows the timeout the call will use): the claim as a CTE, its lease
# from the job's model (``v_grace`` seconds past its timeout; 60 s for a model gone), the claimed rows joined
# back to their model, whose columns come as ``m_<name>`` (``m_id`` NULL: the model is gone).
_MODEL_TIMEOUT = (select(models.c.timeout_seconds).where(models.c.model_name == tasks.c.model_name)
                  .scalar_subquery())
_CLAIMED = (_CLAIM_IN_TIME.values(lease_expires_at=bindparam("v_now") + func.make_interval(
    0, 0, 0, 0, 0, 0, func.coalesce(_MODEL_TIMEOUT, 60) + bindparam("v_grace", type_=Integer)))
    .cte("claimed"))
_CLAIM_WITH_MODEL = (select(*_CLAIMED.c, *[c.label(f"m_{c.name}") for c in models.c])
                     .select_from(_CLAIMED.outerjoin(models, models.c.model_name == _CLAIMED.c.model_name)))


def claim_pulled(conn: Connection, jobs: Sequence[tuple[str, int]], grace_seconds: float,
                 worker: str | None = None) -> list[Row]:
    """claim_group(before_caller_deadline=True) for jobs a worker's free slots pulled, with each job's model row
    (``m_*`` columns) from the same statement and the lease its timeout plus ``grace_seconds``."""
    check_allowed([S.PENDING], S.RUNNING)
    jobs = dict(jobs)
    if not jobs:
        return []
    return list(conn.execute(_CLAIM_WITH_MODEL, {
        "g_id": list(jobs), "g_attempt": list(jobs.values()), "v_now": clock_now(), "v_grace": int(grace_seconds),
        "v_worker": worker}).all())


@dataclass(frozen=True)
class Done:
    """One attempt's answer, for complete_group.  ``inline``: the result itself, kept in the row
    (``location`` is then ``inline:``)."""
    job_id: str
    attempt: int
    location: str
    content_type: str
    size: int
    inline: bytes | None = None


_DONES = _group(("id", String), ("attempt", Integer), ("location", Text), ("content_type", String),
                ("size", BigInteger), ("inline", LargeBinary))
_DONE = (update(tasks).where(tasks.c.id == _DONES.c.id, tasks.c.attempt == _DONES.c.attempt,
                             tasks.c.state == int(S.RUNNING))
         .values(state=int(S.DONE), updated_at=bindparam("v_now"), finished_at=bindparam("v_now"),
                 lease_expires_at=None, error=None, error_detail=None, passthrough_headers=None, model_key=None,
                 result_location=_DONES.c.location, result_content_type=_DONES.c.content_type,
                 result_size=_DONES.c.size, result_inline=_DONES.c.inline)
         .returning(*tasks.c))


def complete_group(conn: Connection, done: Sequence[Done], *, alongside: tuple | None = None) -> list[Moved]:
    """running -> done for each attempt of ``done`` that still holds its row, with every attempt's log row
    and outbox rows, in ONE statement (app/jobs/execution.py's writer: one commit per group of finished
    calls).  Returns the moves won; the outbox rows' count rides on the first (one doorbell each)."""
    check_allowed([S.RUNNING], S.DONE)
    if not done:
        return []
    side = alongside[0] if alongside else None
    stmt = _STATEMENTS.get(("done", id(side)))
    if stmt is None:
        stmt = _STATEMENTS[("done", id(side))] = _combined(_DONE, side, True, S.DONE)
    params = {f"g_{k}": [getattr(d, f) for d in done] for k, f in (
        ("id", "job_id"), ("attempt", "attempt"), ("location", "location"), ("content_type", "content_type"),
        ("size", "size"), ("inline", "inline"))}
    moved = [_moved(row) for row in conn.execute(stmt, params | {"v_now": clock_now()} | (alongside or (0, {}))[1])]
    return [m if i == 0 else Moved(m.row, m.release, m.terminal, 0) for i, m in enumerate(moved)]


def complete(conn: Connection, job_id: str, attempt: int, *, location: str, content_type: str, size: int,
             inline: bytes | None = None, alongside: tuple | None = None) -> Moved | None:
    """A group of one (complete_group)."""
    won = complete_group(conn, [Done(job_id, attempt, location, content_type, size, inline)], alongside=alongside)
    return won[0] if won else None


def fail_attempt(
    conn: Connection, job_id: str, attempt: int, error: str,
    *, retry_at: datetime | None, lease_expired_before: datetime | None = None, worker_gone: str | None = None,
    alongside: tuple | None = None, detail: str | None = None,
) -> Moved | None:
    """running -> retry_wait (retry_at given) or failed.  ``error``: what the
    tenant sees (app/states.py job_error); ``detail``: the internals, for admin views.  Recovery:
    only if the lease ran out before ``lease_expired_before`` / node ``worker_gone`` still holds it."""
    where = []
    if lease_expired_before is not None:
        where.append(tasks.c.lease_expires_at < lease_expired_before)
    if worker_gone is not None:
        where.append(tasks.c.worker == worker_gone)
    values = {"error": error[:4000], "error_detail": detail[:4000] if detail else None, "lease_expires_at": None}
    values |= {"next_retry_at": retry_at} if retry_at is not None else {"finished_at": clock_now()}
    return _moved(_cas(conn, job_id, [S.RUNNING], S.RETRY_WAIT if retry_at is not None else S.FAILED,
                       attempt=attempt, where=where, values=values, alongside=alongside, log_attempt=True),
                  stops_call=bool(where))  # recovery's: the worker may live on (paused, partitioned)


def return_busy(conn: Connection, job_id: str, attempt: int, error: str, *, busy_count: int,
                detail: str | None = None, alongside: tuple | None = None) -> Moved | None:
    """running -> pending: the model's upstream answered busy (429/503).  It
    keeps its gate slot and goes back to the head of its tenant's queue (its
    queue time its creation, ``promoted_at`` now: app/jobs/dispatch.py entry);
    the effects set it aside for its backoff first.  ``busy_count``: the row's + 1, so no retry is spent."""
    now = clock_now()
    row = _cas(conn, job_id, [S.RUNNING], S.PENDING, attempt=attempt, alongside=alongside, log_attempt=True,
               values={"busy_count": busy_count, "lease_expires_at": None, "error": error[:4000],
                       "error_detail": detail and detail[:4000], "enqueue_at": tasks.c.created_at,
                       "promoted_at": now})
    return None if row is None else Moved(row=row, release=False, terminal=False, deliveries=0, requeue=True)


def readmit(conn: Connection, job_id: str, attempt: int, enqueue_at: datetime,
            *, retries: int, promoted_at: datetime | None = None) -> Moved | None:
    """retry_wait -> pending (the caller holds a gate slot for it); the effects queue it.
    ``promoted_at``: at the head at once (retry_queue_max_seconds = 0, ``enqueue_at`` its creation); None: at
    the tail until the promotion pass.  ``retries``: ``attempt - busy_count``."""
    row = _cas(conn, job_id, [S.RETRY_WAIT], S.PENDING, attempt=attempt, values={
        "retry_count": retries, "enqueue_at": enqueue_at, "next_retry_at": None, "promoted_at": promoted_at})
    return None if row is None else Moved(row=row, release=False, terminal=False, deliveries=0, requeue=True)


def mark_promoted(conn: Connection, job_id: str, attempt: int, *, now: datetime) -> Row | None:
    """A waiting retry moves to the head of its tenant's queue (not a state change): its queue time becomes
    its creation and ``promoted_at`` marks it, once; ``updated_at`` restarts the lost-message clock.  Returns
    the row to queue (app/jobs/dispatch.py entry), or None if the job moved on or was promoted already."""
    stmt = update(tasks).where(tasks.c.id == job_id, tasks.c.state == int(S.PENDING), tasks.c.attempt == attempt,
                               tasks.c.promoted_at.is_(None))
    return conn.execute(stmt.values(updated_at=now, promoted_at=now, enqueue_at=tasks.c.created_at)
                        .returning(*tasks.c)).first()


def mark_read(conn: Connection, job_ids: Sequence[str], *, now: datetime) -> None:
    """done/claimed results were read (not a state change): ``last_read_at``,
    the order max_completed evicts in.  Rows another transaction holds are skipped (SKIP LOCKED):
    reads never wait for or deadlock with claims.  Autocommit, after any claim committed."""
    if not job_ids:
        return
    where = [tasks.c.id.in_(list(job_ids)), tasks.c.state.in_([int(s) for s in RESULT_STATES])]
    free = select(tasks.c.id).where(*where).with_for_update(skip_locked=True).scalar_subquery()
    conn.execute(update(tasks).where(tasks.c.id.in_(free)).values(last_read_at=now))


def purge_many(conn: Connection, job_ids: Sequence[str], states: Sequence[S], older_than,
               before: datetime) -> list[Row]:
    """Hard-delete the jobs of ``job_ids`` still in ``states`` with ``older_than``
    before ``before`` (one DELETE, after cleanup deleted their objects: only rows still as it
    judged them).  Returns their id, state and result location."""
    if not job_ids:
        return []
    stmt = delete(tasks).where(tasks.c.id.in_(list(job_ids)), tasks.c.state.in_([int(x) for x in states]),
                               older_than < before)
    return list(conn.execute(stmt.returning(tasks.c.id, tasks.c.state, tasks.c.result_location)).all())


def _end_active(conn: Connection, job_id: str, to_state: S, error: str, *, now: datetime | None = None,
                where: Sequence = (), **values) -> Moved | None:
    """pending/running/retry_wait -> ``to_state``; a running attempt is logged
    and its late writes are refused by the attempt guard."""
    return _moved(_cas(conn, job_id, [S.PENDING, S.RUNNING, S.RETRY_WAIT], to_state, where=where, log_attempt="open",
                       values={"finished_at": now or clock_now(), "lease_expires_at": None, "error": error, **values}),
                  stops_call=True)


def cancel(conn: Connection, job_id: str, tenant_id: str | None) -> Moved | None:
    return _end_active(conn, job_id, S.CANCELED, job_error("canceled", "canceled by client"),
                       where=[] if tenant_id is None else [tasks.c.tenant_id == tenant_id])


def fail_by_admin(conn: Connection, job_id: str, reason: str) -> Moved | None:
    """-> failed by an admin (beside cancel: the job ends as a failure, e.g. a poisoned payload)."""
    return _end_active(conn, job_id, S.FAILED, (f"failed by admin: {reason}" if reason else "failed by admin")[:4000],
                       next_retry_at=None)


def time_out(conn: Connection, job_id: str, *, now: datetime) -> Moved | None:
    """Past the job's budget -> timeout."""
    return _end_active(conn, job_id, S.TIMEOUT, job_error("job_timeout", "job budget exceeded"), now=now,
                       where=[tasks.c.deadline_at < now])


def expire(conn: Connection, job_id: str, *, now: datetime) -> Moved | None:
    """pending past its caller's deadline (X-Deadline) -> expired, never run."""
    return _moved(_cas(conn, job_id, [S.PENDING], S.EXPIRED, where=[tasks.c.caller_deadline_at < now], values={
        "finished_at": now, "error": job_error("deadline_expired", "not started before its deadline")}))


def claim_results(conn: Connection, job_ids: Sequence[str], tenant_id: str | None,
                  returning: Sequence = tuple(tasks.c)) -> list[Row]:
    """done -> claimed for every job of ``job_ids`` still done (and of
    ``tenant_id``, unless None), in one UPDATE, expire_at = now + the model's auto_clean_seconds
    (DEFAULT_KEEP_SECONDS: model gone).  Rows are locked in id order first, so overlapping
    batches queue instead of deadlocking; the loser skips rows no longer done.  Returns only the
    rows this call moved (each claimed once); ``returning``: the columns (not the payloads)."""
    check_allowed([S.DONE], S.CLAIMED)
    if not job_ids:
        return []
    where = [tasks.c.id.in_(list(job_ids)), tasks.c.state == int(S.DONE)]
    if tenant_id is not None:
        where.append(tasks.c.tenant_id == tenant_id)
    now = clock_now()
    locked = select(tasks.c.id).where(*where).order_by(tasks.c.id).with_for_update()
    # Correlated to the row being updated: one primary-key probe of asynch_models per row.
    keep = select(models.c.auto_clean_seconds).where(models.c.model_name == tasks.c.model_name).scalar_subquery()
    stmt = (update(tasks).where(tasks.c.id.in_(locked.scalar_subquery()), tasks.c.state == int(S.DONE))
            .values(state=int(S.CLAIMED), updated_at=now, claimed_at=now, last_read_at=now,
                    expire_at=literal(now, DateTime(timezone=True))
                    + func.make_interval(0, 0, 0, 0, 0, 0, func.coalesce(keep, DEFAULT_KEEP_SECONDS)))
            .returning(*returning))
    return list(conn.execute(stmt).all())

