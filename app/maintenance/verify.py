"""The ledger checks itself (`asynch verify`, and beat's sampled pass): read a live deployment and report every
broken guarantee with the job ids (docs/operations.md "Verifying the ledger").

Checks (``CHECKS``; each a guarantee of docs/architecture.md "Invariants"):
- ``orphaned``: an admitted job with no terminal record and nothing that will move it: pending and not held by
  its model's dispatcher (queued, pulled or set aside), running past its lease, retry_wait past its retry time.
- ``terminal_twice``: a job with more than one terminal attempt record, or one while the job is still active.
- ``result_missing``: a done (or claimed) job whose stored result object is gone.
- ``delivery_stuck``: a delivery the job wants (its callback, its own webhook, a subscription's) with no outbox
  row, or a row neither delivered nor dead that nobody is working on (due and unleased, past the grace).
- ``gate_mismatch``: a gate slot or a live permit with no pending/running row behind it, or a pending/running
  row without its model's or its tenant's gate slot.
- ``past_deadline``: a job still active past its budget (``deadline_at``), or still pending past its caller's
  deadline (``caller_deadline_at``).

Invariants: the check only reads (it repairs nothing: recovery does); anything younger than the grace
(``ASYNCH_VERIFY_GRACE_SECONDS``: a commit's after-effects, a hand-over, a pass about to run) is spared; a
suspect found by comparing Redis with the rows is read again after the Redis read and reported only if its row
has not moved meanwhile, so a job that moves while it is checked is never a violation.  ``sample``: each check
looks at most at that many rows (the oldest waiting, the newest ended): beat's pass costs the same at any depth.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import and_, case, exists, func, or_, select

from app.clock import now as clock_now
from app.config import get_settings
from app.infra import storage
from app.infra.db import transaction
from app.infra.delivery_rows import CALLBACK, EVENT_BITS, EVENT_OF_STATE, JOB_OWN, WEBHOOK
from app.infra.redis import gate as redis_gate, ledger
from app.infra.tables import deliveries, models, task_attempts, tasks, webhook_subscriptions
from app.states import ACTIVE_STATES, RESULT_STATES, SLOT_STATES, TERMINAL_STATES, JobState as S

CHECKS = ("orphaned", "terminal_twice", "result_missing", "delivery_stuck", "gate_mismatch", "past_deadline")
_TERMINAL = sorted(int(x) for x in TERMINAL_STATES)
_ACTIVE = sorted(int(x) for x in ACTIVE_STATES)
_SLOTS = sorted(int(x) for x in SLOT_STATES)


@dataclass(frozen=True)
class Violation:
    check: str
    job_id: str
    detail: str

    def as_dict(self) -> dict:
        return {"check": self.check, "job_id": self.job_id, "detail": self.detail}


@dataclass
class LedgerReport:
    violations: list[Violation] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(CHECKS, 0)
        for v in self.violations:
            out[v.check] += 1
        return out

    def as_dict(self) -> dict:
        return {"processed": len(self.violations), "violations": self.counts(),
                "jobs": sorted({v.job_id for v in self.violations})[:50]}


def verify(sample: int | None = None, grace_seconds: float | None = None) -> LedgerReport:
    """Every check once; ``sample``: at most that many rows per check (None: all)."""
    s = get_settings()
    grace = s.verify_grace_seconds if grace_seconds is None else grace_seconds
    now = clock_now()
    cutoff = now - timedelta(seconds=grace)
    rep = LedgerReport()
    for check in (_orphaned, _terminal_twice, _result_missing, _delivery_stuck, _gate_mismatch, _past_deadline):
        rep.violations += check(now, cutoff, sample)
    return rep


def run_sampled() -> dict:
    """Beat's pass: the checks on ``ASYNCH_VERIFY_SAMPLE`` rows each; the counts become the gauge."""
    rep = verify(sample=get_settings().verify_sample)
    ledger.record(rep.counts())
    return rep.as_dict()


def _limit(q, sample: int | None):
    return q if sample is None else q.limit(sample)


def _unmoved(suspects: dict[str, tuple], states: list[int]) -> set[str]:
    """The suspects (job -> (attempt, updated_at) when first read) whose row is still in ``states`` unmoved."""
    if not suspects:
        return set()
    with transaction() as conn:
        rows = conn.execute(select(tasks.c.id, tasks.c.attempt, tasks.c.updated_at).where(
            tasks.c.id.in_(list(suspects)), tasks.c.state.in_(states))).all()
    return {r.id for r in rows if (r.attempt, r.updated_at) == suspects[r.id]}


