"""Autotune: fit each model's runtime limits to how it behaved recently.

For every enabled model, over a window (cut short by the model's last
applied change) of jobs that ended done: P90 of finished_at - started_at,
throughput, and how many waited for a worker.  ``decide`` (pure) turns that
into new runtime limits; ``autotune`` writes them to
``asynch:runtime:{max_concurrency,queue_limit}:{model}`` with a TTL (back to
the configured caps if autotune stops) and logs each change in
``asynch_autotune_log`` (the map: docs/architecture.md, "Autotune").

Why this rule:
- max_concurrency, additive increase / multiplicative decrease on P90 against
  the model's ``expected_seconds``.  P90 above it means the model is saturated
  (or degrading) and more parallel calls only queue inside it: halve (floor 1),
  a large cut so an overloaded upstream recovers quickly.  P90 within it and
  jobs that waited (``ASYNCH_AUTOTUNE_QUEUED_SECONDS``) mean demand the model
  handles well: add 1 (never above the cap) and probe gently.  Otherwise hold.
  TCP's congestion rule, for the same reason: it converges on a fair, stable
  operating point without knowing the upstream's capacity.
- queue_limit, Little's law: a job admitted at the back of the queue should
  still finish within its budget B, so admit at most floor(X x B), clamped to
  [1, cap], with X = max(X_obs, c_new / P90).  X_obs is what the model
  demonstrably completed; c_new / P90 is a conservative capacity at the new
  concurrency, which matters when the window saw little traffic (an idle model
  must not have its queue shrunk to its tiny observed rate).  B is
  ``timeout_seconds``: the operator's own statement of how long a call may
  take (an ``expected_seconds x k`` budget would need an invented k).
- Evidence is only what finished since the last applied change, so a change is
  judged by jobs that ran under it and a second run right after one has too few
  samples (< ASYNCH_AUTOTUNE_MIN_SAMPLES) to halve twice.  The model row is
  locked (SKIP LOCKED) while deciding and the Redis write is a compare-and-set
  (runtime_limits_cas.lua), so concurrent runs apply one decision.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import timedelta

from sqlalchemy import func, insert, select

from app.clock import as_utc, now as clock_now
from app.config import get_settings
from app.infra.db import transaction
from app.infra.redis import runtime
from app.infra.tables import autotune_log, models, tasks
from app.maintenance.report import Report
from app.maintenance.schemas import Limits
from app.states import JobState

# A P90 below this (sub-millisecond stub models) is treated as this, so the
# capacity estimate stays finite.
MIN_SERVICE_SECONDS = 0.001


@dataclass(frozen=True)
class Inputs:
    samples: int = 0                     # jobs done in the window
    p90_seconds: float = 0.0             # P90 of finished_at - started_at
    throughput_per_second: float = 0.0   # samples / window
    queued: int = 0                      # of them, how many waited for a worker


@dataclass(frozen=True)
class Decision:
    action: str          # skip | decrease | increase | hold
    reason: str
    old: Limits
    new: Limits | None   # None: nothing to write


def _clamp(v: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, v))


def p90(values: list[float]) -> float:
    """Nearest-rank 90th percentile (a value that occurred)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def decide(inputs: Inputs, *, current: Limits, caps: Limits, expected_seconds: float,
           timeout_seconds: float, min_samples: int) -> Decision:
    """max_concurrency: additive increase / multiplicative decrease on P90
    against expected_seconds.  queue_limit: Little's law, L = X * B (X: the
    completion rate at the new concurrency, B: timeout_seconds), in [1, cap]."""
    if caps.max_concurrency < 1 or caps.queue_limit < 1:
        return Decision("skip", "a configured cap is below 1 (the model takes no jobs)", current, None)
    old = Limits(_clamp(current.max_concurrency, 1, caps.max_concurrency),
                 _clamp(current.queue_limit, 1, caps.queue_limit))
    if inputs.samples < min_samples:
        return Decision("skip", f"{inputs.samples} jobs done in the window, at least {min_samples} needed",
                        old, None)
    if inputs.p90_seconds > expected_seconds:
        c, action = max(1, old.max_concurrency // 2), "decrease"
        reason = f"P90 {inputs.p90_seconds:.3f}s > expected {expected_seconds}s: the model is saturating"
    elif inputs.queued > 0:
        c, action = min(caps.max_concurrency, old.max_concurrency + 1), "increase"
        reason = f"P90 within expected and {inputs.queued} jobs waited for a worker"
    else:
        c, action = old.max_concurrency, "hold"
        reason = "P90 within expected and no job waited for a worker"
    rate = max(inputs.throughput_per_second, c / max(inputs.p90_seconds, MIN_SERVICE_SECONDS))
    q = _clamp(math.floor(rate * timeout_seconds), 1, caps.queue_limit)
    return Decision(action, reason, old, Limits(c, q))


def gather(conn, model: str, since, until, queued_seconds: float) -> Inputs:
    """Inputs from the model's jobs that ended done in [since, until]."""
    window = max(1e-9, (until - since).total_seconds())
    rows = conn.execute(select(tasks.c.enqueue_at, tasks.c.started_at, tasks.c.finished_at).where(
        tasks.c.model_name == model, tasks.c.finished_at >= since, tasks.c.finished_at <= until,
        tasks.c.state.in_([int(JobState.DONE), int(JobState.CLAIMED)]), tasks.c.started_at.is_not(None),
    )).all()
    if not rows:
        return Inputs()
    runs = [(as_utc(r.finished_at) - as_utc(r.started_at)).total_seconds() for r in rows]
    waited = sum(1 for r in rows if (as_utc(r.started_at) - as_utc(r.enqueue_at)).total_seconds() >= queued_seconds)
    return Inputs(samples=len(runs), p90_seconds=p90(runs), throughput_per_second=len(runs) / window,
                  queued=waited)


def effective(raw: str | None, cap: int) -> int:
    """A stored runtime override capped by the configuration; the gate ignores
    an unreadable one and uses the cap, and so does everyone else."""
    try:
        return min(int(raw), cap) if raw else cap
    except ValueError:
        return cap


def tune_model(name: str, window: int, dry_run: bool) -> dict | None:
    """One model's decision, written unless ``dry_run``; None: another run
    holds its row (SKIP LOCKED; the Redis write is a CAS too).  Evidence is
    what finished since the last applied change, so a second run right after
    one has too few samples instead of halving twice."""
    s = get_settings()
    now = clock_now()
    with transaction() as conn:
        m = conn.execute(select(models).where(models.c.model_name == name, models.c.enabled.is_(True))
                         .with_for_update(skip_locked=True)).first()
        if m is None:
            return None
        last = conn.execute(select(func.max(autotune_log.c.created_at))
                            .where(autotune_log.c.model_name == name)).scalar()
        start = now - timedelta(seconds=window)
        since = max(start, as_utc(last)) if last is not None else start
        inputs = gather(conn, name, since, now, s.autotune_queued_seconds)
        raw = runtime.runtime_limits_raw(name)
        caps = Limits(m.max_concurrency, m.queue_limit)
        d = decide(inputs, current=Limits(effective(raw[0], caps.max_concurrency),
                                          effective(raw[1], caps.queue_limit)),
                   caps=caps, expected_seconds=m.expected_seconds, timeout_seconds=m.timeout_seconds,
                   min_samples=s.autotune_min_samples)
        item = {"model": name, "action": d.action, "reason": d.reason, "old": asdict(d.old),
                "new": asdict(d.new) if d.new else None, "inputs": asdict(inputs),
                "evidence_seconds": round((now - since).total_seconds(), 3), "applied": False, "changed": False}
        if d.new is None or dry_run:
            return item
        # Written even when unchanged: that refreshes the TTL while autotune runs.
        item["applied"] = runtime.runtime_limits_cas(
            name, raw, d.new.max_concurrency, d.new.queue_limit, s.autotune_ttl_seconds)
        if not item["applied"]:
            item["reason"] += "; not written: the limits changed meanwhile"
        elif d.new != d.old:
            item["changed"] = True
            conn.execute(insert(autotune_log).values(
                model_name=name, action=d.action, window_seconds=window, created_at=now, **asdict(inputs),
                old_max_concurrency=d.old.max_concurrency, new_max_concurrency=d.new.max_concurrency,
                old_queue_limit=d.old.queue_limit, new_queue_limit=d.new.queue_limit))
        return item


def autotune(window_seconds: int | None = None, dry_run: bool = False) -> Report:
    """Decide for every enabled model; unless ``dry_run``, write the limits and log each change."""
    window = window_seconds if window_seconds and window_seconds > 0 else get_settings().autotune_window_seconds
    with transaction() as conn:
        names = [r.model_name for r in conn.execute(select(models.c.model_name).where(
            models.c.enabled.is_(True)).order_by(models.c.model_name))]
    tuned = {name: tune_model(name, window, dry_run) for name in names}
    items = [i for i in tuned.values() if i is not None]
    busy = [name for name, i in tuned.items() if i is None]
    return Report(processed=sum(1 for i in items if i["changed"]),
                  details={"window_seconds": window, "dry_run": dry_run, "models": items, "busy": busy})
