"""Live numbers per model (the console's models page, /metrics/cluster),
throughput and P90 latency over a window.  Reads only, at request time.

Invariants:
- The cost of a read does not grow with the backlog or the history.  Pending
  and running come from the Redis gates (``gate.slot_split``), which hold
  exactly the jobs admission let in and the transitions have not released:
  the gate IS the admission truth, what a caller is refused against.  A
  count may be off by a job mid-transition (a slot taken before its row
  commits, a row claimed before its worker tells the dispatcher, a slot
  released just after its row left the state), or by what a wiped Redis lost
  until recovery rebuilds it; reconcile makes the gates equal the rows again
  within a pass (docs/architecture.md, invariants 1 and 4).
- Retry_wait (no slot) and terminal states are counted on their rows, one
  index range per model and state (``ix_asynch_task_model_state``):
  retry_wait exactly (bounded by the failures waiting out their delay, not
  by the backlog), terminal states up to a cap; never a GROUP BY.
- The queue's head is one probe per model with pending jobs, on the
  per-model pending partial index (revision 0023).
- With Redis away, ``job_counts`` (one GROUP BY on the rows, the one read
  whose cost grows with the backlog) is the fallback of /metrics/cluster.
"""
from __future__ import annotations

import calendar
from datetime import datetime, timedelta, timezone
from decimal import Decimal

from sqlalchemy import bindparam, func, select, text

from app.clock import as_utc, now as clock_now
from app.infra.db import transaction
from app.infra.redis import gate, upstream
from app.infra.tables import models, tasks
from app.states import ACTIVE_STATES, JobState


def job_counts(conn) -> dict[tuple[str, str], int]:
    """(model, state label) -> rows of the active states: one GROUP BY on
    ix_asynch_task_model_state (what the gates replace; the fallback with Redis away)."""
    q = (select(tasks.c.model_name, tasks.c.state, func.count())
         .where(tasks.c.state.in_([int(s) for s in ACTIVE_STATES])).group_by(tasks.c.model_name, tasks.c.state))
    return {(m, JobState(s).label): n for m, s, n in conn.execute(q)}


# Per (model, state) of the arrays: its rows, at most its cap (NULL: LIMIT ALL).  One statement; the
# subquery's model and state are parameters, so the planner cannot match a partial index on one state
# (whose scan walks every model's rows of that state) and ranges ix_asynch_task_model_state, index-only.
_COUNTS = """
SELECT q.m, q.s, (SELECT count(*) FROM (SELECT 1 FROM {table} AS t
                  WHERE t.model_name = q.m AND t.state = q.s {tenant} LIMIT q.cap) AS r)
FROM unnest(CAST(:models AS text[]), CAST(:states AS smallint[]), CAST(:caps AS bigint[])) AS q(m, s, cap)
"""
# Per model of the array: the enqueue_at of its oldest pending row, the first entry of its range of
# ix_asynch_task_pending_model_enqueue (revision 0023).
_HEADS = """
SELECT q.m, (SELECT min(t.enqueue_at) FROM {table} AS t WHERE t.state = :pending AND t.model_name = q.m)
FROM unnest(CAST(:models AS text[])) AS q(m)
"""


def row_counts(conn, model_names: list[str], caps: dict[JobState, int | None],
               tenant_id: str | None = None) -> dict[tuple[str, str], int]:
    """(model, state label) -> rows of each state in ``caps``, at most its
    cap (None: all), of one tenant or all: ``_COUNTS``, one index range per
    model and state, each stopped by its LIMIT."""
    pairs = [(m, s) for m in model_names for s in caps]
    q = text(_COUNTS.format(table=tasks.name, tenant="AND t.tenant_id = :tenant" if tenant_id is not None else ""))
    params = {"models": [m for m, _ in pairs], "states": [int(s) for _, s in pairs],
              "caps": [caps[s] for _, s in pairs], "tenant": tenant_id}  # (not bound without the tenant clause)
    return {(m, JobState(s).label): n for m, s, n in conn.execute(q, params)}


def oldest_pending(conn, model_names: list[str]) -> dict[str, datetime]:
    """model -> enqueue_at of its queue's head (``_HEADS``: one index probe per model, revision 0023)."""
    rows = conn.execute(text(_HEADS.format(table=tasks.name)),
                        {"models": list(model_names), "pending": int(JobState.PENDING)})
    return {m: as_utc(t) for m, t in rows if t is not None}


def active_counts(conn, model_names: list[str], tenant_id: str | None = None) -> dict[tuple[str, str], int]:
    """(model, state label) -> jobs of the active states, of one tenant or all:
    pending and running from the gates, retry_wait from its rows."""
    split = gate.slot_split(model_names, tenant_id)
    out = row_counts(conn, model_names, {JobState.RETRY_WAIT: None}, tenant_id)
    for m, (pending, running) in split.items():
        out[(m, JobState.PENDING.label)] = pending
        out[(m, JobState.RUNNING.label)] = running
    return out