def _orphaned(now, cutoff, sample) -> list[Violation]:
    c = tasks.c
    with transaction() as conn:
        running = conn.execute(_limit(select(c.id, c.lease_expires_at).where(
            c.state == int(S.RUNNING), c.lease_expires_at < cutoff).order_by(c.lease_expires_at), sample)).all()
        waiting = conn.execute(_limit(select(c.id, c.next_retry_at).where(
            c.state == int(S.RETRY_WAIT), c.next_retry_at < cutoff).order_by(c.next_retry_at), sample)).all()
        pending = conn.execute(_limit(select(c.id, c.model_name, c.attempt, c.updated_at).where(
            c.state == int(S.PENDING), c.updated_at < cutoff).order_by(c.enqueue_at, c.id), sample)).all()
    out = [Violation("orphaned", r.id, f"running, its lease ended at {r.lease_expires_at.isoformat()}")
           for r in running]
    out += [Violation("orphaned", r.id, f"retry_wait, its retry was due at {r.next_retry_at.isoformat()}")
            for r in waiting]
    by_model: dict[str, list] = {}
    for r in pending:
        by_model.setdefault(r.model_name, []).append(r)
    suspects = {}
    for model, rows in by_model.items():
        for r, held in zip(rows, ledger.held_by_dispatcher(model, [r.id for r in rows])):
            if not held:
                suspects[r.id] = (r.attempt, r.updated_at)
    out += [Violation("orphaned", j, "pending, not held by its model's dispatcher (no queue place, no permit)")
            for j in sorted(_unmoved(suspects, [int(S.PENDING)]))]
    return out


def _terminal_twice(now, cutoff, sample) -> list[Violation]:
    a, c = task_attempts.c, tasks.c
    ended = a.outcome.in_(_TERMINAL)
    q = (select(a.job_id, func.count().label("n"), func.max(c.state).label("state"))
         .select_from(task_attempts.join(tasks, tasks.c.id == a.job_id)).where(ended)
         .group_by(a.job_id).having(or_(func.count() > 1, func.max(c.state).in_(_ACTIVE))))
    if sample is not None:
        recent = select(c.id).order_by(c.created_at.desc()).limit(sample).scalar_subquery()
        q = q.where(a.job_id.in_(recent))
    with transaction() as conn:
        rows = conn.execute(q.order_by(a.job_id)).all()
    return [Violation("terminal_twice", r.job_id, f"{r.n} terminal attempt records, job {S(r.state).label}")
            for r in rows]


def _result_missing(now, cutoff, sample) -> list[Violation]:
    c = tasks.c
    q = select(c.id, c.result_location).where(
        c.state.in_([int(x) for x in RESULT_STATES]), c.result_location.is_not(None),
        ~c.result_location.startswith("inline:"), c.finished_at < cutoff).order_by(c.finished_at.desc())
    with transaction() as conn:
        rows = conn.execute(_limit(q, sample)).all()
    store = storage.get_storage()
    gone = [r for r in rows if not store.exists(r.result_location)]
    if not gone:
        return []
    with transaction() as conn:  # cleanup may have deleted the job (and its object) meanwhile
        still = {r.id for r in conn.execute(select(c.id).where(
            c.id.in_([r.id for r in gone]), c.state.in_([int(x) for x in RESULT_STATES])))}
    return [Violation("result_missing", r.id, f"result object missing: {r.result_location}")
            for r in gone if r.id in still]


def _wanted_bit():
    """The event bit of a terminal row's state (claimed: done), as SQL."""
    c = tasks.c
    whens = {int(st): EVENT_BITS[ev] for st, ev in EVENT_OF_STATE.items()} | {int(S.CLAIMED): EVENT_BITS["done"]}
    return case(whens, value=c.state, else_=0)


