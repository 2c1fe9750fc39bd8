"""Queue estimates and deadline admission (docs/architecture.md, "Deadlines
and queue estimates"): where a pending job stands in the dispatcher's order
and when it should start and end.

The formula.  T: the model's run time, an EWMA of done attempts' seconds
(dispatch_finish.lua, weight ASYNCH_ESTIMATE_ALPHA; expected_seconds until
a first sample).  c: the model's max_concurrency (its runtime override if
lower).  For a job of tenant U, dispatch_position.lua (one read-only step)
gives k, U's own jobs ahead of it; p, every tenant's jobs dispatched before
it (stride scheduling projected forward); r_U and r, the slots U and
everyone hold but not ready; A, the tenants with ready work.  With

    wave(n, busy, slots) = (0 if n mod slots < slots - min(busy, slots) else T/2) + floor(n / slots) * T

(busy servers taken as half done), a job starts at

    start = now + max(wave(k, r_U, c), wave(p, r, c * A)),   done = start + T

-- its tenant's lane or the model's whole line, whichever binds.
``queue_position`` is p (0: next).  A batch's item also counts the batch's
earlier items at or before its score, in its own lane, and so does a new job
for its tenant's jobs this process admitted that the dispatcher does not hold
yet (app/jobs/handoff.py hands them over just after their 202).  The worker count is
not known: with fewer worker processes than c * A the estimate is early.

Invariants:
- Read only: estimating never changes the dispatcher's order.
- Deadline admission happens before the gate (``refuse_late``): a refused
  job takes no slot and writes no row; no estimate (Redis away) refuses nothing.
- Monotone: a job behind another of the same tenant and band is never
  estimated to start earlier (k and p grow with the line).
- A full queue's Retry-After (``retry_after``) comes from the same reading:
  the time until one of the slots the refusal counted frees, never more than
  ASYNCH_QUEUE_RETRY_AFTER_MAX_SECONDS and never less than 1 s.
"""
from __future__ import annotations

import bisect
import logging
import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import redis

from app.catalog.registry import enabled_model
from app.clock import as_utc, now as clock_now
from app.config import get_settings
from app.contract import iso_z
from app.errors import DeadlineUnmeetable, DomainError
from app.infra.redis import dispatch as rd
from app.jobs import handoff
from app.jobs.dispatch import order_score
from app.states import JobState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Estimate:
    position: int
    start_at: datetime
    done_at: datetime
    # What the reading saw (for ``retry_after``): T (measured, else expected_seconds) and the
    # slots held by attempts under way (dispatched or running), the model's and its tenant's.
    run_seconds: float = 0.0
    running: int = 0
    own_running: int = 0

    def fields(self) -> dict:
        """The poll body's and the 202's estimate fields."""
        return {"queue_position": self.position, "estimated_start_at": self.start_at, "estimated_done_at": self.done_at}