def model_live(include_disabled: bool = True, tenant_id: str | None = None,
               counts: dict[tuple[str, str], int] | None = None) -> list[dict]:
    """Every configured model's queue and concurrency, configured and
    effective (autotune, the upstream controller).  With ``tenant_id`` the
    job numbers are that tenant's only (queue_depth too, never the gate's
    total: other tenants' load).  ``counts``: the active counts the caller
    already read (a scrape reads them once)."""
    with transaction() as conn:
        rows = conn.execute(select(models.c.model_name, models.c.enabled, models.c.queue_limit,
                                   models.c.max_concurrency).order_by(models.c.model_name)).all()
        if not include_disabled:
            rows = [r for r in rows if r.enabled]
        if counts is None:
            counts = active_counts(conn, [r.model_name for r in rows], tenant_id)
    gates = gate.gate_snapshot(r.model_name for r in rows)
    ups = upstream.snapshot(r.model_name for r in rows)
    out = []
    for r in rows:
        depth, rt_ql, rt_mc = gates[r.model_name]
        mc = min(r.max_concurrency, rt_mc) if rt_mc is not None else r.max_concurrency
        ul, paused = ups[r.model_name]
        if tenant_id is not None:
            depth = sum(counts.get((r.model_name, s.label), 0) for s in ACTIVE_STATES)
        out.append({
            "model_name": r.model_name, "enabled": bool(r.enabled), "queue_depth": depth,
            "queue_limit": min(r.queue_limit, rt_ql) if rt_ql is not None else r.queue_limit,
            "queue_limit_configured": r.queue_limit,
            **{s: counts.get((r.model_name, s), 0) for s in ("running", "pending", "retry_wait")},
            "max_concurrency": mc, "max_concurrency_configured": r.max_concurrency,
            "runtime": {"queue_limit": rt_ql, "max_concurrency": rt_mc},
            "effective_concurrency": min(mc, ul) if ul is not None else mc,
            "paused_until": datetime.fromtimestamp(paused, timezone.utc) if paused else None})
    return out


# Per (model, bucket) of the window: the finished-done jobs and the P90 of
# created -> finished seconds, by nearest rank (the smallest duration with at
# least 90% at or below it: rank ceil(0.9 n), in integers as (9n + 9) / 10;
# percentile_disc's float ceil(0.9 * n) gives 64 for n = 70).  One statement,
# PostgreSQL only; it answers at most models x buckets rows, however many
# jobs finished.  Times are compared as epoch seconds (exact numerics).
_SERIES = """
SELECT model_name, b, n, dur FROM (
  SELECT model_name, b, dur,
         row_number() OVER (PARTITION BY model_name, b ORDER BY dur) AS rn,
         count(*) OVER (PARTITION BY model_name, b) AS n
  FROM (SELECT model_name,
               LEAST(floor((extract(epoch FROM finished_at) - :start_epoch) / :width)::int, :last) AS b,
               extract(epoch FROM finished_at) - extract(epoch FROM created_at) AS dur
        FROM {table}
        WHERE state IN :states AND finished_at >= :start {tenant}) AS d
) AS w
WHERE rn = (9 * n + 9) / 10
"""


def throughput_series(minutes: int = 60, bucket_minutes: int = 5, tenant_id: str | None = None) -> dict:
    """Per model and bucket of the last ``minutes``: ``_SERIES``, on
    ix_asynch_task_state_finished (models x buckets rows, not jobs)."""
    start = clock_now() - timedelta(minutes=minutes)
    n_buckets = max(1, -(-minutes // bucket_minutes))
    q = text(_SERIES.format(table=tasks.name, tenant="AND tenant_id = :tenant" if tenant_id is not None else "")
             ).bindparams(bindparam("states", expanding=True))
    # The window's start as exact epoch seconds (microseconds kept), as extract() gives the rows'.
    start_epoch = Decimal(calendar.timegm(start.utctimetuple())) + Decimal(start.microsecond) / Decimal(1_000_000)
    params = {"states": [int(JobState.DONE), int(JobState.CLAIMED)], "start": start, "start_epoch": start_epoch,
              "width": bucket_minutes * 60, "last": n_buckets - 1, "tenant": tenant_id}
    per: dict[str, list[dict]] = {}
    with transaction() as conn:
        for m, b, n, dur in conn.execute(q, params):
            per.setdefault(m, [{"done": 0, "p90_seconds": None} for _ in range(n_buckets)])[b] = {
                "done": int(n), "p90_seconds": float(dur)}
    return {"since": start.isoformat().replace("+00:00", "Z"), "bucket_minutes": bucket_minutes,
            "models": dict(sorted(per.items()))}