def _delivery_stuck(now, cutoff, sample) -> list[Violation]:
    c, d, sub = tasks.c, deliveries.c, webhook_subscriptions.c
    bit = _wanted_bit()
    ended = and_(c.state.in_(_TERMINAL), c.finished_at < cutoff)

    def row_of(kind, receiver):
        return exists().where(d.job_id == c.id, d.kind == kind, d.subscription_id == receiver)

    missing_own = [
        (CALLBACK, and_(c.callback_url.is_not(None), c.state.in_([int(S.DONE), int(S.CLAIMED)]),
                        ~row_of(CALLBACK, JOB_OWN))),
        (WEBHOOK, and_(c.webhook_url.is_not(None), c.webhook_events.op("&")(bit) != 0, ~row_of(WEBHOOK, JOB_OWN))),
    ]
    out = []
    with transaction() as conn:
        for kind, cond in missing_own:
            q = select(c.id).where(ended, cond).order_by(c.finished_at.desc())
            out += [Violation("delivery_stuck", j, f"its {kind} was wanted and has no outbox row")
                    for j in conn.execute(_limit(q, sample)).scalars()]
        q = (select(c.id, sub.id.label("sub")).select_from(tasks.join(webhook_subscriptions, sub.tenant_id == c.tenant_id))
             .where(ended, sub.events.op("&")(bit) != 0, sub.created_at < c.finished_at, ~row_of(WEBHOOK, sub.id))
             .order_by(c.finished_at.desc()))
        out += [Violation("delivery_stuck", r.id, f"subscription {r.sub} wanted its webhook; no outbox row")
                for r in conn.execute(_limit(q, sample))]
        late = now - timedelta(seconds=max((now - cutoff).total_seconds(), 4 * get_settings().beat_deliveries_seconds))
        q = (select(d.job_id, d.id, d.kind, d.status, d.next_attempt_at).where(
            d.status.in_(("pending", "sending")), d.next_attempt_at < late,
            or_(d.lease_until.is_(None), d.lease_until < late)).order_by(d.next_attempt_at))
        out += [Violation("delivery_stuck", r.job_id, f"{r.kind} delivery {r.id} {r.status}, due since "
                          f"{r.next_attempt_at.isoformat()} and nobody sending it") for r in conn.execute(_limit(q, sample))]
    return out


def _gate_mismatch(now, cutoff, sample) -> list[Violation]:
    with transaction() as conn:
        names = set(conn.execute(select(models.c.model_name)).scalars())
    names |= set(redis_gate.gate_models())
    old = cutoff.timestamp()
    out = []
    for model in sorted(names):
        gate, tenant_gates, permits = ledger.model_state(model)  # Redis first, then the rows (module docstring)
        held = set(gate) | {j for g in tenant_gates.values() for j in g} | {
            j.partition("#")[0] for p in permits.values() for j in p}
        with transaction() as conn:
            active = {r.id: r for r in conn.execute(select(
                tasks.c.id, tasks.c.tenant_id, tasks.c.state, tasks.c.attempt, tasks.c.updated_at).where(
                tasks.c.model_name == model, tasks.c.state.in_(_SLOTS)))}
            ended = {r.id: r for r in conn.execute(select(tasks.c.id, tasks.c.finished_at, tasks.c.updated_at).where(
                tasks.c.id.in_(list(held - set(active)))))} if held - set(active) else {}

        def no_row(job: str) -> bool:  # no active row, and not one that just left (its release may still come)
            r = ended.get(job)
            return job not in active and (r is None or (r.finished_at or r.updated_at) < cutoff)

        for job, at in gate.items():
            if at < old and no_row(job):
                out.append(Violation("gate_mismatch", job, f"holds a slot of {model}'s gate; no pending/running row"))
        for tenant, members in tenant_gates.items():
            for job, at in members.items():
                if at < old and (no_row(job) or (job in active and active[job].tenant_id != tenant)):
                    out.append(Violation("gate_mismatch", job, f"holds a slot of tenant {tenant}'s gate on {model}; "
                                                               "no pending/running row of that tenant"))
        for scope, members in permits.items():
            for job in members:
                if "#" not in job and no_row(job):  # "<job>#<attempt>": a call still ending, kept to its lease
                    out.append(Violation("gate_mismatch", job, f"holds a permit ({scope}) of {model}; "
                                                               "no pending/running row"))
        suspects = {j: (r.attempt, r.updated_at) for j, r in active.items() if r.updated_at < cutoff and (
            j not in gate or j not in tenant_gates.get(r.tenant_id, {}))}
        for job in sorted(_unmoved(suspects, _SLOTS)):
            out.append(Violation("gate_mismatch", job, f"{S(active[job].state).label} without its slot in "
                                                       f"{model}'s gate (or its tenant's)"))
        if sample is not None and len(out) >= sample:
            break
    return out


def _past_deadline(now, cutoff, sample) -> list[Violation]:
    c = tasks.c
    q = select(c.id, c.state, c.deadline_at, c.caller_deadline_at).where(or_(
        and_(c.state.in_(_ACTIVE), c.deadline_at < cutoff),
        and_(c.state == int(S.PENDING), c.caller_deadline_at < cutoff))).order_by(c.deadline_at)
    with transaction() as conn:
        rows = conn.execute(_limit(q, sample)).all()
    return [Violation("past_deadline", r.id, f"{S(r.state).label} past its "
                      + (f"deadline {r.deadline_at.isoformat()}" if r.deadline_at and r.deadline_at < cutoff
                         else f"caller's deadline {r.caller_deadline_at.isoformat()}")) for r in rows]