def _wave(n: int, busy: int, slots: int, t: float) -> float:
    slots = max(1, slots)
    return (0.0 if n % slots < slots - min(busy, slots) else t / 2) + (n // slots) * t


def _read(model, out: list, scores: list[float], now: datetime,
          handed: dict[str, float] | None = None) -> tuple[list[Estimate], list[float]]:
    """A dispatch_position.lua answer as the estimates at ``scores``, and the scores of the ``handed``
    jobs the dispatcher does not hold yet."""
    cap, running, own_running, tenants = (int(x) for x in out[:4])
    t = max(float(out[4]) if out[4] not in (None, "", b"") else float(model.expected_seconds), 0.001)
    ests = []
    pairs = out[6:6 + 2 * len(scores)]
    for k, p in zip(map(int, pairs[0::2]), map(int, pairs[1::2])):
        wait = 0.0 if p < 0 else max(_wave(k, own_running, cap, t), _wave(p, running, cap * tenants, t))
        start = now + timedelta(seconds=wait)
        ests.append(Estimate(max(p, 0), start, start + timedelta(seconds=t), t, running, own_running))
    held = out[6 + 2 * len(scores):]
    return ests, [handed[j] for j, h in zip(handed or {}, held) if not int(h)]


def for_new_many(asks: list[tuple[Any, str, list[float]]]) -> list[list[Estimate] | None]:
    """Estimates for (model, tenant, scores) groups about to be admitted, each behind its lane's earlier
    and unsent jobs (see above), in one round trip; None for every group if Redis cannot say."""
    now = clock_now()
    prepared = [(model, scores, sorted(set(scores)), handoff.unsent(model.model_name, tenant))
                for model, tenant, scores in asks]
    try:
        answers = rd.positions([(model.model_name, tenant, distinct, model.max_concurrency, list(handed))
                                for (model, tenant, _s), (_m, _s2, distinct, handed) in zip(asks, prepared)])
    except redis.RedisError as exc:
        log.warning("queue estimate unavailable: %s", exc)
        return [None] * len(asks)
    return [_lined_up(model, scores, distinct, *_read(model, answer, distinct, now, handed))
            for (model, scores, distinct, handed), answer in zip(prepared, answers)]


def _lined_up(model, scores: list[float], distinct: list[float], base: list[Estimate],
              unsent: list[float]) -> list[Estimate]:
    """Each score's estimate, behind the group's earlier scores and ``unsent`` (its tenant's lane, c at a time)."""
    by_score = dict(zip(distinct, base))
    t = base[0].done_at - base[0].start_at
    earlier = sorted(unsent)
    out = []
    for s in scores:
        est, extra = by_score[s], bisect.bisect_right(earlier, s)
        bisect.insort(earlier, s)
        if extra:
            shift = t * math.ceil(extra / max(1, model.max_concurrency))
            est = replace(est, position=est.position + extra, start_at=est.start_at + shift,
                          done_at=est.done_at + shift)
        out.append(est)
    return out


def of_job(row) -> Estimate | None:
    """A pending job's estimate (the poll body); None for any other state,
    a job whose model is gone, or Redis away."""
    if JobState(row.state) != JobState.PENDING:
        return None
    try:
        model = enabled_model(row.model_name)
        scores = [order_score(row.enqueue_at, row.priority)]
        out = rd.position(model.model_name, row.tenant_id, row.id, scores, cap=model.max_concurrency)
        return _read(model, out, scores, clock_now())[0][0]
    except (redis.RedisError, DomainError):
        return None


def refuse_late(est: Estimate | None, deadline_at: datetime | None) -> None:
    """429 deadline_unmeetable when the estimate ends after the deadline."""
    if est is None or deadline_at is None or est.done_at <= deadline_at:
        return
    late = (est.done_at - deadline_at).total_seconds()
    shown = {k: iso_z(v) if isinstance(v, datetime) else v for k, v in est.fields().items()}
    raise DeadlineUnmeetable(shown, iso_z(deadline_at), retry_after=int(min(300, max(1, math.ceil(late)))))


def retry_after(est: Estimate | None, by_tenant: bool, fallback: int) -> int:
    """A full queue's Retry-After, in whole seconds from 1 to ASYNCH_QUEUE_RETRY_AFTER_MAX_SECONDS: about
    when one of the slots that refused the job frees -- the model's (``by_tenant`` False) or its tenant's
    share.  With n of them under way, each taken as uniformly far along, the first of n runs of T ends
    after T / (n + 1); with none under way the slots are held by queued jobs, and the first ends a whole
    T after it starts (T / 1).  T is the measured run time when there is one; ``fallback`` (from the
    model's configuration) when the estimator cannot say (None)."""
    cap = max(1, get_settings().queue_retry_after_max_seconds)
    if est is None:
        return min(cap, max(1, fallback))
    under_way = est.own_running if by_tenant else est.running
    return min(cap, max(1, math.ceil(est.run_seconds / (under_way + 1))))


def ran_seconds(row) -> float | None:
    """A done attempt's run time (claim to done), which the finish step adds
    to its model's EWMA (dispatch_finish.lua, with the slot's release)."""
    if row.started_at is None or row.finished_at is None:
        return None
    return max(0.0, (as_utc(row.finished_at) - as_utc(row.started_at)).total_seconds())
