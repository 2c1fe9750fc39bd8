"""Celery beat's schedule; intervals come from app.config (ASYNCH_BEAT_*).

Maintenance messages go out at high priority (they repair the queue, so
they must not wait behind it) and expire after one interval: a backlog of
identical passes is worth nothing, the next one is already scheduled."""
from __future__ import annotations

from app.config import Settings
from app.infra.celery_config import queue_for
from app.infra.publisher import Priority, broker_priority


def build_schedule(s: Settings) -> dict:
    high = broker_priority(Priority.HIGH, s.effective_broker_url)

    def entry(task: str, every: float) -> dict:
        return {"task": task, "schedule": every, "options": {"priority": high, "expires": max(1.0, every),
                                                             "queue": queue_for(task, s)}}

    return {
        "run-work": entry("asynch.run_work", s.beat_retry_seconds),
        "recover": entry("asynch.recover", s.beat_recover_seconds),
        "cleanup": entry("asynch.cleanup", s.beat_cleanup_seconds),
        "autotune": entry("asynch.autotune", s.beat_autotune_seconds),
        "deliver": entry("asynch.deliver_due", s.beat_deliveries_seconds),
        "batches": entry("asynch.batches", s.beat_batches_seconds),
        **({"verify": entry("asynch.verify", s.beat_verify_seconds)} if s.beat_verify_seconds > 0 else {}),
    }
