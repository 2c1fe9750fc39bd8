"""Autotune: fit each model's runtime limits to how it behaved recently.

For every enabled model, over a window (default 3600 s) of jobs that ended
done: P90 of finished_at - started_at, throughput = completed / window, and
how many of them waited for a worker.  ``decide`` (pure) turns that into
new runtime limits; ``autotune`` writes them to
``asynch:runtime:max_concurrency:{model}`` / ``asynch:runtime:queue_limit:{model}``
with a TTL (they fall back to the configured caps if autotune stops) and
logs each change in ``asynch_autotune_log``.  The rule and its reasoning
are in docs/architecture.md ("Autotune").
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import timedelta

from sqlalchemy import insert, select

from app import redis_scripts
from app.clock import as_utc, now as clock_now
from app.config import get_settings
from app.db import transaction
from app.errors import ValidationFailed
from app.models import autotune_log, models, tasks
from app.services.maintenance import Report
from app.states import JobState

# A P90 below this (sub-millisecond stub models) is treated as this, so the
# capacity estimate stays finite.
MIN_SERVICE_SECONDS = 0.001


@dataclass(frozen=True)
class Limits:
    max_concurrency: int
    queue_limit: int


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

    @property
    def changes(self) -> bool:
        return self.new is not None and self.new != self.old


def _clamp(v: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, v))


def p90(values: list[float]) -> float:
    """Nearest-rank 90th percentile (a value that occurred)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def decide(inputs: Inputs, *, current: Limits, caps: Limits, expected_seconds: float,
           timeout_seconds: float, min_samples: int) -> Decision:
    """The rule.  max_concurrency: additive increase / multiplicative
    decrease on P90 against expected_seconds.  queue_limit: Little's law,
    L = X * B, with X the rate the model completes jobs at the new
    concurrency and B = timeout_seconds the time a job may spend in the
    system; clamped to [1, cap]."""
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


def gather(conn, since, until, queued_seconds: float) -> dict[str, Inputs]:
    """Inputs per model from the jobs that ended done in [since, until]."""
    window = max(1e-9, (until - since).total_seconds())
    rows = conn.execute(select(tasks.c.model_name, tasks.c.enqueue_at, tasks.c.started_at,
                               tasks.c.finished_at).where(
        tasks.c.state.in_([int(JobState.DONE), int(JobState.CLAIMED)]),
        tasks.c.finished_at >= since, tasks.c.finished_at <= until,
    ))
    runs: dict[str, list[float]] = {}
    waited: dict[str, int] = {}
    for r in rows:
        if r.started_at is None:
            continue
        started = as_utc(r.started_at)
        runs.setdefault(r.model_name, []).append((as_utc(r.finished_at) - started).total_seconds())
        if (started - as_utc(r.enqueue_at)).total_seconds() >= queued_seconds:
            waited[r.model_name] = waited.get(r.model_name, 0) + 1
    return {m: Inputs(samples=len(v), p90_seconds=p90(v), throughput_per_second=len(v) / window,
                      queued=waited.get(m, 0)) for m, v in runs.items()}


def _effective(raw: str | None, cap: int) -> int:
    # The gate ignores an unreadable override and uses the cap; so do we.
    try:
        return min(int(raw), cap) if raw is not None else cap
    except ValueError:
        return cap


def autotune(window_seconds: int | None = None, dry_run: bool = False) -> Report:
    """Decide for every enabled model; unless ``dry_run``, write the limits
    (compare-and-set: a concurrent run that changed them first wins) and
    log the changes."""
    s = get_settings()
    window = window_seconds if window_seconds and window_seconds > 0 else s.autotune_window_seconds
    now = clock_now()
    with transaction() as conn:
        configured = conn.execute(select(models).where(models.c.enabled.is_(True))
                                  .order_by(models.c.model_name)).all()
        stats = gather(conn, now - timedelta(seconds=window), now, s.autotune_queued_seconds)
    items, applied = [], 0
    for m in configured:
        inputs = stats.get(m.model_name, Inputs())
        raw = redis_scripts.runtime_limits_raw(m.model_name)
        caps = Limits(m.max_concurrency, m.queue_limit)
        d = decide(inputs, current=Limits(_effective(raw[0], caps.max_concurrency),
                                          _effective(raw[1], caps.queue_limit)),
                   caps=caps, expected_seconds=m.expected_seconds, timeout_seconds=m.timeout_seconds,
                   min_samples=s.autotune_min_samples)
        item = {"model": m.model_name, "action": d.action, "reason": d.reason, "old": asdict(d.old),
                "new": asdict(d.new) if d.new else None, "inputs": asdict(inputs), "applied": False}
        if d.new is not None and not dry_run:
            # Written even when unchanged: it refreshes the TTL while autotune runs.
            item["applied"] = redis_scripts.runtime_limits_cas(
                m.model_name, raw, d.new.max_concurrency, d.new.queue_limit, s.autotune_ttl_seconds)
            if not item["applied"]:
                item["reason"] += "; not written: the limits changed meanwhile"
            elif d.changes:
                applied += 1
                with transaction() as conn:
                    conn.execute(insert(autotune_log).values(
                        model_name=m.model_name, action=d.action,
                        old_max_concurrency=d.old.max_concurrency, new_max_concurrency=d.new.max_concurrency,
                        old_queue_limit=d.old.queue_limit, new_queue_limit=d.new.queue_limit,
                        p90_seconds=inputs.p90_seconds, throughput_per_second=inputs.throughput_per_second,
                        samples=inputs.samples, queued=inputs.queued, window_seconds=window, created_at=now))
        items.append(item)
    return Report(processed=applied, details={"window_seconds": window, "dry_run": dry_run, "models": items})


MAX_WINDOW_SECONDS = 30 * 86400


def parse_request(body: dict, window_field: str, dry_run_field: str) -> tuple[int | None, bool]:
    """(window, dry_run) from a request body; absent or <= 0 window means
    the default (seed: windowSeconds).  Field names differ per API face."""
    errs = []
    window = body.get(window_field)
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)):
        errs.append({"pointer": f"/{window_field}", "message": "must be an integer number of seconds"})
    elif window is not None and window > MAX_WINDOW_SECONDS:
        errs.append({"pointer": f"/{window_field}", "message": f"must be at most {MAX_WINDOW_SECONDS}"})
    dry_run = body.get(dry_run_field, False)
    if not isinstance(dry_run, bool):
        errs.append({"pointer": f"/{dry_run_field}", "message": "must be true or false"})
    if errs:
        raise ValidationFailed("invalid autotune request", errs)
    return (window if window and window > 0 else None), dry_run
